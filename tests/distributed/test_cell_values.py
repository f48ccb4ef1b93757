"""What a cell's result says in the notebook, as library functions: identical per-rank values shown once, and the
``%gpu_push`` hint for a notebook variable the workers never got."""

from gpu_notebook.distributed import (
    CellResult,
    RankFailure,
    RankResults,
    push_hint,
    value_groups,
    value_lines,
)


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def _name_error(rank: int, name: str) -> RankFailure:
    return RankFailure(rank, "error", "NameError", f"name '{name}' is not defined")


def test_identical_values_are_grouped_with_their_ranks_in_order_of_first_rank():
    values = [(0, 1.5), (1, 2.5), (2, 1.5), (3, None), (4, 1.5)]
    assert value_groups(values) == [([0, 2, 4], "1.5"), ([1], "2.5")]


def test_a_repr_that_raises_is_shown_as_such_and_the_other_values_still_are():
    groups = value_groups([(0, _BadRepr()), (1, "ok")])
    assert groups == [([0], "<repr failed: no repr>"), ([1], "'ok'")]


def test_value_lines_read_as_px_output():
    assert value_lines([(0, 1.0), (1, 1.0), (2, 7)]) == ["Out[ranks 0-1]: 1.0", "Out[rank 2]: 7"]
    assert value_lines([(0, "a\nb")]) == ["Out[rank 0]: 'a\\nb'"]  # a str's repr is one line
    multi = value_lines([(0, _Lines())])
    assert multi == ["Out[rank 0]:\nline 1\nline 2"]
    assert value_lines([(0, None)]) == []


class _Lines:
    def __repr__(self) -> str:
        return "line 1\nline 2"


def test_cell_result_value_lines():
    result = CellResult([0, 1], RankResults({0: 3, 1: 3}), {}, 0.1)
    assert result.value_lines() == ["Out[ranks 0-1]: 3"]


def test_the_push_hint_names_notebook_variables_once():
    failures = [
        _name_error(0, "lr"),
        _name_error(1, "lr"),
        _name_error(1, "batch"),
        _name_error(0, "nowhere"),
    ]
    hint = push_hint(failures, {"lr": 0.1, "batch": 64})
    assert hint == (
        "'lr', 'batch' are defined in the notebook, not on the workers (each worker has its own namespace): "
        "send them first with %gpu_push lr batch"
    )
    one = push_hint([_name_error(0, "lr")], {"lr": 0.1})
    assert one.startswith("'lr' is defined in the notebook") and one.endswith(
        "send it first with %gpu_push lr"
    )


def test_no_push_hint_without_a_name_error_of_a_notebook_variable():
    other = RankFailure(0, "error", "ValueError", "name 'lr' is not defined")
    assert push_hint([other], {"lr": 1}) == ""
    assert push_hint([_name_error(0, "x")], {"lr": 1}) == ""
    assert push_hint([], {"lr": 1}) == ""


def test_add_push_hint_appends_to_the_note():
    result = CellResult([0], RankResults({}), {}, 0.1, failures=[_name_error(0, "lr")])
    result.add_push_hint({"lr": 1})
    assert result.note.startswith("'lr' is defined in the notebook")
    noted = CellResult(
        [0], RankResults({}), {}, 0.1, failures=[_name_error(0, "lr")], note="worker 0 restarted"
    )
    noted.add_push_hint({"lr": 1})
    assert noted.note.startswith("worker 0 restarted\n'lr' is defined")
    clean = CellResult([0], RankResults({0: 1}), {}, 0.1)
    clean.add_push_hint({"lr": 1})
    assert clean.note == ""
