"""Chunk codec: lossless delta (XOR or zigzag integer difference of bit patterns), byte planes, zstd.

A *frame* is the stored form of one chunk of raw tensor bytes. It is self-describing::

    header  "<4sBBBBQ"  magic b"GNCK", frame version, mode, transform, width, raw length
    mode 0 (raw):    the raw bytes follow
    mode 1 (planes): (version >= 2) "<BBq" flags, rotation, offset; then
                     width x "<BQ" (plane kind, payload length), then the payloads;
                     plane kind 0 = stored as is, 1 = zstd

The transform is 0 (none), 1 (XOR against the base chunk) or 2 (wrapping integer difference of the
unsigned bit patterns against the base chunk, minus ``offset``, zigzag mapped). The transformed elements are
then rotated left by ``rotation`` bits (this moves the byte-plane boundaries, e.g. the sign bit of a float
out of its exponent byte) and, when ``flags & 1``, permuted into the stable order of their base element's
exponent bits (a context model for free: elements of similar magnitude change by similar amounts, so each
zstd block sees a homogeneous population). Width is the element size in bytes; the elements are split into
``width`` byte planes, which compress separately (sign and exponent bytes compress far better than
mantissa bytes). Version 1 frames (no flags/rotation/offset) are still read.

numpy + zstandard; the transform and the byte-plane split (and their inverse) run in one pass each in the C
kernels of ``_planes.c`` when that extension was built (``pip install`` compiles it; without a compiler the numpy
path below writes and reads exactly the same bytes, slower: see :func:`notice_fallback`).
``GPU_NOTEBOOK_NO_C_EXT=1`` (or ``GPU_NOTEBOOK_NATIVE=0``), read at import, turns the kernels off.
"""

from __future__ import annotations

import struct
import threading
import warnings
from typing import Any

import numpy as np

from gpu_notebook import _settings

from ._scratch import scratch

__all__ = ["encode_chunk", "decode_chunk", "TRANSFORMS", "FRAME_MAGIC"]

FRAME_MAGIC = b"GNCK"
FRAME_VERSION = 2
_HDR = struct.Struct("<4sBBBBQ")
_EXT = struct.Struct("<BBq")  # flags, rotation, offset (planes frames of version >= 2)
_FLAG_PERM = 1
_PLANE = struct.Struct("<BQ")
TRANSFORMS = ("none", "xor", "sub")
_MODE_RAW, _MODE_PLANES = 0, 1
_KIND_STORED, _KIND_ZSTD = 0, 1
#: the encoding of a chunk is chosen on samples from its middle: this size for transform and rotation ...
_SAMPLE_BYTES = 24 * 1024
#: ... and this size for the order (its gain only shows on a population of many exponents)
_ORDER_SAMPLE_BYTES = 64 * 1024
#: the order costs a counting sort per chunk when saving and at every level of a restore (it halves the decode
#: speed): used only when its estimate is below this fraction of the plain one (it then saves 3 % or more; at 1 %
#: the benchmark's fp32 fine-tune at lr 1e-5 restored its deltas at 1.20x torch.load, at 3 % 0.99x, for 0.1 % more
#: bytes)
_ORDER_GAIN = 0.97
#: ... and only for elements of at least this many bytes (2-byte elements: twice the sort per byte)
_ORDER_MIN_WIDTH = 4
#: a plane is stored as is when zstd does not get it below this fraction of its size
_STORE_RATIO = 0.995
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_INT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}

_local = threading.local()


try:
    from . import _planes as _compiled  # type: ignore[attr-defined]
except ImportError:  # optional: built at install time where a C compiler is there
    _compiled = None


def _load_native() -> Any:
    # the switch is read once, at this module's import (docs/settings.md): one path for the whole process
    return None if _settings.native_switched_off() else _compiled


#: the compiled kernels (``_planes.c``), or None: the numpy reference path
_native: Any = _load_native()
_noticed = False
_notice_lock = threading.Lock()


def native_kernels() -> bool:
    """Whether the compiled byte-plane kernels are in use (else the slower numpy path, same bytes)."""
    return _native is not None


