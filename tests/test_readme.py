"""README.md is a new user's front door: short, the two commands first, the paths to the guide, no development log.

What a test can hold it to: its length, that its first command block is the quickstart and the test command and
that CI runs that same test command, that every chapter of the user guide is reachable from it under the same
path as in ``docs/guide/README.md``, and that no commit hash, issue number or session history crept back in.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _links(path: Path) -> set[Path]:
    """The files that ``path`` links to (relative links only), resolved."""
    out = set()
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if "://" not in target:
            out.add((path.parent / target).resolve())
    return out


def test_readme_is_short() -> None:
    lines = _text().splitlines()
    assert len(lines) < 200, (
        f"README.md has {len(lines)} lines; keep it under 200 (figures go to docs/benchmarks.md)"
    )


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second() -> None:
    text = _text()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block is not None, "README.md has no bash block"
    assert text.index(first_block.group(0)) < len(text) // 4, "the two commands must come first"
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines() if line.strip()]
    assert commands == ["scripts/quickstart.sh", "scripts/test.sh"], commands
    for command in commands:
        assert (ROOT / command).is_file(), command
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^exec scripts/test\.sh\s*$", ci, re.M), "CI must run README's test command"


def test_install_first_cluster_and_paths_are_on_the_first_screen() -> None:
    first_screen = "\n".join(_text().splitlines()[:20])
    for needle in ("#install", "first-cluster.md", "cloud.md", "workshops.md", "#status"):
        assert needle in first_screen, f"{needle} is not linked from README's first screen"


def test_every_guide_chapter_is_linked_from_readme_by_the_same_path() -> None:
    guide = ROOT / "docs" / "guide" / "README.md"
    chapters = {p for p in _links(guide) if p.parent == guide.parent and p.suffix == ".md"}
    assert len(chapters) >= 8, chapters  # the guide's own list: install ... troubleshooting
    missing = chapters - _links(README)
    assert not missing, f"guide chapters not linked from README.md: {sorted(p.name for p in missing)}"
    assert guide.resolve() in _links(README)


def test_every_relative_link_of_readme_exists() -> None:
    missing = [str(p.relative_to(ROOT)) for p in _links(README) if not p.exists()]
    assert not missing, missing


def test_readme_holds_no_development_log() -> None:
    text = _text()
    assert not re.search(r"\bissue \d+|#\d{2,}\b", text, re.I), "issue numbers belong in commit messages"
    log = re.search(r"tried and dropped|before and after|what changed in|reverted", text, re.I)
    assert not log, f"{log.group(0)!r}: the history of our work belongs in commit messages and CHANGELOG.md"
    words = set(re.findall(r"\b[0-9a-f]{7,40}\b", text))
    hashes = [w for w in words if re.search(r"[a-f]", w) and re.search(r"\d", w)]
    if hashes and (ROOT / ".git").exists():
        known = subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "--batch-check"],
            input="\n".join(hashes),
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        found = [line.split()[0] for line in known.splitlines() if "missing" not in line]
        assert not found, f"commit hashes in README.md: {found}"
    else:
        assert not hashes, f"what look like commit hashes in README.md: {hashes}"
