"""The checks of a manifest a reader makes before it allocates anything for it.

A store is not trusted: a damaged or hostile manifest must fail with an :class:`IntegrityError` that names the
manifest, the tensor and the chunk, never with a ``MemoryError``, a hang or a ``RecursionError`` half way
through a restore. Every size a restore allocates is bound by something checkable:

- a leaf's ``nbytes`` is ``prod(shape) * itemsize`` of a known dtype, and the sum of its chunks' ``len``;
- a chunk's ``len`` is at most :data:`MAX_CHUNK_BYTES`, and every frame of its delta chain has the chunk's ``len``
  and a stored ``size`` of at most ``len`` + :data:`FRAME_SLACK` (a writer stores a chunk raw, 16 bytes of header
  and its bytes, when encoding does not make it smaller);
- a delta chain (a chunk's ``base`` entries) is at most :data:`MAX_CHAIN` frames long, has no loop, and each
  frame's ``depth`` is one more than its base's;
- the tree of plain values nests at most :data:`MAX_TREE_DEPTH` levels (the reader rebuilds it recursively) and
  references only leaves the shard lists;
- and at restore, the bytes of a shard's tensors fit in the memory this machine has available
  (:func:`check_restore`).

The decoder then checks what only the stored bytes can say (a frame's header against its chunk's ``len``, a zstd
plane's declared size, the hashes). Fields this reader does not know are left alone: a newer writer may add them.
"""

from __future__ import annotations

import math
import os
import re
import sys
from typing import Any, TypeGuard

from ..._display import fmt_bytes
from .._errors import CheckpointError, IntegrityError

__all__ = [
    "MAX_CHAIN",
    "MAX_CHUNK_BYTES",
    "MAX_TREE_DEPTH",
    "FRAME_SLACK",
    "check_manifest",
    "check_shard",
    "expand_groups",
    "check_restore",
    "available_memory",
]

#: the longest delta chain a reader follows (a writer's chains are two frames, a delta on its base, or with
#: ``delta_against="previous"`` at most ``full_every`` long; embedded in the manifest's JSON a chain of 1000 is
#: also about as deep as Python's JSON reader goes)
MAX_CHAIN = 1000
#: the biggest chunk a reader decodes (writers cut tensors into ``chunk_mb`` chunks, 4 MiB by default; decoding
#: one needs a few scratch buffers of its size)
MAX_CHUNK_BYTES = 4 << 30
#: a frame is at most this many bytes bigger than its chunk (the raw frame: 16 bytes of header)
FRAME_SLACK = 128
#: the deepest tree of plain values a reader rebuilds (it recurses, two Python frames a level; a writer fails
#: with a RecursionError on about 330 levels of dicts)
MAX_TREE_DEPTH = 400
#: the most dimensions a tensor has (numpy 2 and torch: 64)
MAX_DIMS = 64
#: bytes per element of each dtype a writer writes (those of ``tree.DTYPES``, which gives the width of the delta
#: unit instead: a complex number is two floats; spelled out here because ``tree`` needs numpy and reading a
#: manifest must not: a test keeps the two in step)
ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "uint16": 2, "uint32": 4, "uint64": 8,
    "complex64": 8, "complex128": 16,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip
_KINDS = ("tensor", "ndarray", "pickle")
_OBJECT_KEY = re.compile(r"objects/([0-9a-f]{2})/\1[0-9a-f]{6,126}")
_LEAF_TAGS = ("$tensor", "$ndarray", "$pickle")

Entry = dict[str, Any]


def _sizes(shape: list[Any]) -> bool:
    """Every item of ``shape`` is a JSON integer of at least 0 (the loop of :func:`_int`, for 10,000 shapes)."""
    for d in shape:
        if type(d) is not int or d < 0:
            return False
    return True


def _int(v: Any, lo: int = 0) -> TypeGuard[int]:
    """``v`` is a JSON integer (not a bool, not a float) of at least ``lo``."""
    return type(v) is int and v >= lo