def fallback_message() -> str:
    """What the numpy path costs and how to get the compiled one (measured on x86-64 with GCC 12, 16 MiB
    float32 and bfloat16 delta chunks: encoding 1.4-2x, decoding 2.8-3.8x slower)."""
    off = _settings.native_switched_off()
    if off is not None and _compiled is not None:
        why, fix = f"are turned off ({off})", "Unset it for the fast path."
    else:
        why = "were not built (no C compiler when gpu_notebook was installed)"
        fix = (
            "For the fast path install a C compiler (Debian/Ubuntu: apt install build-essential python3-dev; "
            "macOS: xcode-select --install; Windows: Build Tools for Visual Studio) and reinstall without pip's "
            "cached wheel: pip install --force-reinstall --no-deps --no-cache-dir gpu_notebook"
        )
    return (
        f"gpu_notebook.checkpoint: the C kernels of the checkpoint codec {why}; checkpoints are encoded by the "
        "numpy fallback, which writes the same bytes but encodes about 1.5-2x and decodes about 3-4x slower "
        "(measured per chunk on x86-64; whole saves and restores slow down less). " + fix
    )


def notice_fallback() -> bool:
    """Warn (once per process: the first call with the numpy path in use) that the fallback is slower and how to
    get the compiled kernels. Called by the first save, not at import (importing must stay quiet and cheap).
    Returns whether it warned."""
    global _noticed
    if _native is not None or _noticed:
        return False
    with _notice_lock:
        if _noticed:
            return False
        _noticed = True
    warnings.warn(fallback_message(), RuntimeWarning, stacklevel=3)
    return True


#: chunks below this size only try the plain transforms (no rotation, no permutation)
_SMALL_BYTES = 4 * 1024
#: rotations tried (left, in bits) after the transform; 0 is always tried
_ROTATIONS = (2, 3, 4, 7)
#: check an earlier choice against the plain transforms on a sample before using it
_CHECK_HINTS = False
#: (transform, rotation, permute, offset): one way to encode a chunk
Variant = tuple[int, int, bool, int]
#: (transform, rotation, permute, use an offset, planes stored without trying zstd): a choice to reuse for
#: chunks of the same kind
Hint = tuple[int, int, bool, bool, frozenset[int]]


def _zc(level: int) -> Any:
    """A per-thread zstd compressor. ``min_match=7`` keeps zstd from trading good Huffman-coded literals
    for short, costly matches in the noisy byte planes (smaller and faster than plain level 1 here); a small
    hash table and window (planes are at most a few MB, their matches are local) are 5-7 % faster still."""
    import zstandard

    cache = getattr(_local, "zc", None)
    if cache is None:
        cache = _local.zc = {}
    c = cache.get(level)
    if c is None:
        fast = {"hash_log": 12, "window_log": 17} if level <= 2 else {}  # higher levels: as zstd sets them
        params = zstandard.ZstdCompressionParameters.from_level(level, min_match=7, **fast)
        c = cache[level] = zstandard.ZstdCompressor(compression_params=params)
    return c


def _zd() -> Any:
    import zstandard

    d = getattr(_local, "zd", None)
    if d is None:
        d = _local.zd = zstandard.ZstdDecompressor()
    return d


def _order(base: np.ndarray, width: int) -> np.ndarray:
    """The permutation that sorts elements stably by their base element's top exponent bits.

    Encoder and decoder compute it from the base alone. Key and index are packed into one unsigned integer
    and sorted (a plain sort of unique integers is deterministic and several times faster than argsort).
    """
    u: Any = _UINT[width]
    bits = 8 * width
    n = base.nbytes // width
    key = np.right_shift(base.view(u), u(bits - 9)).astype(np.uint32 if n < (1 << 24) else np.uint64)
    ib = max(1, (n - 1).bit_length())
    k: Any = key.dtype.type
    np.bitwise_and(key, k(0xFF), out=key)
    np.left_shift(key, k(ib), out=key)
    np.bitwise_or(key, np.arange(n, dtype=key.dtype), out=key)
    key.sort()
    np.bitwise_and(key, k((1 << ib) - 1), out=key)
    return key


