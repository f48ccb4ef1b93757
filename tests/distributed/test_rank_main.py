"""Each rank's cells run in a real ``__main__`` module: pickling cell-defined classes works, in the rank and in
the child processes it starts with spawn or forkserver (DataLoader workers, torch.multiprocessing.spawn,
ProcessPoolExecutor), on the shared 2-worker gloo cluster."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(240)


def test_cells_run_in_sys_modules_main_and_torch_save_of_a_cell_defined_class_works(ip, shared, tmp_path):
    cell = (
        "%%distributed -o got\n"
        "import sys, torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(3, 1)\n"
        "    def forward(self, x):\n"
        "        return self.fc(x)\n"
        "model = Net()\n"
        f"path = {str(tmp_path)!r} + f'/model{{rank}}.pt'\n"
        "torch.save(model, path)\n"
        "back = torch.load(path, weights_only=False)\n"
        "(type(back).__name__, type(back).__module__, __name__, sys.modules['__main__'].__dict__ is globals(),\n"
        " torch.equal(back.fc.weight, model.fc.weight), sys.modules['__main__'].model is model)\n"
    )
    res = ip.run_cell(cell)
    assert res.success, res.error_in_exec
    assert list(ip.user_ns["got"]) == [("Net", "__main__", "__main__", True, True, True)] * 2


def test_sys_argv_is_a_cell_like_list_and_settable(ip, shared):
    res = ip.run_cell("%%distributed -o argv\nimport sys\nsys.argv\n")
    assert res.success, res.error_in_exec
    assert list(ip.user_ns["argv"]) == [["<cell>"], ["<cell>"]]
    res = ip.run_cell("%%distributed\nimport sys\nsys.argv = ['train.py', '--lr', '0.1']\n")
    res = ip.run_cell(
        "%%distributed -o argv\nimport argparse, sys\n"
        "p = argparse.ArgumentParser(); p.add_argument('--lr', type=float)\np.parse_args().lr\n"
    )
    assert res.success, res.error_in_exec
    assert list(ip.user_ns["argv"]) == [0.1, 0.1]
    ip.run_cell("%%distributed\nimport sys\nsys.argv = ['<cell>']\n")


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_dataloader_workers_started_by_spawn_or_forkserver_find_a_cell_defined_dataset(ip, shared, method):
    cell = (
        "%%distributed --ranks 0 -o got\n"
        "import torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "def double(x):\n"
        "    return 2 * x\n"
        "class Squares(Dataset):\n"
        "    def __len__(self):\n"
        "        return 4\n"
        "    def __getitem__(self, i):\n"
        "        return torch.tensor(double(i * i))\n"
        f"dl = DataLoader(Squares(), batch_size=2, num_workers=2, multiprocessing_context={method!r})\n"
        "[b.tolist() for b in dl]\n"
    )
    res = ip.run_cell(cell)
    assert res.success, res.error_in_exec
    assert list(ip.user_ns["got"]) == [[[0, 2], [8, 18]]]


def test_torch_multiprocessing_spawn_runs_a_cell_defined_function(ip, shared, tmp_path):
    cell = (
        "%%distributed --ranks 1 -o got\n"
        "import torch.multiprocessing as tmp\n"
        "def work(i, path):\n"
        "    with open(path, 'w') as f:\n"
        "        f.write(f'child {i} ran')\n"
        f"path = {str(tmp_path / 'spawned.txt')!r}\n"
        "tmp.spawn(work, args=(path,), nprocs=1)\n"
        "open(path).read()\n"
    )
    res = ip.run_cell(cell)
    assert res.success, res.error_in_exec
    assert list(ip.user_ns["got"]) == ["child 0 ran"]


def test_a_spawn_process_pool_runs_a_cell_defined_function(ip, shared):
    cell = (
        "%%distributed --ranks 0 -o got\n"
        "import multiprocessing\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "class Point:\n"
        "    def __init__(self, x):\n"
        "        self.x = x\n"
        "def norm(p):\n"
        "    return p.x * p.x\n"
        "with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context('spawn')) as pool:\n"
        "    out = list(pool.map(norm, [Point(2), Point(3)]))\n"
        "out\n"
    )
    res = ip.run_cell(cell)
    assert res.success, res.error_in_exec
    assert list(ip.user_ns["got"]) == [[4, 9]]


def test_ipython_syntax_runs_on_the_ranks(ip, shared, capsys):
    cell = (
        "%%distributed -o got\n"
        "!echo shell says $((40 + 2))\n"
        "files = !echo one; echo two\n"
        "%time y = 21 * 2\n"
        "display('shown by display')\n"
        "(list(files), y)\n"
    )
    res = ip.run_cell(cell)
    assert res.success, res.error_in_exec
    assert list(ip.user_ns["got"]) == [(["one", "two"], 42)] * 2
    got = capsys.readouterr()
    text = got.out + got.err
    # display() sends a display, shown once for both ranks (a terminal prints its text form)
    assert "[ranks 0-1 display]\n'shown by display'\n" in text
    for r in (0, 1):
        assert f"[rank {r}] shell says 42" in text
        assert f"[rank {r}] Wall time:" in text
    res = ip.run_cell("%%distributed\nexit(0)\n")  # still ours once the shell exists: ends the cell
    assert res.success, res.error_in_exec


def test_an_error_after_ipython_syntax_points_at_the_notebook_line(ip, shared):
    res = ip.run_cell("%%distributed\n\n!true\nx = 1\nraise ValueError('line 5')\n")
    err = res.error_in_exec
    assert err is not None
    assert "ValueError: line 5 at cell line 5" in "\n".join(err._render_traceback_())


def test_which_cells_need_ipython():
    from gpu_notebook.distributed._shell import uses_ipython_syntax

    needs = ["!nvidia-smi", "  %time f()", "files = !ls", "a, b = %sx ls", "%%timeit\nf()", "if x:\n    !ls"]
    plain = ["a != b", "x = 5 % 2", "print('!x')", "s = '%d' % 3", "x = 1"]
    assert [uses_ipython_syntax(c) for c in needs] == [True] * len(needs)
    assert [uses_ipython_syntax(c) for c in plain] == [False] * len(plain)