def check_manifest(doc: dict[str, Any], where: str, ckpt_id: str | None = None) -> None:
    """Check a manifest's structure and every size it claims (``where`` names it in errors, e.g. its key;
    ``ckpt_id``: the id it was read under, which it must hold).

    Raises
    ------
    IntegrityError
        The manifest cannot be what a writer wrote, naming what is wrong.
    """
    ckpt = doc.get("id")
    if not isinstance(ckpt, str) or not ckpt or (ckpt_id is not None and ckpt != ckpt_id):
        raise IntegrityError(f"manifest {where} holds checkpoint id {ckpt!r}, not {ckpt_id!r}")
    for name in ("step", "world_size"):
        if name in doc and not _int(doc[name], -1 if name == "step" else 1):
            raise IntegrityError(f"manifest {where}: {name!r} is {doc[name]!r}, not a count")
    if "created_at" in doc and (type(doc["created_at"]) not in (int, float)):
        raise IntegrityError(f"manifest {where}: 'created_at' is {doc['created_at']!r}, not a time")
    stats = doc.get("stats", {})
    if not isinstance(stats, dict) or any(
        k in stats and not _int(stats[k]) for k in ("raw_bytes", "new_bytes", "new_objects", "reused_bytes")
    ):
        raise IntegrityError(f"manifest {where}: its 'stats' are not byte counts")
    shards = doc.get("shards")
    if not isinstance(shards, list) or not shards:
        raise IntegrityError(f"manifest {where} has no shards")
    for i, shard in enumerate(shards):
        check_shard(shard, f"shard {i} of manifest {where}")
    sections = doc.get("per_rank") or []  # each rank's own state: shaped like a shard
    if not isinstance(sections, list):
        raise IntegrityError(f"manifest {where}: 'per_rank' is not a list of sections")
    for i, section in enumerate(sections):
        check_shard(section, f"per-rank section {i} of manifest {where}")