def _forward(cur: np.ndarray, base: np.ndarray | None, v: Variant, width: int) -> np.ndarray:
    """Apply a variant to a ``uint8`` chunk; returns ``cur`` itself or a per-thread scratch buffer."""
    t, rot, perm, off = v
    if t == 0 and not rot and not perm:
        return cur
    n = cur.nbytes
    u: Any = _UINT[width]
    out = scratch("fwd", n)
    if t == 0:
        np.copyto(out, cur)
    elif t == 1:
        np.bitwise_xor(cur.view(u), base.view(u), out=out.view(u))  # type: ignore[union-attr]
    else:
        s: Any = _INT[width]
        d = out.view(s)
        np.subtract(cur.view(s), base.view(s), out=d)  # type: ignore[union-attr]  # wraps
        if off:
            np.subtract(d, s(off), out=d)
        sign = scratch("tmp", n).view(s)
        np.right_shift(d, 8 * width - 1, out=sign)
        np.left_shift(d, 1, out=d)
        np.bitwise_xor(d, sign, out=d)  # zigzag
    if rot:
        x = out.view(u)
        tmp = scratch("tmp", n).view(u)
        np.right_shift(x, u(8 * width - rot), out=tmp)
        np.left_shift(x, u(rot), out=x)
        np.bitwise_or(x, tmp, out=x)
    if perm:
        res = scratch("perm", n)
        np.take(out.view(u), _order(base, width), out=res.view(u))  # type: ignore[arg-type]
        return res
    return out


def _inverse(
    data: np.ndarray, base: np.ndarray | None, v: Variant, width: int, out: np.ndarray
) -> np.ndarray:
    """Undo a variant: ``data`` (scratch, modified) -> ``out`` (``uint8``, same length)."""
    t, rot, perm, off = v
    u: Any = _UINT[width]
    n = data.nbytes
    z = data.view(u)
    if perm:
        y = scratch("dperm", n).view(u)
        y[_order(base, width)] = z  # type: ignore[arg-type]
        z = y
    if rot:
        tmp = scratch("tmp", n).view(u)
        np.left_shift(z, u(8 * width - rot), out=tmp)
        np.right_shift(z, u(rot), out=z)
        np.bitwise_or(z, tmp, out=z)
    o = out.view(u)
    if t == 0:
        np.copyto(o, z)
        return out
    b = base.view(u)  # type: ignore[union-attr]
    if t == 1:
        np.bitwise_xor(z, b, out=o)
        return out
    neg = scratch("tmp", n).view(u)
    np.bitwise_and(z, u(1), out=neg)
    np.negative(neg, out=neg)  # 0 -> 0, 1 -> all ones (unsigned wrap)
    np.right_shift(z, u(1), out=z)
    np.bitwise_xor(z, neg, out=z)
    if off:
        np.add(z, np.array(off).astype(_INT[width]).view(u), out=z)  # wraps
    np.add(z, b, out=o)  # wraps
    return out


def _split(buf: np.ndarray, width: int) -> np.ndarray:
    """Byte planes of ``buf`` as a (width, n) array (per-thread scratch)."""
    if width == 1:
        return buf.reshape(1, -1)
    out = scratch("split", buf.nbytes).reshape(width, -1)
    np.copyto(out, buf.reshape(-1, width).T)
    return out


def _merge(planes: np.ndarray, width: int, out: np.ndarray) -> np.ndarray:
    if width == 1:
        np.copyto(out, planes.reshape(-1))
    else:
        o = out.reshape(-1, width)
        for i in range(width):  # one strided column at a time: ~3x faster than copying the transpose
            o[:, i] = planes[i]
    return out


def _planes_of(cur: np.ndarray, base: np.ndarray | None, v: Variant, width: int) -> np.ndarray:
    """The byte planes, as a (width, n) ``uint8`` array (per-thread scratch), of a chunk encoded by ``v``."""
    nat = _native
    if nat is None:
        return _split(_forward(cur, base, v, width), width)
    t, rot, perm, off = v
    out = scratch("split", cur.nbytes)
    nat.forward_split(cur, base if (t or perm) else None, out, width, t, rot, perm, off)
    return out.reshape(width, -1)


def _encode_planes(planes: np.ndarray, v: Variant, width: int, level: int, store: frozenset[int]) -> bytes:
    zc = _zc(level)
    heads: list[bytes] = []
    bodies: list[bytes | memoryview] = []
    for i in range(planes.shape[0]):
        p = planes[i]
        if i in store:  # the sample showed this plane is noise: do not spend time compressing it
            heads.append(_PLANE.pack(_KIND_STORED, p.nbytes))
            bodies.append(memoryview(p))
            continue
        comp = zc.compress(p)
        if len(comp) < _STORE_RATIO * p.nbytes:
            heads.append(_PLANE.pack(_KIND_ZSTD, len(comp)))
            bodies.append(comp)
        else:
            heads.append(_PLANE.pack(_KIND_STORED, p.nbytes))
            bodies.append(memoryview(p))
    t, rot, perm, off = v
    hdr = _HDR.pack(FRAME_MAGIC, FRAME_VERSION, _MODE_PLANES, t, width, planes.nbytes)
    ext = _EXT.pack(_FLAG_PERM if perm else 0, rot, off)
    return b"".join([hdr, ext, *heads, *bodies])


