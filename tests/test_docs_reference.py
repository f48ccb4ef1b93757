"""docs/reference/magics.md is generated from the magics' own help (scripts/gen_reference.py) and kept current.

Pure: the magics' modules are imported, no Ray is started.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys
from types import ModuleType

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


gen = _script("gen_reference")


def test_reference_is_current() -> None:
    committed = gen.OUT.read_text() if gen.OUT.exists() else ""
    assert committed == gen.render(), (
        f"{gen.OUT.relative_to(ROOT)} is stale (a magic's options or help changed): run {gen.COMMAND} "
        "and commit the result"
    )


def test_reference_covers_every_magic_and_subcommand() -> None:
    """Each magic has its section and each subcommand its usage line and heading, so a new one cannot be
    left out by the generator."""
    text = gen.render()
    for name, func in gen._magic_funcs():
        assert f"## `{name}`" in text
        for cmd in getattr(func, "subcommand_options", {}):
            assert f"### `{name} {cmd}`" in text
            assert f"`{name} {cmd}" in text.split(f"### `{name} {cmd}`")[0]  # in the command table too
        for action in gen._actions(func):
            for flag in action.option_strings:
                assert f"`{flag}`" in text, f"{name}: option {flag} missing from the reference"


def test_reference_links_resolve() -> None:
    """Every in-page link (#anchor) names a heading of the page, as GitHub makes its anchors."""
    text = gen.render()
    anchors = {gen._anchor(h.strip("`")) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}
    for target in re.findall(r"\]\(#([^)]+)\)", text):
        assert target in anchors, f"link to #{target}: no such heading"