def check_shard(shard: Any, where: str) -> None:
    """Check one shard of a manifest: its leaves, their chunks and delta chains, and its tree."""
    if not isinstance(shard, dict):
        raise IntegrityError(f"{where} is not a JSON object")
    if "rank" in shard and not _int(shard["rank"]):
        raise IntegrityError(f"{where}: 'rank' is {shard['rank']!r}, not a rank")
    leaves = shard.get("leaves")
    if not isinstance(leaves, dict):
        raise IntegrityError(f"{where} has no leaves")
    groups = shard.get("groups", {})  # small tensors saved together (format 4): checked as tensors of bytes
    if not isinstance(groups, dict) or not all(isinstance(g, dict) for g in groups.values()):
        raise IntegrityError(f"{where}: 'groups' is not a JSON object of groups")
    for key, g in groups.items():
        n, dt = g.get("nbytes"), g.get("dtype")
        shape = [n // ITEMSIZE[dt]] if _int(n) and dt in ITEMSIZE else None
        _check_leaf(f"group {key}", {**g, "kind": "tensor", "shape": shape}, where)
    for name, lf in leaves.items():
        _check_leaf(name, lf, where, groups)
    expand_groups(shard, where)  # (format 5: the members, listed in their group, checked as they are listed)
    _check_tree(shard.get("tree"), leaves, where)


def expand_groups(shard: dict[str, Any], where: str) -> None:
    """List the members of a shard's groups (format 5: columnar in their group, ``names`` and ``shapes`` in the
    order their bytes lie there) as leaves again, as format 4 listed them: ``{"kind": "tensor", "dtype", "shape",
    "nbytes", "chunks": [], "group", "goff"}``, the group's ``names`` and ``shapes`` removed. Each member is checked
    on the way (a new name, a shape, its bytes within the group's, the members' bytes together the group's).
    Groups of format 4 (no ``names``) are left alone."""
    groups, leaves = shard.get("groups") or {}, shard["leaves"]
    for key, g in groups.items():
        if "names" not in g:
            continue
        names, shapes, dtype, total = g.get("names"), g.get("shapes"), g["dtype"], g["nbytes"]
        what = f"group {key!r} of {where}"
        if not isinstance(names, list) or not isinstance(shapes, list) or len(names) != len(shapes):
            raise IntegrityError(f"{what}: its 'names' and 'shapes' are not two lists of the same length")
        size, off = ITEMSIZE[dtype], 0
        for name, shape in zip(names, shapes, strict=True):
            if type(name) is not str or name in leaves:
                raise IntegrityError(f"{what} lists a member {name!r} that is not a new tensor name")
            if type(shape) is not list or len(shape) > MAX_DIMS or not _sizes(shape):
                raise IntegrityError(
                    f"tensor {name!r} of {where} has a shape that is not a list of at most {MAX_DIMS} sizes: "
                    f"{shape!r}"
                )
            n = math.prod(shape) * size
            if off + n > total:
                raise IntegrityError(f"tensor {name!r} of {where} does not lie within its {what}")
            leaves[name] = {
                "kind": "tensor",
                "dtype": dtype,
                "shape": shape,
                "nbytes": n,
                "chunks": [],
                "group": key,
                "goff": off,
            }
            off += n
        if off != total:
            raise IntegrityError(f"the members of {what} hold {off} bytes, not the group's {total}")
        del g["names"], g["shapes"]


def _check_leaf(name: str, lf: Any, where: str, groups: dict[str, Any] | None = None) -> None:
    # the messages are only formatted for an error (10,000 tensors are checked in about as long as their JSON
    # takes to parse)
    problem = _leaf_problem(lf, groups)
    if problem is not None:
        raise IntegrityError(f"tensor {name!r} of {where} {problem}")
    for i, c in enumerate(lf.get("chunks") or ()):
        found = _chain_problem(c)
        if found is not None:
            level, text = found
            at = f"tensor {name!r} chunk {i}" + (f", delta base {level}," if level else "")
            raise IntegrityError(f"{at} of {where} {text}")
    if "group" not in lf:
        nbytes, total = lf["nbytes"], sum(c["len"] for c in lf["chunks"])
        if total != nbytes:
            raise IntegrityError(
                f"tensor {name!r} of {where} has chunks that do not add up to its {nbytes} bytes ({total} bytes)"
            )


def _leaf_problem(lf: Any, groups: dict[str, Any] | None) -> str | None:
    """What is wrong with a leaf's own fields (not its chunks), or None."""
    if not isinstance(lf, dict):
        return "is not a JSON object"
    kind = lf.get("kind", "tensor")
    if kind not in _KINDS:
        return f"has an unknown kind {kind!r}"
    dtype = lf.get("dtype")
    if dtype not in ITEMSIZE:
        return f"has an unknown dtype {dtype!r}"
    shape = lf.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not _sizes(shape):
        return f"has a shape that is not a list of at most {MAX_DIMS} sizes: {shape!r}"
    nbytes = lf.get("nbytes")
    if not _int(nbytes):
        return f"claims {nbytes!r} bytes, not a non-negative integer"
    want = math.prod(shape) * ITEMSIZE[dtype]
    if nbytes != want:
        return f"claims {nbytes} bytes, but its shape {shape} of {dtype} holds {want} bytes"
    if "group" in lf:  # its bytes lie in a group's
        key, goff = lf["group"], lf.get("goff")
        g = (groups or {}).get(key) if isinstance(key, str) else None
        if g is None or not _int(goff) or lf.get("chunks") or goff + nbytes > g["nbytes"]:
            return f"does not lie within its group {key!r}"
        return None
    chunks = lf.get("chunks")
    if not isinstance(chunks, list):
        return "has no chunk list"
    return None


def _chain_problem(entry: Any) -> tuple[int, str] | None:
    """What is wrong with a chunk entry or its delta chain: (the level of the frame at fault, 0 for the chunk
    itself; what), or None. A loop or a chain longer than :data:`MAX_CHAIN` is found before it is followed
    further."""
    if not isinstance(entry, dict):
        return 0, "is not a JSON object"
    ln = entry.get("len")
    if not _int(ln) or ln > MAX_CHUNK_BYTES:
        return 0, f"claims a length of {ln!r} bytes (at most {fmt_bytes(MAX_CHUNK_BYTES)} are read)"
    chain: list[Entry] = []
    seen: set[int] = set()
    e: Any = entry
    while e is not None:
        level = len(chain)
        if not isinstance(e, dict):
            return level, "is not a JSON object"
        if id(e) in seen:
            return 0, f"has a delta chain that loops back on itself at base {level}"
        if level >= MAX_CHAIN:
            return 0, f"has a delta chain longer than {MAX_CHAIN} frames"
        seen.add(id(e))
        if e.get("len") != ln:
            return level, f"claims {e.get('len')!r} bytes, its chunk {ln}"
        size, off, obj = e.get("size"), e.get("off"), e.get("obj")
        if not _int(size) or size > ln + FRAME_SLACK:
            return level, f"claims a stored frame of {size!r} bytes for a chunk of {ln} bytes"
        if not _int(off):
            return level, f"has an offset {off!r}, not a non-negative integer"
        if not isinstance(obj, str) or not _OBJECT_KEY.fullmatch(obj):
            return level, f"names an object {obj!r} that is not an object key"
        if not isinstance(e.get("raw"), str) or not isinstance(e.get("hash"), str):
            return level, "has no 'raw' or 'hash' hash"
        if not isinstance(e.get("xxh3", ""), str):
            return level, f"has an 'xxh3' check {e['xxh3']!r} that is not a hex digest"
        chain.append(e)
        e = e.get("base")
    # the recorded depth of each frame: the number of bases below it (0: a full frame); absent in old manifests
    for level, e in enumerate(chain):
        depth = e.get("depth")
        if depth is not None and depth != len(chain) - 1 - level:
            return (
                level,
                f"says {depth!r} delta bases are below it, but its chain has {len(chain) - 1 - level}",
            )
    return None


def _check_tree(tree: Any, leaves: dict[str, Any], where: str) -> None:
    """The tree nests at most :data:`MAX_TREE_DEPTH` levels and references only listed leaves (no recursion:
    this is what guards the recursive reader)."""
    stack: list[tuple[Any, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_TREE_DEPTH:
            raise IntegrityError(f"the tree of {where} nests deeper than {MAX_TREE_DEPTH} levels")
        if isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, dict):
            if len(node) == 1:
                ((tag, val),) = node.items()
                if tag in _LEAF_TAGS:
                    if not isinstance(val, str) or val not in leaves:
                        raise IntegrityError(
                            f"the tree of {where} references a tensor {val!r} it does not list"
                        )
                    continue
            stack.extend((v, depth + 1) for v in node.values())


def check_restore(doc: dict[str, Any], shard: dict[str, Any]) -> None:
    """Before a shard is decoded: the sizes it allocates by, and whether they fit in the memory available.

    The manifest was checked whole when it was read (:func:`check_manifest`, from ``read_manifest``); this
    checks again, cheaply, only the sizes the decoder allocates (a shard may be put together after reading, e.g.
    with a rank's own section).

    Raises
    ------
    IntegrityError
        A size is not one a writer writes.
    CheckpointError
        Restoring it needs more host memory than is available (naming both).
    """
    where = f"checkpoint {doc.get('id')}"
    leaves = shard.get("leaves")
    groups = shard.get("groups") or {}
    if not isinstance(leaves, dict) or not isinstance(groups, dict):
        raise IntegrityError(f"{where} has no leaves")
    # the tensors' bytes (those of a group's members lie in the group's), and a few scratch buffers of the
    # biggest chunk (decoding one needs them)
    need = biggest = 0
    for name, lf in [*((n, lf) for n, lf in leaves.items() if "group" not in lf), *groups.items()]:
        nbytes, chunks = lf.get("nbytes"), lf.get("chunks")
        chunks = chunks if isinstance(chunks, list) else [None]
        lens = [n for c in chunks if isinstance(c, dict) and _int(n := c.get("len")) and n <= MAX_CHUNK_BYTES]
        if not _int(nbytes) or len(lens) != len(chunks) or sum(lens) != nbytes:
            raise IntegrityError(f"tensor {name!r} of {where} has sizes that are not a writer's")
        need += nbytes
        biggest = max([biggest, *lens])
    need += 2 * biggest
    have = available_memory()
    if have is not None and need > have:
        raise CheckpointError(
            f"restoring {where} needs {fmt_bytes(need)} of host memory for its tensors, but only "
            f"{fmt_bytes(have)} is available: restore it on a machine with more memory (or its manifest is "
            "damaged)"
        )


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def available_memory() -> int | None:
    """Bytes of memory this process can still allocate: available RAM (reclaimable page cache included) plus
    free swap, within the cgroup's limit (a container's); None where that cannot be told (then nothing is
    refused)."""
    limits: list[int] = []
    info = _meminfo()
    if "MemAvailable" in info:
        limits.append(info["MemAvailable"] + info.get("SwapFree", 0))
    elif sys.platform != "win32" and hasattr(os, "sysconf"):
        try:
            limits.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError):
            pass
    for d, limit_file, usage_file, cache_key in (
        ("/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"),  # cgroup v2
        ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
    ):
        limit, usage = _read_int(f"{d}/{limit_file}"), _read_int(f"{d}/{usage_file}")
        if limit is not None and usage is not None and limit < (1 << 60):
            # the usage counts the group's page cache; the inactive part of it is given back under pressure
            cache = _stat(f"{d}/memory.stat").get(cache_key, 0)
            limits.append(max(0, limit - usage + cache))
    return min(limits) if limits else None


def _stat(path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if value.strip().isdigit():
                    out[key] = int(value)
    except OSError:
        pass
    return out
