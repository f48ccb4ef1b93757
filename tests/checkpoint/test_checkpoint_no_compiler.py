"""Without a C compiler: the install still works, the numpy fallback writes the same bytes as the C kernels, and
the first save of a process (not the import) says once that it is slower and how to get the fast path. And the C
is strict, portable C99 (scripts/check_c.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gpu_notebook.checkpoint.format.codec as codec

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]

# two saves (a base and a delta) and a restore, with one thread so that packs are filled in a fixed order; prints
# how many fallback warnings there were after each step, the stored objects' digest, whether the kernels were
# used, and every warning
_SAVE_RESTORE = r"""
import hashlib, pathlib, sys, warnings
warnings.simplefilter("always")
import torch
caught = []
warnings.showwarning = lambda m, c, *a, **k: caught.append((c.__name__, str(m)))
def n():
    return sum("numpy fallback" in m for _, m in caught)
import gpu_notebook.checkpoint as ck
from gpu_notebook.checkpoint.format import codec
print("import", n())
root = pathlib.Path(sys.argv[1])
c = ck.Checkpointer(root, threads=1, preemption=None, progress=False)
print("created", n())
g = torch.Generator().manual_seed(0)
state = {"w": torch.randn(300, 500, generator=g), "h": (torch.randn(40_000, generator=g)).bfloat16(), "step": 0}
c.save(state, step=0, block=True)
print("first_save", n())
state["w"] = state["w"] + 1e-3 * torch.randn(300, 500, generator=g)
state["h"] = (state["h"].float() * 1.001).bfloat16()
c.save(state, step=1, block=True)
c.close()
got = ck.Checkpointer(root, read_only=True, preemption=None).restore()
assert torch.equal(got["w"], state["w"]) and torch.equal(got["h"], state["h"])
print("restored", n())
objs = sorted((p.name, hashlib.sha256(p.read_bytes()).hexdigest()) for p in (root / "objects").rglob("*") if p.is_file())
print("objects", hashlib.sha256(repr(objs).encode()).hexdigest(), len(objs))
print("native", codec.native_kernels())
for cat, msg in caught:
    print("warning", cat, msg)
"""


def _run(tmp: Path, env: dict[str, str], name: str, pythonpath: str | None = None) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("GPU_NOTEBOOK_NO_C_EXT", "GPU_NOTEBOOK_NATIVE")}
    e.update(env)
    if pythonpath:
        e["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        [sys.executable, "-c", _SAVE_RESTORE, str(tmp / name)],
        env=e,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines: dict[str, str] = {}
    warns = []
    for line in out.stdout.splitlines():
        key, _, rest = line.partition(" ")
        if key == "warning":
            warns.append(rest)
        else:
            lines[key] = rest
    lines["warnings"] = "\n".join(warns)
    return lines


def _fallback_warnings(run: dict[str, str]) -> list[str]:
    return [w for w in run["warnings"].splitlines() if "numpy fallback" in w]


@pytest.mark.skipif(codec._compiled is None, reason="the kernels are not built here: nothing to compare with")
def test_disabled_extension_writes_the_same_bytes_and_says_so_once_at_the_first_save(tmp_path: Path) -> None:
    compiled = _run(tmp_path, {}, "compiled")
    fallback = _run(tmp_path, {"GPU_NOTEBOOK_NO_C_EXT": "1"}, "fallback")
    assert compiled["native"] == "True" and fallback["native"] == "False"
    # the same objects, byte for byte (their keys are their hashes)
    assert fallback["objects"] == compiled["objects"]
    assert not _fallback_warnings(compiled)
    (msg,) = _fallback_warnings(fallback)  # once, for two saves and a restore
    # ... at the first save: not at import, not when the Checkpointer is made
    assert (fallback["import"], fallback["created"], fallback["first_save"]) == ("0", "0", "1")
    assert fallback["restored"] == "1"
    assert msg.startswith("RuntimeWarning ")
    assert "turned off (GPU_NOTEBOOK_NO_C_EXT=1)" in msg and "Unset it" in msg
    assert "slower" in msg and "x" in msg


def test_the_message_without_kernels_says_how_to_get_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "_compiled", None)
    monkeypatch.delenv("GPU_NOTEBOOK_NO_C_EXT", raising=False)
    monkeypatch.delenv("GPU_NOTEBOOK_NATIVE", raising=False)
    msg = codec.fallback_message()
    assert "not built (no C compiler" in msg
    assert "build-essential" in msg and "--no-cache-dir" in msg and "pip install --force-reinstall" in msg
    monkeypatch.setattr(codec, "_native", None)
    monkeypatch.setattr(codec, "_noticed", False)
    with pytest.warns(RuntimeWarning, match="numpy fallback"):
        assert codec.notice_fallback()
    assert not codec.notice_fallback()  # once per process


def _source_copy(dst: Path) -> Path:
    """The project's files (those git tracks or would: what an sdist holds), without any build of the kernels."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)
    return dst


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the project's git checkout")
def test_pip_install_works_with_a_compiler_that_fails(tmp_path: Path) -> None:
    """``pip install`` with a C compiler that fails (CC=/bin/false), offline with the local setuptools: the
    install succeeds without the kernels, and the installed package saves and restores (numpy path) and says so
    at the first save. With GPU_NOTEBOOK_BUILD_NATIVE=require (the test environment's setting) it fails instead."""
    src = _source_copy(tmp_path / "src")
    env = {k: v for k, v in os.environ.items() if k != "GPU_NOTEBOOK_BUILD_NATIVE"}
    env.update(CC="/bin/false", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index"]
    target = tmp_path / "site"
    out = subprocess.run(
        [*pip, "--no-cache-dir", "--target", str(target), str(src)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    fmt = target / "gpu_notebook" / "checkpoint" / "format"
    assert (fmt / "codec.py").is_file()
    assert not list(fmt.glob("_planes*.so")) and not list(fmt.glob("_planes*.pyd"))
    run = _run(tmp_path, {}, "installed", pythonpath=str(target))
    assert run["native"] == "False"
    (msg,) = _fallback_warnings(run)
    assert "were not built (no C compiler" in msg and "build-essential" in msg

    required = subprocess.run(
        [*pip, "--no-cache-dir", "--target", str(tmp_path / "site2"), str(src)],
        env={**env, "GPU_NOTEBOOK_BUILD_NATIVE": "require"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert required.returncode != 0


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler")
def test_the_kernels_build_as_strict_portable_c99() -> None:
    """scripts/check_c.sh: -std=c99 -Wall -Wextra -pedantic -Werror, as installed and as the portable version."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "check_c.sh"), sys.executable],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
