"""The docs and the example notebooks name only magic options that exist, and link only to files that exist.

Every magic option the docs mention (``docs/**/*.md``, ``README.md``, the markdown and code cells of
``examples/*.ipynb``) is checked against the magic's own parser, built from the magics themselves as
``scripts/gen_reference.py`` builds the reference (no list of options is written here):

- a magic line in a code block or a code cell (``%gpu_cluster start --workers 2``, ``%%distributed -o x``, also
  one commented out: ``# %gpu_cluster start --address ...``) must parse: its options exist, belong to its
  subcommand, and have values of the right kind (nothing runs);
- in prose, an inline code span that names a magic (```%gpu_checkpoint show```, ```%gpu_cluster start ... --foo```)
  sets the magic and subcommand that the option spans after it in the same sentence (```--foo```) are about: each
  must be an option of that magic, and of that subcommand when one is named (not of another subcommand only);
- an option a magic knows but hides from its help (one refused with a message that names the option to use
  instead) may be named only in a sentence that says so.

Pure: the magics' modules are imported, no Ray or kernel is started.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from _scripts import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]


gen = load_script("gen_reference")

#: what a sentence that names a hidden (refused) option says about it
_SAYS_REFUSED = re.compile(
    r"refus|instead|renamed|no longer|old spelling|not an option|use `--|not `--", re.I
)
#: the start of an inline code span that is another program's command line: options after it are not a magic's
_OTHER_COMMAND = re.compile(
    r"^(%%?(?!gpu_|distributed)\w+|python|pip|ray|torchrun|docker|kubectl|bash|\.venv|scripts/)"
)
_SPAN = re.compile(r"(`+)(.+?)\1")
_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
_SHELL = ("bash", "sh", "shell", "console", "text", "yaml", "json", "toml", "ini")


@dataclass(frozen=True)
class Parser:
    """What one magic accepts, read from its parser and its ``@subcommands`` table."""

    name: str  # "%gpu_cluster", "%%distributed"
    func: Callable[..., Any]  # the magic, for gen.check_magic_line
    flags: dict[str, argparse.Action]  # every option string the parser knows -> its action
    commands: dict[str, set[str]]  # subcommand -> the option strings it takes (empty: no subcommands)

    def owners(self, flag: str) -> list[str]:
        """The subcommands that take ``flag`` ([] when it is the magic's own, outside every subcommand)."""
        return [c for c, flags in self.commands.items() if flag in flags]

    def hidden(self, flag: str) -> bool:
        return self.flags[flag].help == argparse.SUPPRESS


def _parsers() -> dict[str, Parser]:
    out = {}
    for name, func in gen._magic_funcs():
        # every option the parser knows, the ones its help hides included (gen._actions leaves those out)
        actions = [a for a in func.parser._actions if not isinstance(a, argparse._HelpAction)]
        flags = {f: a for a in actions for f in a.option_strings}
        table = getattr(func, "subcommand_options", None) or {}
        commands = {cmd: {f for o in opts for f in o.flags} for cmd, opts in table.items()}
        out[name] = Parser(name, func, flags, commands)
    return out


PARSERS = _parsers()


@dataclass(frozen=True)
class Mention:
    """An option named in prose for a magic (and a subcommand, when the sentence names one)."""

    where: str  # file:line
    magic: str
    command: str | None
    option: str
    sentence: str


def problem(m: Mention) -> str | None:
    """Why the option of a prose mention is wrong, or None."""
    p = PARSERS[m.magic]
    if m.option not in p.flags:
        return f"{m.magic} has no option {m.option}"
    if p.hidden(m.option) and not _SAYS_REFUSED.search(m.sentence):
        return (
            f"{m.magic} {m.option} is refused (hidden from its help): name it only in a sentence that says so, "
            "or name the option to use"
        )
    if m.command is not None and p.commands and not _SAYS_REFUSED.search(m.sentence):
        owners = p.owners(m.option)
        if owners and m.command not in owners:
            return f"{m.option} is an option of {m.magic} {'/'.join(owners)}, not of {m.magic} {m.command}"
    return None


def _magic_of(span: str) -> tuple[str, str | None] | None:
    """(magic, subcommand or None) when an inline code span starts with one of our magics."""
    words = span.split()
    if not words or words[0] not in PARSERS:
        return None
    p = PARSERS[words[0]]
    command = words[1] if len(words) > 1 and words[1] in p.commands else None
    return words[0], command


def _sentences(text: str) -> Iterator[tuple[int, str]]:
    """(offset, sentence) of a paragraph: split after '. ' and ';' outside code spans (a clause after a
    semicolon is often about something else: "`%gpu_cluster doctor`; `--backend gloo` works without GPUs")."""
    start = 0
    for m in re.finditer(r"`+.+?`+|\.\s+(?=[A-Z(*`])|;\s", text, flags=re.S):
        if not m.group(0).startswith("`"):
            yield start, text[start : m.end()]
            start = m.end()
    yield start, text[start:]


def prose_mentions(text: str, where: Callable[[int], str]) -> Iterator[Mention]:
    """The options named for a magic in a paragraph of prose (``where(offset)`` says file:line)."""
    for base, sentence in _sentences(text):
        magic: tuple[str, str | None] | None = None
        for span in _SPAN.finditer(sentence):
            code = span.group(2).strip()
            found = _magic_of(code)
            if found is not None:
                magic = found
                # a whole magic line that parses is right as it is (``%gpu_run train.py --lr 0.1``: the script's
                # options); else (``...`` placeholders, a refused option) its options are checked one by one
                options = [] if gen.check_magic_line(code) is None else _OPTION.findall(code)
            elif code.startswith("--") and magic is not None:
                options = _OPTION.findall(code.split()[0])
            else:
                if _OTHER_COMMAND.match(code):
                    magic = None  # options after another program's command line are that program's
                continue
            for option in options:
                assert magic is not None
                yield Mention(
                    where(base + span.start()), magic[0], magic[1], option, " ".join(sentence.split())
                )


def markdown_parts(markdown: str) -> Iterator[tuple[int, str, str]]:
    """(first line number, "prose" or "code:LANG", text) of a markdown text: paragraphs (a table row is one)
    and fenced code blocks (one per line)."""
    lang: str | None = None
    para: list[str] = []
    first = 0
    for no, line in enumerate(markdown.splitlines(), 1):
        fence = re.match(r"^\s*(```+|~~~+)\s*([\w+-]*)", line)
        if fence:
            if para:
                yield first, "prose", "\n".join(para)
                para = []
            lang = None if lang is not None else (fence.group(2) or "")
            continue
        if lang is not None:
            yield no, f"code:{lang}", line
            continue
        if para and re.match(r"\s*([-*+]|\d+\.)\s", line):  # a list item starts a paragraph of its own
            yield first, "prose", "\n".join(para)
            para = []
        if not line.strip() or line.lstrip().startswith("|"):
            if para:
                yield first, "prose", "\n".join(para)
                para = []
            if line.strip():
                yield no, "prose", line
            continue
        if not para:
            first = no
        para.append(line)
    if para:
        yield first, "prose", "\n".join(para)


def _docs() -> list[pathlib.Path]:
    pages = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    return [p for p in pages if p.exists()]


def _notebooks() -> list[pathlib.Path]:
    return sorted((ROOT / "examples").glob("*.ipynb"))


def _cells(path: pathlib.Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["cells"])


def _text(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def texts() -> Iterator[tuple[str, int, str, str]]:
    """(file, line, kind, text) of every doc page's paragraph and code line, and of every notebook cell's
    (a notebook's "line" is ``cell N line M``, as ``file:cell:line``)."""
    for page in _docs():
        rel = str(page.relative_to(ROOT))
        for no, kind, text in markdown_parts(page.read_text()):
            yield rel, no, kind, text
    for nb in _notebooks():
        rel = str(nb.relative_to(ROOT))
        for i, cell in enumerate(_cells(nb)):
            source = _text(cell)
            if cell.get("cell_type") == "markdown":
                for no, kind, text in markdown_parts(source):
                    yield f"{rel}:cell {i}", no, kind, text
            elif cell.get("cell_type") == "code":
                for no, line in enumerate(source.splitlines(), 1):
                    yield f"{rel}:cell {i}", no, "code:python", line


def magic_line(line: str) -> str | None:
    """The magic line in a line of code (``In [1]:`` prompts removed), or None. A line commented out counts when
    it reads as a magic line (its second word an option or a subcommand): ``# %gpu_cluster start --address ...``,
    not ``# %%distributed runs on the current cluster``."""
    text = re.sub(r"^In \[\d+\]:\s*", "", line.strip())
    commented = re.match(r"^#\s*", text)
    text = text[commented.end() :] if commented else text
    words = text.split()
    if not words or words[0] not in PARSERS:
        return None
    if commented and not (
        len(words) > 1 and (words[1].startswith("-") or words[1] in PARSERS[words[0]].commands)
    ):
        return None
    return text


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset)


def bad_options() -> tuple[int, list[str]]:
    """(how many options and magic lines were checked, what is wrong with each bad one as file:line: why)."""
    checked = 0
    bad = []
    for file, no, kind, text in texts():
        if kind.startswith("code:"):
            if kind.split(":", 1)[1] in _SHELL:
                continue
            line = magic_line(text)
            if line is None:
                continue
            checked += 1
            why = gen.check_magic_line(line)
            if why is not None:
                bad.append(f"{file}:{no}: {line}\n    {why}")
            continue
        for m in prose_mentions(text, lambda off, f=file, no=no, text=text: f"{f}:{no + line_of(text, off)}"):
            checked += 1
            why = problem(m)
            if why is not None:
                bad.append(f"{m.where}: {m.option}: {why}\n    in: {m.sentence[:200]}")
    return checked, bad


def test_every_magic_option_in_the_docs_and_examples_exists() -> None:
    checked, bad = bad_options()
    assert checked > 200, checked  # the collector finds the docs' options (a broken pattern finds none)
    assert not bad, f"{len(bad)} magic option(s) in the docs that the magics do not take:\n" + "\n".join(bad)


# the checks can fail: what each one refuses, on text written here


def _prose(text: str) -> list[str]:
    return [f"{m.option}: {problem(m)}" for m in prose_mentions(text, lambda off: "x") if problem(m)]


def test_a_bogus_option_is_flagged_in_prose_and_in_code() -> None:
    assert _prose("Run `%gpu_cluster start --cloud aws --bogus-flag` to launch.") == [
        "--bogus-flag: %gpu_cluster has no option --bogus-flag"
    ]
    assert _prose("With `%gpu_checkpoint show`, `--no-such-option` does more.") == [
        "--no-such-option: %gpu_checkpoint has no option --no-such-option"
    ]
    assert "--bogus" in str(gen.check_magic_line("%gpu_cluster start --bogus 2"))
    assert magic_line("# %gpu_cluster start --address ADDRESS") == "%gpu_cluster start --address ADDRESS"
    assert magic_line("%load_ext gpu_notebook") is None
    assert magic_line("# %%distributed runs on the current cluster") is None


def test_an_option_of_another_subcommand_is_flagged() -> None:
    p = PARSERS["%gpu_cluster"]
    only_start = next(f for f in p.flags if f.startswith("--") and p.owners(f) == ["start"])
    other = next(c for c in p.commands if c != "start" and only_start not in p.commands[c])
    assert _prose(f"`%gpu_cluster {other}` takes `{only_start}`.") == [
        f"{only_start}: {only_start} is an option of %gpu_cluster start, not of %gpu_cluster {other}"
    ]
    assert _prose(f"`%gpu_cluster start` takes `{only_start}`.") == []
    # a sentence about another program's options is not about the magic named before it
    assert _prose("Unlike `%gpu_cluster start`, `ray start --head` takes `--bogus-ray-flag`.") == []


def test_a_hidden_option_is_only_named_where_the_sentence_says_it_is_refused() -> None:
    hidden = [(n, f) for n, p in PARSERS.items() for f in p.flags if f.startswith("--") and p.hidden(f)]
    if not hidden:
        pytest.skip("no magic hides an option")
    for name, flag in hidden:
        assert _prose(f"Use `{name} {flag} 0` to pick ranks.")
        assert not _prose(f"`{name} {flag}` is refused: it names the option to use instead.")


# links


def _links(markdown: str) -> Iterator[tuple[int, str]]:
    """(line, target) of every link and image in a markdown text, outside code blocks and code spans."""
    for no, kind, text in markdown_parts(markdown):
        if kind != "prose":
            continue
        plain = _SPAN.sub(lambda m: " " * len(m.group(0)), text)
        for m in re.finditer(
            r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|^\s*\[[^\]]+\]:\s*(\S+)", plain, re.M
        ):
            yield no + line_of(plain, m.start()), m.group(1) or m.group(2)


