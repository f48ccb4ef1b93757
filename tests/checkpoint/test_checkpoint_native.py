"""The compiled byte-plane kernels (``_planes.c``) against the numpy reference path of the codec.

Both paths must write and read exactly the same bytes: a checkpoint written on a machine without a compiler
restores on one with the kernels and the other way round.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import gpu_notebook.checkpoint.format.codec as codec

pytestmark = pytest.mark.timeout(120)

needs_native = pytest.mark.skipif(
    codec._native is None, reason="kernels not built (or GPU_NOTEBOOK_NATIVE=0)"
)


def _variants(width: int) -> list[tuple[int, int, bool, int]]:
    out = []
    for t, rot, perm, off in itertools.product(
        (0, 1, 2), (0, 1, 3, 7, 8 * width - 1), (False, True), (0, -5, 3)
    ):
        if (perm and width == 1) or (off and t != 2) or rot >= 8 * width:
            continue
        out.append((t, rot, perm, off))
    return out


def _pair(width: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, n * width, dtype=np.uint8)
    cur = base.copy()
    cur[::7] ^= rng.integers(0, 256, cur[::7].size, dtype=np.uint8)
    return cur, base


def test_kernels_are_built_in_the_test_environment() -> None:
    """The test command installs with a compiler: a silent fallback to numpy would go unnoticed otherwise."""
    if os.environ.get("GPU_NOTEBOOK_NATIVE", "1") == "0":
        pytest.skip("disabled by GPU_NOTEBOOK_NATIVE=0")
    assert codec.native_kernels(), (
        "gpu_notebook.checkpoint.format._planes did not build: is a C compiler installed?"
    )
    so = pathlib.Path(codec._native.__file__)
    src = pathlib.Path(codec.__file__).with_name("_planes.c")
    assert so.stat().st_mtime >= src.stat().st_mtime, (
        f"{so.name} is older than _planes.c: a stale build (rebuild with scripts/setup_env.sh or pip install -e .)"
    )


def _check_kernels(nat: object, width: int) -> None:
    """``nat``'s forward_split equals the numpy reference, and its merge_inverse (and numpy's) invert it."""
    n = 3001  # odd: no element count that happens to be a multiple of a vector width
    cur, base = _pair(width, n, width)
    for v in _variants(width):
        t, rot, perm, off = v
        ref = codec._split(codec._forward(cur, base, v, width), width).copy()
        got = np.empty(cur.nbytes, np.uint8)
        nat.forward_split(cur, base, got, width, t, rot, perm, off)  # type: ignore[attr-defined]
        np.testing.assert_array_equal(got.reshape(width, -1), ref, err_msg=str(v))
        back = np.empty_like(cur)
        nat.merge_inverse(  # type: ignore[attr-defined]
            [got.reshape(width, -1)[k] for k in range(width)], base, back, width, t, rot, perm, off
        )
        np.testing.assert_array_equal(back, cur, err_msg=str(v))
        # and the numpy inverse reads what the kernel wrote
        ref_back = np.empty_like(cur)
        merged = codec._merge(got.reshape(width, -1).copy(), width, np.empty_like(cur))
        codec._inverse(merged, base, v, width, ref_back)
        np.testing.assert_array_equal(ref_back, cur, err_msg=str(v))


@needs_native
@pytest.mark.parametrize("width", [1, 2, 4, 8])
def test_forward_split_matches_numpy_and_inverts(width: int) -> None:
    _check_kernels(codec._native, width)


def _cpu_flags() -> set[str]:
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


_V3 = {"avx2", "bmi2", "fma", "movbe"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


@pytest.mark.timeout(300)
@pytest.mark.skipif(
    not (sys.platform == "linux" and os.uname().machine == "x86_64" and shutil.which("gcc")),
    reason="the instruction-set versions are built by GCC on x86-64 Linux",
)
@pytest.mark.parametrize("target", ["portable", "arch=x86-64-v3", "arch=x86-64-v4"])
def test_every_instruction_set_version_computes_the_same_bytes(target: str, tmp_path: pathlib.Path) -> None:
    """The installed module picks one version of each kernel for this CPU (GCC target_clones); build each
    version alone and check it against the numpy reference, so that no CPU gets a differently compiled bug."""
    flags = _cpu_flags()
    need = {"arch=x86-64-v3": _V3, "arch=x86-64-v4": _V4}.get(target, set())
    if not need <= flags:
        pytest.skip(f"this CPU cannot run {target}")
    import importlib.util
    import sysconfig

    src = pathlib.Path(codec.__file__).with_name("_planes.c")
    so = tmp_path / f"_planes{sysconfig.get_config_var('EXT_SUFFIX')}"
    define = (
        "-DGPU_NOTEBOOK_KERNEL_PORTABLE"
        if target == "portable"
        else f'-DGPU_NOTEBOOK_KERNEL_TARGET="{target}"'
    )
    cmd = ["gcc", "-shared", "-fPIC", "-O3", "-Wall", "-Werror", define]
    cmd += [f"-I{sysconfig.get_paths()['include']}", str(src), "-o", str(so)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    spec = importlib.util.spec_from_file_location("_planes", so)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for width in (1, 2, 4, 8):
        _check_kernels(mod, width)


@needs_native
@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 15, 17, 4099, 20_000])
def test_permutation_is_the_stable_exponent_order(n: int) -> None:
    """The counting sort in C is the same permutation as ``_order`` (a sort of key and index), for element counts
    that leave every kind of remainder after the interleaved histogram (two segments, four sub-histograms), and
    inverts to the same elements."""
    nat = codec._native
    rng = np.random.default_rng(n)
    base = (rng.standard_normal(n).astype(np.float32) * 0.02).view(np.uint8)
    cur = np.arange(n, dtype=np.uint32).view(np.uint8)  # element i holds i: the planes spell the order
    got = np.empty(cur.nbytes, np.uint8)
    nat.forward_split(cur, base, got, 4, 0, 0, True, 0)
    idx = got.reshape(4, -1).T.copy().view(np.uint32).reshape(-1)
    np.testing.assert_array_equal(idx, codec._order(base, 4))
    back = np.empty_like(cur)
    nat.merge_inverse([got.reshape(4, -1)[k] for k in range(4)], base, back, 4, 0, 0, True, 0)
    np.testing.assert_array_equal(back, cur)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64])
def test_frames_are_identical_with_and_without_kernels(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same frame bytes from both paths, and each path decodes the other's frames."""
    if codec._native is None:
        pytest.skip("kernels not built")
    g = torch.Generator().manual_seed(0)
    if dtype.is_floating_point:
        a = (torch.randn(200_000, generator=g) * 0.02).to(dtype)
        b = (a.float() + 1e-4 * torch.randn(200_000, generator=g)).to(dtype)
    else:
        a = torch.randint(-1000, 1000, (200_000,), generator=g, dtype=dtype)
        b = a + torch.randint(-3, 3, (200_000,), generator=g, dtype=dtype)
    raw = b.view(torch.uint8).numpy().copy()
    base = a.view(torch.uint8).numpy().copy()
    width = b.element_size()
    native = codec._native
    frames = {}
    for label, mod in (("native", native), ("numpy", None)):
        monkeypatch.setattr(codec, "_native", mod)
        hint: dict = {}
        frames[label] = codec.encode_chunk(raw, width, base, chosen=hint)
        frames[label + "-full"] = codec.encode_chunk(raw, width)
    assert frames["native"] == frames["numpy"]
    assert frames["native-full"] == frames["numpy-full"]
    for mod in (native, None):
        monkeypatch.setattr(codec, "_native", mod)
        for key in ("native", "numpy"):
            np.testing.assert_array_equal(codec.decode_chunk(frames[key][0], base), raw)
            np.testing.assert_array_equal(codec.decode_chunk(frames[key + "-full"][0]), raw)


