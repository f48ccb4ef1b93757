"""docs/reference/magics.md is generated from the magics' own help (scripts/gen_reference.py) and kept current.

Pure: the magics' modules are imported, no Ray is started.
"""

from __future__ import annotations

import pathlib
import re

from _scripts import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]


gen = load_script("gen_reference")


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


def test_every_magic_line_in_the_guide_parses() -> None:
    """Each magic line in the user guide's code blocks is one the magic accepts: its options exist, belong to
    its subcommand, and have values of the right kind (parsed by the magic's own parser; nothing runs)."""
    pages = sorted((ROOT / "docs" / "guide").glob("*.md"))
    assert pages
    checked = 0
    bad = []
    for page in pages:
        for no, line in gen.magic_lines(page.read_text()):
            checked += 1
            why = gen.check_magic_line(line)
            if why is not None:
                bad.append(f"{page.relative_to(ROOT)}:{no}: {line}\n    {why}")
    assert checked > 50, checked
    assert not bad, "magic lines in the guide that the magics refuse:\n" + "\n".join(bad)


def test_the_line_check_refuses_what_a_magic_refuses() -> None:
    assert gen.check_magic_line("%gpu_cluster start --workers 2") is None
    assert gen.check_magic_line("%%distributed --ranks 0 -o x") is None
    assert gen.check_magic_line("%%distributed --targets 0-1") is None
    assert "--ranks" in str(gen.check_magic_line("%%distributed --workers 0 -o x"))
    assert "does not apply" in str(gen.check_magic_line("%gpu_cluster stop --budget 5"))
    assert "positional" in str(gen.check_magic_line("%gpu_cluster list big"))
    assert "--workers" in str(gen.check_magic_line("%gpu_cluster start --workers 0"))
    assert "no magic" in str(gen.check_magic_line("%gpu_clusters start"))
    assert gen.check_magic_line("%load_ext gpu_notebook") is None  # IPython's own magics are not checked
    assert "--port" in str(gen.check_magic_line("%gpu_monitor prometheus --port 99999"))


def test_every_example_in_the_magics_help_parses() -> None:
    """The `In [1]: %gpu_cluster ...` examples of each magic's help (shown in the reference too) are accepted."""
    bad = []
    for name, func in gen._magic_funcs():
        _, examples = gen._description(func)
        for line in examples.splitlines():
            text = line.split(":", 1)[1].strip() if line.startswith("In [") else ""
            if text.startswith("%") and not text.startswith("%%"):
                why = gen.check_magic_line(text)
                if why is not None:
                    bad.append(f"{name}: {text}\n    {why}")
    assert not bad, "examples in the magics' help that the magics refuse:\n" + "\n".join(bad)


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub makes for a page's headings (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    fence = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"^#{1,6} (.+?)\s*$", line)
        if m:
            base = gen._anchor(m.group(1).replace("`", ""))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_the_guide_links_resolve() -> None:
    """Every relative link of the guide and the reference names a file that exists, and a heading in it."""
    pages = sorted((ROOT / "docs" / "guide").glob("*.md")) + [gen.OUT]
    bad = []
    for page in pages:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text()):
                bad.append(f"{page.relative_to(ROOT)}: {target}: no such heading")
    assert not bad, "\n".join(bad)