def bad_links() -> list[str]:
    """file:line, target and why of every relative link to a file that does not exist (anchors not checked)."""
    bad = []
    texts = [(str(p.relative_to(ROOT)), p.parent, p.read_text()) for p in _docs()]
    for nb in _notebooks():
        rel = str(nb.relative_to(ROOT))
        cells = enumerate(_cells(nb))
        texts += [
            (f"{rel}:cell {i}", nb.parent, _text(c)) for i, c in cells if c.get("cell_type") == "markdown"
        ]
    for label, folder, text in texts:
        for no, target in _links(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL (https:, mailto:) or an anchor of the page itself
            path = target.partition("#")[0].partition("?")[0]
            dest = folder / path if not path.startswith("/") else ROOT / path.lstrip("/")
            if not dest.exists():
                bad.append(f"{label}:{no}: {target}: no such file")
    return bad


def test_every_relative_link_names_a_file_that_exists() -> None:
    bad = bad_links()
    assert not bad, "links to files that do not exist:\n" + "\n".join(bad)


def test_the_link_check_finds_links() -> None:
    text = "See [a](../x.md#y) and ![img](img/p.png), not `[c](d.md)`.\n\n[ref]: other.md\n"
    assert list(_links(text)) == [(1, "../x.md#y"), (1, "img/p.png"), (3, "other.md")]
