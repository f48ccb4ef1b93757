"""Counts of the structural debts the house keeps down, printed as a table (a development tool, not a test).

Usage::

    .venv/bin/python scripts/house_counts.py            # the table
    .venv/bin/python scripts/house_counts.py --list     # and every site

What it counts, in ``gpu_notebook/`` (``tests/`` for the sleeps):

* private cross-package imports: an import in ``gpu_notebook.<a>`` of a private module or name (a part starting
  with ``_``) of another package ``gpu_notebook.<b>`` (the bottom modules ``gpu_notebook._registry``, ``_lazy``,
  ``_display``, ... are meant for every package and are not counted);
* ``global`` statements outside ``gpu_notebook/_registry.py`` and the settings module: kernel-wide state elsewhere;
* reads of ``GPU_NOTEBOOK_*`` variables outside the settings module;
* ``Any`` in the signatures of public functions and methods of public modules, every ``Any`` and every
  ``dict[str, Any]``;
* fixed sleeps in tests: ``time.sleep`` calls outside a ``while``/``for`` loop (a poll sleeps inside one).
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "gpu_notebook"
#: where kernel-wide state and settings belong
STATE_HOMES = {"gpu_notebook/_registry.py", "gpu_notebook/_settings.py"}
SETTINGS = "gpu_notebook/_settings.py"


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(mod: str, node: ast.ImportFrom, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports() -> list[str]:
    out = []
    for path in sorted(LIB.rglob("*.py")):
        mod = _module(path)
        src_pkg = mod.split(".")[1] if mod.count(".") else ""
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = _resolve(mod, node, path.name == "__init__.py")
            parts = target.split(".")
            if parts[0] != "gpu_notebook" or len(parts) < 2 or parts[1].startswith("_"):
                continue
            if parts[1] == src_pkg:
                continue
            names = [a.name for a in node.names]
            if any(p.startswith("_") for p in parts[2:]) or any(n.startswith("_") for n in names):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {target} {names}")
    return out


def globals_outside() -> list[str]:
    out = []
    for path in sorted(LIB.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in STATE_HOMES:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Global):
                out.append(f"{rel}:{node.lineno}: global {', '.join(node.names)}")
    return out


ENV_READ = re.compile(r"(environ|getenv)[^\n]*GPU_NOTEBOOK_|GPU_NOTEBOOK_\w+[\"']\s*(in|,)[^\n]*environ")


def env_reads() -> list[str]:
    out = []
    for path in sorted(LIB.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel == SETTINGS:
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if ENV_READ.search(line) and not line.lstrip().startswith("#"):
                out.append(f"{rel}:{i}: {line.strip()[:100]}")
    return out


def _is_public(path: Path) -> bool:
    rel = path.relative_to(LIB)
    return not any(p.startswith("_") and p != "__init__.py" for p in rel.parts) and "testing" not in rel.parts


def any_counts() -> tuple[list[str], int, int]:
    public = []
    total = dicts = 0
    for path in sorted(LIB.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        total += len(re.findall(r"\bAny\b", text))
        dicts += len(re.findall(r"dict\[str, Any\]", text))
        if not _is_public(path):
            continue
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            anns = [
                a.annotation for a in [*node.args.args, *node.args.kwonlyargs] if a.annotation is not None
            ]
            anns += [a.annotation for a in (node.args.vararg, node.args.kwarg) if a and a.annotation]
            if node.returns is not None:
                anns.append(node.returns)
            n = sum(len(re.findall(r"\bAny\b", ast.unparse(a))) for a in anns)
            if n:
                public.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name} ({n})")
    return public, total, dicts


def fixed_sleeps() -> list[str]:
    out = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) in ("time.sleep", "sleep", "_time.sleep")
            ):
                continue
            up = parents.get(node)
            while up is not None and not isinstance(up, (ast.While, ast.For, ast.FunctionDef)):
                up = parents.get(up)
            if not isinstance(up, (ast.While, ast.For)):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--list", action="store_true", help="print every site")
    a = ap.parse_args()
    public_any, total_any, dict_any = any_counts()
    rows = [
        ("private cross-package imports", private_imports()),
        ("global statements outside the registry and settings", globals_outside()),
        ("GPU_NOTEBOOK_* reads outside the settings module", env_reads()),
        ("public functions with Any in their signature", public_any),
        ("fixed sleeps in tests (outside a loop)", fixed_sleeps()),
    ]
    width = max(len(r[0]) for r in rows)
    for name, sites in rows:
        print(f"{name:<{width}}  {len(sites):>5}")
    print(f"{'Any (every mention in gpu_notebook/)':<{width}}  {total_any:>5}")
    print(f"{'dict[str, Any]':<{width}}  {dict_any:>5}")
    if a.list:
        for name, sites in rows:
            print(f"\n## {name}")
            print("\n".join(sites))


if __name__ == "__main__":
    main()
