"""Writes the golden checkpoints under this folder: run once, with the format of the day, and commit the output.

They are never rewritten: ``tests/checkpoint/test_checkpoint_golden.py`` restores each of them bit-exact with
today's code, so a later format change that could no longer read them fails CI. A new format version adds a new
folder (``v<N>/``) next to the old ones instead of replacing them.

Each store holds a chain: a full base, then deltas (small changes: ``sub`` and ``xor`` frames, unchanged chunks
reused, packs), of every dtype the format knows, torch tensors and numpy arrays, module and optimizer state, and
plain values of every kind the tree encodes. ``expected.json`` records, per checkpoint and per tensor, its dtype,
shape and the SHA-256 of its raw little-endian bytes, plus the plain values as ``repr``.

Usage: ``python tests/checkpoint/golden/make_golden.py OUT_DIR`` (OUT_DIR: e.g. ``tests/checkpoint/golden/v3``).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpu_notebook.checkpoint import Checkpointer


def _raw(x: Any) -> bytes:
    if isinstance(x, torch.Tensor):
        t = x.detach().contiguous().reshape(-1)
        return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8).tobytes()


def describe(state: Any, path: str = "") -> dict[str, Any]:
    """tensor path -> [kind, dtype, shape, sha256]; plain path -> repr."""
    out: dict[str, Any] = {}
    if isinstance(state, torch.Tensor):
        out[path] = [
            "tensor",
            str(state.dtype).removeprefix("torch."),
            list(state.shape),
            hashlib.sha256(_raw(state)).hexdigest(),
        ]
    elif isinstance(state, np.ndarray):
        out[path] = ["ndarray", state.dtype.name, list(state.shape), hashlib.sha256(_raw(state)).hexdigest()]
    elif isinstance(state, dict):
        for k, v in state.items():
            out.update(describe(v, f"{path}/{k!r}"))
    elif isinstance(state, list | tuple):
        out[path + ("/tuple" if isinstance(state, tuple) else "/list")] = len(state)
        for i, v in enumerate(state):
            out.update(describe(v, f"{path}/{i}"))
    else:
        out[path] = repr(state)
    return out


def _tensors(g: torch.Generator) -> dict[str, torch.Tensor]:
    f = torch.randn(3000, generator=g)
    return {
        "f64": torch.randn(1500, generator=g, dtype=torch.float64),
        "f32": f,
        "f16": f.half(),
        "bf16": f.bfloat16(),
        "f8e4": (f * 4).to(torch.float8_e4m3fn),
        "f8e5": (f * 4).to(torch.float8_e5m2),
        "i64": torch.randint(-(2**40), 2**40, (800,), generator=g, dtype=torch.int64),
        "i32": torch.randint(-(2**30), 2**30, (900,), generator=g, dtype=torch.int32),
        "i16": torch.randint(-(2**14), 2**14, (1000,), generator=g, dtype=torch.int16),
        "i8": torch.randint(-128, 127, (1000,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (1000,), generator=g, dtype=torch.uint8),
        "bool": torch.rand(999, generator=g) > 0.5,
        "c64": torch.randn(500, generator=g, dtype=torch.complex64),
        "c128": torch.randn(300, generator=g, dtype=torch.complex128),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "matrix": torch.randn(64, 96, generator=g),  # several chunks at chunk_mb=0.01
    }


def _numpy(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "u16": rng.integers(0, 2**16, 700, dtype=np.uint16),
        "u32": rng.integers(0, 2**32, 700, dtype=np.uint32),
        "u64": rng.integers(0, 2**63, 700, dtype=np.uint64),
        "f32": rng.standard_normal((20, 30)).astype(np.float32),
        "i64": np.arange(-50, 50, dtype=np.int64),
    }


def write(out: Path, hash_name: str) -> dict[str, Any]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    rng = np.random.default_rng(1234)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tensors = _tensors(g)
    arrays = _numpy(rng)
    ck = Checkpointer(
        out,
        chunk_mb=0.01,
        pack_kb=64,
        pack_max_mb=0.1,
        threads=2,
        hash=hash_name,
        preemption=None,
        current=False,
    )
    expected: dict[str, Any] = {"hash": hash_name, "checkpoints": []}
    x = torch.randn(64, 16, generator=g)
    for step in range(4):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step:  # small changes: deltas (sub, xor), most integer tensors unchanged (reused chunks)
            tensors["f32"][::7] += 1e-3
            tensors["f64"][::5] *= 1.0001
            tensors["bf16"][::3] += 0.0078125
            tensors["i32"][:10] += step
            tensors["matrix"][:, :8] -= 1e-4
            arrays["f32"][0] += 0.5
        state = {
            "model": model,
            "optim": opt,
            "step": step,
            "t": tensors,
            "np": arrays,
            "plain": {
                "lr": 1e-2,
                "nan": float("nan"),
                "inf": float("-inf"),
                "tuple": (1, "two", None, True),
                "bytes": b"\x00\xffgolden",
                "int_keys": {0: "zero", 7: "seven"},
                "$dollar": "key starting with $",
                "dtype": torch.bfloat16,
                "size": torch.Size([2, 3]),
                "list": [1.5, [2, 3], {"k": "v"}],
            },
        }
        info = ck.save(state, step, block=True).result()
        sd = {"model": model.state_dict(), "optim": opt.state_dict()}
        desc = describe({**state, "model": sd["model"], "optim": sd["optim"]})
        expected["checkpoints"].append({"id": info.id, "step": step, "is_base": info.is_base, "state": desc})
    ck.close()
    return expected


def main() -> None:
    out = Path(sys.argv[1])
    for hash_name in ("blake3", "sha256"):
        exp = write(out / hash_name, hash_name)
        (out / hash_name / "expected.json").write_text(json.dumps(exp, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