def _raw_frame(buf: np.ndarray) -> bytes:
    return _HDR.pack(FRAME_MAGIC, FRAME_VERSION, _MODE_RAW, 0, 1, buf.nbytes) + buf.tobytes()


def _estimate(planes: np.ndarray, level: int) -> tuple[int, frozenset[int]]:
    """Compressed size of byte planes (no header), and the planes not worth compressing."""
    zc = _zc(level)
    total = 0
    store = set()
    for i in range(planes.shape[0]):
        n = planes[i].nbytes
        c = len(zc.compress(planes[i]))
        if c >= _STORE_RATIO * n:
            store.add(i)
            c = n
        total += c
    return total, frozenset(store)


def _median_offset(cur: np.ndarray, base: np.ndarray, width: int) -> int:
    """The median integer difference of a strided sample (as a signed integer of ``width`` bytes)."""
    s: Any = _INT[width]
    c = cur.view(s)
    step = max(1, c.size // 1024)
    d = (c[::step] - base.view(s)[::step]).astype(np.int64)  # wraps, like the transform
    # np.median's result, without its overhead (this runs once per chunk): the mean of the middle one or two
    k = d.size // 2
    if d.size % 2:
        off = int(float(np.partition(d, k)[k]))
    else:
        p = np.partition(d, (k - 1, k))
        off = int((float(p[k - 1]) + float(p[k])) / 2)
    return int(np.array(off).astype(s))


def _sample(raw: np.ndarray, base: np.ndarray | None, width: int, nbytes: int) -> tuple[np.ndarray, Any]:
    """A contiguous, element aligned slice of about ``nbytes`` from the middle of the chunk (and its base)."""
    n = raw.nbytes
    if n <= nbytes:
        return raw, base
    m = (nbytes // width) * width
    lo = max(0, min(((n // 2) // width) * width, n - m))
    return raw[lo : lo + m], (base[lo : lo + m] if base is not None else None)


def _choose(
    raw: np.ndarray,
    base: np.ndarray | None,
    width: int,
    level: int,
    off: int,
    transforms: tuple[str, ...],
    hint: Variant | None = None,
) -> tuple[Variant, frozenset[int]]:
    """Pick the variant with the smallest estimated size, greedily and on samples: the transform, then the
    order (on a larger sample: its gain only shows on a population of many exponents), then the rotation,
    then the order and the offset again with that rotation."""
    small = _sample(raw, base, width, _SAMPLE_BYTES)
    large = _sample(raw, base, width, _ORDER_SAMPLE_BYTES)

    def est(v: Variant, smp: tuple[np.ndarray, Any] = small) -> tuple[int, frozenset[int]]:
        return _estimate(_planes_of(smp[0], smp[1], v, width), level)

    ts: list[Variant] = [(0, 0, False, 0)]
    if base is not None:
        for name in transforms:
            t = TRANSFORMS.index(name)
            if t:
                ts.append((t, 0, False, 0))
                if t == 2 and off:
                    ts.append((t, 0, False, off))
    scored = [(*est(v), v) for v in ts]
    size, store, v = min(scored, key=lambda x: x[0])
    if hint is not None and hint not in ts and _CHECK_HINTS:  # an earlier choice: keep it while it pays
        hs, hst = est(hint)
        if hs <= size:
            return hint, hst
    if width == 1 or raw.nbytes < _SMALL_BYTES:
        return v, store
    t, _, _, o = v
    perm = False
    if t and width >= _ORDER_MIN_WIDTH:  # delta: does the base-exponent order pay?
        perm = est((t, 0, True, o), large)[0] < _ORDER_GAIN * est(v, large)[0]
        if perm:
            v = (t, 0, True, o)
            size, store = est(v)
    for r in _ROTATIONS:
        vr = (t, r, perm, o)
        s2, st2 = est(vr)
        if s2 < size:
            size, store, v = s2, st2, vr
    if t == 2 and off:  # with that rotation, revisit the offset
        va = (t, v[1], v[2], off if v[3] == 0 else 0)
        s2, st2 = est(va)
        if s2 < size:
            size, store, v = s2, st2, va
    return v, store


def _encode_variant(
    raw: np.ndarray,
    width: int,
    base: np.ndarray | None,
    v: Variant,
    level: int = 1,
    store: frozenset[int] = frozenset(),
) -> bytes:
    """Encode a chunk in one given way (no search; for tests and tools)."""
    return _encode_planes(_planes_of(raw.reshape(-1), base, v, width), v, width, level, store)


def encode_chunk(
    raw: np.ndarray,
    width: int,
    base: np.ndarray | None = None,
    level: int = 1,
    transforms: tuple[str, ...] = TRANSFORMS,
    hint: Hint | None = None,
    chosen: dict[str, Any] | None = None,
) -> tuple[bytes, str]:
    """Encode one chunk.

    Parameters
    ----------
    raw
        The chunk's raw bytes (contiguous ``uint8`` array, length a multiple of ``width``).
    width
        Element size in bytes (1, 2, 4 or 8).
    base
        The same chunk in the checkpoint this one is a delta against (the last full base, or the previous
        checkpoint with ``delta_against="previous"``; same length), or None for a full (base) encoding.
    level
        zstd level.
    transforms
        Which transforms may be tried when ``base`` is given.
    hint
        The choice made for this chunk by an earlier save (``chosen["hint"]`` of that call): it is used
        without a search (with ``_CHECK_HINTS``, only while it still beats the plain transforms on a sample).
    chosen
        A dict that receives ``"hint"``, the choice made for this chunk.

    Returns
    -------
    (frame, transform)
        The frame bytes and the transform used (``"none"``, ``"xor"``, ``"sub"``, or ``"raw"`` when the
        chunk did not shrink and is stored raw). Only ``"xor"`` and ``"sub"`` frames need the base to decode.
    """
    raw = raw.reshape(-1)
    if width not in _UINT or raw.nbytes % width:
        width = 1
    n = raw.nbytes
    delta = base is not None and base.nbytes == n and n > 0
    if delta:
        base = base.reshape(-1)  # type: ignore[union-attr]
    else:
        base = None
    usable = hint is not None and (delta or (hint[0] == 0 and not hint[2])) and (width > 1 or hint[1] == 0)
    # the offset is only computed when it can be used: a search, or a reused choice that has one
    need_off = delta and "sub" in transforms and (not usable or _CHECK_HINTS or bool(hint[3]))  # type: ignore[index]
    off = _median_offset(raw, base, width) if need_off else 0  # type: ignore[arg-type]
    hv: Variant | None = None
    if usable:
        hv = (hint[0], hint[1], hint[2], off if hint[3] else 0)  # type: ignore[index]
    if hv is not None and not _CHECK_HINTS:
        v, store = hv, hint[4]  # type: ignore[index]
    else:
        v, store = _choose(raw, base, width, level, off, transforms, hv)
    if chosen is not None:
        chosen["hint"] = (v[0], v[1], v[2], bool(v[3]), store)
    frame = _encode_variant(raw, width, base, v, level, store)
    if len(frame) >= n + _HDR.size:
        return _raw_frame(raw), "raw"
    return frame, TRANSFORMS[v[0]]


def frame_info(frame: bytes | memoryview) -> dict[str, Any]:
    """Decode a frame's header (for ``show`` and debugging)."""
    magic, ver, mode, transform, width, n = _HDR.unpack_from(frame, 0)
    info = {
        "magic": magic,
        "version": ver,
        "mode": mode,
        "transform": transform,
        "width": width,
        "raw_len": n,
    }
    if mode == _MODE_PLANES and ver >= 2:
        flags, rot, off = _EXT.unpack_from(frame, _HDR.size)
        info.update(permuted=bool(flags & _FLAG_PERM), rotation=rot, offset=off)
    return info


def _read_planes(mv: memoryview, pos: int, heads: list[tuple[int, int]], plane_len: int) -> list[Any]:
    """The planes of a frame whose payloads start at ``pos``: decompressed bytes, or views of stored ones."""
    import zstandard

    zd = _zd()
    bufs: list[Any] = []
    for kind, clen in heads:
        payload = mv[pos : pos + clen]
        if len(payload) != clen:
            raise ValueError("frame is truncated")
        pos += clen
        if kind == _KIND_ZSTD:
            # zstd allocates what a frame's header declares (max_output_size only bounds frames that declare
            # nothing): a damaged or hostile header must not make it allocate a terabyte
            try:
                declared = zstandard.frame_content_size(payload)
                if declared not in (-1, plane_len):
                    raise ValueError(f"plane claims {declared} bytes, the frame {plane_len}")
                dec = zd.decompress(payload, max_output_size=plane_len)
            except zstandard.ZstdError as err:
                raise ValueError(f"plane does not decompress: {err}") from None
            if len(dec) != plane_len:
                raise ValueError("plane has the wrong length")
            bufs.append(dec)
        elif kind == _KIND_STORED:
            if clen != plane_len:
                raise ValueError("plane has the wrong length")
            bufs.append(payload)
        else:
            raise ValueError("unknown plane kind")
    return bufs


def decode_chunk(
    frame: bytes | memoryview, base: np.ndarray | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """Decode a frame back into raw bytes.

    Parameters
    ----------
    frame
        The stored frame.
    base
        The decoded base chunk, for ``xor``/``sub`` frames.
    out
        A writable ``uint8`` array of the raw length to decode into (default: a fresh array).

    Returns
    -------
    ``out`` (or a fresh writable ``uint8`` array) holding the raw bytes.

    Raises
    ------
    ValueError
        The frame is malformed, or it needs a base that was not given.
    """
    mv = memoryview(frame)
    if len(mv) < _HDR.size:
        raise ValueError("frame is truncated")
    magic, ver, mode, transform, width, n = _HDR.unpack_from(mv, 0)
    if magic != FRAME_MAGIC:
        raise ValueError("not a chunk frame (bad magic)")
    if ver > FRAME_VERSION:
        raise ValueError(f"chunk frame version {ver} is newer than this library supports ({FRAME_VERSION})")
    if out is None:
        out = np.empty(n, dtype=np.uint8)
    elif out.nbytes != n:
        raise ValueError(f"output buffer has {out.nbytes} bytes, the frame holds {n}")
    if mode == _MODE_RAW:
        body = mv[_HDR.size :]
        if len(body) != n:
            raise ValueError("raw frame has the wrong length")
        out[:] = np.frombuffer(body, dtype=np.uint8)
        return out
    if mode != _MODE_PLANES or width not in _UINT or transform > 2 or n % width:
        raise ValueError("unknown frame mode")
    pos = _HDR.size
    flags, rot, off = 0, 0, 0
    if ver >= 2:
        if len(mv) < pos + _EXT.size:
            raise ValueError("frame is truncated")
        flags, rot, off = _EXT.unpack_from(mv, pos)
        pos += _EXT.size
        if flags & ~_FLAG_PERM or rot >= 8 * width:
            raise ValueError("unknown frame flags")
    nplanes = width
    plane_len = n // width
    if len(mv) < pos + nplanes * _PLANE.size:
        raise ValueError("frame is truncated")
    heads = []
    for _ in range(nplanes):
        heads.append(_PLANE.unpack_from(mv, pos))
        pos += _PLANE.size
    perm = bool(flags & _FLAG_PERM)
    if (transform or perm) and (base is None or base.nbytes != n):
        raise ValueError("delta frame needs its base chunk")
    simple = width == 1 and not transform and not rot and not perm
    bufs = _read_planes(mv, pos, heads, plane_len)
    nat = _native
    if nat is not None and not simple:  # the planes go straight into the kernel: no copies
        b = base.reshape(-1) if (transform or perm) and base is not None else None
        nat.merge_inverse(bufs, b, out, width, transform, rot, perm, off)
        return out
    planes = out.reshape(1, n) if simple else scratch("dplanes", n).reshape(nplanes, plane_len)
    for i, buf in enumerate(bufs):
        planes[i] = np.frombuffer(buf, dtype=np.uint8)
    if simple:
        return out
    if not transform and not rot and not perm:
        return _merge(planes, width, out)
    merged = _merge(planes, width, scratch("dmerge", n))
    b = base.reshape(-1) if base is not None else None
    return _inverse(merged, b, (transform, rot, perm, off), width, out)
