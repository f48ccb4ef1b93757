"""Tests of the chunk codec: every dtype and transform round-trips bit-exactly; bad frames are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpu_notebook.checkpoint.format.codec import (
    FRAME_MAGIC,
    _encode_variant,
    _median_offset,
    decode_chunk,
    encode_chunk,
)

DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
]


def _u8(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().copy()


def _pair(dtype: torch.dtype, n: int = 50_000) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    if dtype.is_floating_point:
        a = (torch.randn(n, generator=g) * 0.02).to(dtype)
        b = (a.float() + 1e-4 * torch.randn(n, generator=g)).to(dtype)
        # special values must survive too
        a[:6] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-40]).to(dtype)
        b[:6] = torch.tensor([0.0, float("nan"), 1e-45, float("inf"), -0.0, -1e-40]).to(dtype)
    else:
        info = torch.iinfo(dtype)
        a = torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64).to(dtype)
        b = a.clone()
        b[::7] = torch.randint(info.min, info.max, (b[::7].numel(),), generator=g, dtype=torch.int64).to(
            dtype
        )
    return a, b


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("transforms", [("xor",), ("sub",), ("xor", "sub")])
def test_delta_round_trip_bit_exact(dtype: torch.dtype, transforms: tuple[str, ...]) -> None:
    a, b = _pair(dtype)
    w = a.element_size()
    base, cur = _u8(a), _u8(b)
    frame, t = encode_chunk(cur, w, base, transforms=transforms)
    out = decode_chunk(frame, base if t in ("xor", "sub") else None)
    assert out.tobytes() == cur.tobytes()
    assert t in (*transforms, "none", "raw")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_full_round_trip_bit_exact(dtype: torch.dtype) -> None:
    _, b = _pair(dtype)
    cur = _u8(b)
    frame, t = encode_chunk(cur, b.element_size())
    assert t in ("none", "raw")
    assert decode_chunk(frame).tobytes() == cur.tobytes()


def test_large_chunk_chooses_on_sample_and_round_trips() -> None:
    a = torch.randn(600_000) * 0.02
    b = a + 1e-6 * torch.randn(600_000)
    frame, t = encode_chunk(_u8(b), 4, _u8(a))
    assert t == "sub" or t == "xor"
    assert len(frame) < 0.8 * b.numel() * 4  # small updates: the delta is much smaller than the raw bytes
    assert decode_chunk(frame, _u8(a)).tobytes() == _u8(b).tobytes()


def test_sub_beats_xor_across_a_carry() -> None:
    # 0x3F7FFFFF -> 0x3F800000: XOR sets 24 bits, the difference is 1
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2**32 - 4, 50_000, dtype=np.uint32)
    b = a + rng.integers(1, 4, 50_000, dtype=np.uint32)  # small increments with random carries
    fx, _ = encode_chunk(b.view(np.uint8), 4, a.view(np.uint8), transforms=("xor",))
    fs, ts = encode_chunk(b.view(np.uint8), 4, a.view(np.uint8), transforms=("sub",))
    assert ts == "sub"
    assert len(fs) < len(fx)


def test_incompressible_chunk_is_stored_raw_with_small_overhead() -> None:
    raw = np.frombuffer(np.random.default_rng(0).bytes(1 << 20), dtype=np.uint8)
    frame, t = encode_chunk(raw, 4)
    assert t == "raw"
    assert len(frame) - raw.nbytes <= 64
    assert decode_chunk(frame).tobytes() == raw.tobytes()


def test_identical_chunk_compresses_to_almost_nothing() -> None:
    a = _u8(torch.randn(100_000))
    frame, t = encode_chunk(a, 4, a.copy())
    assert t in ("xor", "sub")
    assert len(frame) < 200


def test_bad_frames_are_refused() -> None:
    a = _u8(torch.randn(1000))
    b = _u8(torch.randn(1000))
    frame, t = encode_chunk(b, 4, a, transforms=("sub",))
    with pytest.raises(ValueError, match="magic"):
        decode_chunk(b"XXXX" + frame[4:], a)
    with pytest.raises(ValueError, match="truncated|length"):
        decode_chunk(frame[: len(frame) // 2], a)
    if t == "sub":
        with pytest.raises(ValueError, match="base"):
            decode_chunk(frame, None)
    assert frame[:4] == FRAME_MAGIC


def _v1_frame(raw: np.ndarray, width: int) -> bytes:
    """A version-1 frame (no flags/rotation/offset), as the first release wrote them: planes, stored."""
    import struct

    planes = raw.reshape(-1, width).T.copy()
    head = struct.pack("<4sBBBBQ", FRAME_MAGIC, 1, 1, 0, width, raw.nbytes)
    heads = b"".join(struct.pack("<BQ", 0, p.nbytes) for p in planes)
    return head + heads + b"".join(p.tobytes() for p in planes)


def test_version_1_frames_still_decode() -> None:
    raw = _u8(torch.randn(1000))
    assert decode_chunk(_v1_frame(raw, 4)).tobytes() == raw.tobytes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int32], ids=str)
@pytest.mark.parametrize("rot", [0, 1, 3, 4, 7])
@pytest.mark.parametrize("perm", [False, True])
@pytest.mark.parametrize("t", [1, 2])
def test_every_rotation_order_and_offset_round_trips(
    dtype: torch.dtype, rot: int, perm: bool, t: int
) -> None:
    a, b = _pair(dtype, 20_000)
    w = a.element_size()
    base, cur = _u8(a), _u8(b)
    for off in (0, _median_offset(cur, base, w), 12345):
        frame = _encode_variant(cur, w, base, (t, rot, perm, off if t == 2 else 0))
        assert decode_chunk(frame, base).tobytes() == cur.tobytes()
        out = np.zeros(cur.nbytes, np.uint8)
        assert decode_chunk(frame, base, out) is out and out.tobytes() == cur.tobytes()


def test_order_and_offset_pay_for_adam_like_updates() -> None:
    # weights of very different magnitudes, all moved by updates of about the same size (as AdamW does):
    # the base-exponent order groups elements whose integer differences have the same size
    g = torch.Generator().manual_seed(1)
    a = torch.randn(200_000, generator=g) * torch.exp(2 * torch.randn(200_000, generator=g))
    b = a - 1e-4 * torch.sign(torch.randn(200_000, generator=g)) * (0.5 + torch.rand(200_000, generator=g))
    chosen: dict = {}
    frame, t = encode_chunk(_u8(b), 4, _u8(a), chosen=chosen)
    assert t == "sub" and chosen["hint"][2] is True
    plain = _encode_variant(_u8(b), 4, _u8(a), (2, 0, False, 0))
    assert len(frame) < 0.97 * len(plain)
    assert decode_chunk(frame, _u8(a)).tobytes() == _u8(b).tobytes()


def test_permuted_frame_needs_its_base_and_a_right_sized_output() -> None:
    a, b = _pair(torch.float32, 20_000)
    frame = _encode_variant(_u8(b), 4, _u8(a), (1, 0, True, 0))
    with pytest.raises(ValueError, match="base"):
        decode_chunk(frame, None)
    with pytest.raises(ValueError, match="output buffer"):
        decode_chunk(frame, _u8(a), np.zeros(10, np.uint8))


def test_an_earlier_choice_is_reused_without_a_search() -> None:
    g = torch.Generator().manual_seed(2)
    a = torch.randn(200_000, generator=g) * torch.exp(2 * torch.randn(200_000, generator=g))
    b = a - 1e-4 * torch.sign(torch.randn(200_000, generator=g))
    first: dict = {}
    searched, _ = encode_chunk(_u8(b), 4, _u8(a), chosen=first)
    again: dict = {}
    reused, _ = encode_chunk(_u8(b), 4, _u8(a), hint=first["hint"], chosen=again)
    assert again["hint"][:4] == first["hint"][:4] and len(reused) == len(searched)
    # a hint is followed as given (the writer searches afresh every few saves); still lossless when poor
    poor: dict = {}
    frame, t = encode_chunk(_u8(b), 4, _u8(a), hint=(0, 5, False, False, frozenset()), chosen=poor)
    assert t == "none" and poor["hint"][:2] == (0, 5) and len(frame) > len(searched)
    assert decode_chunk(frame).tobytes() == _u8(b).tobytes()