@needs_native
def test_every_variant_round_trips_through_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    """Frames of every variant (not only the ones the search picks) decode on both paths."""
    for width in (1, 2, 4, 8):
        cur, base = _pair(width, 5000, 10 + width)
        for v in _variants(width):
            monkeypatch.setattr(codec, "_native", codec._load_native())
            frame = codec._encode_variant(cur, width, base, v)
            for mod in (codec._load_native(), None):
                monkeypatch.setattr(codec, "_native", mod)
                np.testing.assert_array_equal(codec.decode_chunk(frame, base), cur, err_msg=f"{width} {v}")
                # in place, over its base (how restore decodes a delta chain)
                buf = base.copy()
                assert codec.decode_chunk(frame, buf, buf) is buf
                np.testing.assert_array_equal(
                    buf, cur, err_msg=f"in place: {width} {v} native={mod is not None}"
                )
            monkeypatch.setattr(codec, "_native", None)
            assert codec._encode_variant(cur, width, base, v) == frame


@needs_native
def test_kernels_refuse_bad_arguments() -> None:
    nat = codec._native
    a = np.zeros(16, np.uint8)
    out = np.empty(16, np.uint8)
    with pytest.raises(ValueError, match="width"):
        nat.forward_split(a, None, out, 3, 0, 0, False, 0)
    with pytest.raises(ValueError, match="base"):
        nat.forward_split(a, None, out, 4, 1, 0, False, 0)
    with pytest.raises(ValueError, match="base chunk has the wrong length"):
        nat.forward_split(a, np.zeros(8, np.uint8), out, 4, 1, 0, False, 0)
    with pytest.raises(ValueError, match="same length"):
        nat.forward_split(a, None, np.empty(8, np.uint8), 4, 0, 0, False, 0)
    with pytest.raises(ValueError, match="rotation"):
        nat.forward_split(a, None, out, 2, 0, 16, False, 0)
    with pytest.raises(ValueError, match="at least 2 bytes"):
        nat.forward_split(a, a, out, 1, 0, 0, True, 0)
    with pytest.raises(ValueError, match="one plane per byte"):
        nat.merge_inverse([a[:4]] * 3, None, out, 4, 0, 0, False, 0)
    with pytest.raises(ValueError, match="plane has the wrong length"):
        nat.merge_inverse([a[:4]] * 3 + [a[:3]], None, out, 4, 0, 0, False, 0)
    with pytest.raises(TypeError):
        nat.merge_inverse([a[:4]] * 4, None, b"read-only output....", 4, 0, 0, False, 0)


