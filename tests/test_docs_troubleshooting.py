"""docs/guide/troubleshooting.md covers every error message written in gpu_notebook/ (scripts/error_messages.py).

Pure: the package is read with ``ast``, nothing is imported or started.
"""

from __future__ import annotations

import pathlib
import textwrap

from _scripts import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]


em = load_script("error_messages")


def test_every_error_message_is_in_troubleshooting() -> None:
    missing = em.missing(em.PAGE.read_text())
    listed = "\n".join(f"  {m.cls}: {m.key!r} ({m.where})" for m in missing)
    assert not missing, (
        f"{len(missing)} error message(s) raised in the code are not in {em.PAGE.relative_to(ROOT)}; add each "
        "with what to do (`.venv/bin/python scripts/error_messages.py --missing` lists them), or, for an error a "
        f"user cannot meet, to EXCLUDED in scripts/error_messages.py with the reason:\n{listed}"
    )


def test_exclusions_are_current_and_explained() -> None:
    keys = {m.key for m in em.messages()}
    for key, reason in em.EXCLUDED.items():
        assert key in keys, f"EXCLUDED names {key!r}, which no longer is an error message: remove it"
        assert len(reason) > 10, f"EXCLUDED {key!r}: say why a user cannot meet it"


def test_the_extraction_finds_what_it_should(tmp_path: pathlib.Path) -> None:
    """Our classes through inheritance, literals, f-string prefixes, wrappers, UsageError, builtin errors; not a
    message held in a variable."""
    pkg = tmp_path / "gpu_notebook"
    pkg.mkdir()
    (pkg / "errors.py").write_text("class GpuNotebookError(Exception): ...\n")
    (pkg / "mod.py").write_text(
        textwrap.dedent(
            """
            from gpu_notebook.errors import GpuNotebookError
            class AError(GpuNotebookError, RuntimeError): ...
            class BError(AError): ...
            def f(name, exc):
                raise BError(f"cluster {name!r} is not running: start it with %gpu_cluster start")
                raise wrap(AError("a literal message, " "implicitly joined"))
                raise UsageError(f"{name}: the cluster named twice ({exc})")
                raise UsageError(f"{name}: {exc}")
                raise ValueError("a builtin error with a message")
                err = AError("built first, raised later")
                raise AError(message)
                raise self._fail(f"a helper builds this error, {name}")
                log(f"not raised, not an error: {name}")
            """
        )
    )
    files = sorted(pkg.rglob("*.py"))
    assert em.error_classes(files) == {"GpuNotebookError", "AError", "BError"}
    old_root, old_pkg = em.ROOT, em.PACKAGE
    em.ROOT, em.PACKAGE = tmp_path, pkg
    try:
        found = em.messages(files)
    finally:
        em.ROOT, em.PACKAGE = old_root, old_pkg
    keys = [m.key for m in found]
    assert keys == [
        "is not running: start it with %gpu_cluster start",  # prefix too short: the longest literal part
        "a literal message, implicitly joined",
        ": the cluster named twice (",
        ":",
        "a builtin error with a message",
        "built first, raised later",
        "a helper builds this error,",
    ]
    assert [m.key for m in em.required(found)] == [
        "is not running: start it with %gpu_cluster start",
        "a literal message, implicitly joined",
        ": the cluster named twice (",
        "a builtin error with a message",
        "built first, raised later",
        "a helper builds this error,",
    ]
    assert found[0].text == "cluster {…} is not running: start it with %gpu_cluster start"
    page = "| `BError: a literal message, implicitly joined` | fix |\n| `…: the cluster named twice (…)` |"
    # a message that starts with a value: its literal parts in order on one line, not its longest part alone
    assert found[0].parts == ("cluster", "is not running: start it with %gpu_cluster start")
    alone = page + "\n| `is not running: start it with %gpu_cluster start` |"
    assert "is not running: start it with %gpu_cluster start" in [m.key for m in em.missing(alone, found)]
    whole = page + "\n| `BError: cluster … is not running: start it with %gpu_cluster start` |"
    assert "is not running: start it with %gpu_cluster start" not in [m.key for m in em.missing(whole, found)]
    assert [m.key for m in em.missing(page, found)] == [
        "is not running: start it with %gpu_cluster start",
        "a builtin error with a message",
        "built first, raised later",
        "a helper builds this error,",
    ]