def test_truncated_or_garbled_zstd_plane_is_a_value_error() -> None:
    """A corrupted compressed plane is reported as a bad frame (which restore turns into a named chunk)."""
    g = torch.Generator().manual_seed(3)
    t = torch.randn(100_000, generator=g) * 0.02
    raw = t.view(torch.uint8).numpy().copy()
    frame, _ = codec.encode_chunk(raw, 4)
    info = codec.frame_info(frame)
    assert info["mode"] == 1
    bad = bytearray(frame)
    for i in range(len(bad) - 2000, len(bad) - 1000):
        bad[i] ^= 0x5A
    for mod in (codec._native, None):
        codec_native = codec._native
        try:
            codec._native = mod
            try:
                out = codec.decode_chunk(bytes(bad))
            except ValueError:
                continue
            assert not np.array_equal(
                out, raw
            )  # a stored plane decodes to other bytes: the hash check catches it
        finally:
            codec._native = codec_native


def test_environment_variable_turns_the_kernels_off() -> None:
    code = "import gpu_notebook.checkpoint.format.codec as c; print(c.native_kernels())"
    env = {**os.environ, "GPU_NOTEBOOK_NATIVE": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    env["GPU_NOTEBOOK_NATIVE"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    try:
        import gpu_notebook.checkpoint.format._planes  # type: ignore[import-not-found]  # noqa: F401

        built = True
    except ImportError:
        built = False
    assert out.stdout.strip() == str(built)
