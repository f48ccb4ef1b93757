"""torch.distributed.checkpoint through our stores (issue 20, item 1): DCPWriter / DCPReader.

In one process (``no_dist=True``): every dtype, plain values, deltas and dedup, labels and sequence numbers, a
commit raced by another writer, a damaged store, and S3 (moto's server). With real gloo ranks (tests/checkpoint/_dcp_ranks.py, forked from one
process that imported torch): an FSDP2 (``fully_shard``) model saved at 4 ranks with ``dcp.save`` and then
``dcp.async_save`` (the second save a delta), loaded at 2 ranks (DCP's resharding) and in one process, bit-exact.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from _s3server import serving
from torch.distributed.checkpoint.api import CheckpointException

from gpu_notebook.checkpoint import CheckpointError, NoCheckpointError
from gpu_notebook.checkpoint.dcp import COMMITS, OBJECTS, DCPReader, DCPWriter, list_commits
from gpu_notebook.checkpoint.save.order import COMMIT_TRIES

HERE = pathlib.Path(__file__).parent


def _state() -> dict:
    torch.manual_seed(0)
    return {
        "w": torch.randn(1200, 1000),  # more than one 4 MiB chunk
        "half": torch.randn(300, 7).bfloat16(),
        "f16": torch.randn(5).half(),
        "f64": torch.randn(3, 3).double(),
        "i8": torch.randint(-100, 100, (17,), dtype=torch.int8),
        "ids": torch.arange(5),
        "flag": torch.tensor(True),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 3),
        "step": 7,
        "cfg": {"lr": 0.1, "name": "run-1"},
    }


def _zeros(like: dict) -> dict:
    out: dict = {}
    for k, v in like.items():
        if isinstance(v, torch.Tensor):
            out[k] = torch.zeros_like(v)
        elif isinstance(v, dict):
            out[k] = {kk: type(vv)() for kk, vv in v.items()}
        else:
            out[k] = type(v)()
    return out


def _same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            assert b[k].dtype == v.dtype and torch.equal(b[k], v), k
        else:
            assert b[k] == v, (k, b[k], v)


def _save(state: dict, writer: DCPWriter, **kw) -> None:
    with (
        warnings.catch_warnings()
    ):  # "torch.distributed is disabled ... a single process": what no_dist means
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, storage_writer=writer, no_dist=True, **kw)


def _load(state: dict, reader: DCPReader) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=reader, no_dist=True)
    return state


def test_one_process_round_trip_with_deltas_dedup_and_labels(tmp_path) -> None:
    store = tmp_path / "store"
    state = _state()
    first = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
    writer = DCPWriter(store)
    _save(state, writer)
    full = writer.last_written_bytes
    assert 0 < full <= writer.last_logical_bytes * 1.01  # compressed (random floats barely)
    state["w"][:20] += 1e-3  # a fine-tune's small change to part of one tensor
    _save(state, writer)
    assert writer.last_written_bytes < 0.05 * full, (writer.last_written_bytes, full)
    _save(state, writer, checkpoint_id="final")  # nothing changed: nothing but the commit
    assert writer.last_written_bytes == 0
    commits = list_commits(store)
    assert [(c.seq, c.label) for c in commits] == [(1, None), (2, None), (3, "final")]
    assert commits[0].logical_bytes == commits[2].logical_bytes == writer.last_logical_bytes
    _same(state, _load(_zeros(state), DCPReader(store)))  # the newest
    _same(state, _load(_zeros(state), DCPReader(store, label="final")))
    _same(first, _load(_zeros(state), DCPReader(store, seq=1)))  # the first, not the changed one
    # dcp.load's own checkpoint_id picks a label
    got = _zeros(state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(got, checkpoint_id="final", storage_reader=DCPReader(store), no_dist=True)
    _same(state, got)
    # a new writer (a restarted process): what did not change since the newest commit is not written again
    other = DCPWriter(store)
    _save(state, other)
    assert other.last_written_bytes == 0
    state["w"][-1] += (
        1.0  # the second chunk of "w" changes: a full frame of it, as the new writer has no base
    )
    _save(state, other)
    assert 0 < other.last_written_bytes < 0.3 * full
    state["w"][-1] += 1.0  # and from then on deltas
    _save(state, other)
    assert 0 < other.last_written_bytes < 0.01 * full
    _same(state, _load(_zeros(state), DCPReader(store)))
    # the commits are JSON, not pickles
    doc = json.loads((store / COMMITS / "0000000001.json").read_text())
    assert doc["format"] == "gpu_notebook.dcp" and doc["state"]["w"]["dtype"] == "float32"


def test_a_missing_or_damaged_checkpoint_says_so(tmp_path) -> None:
    store = tmp_path / "store"
    # dcp.load wraps what a reader raises in its CheckpointException; the message is ours
    with pytest.raises(CheckpointException, match="no DCP commit in"):
        _load({"w": torch.zeros(3)}, DCPReader(store))
    _save({"w": torch.arange(300000.0)}, DCPWriter(store))
    with pytest.raises(CheckpointException, match="no DCP commit labelled 'nope'"):
        _load({"w": torch.zeros(300000)}, DCPReader(store, label="nope"))
    with pytest.raises(CheckpointException, match="no DCP commit 9 in"):
        _load({"w": torch.zeros(300000)}, DCPReader(store, seq=9))
    # a commit claiming a huge item fails before anything is allocated
    key = store / COMMITS / "0000000001.json"
    doc = json.loads(key.read_text())
    good = json.dumps(doc)
    doc["items"][0]["nbytes"] = 2**60
    key.write_text(json.dumps(doc))
    with pytest.raises(CheckpointException, match="claims an item of"):
        _load({"w": torch.zeros(300000)}, DCPReader(store))
    key.write_text(good)
    # a flipped byte in an object is caught by its hash
    (obj,) = [p for p in (store / OBJECTS).rglob("*") if p.is_file()]
    data = bytearray(obj.read_bytes())
    data[-1] ^= 1
    obj.write_bytes(bytes(data))
    with pytest.raises(CheckpointException, match="does not match its hash"):
        _load({"w": torch.zeros(300000)}, DCPReader(store))
    with pytest.raises(NoCheckpointError):  # the reader's own error, outside dcp.load
        DCPReader(store, seq=9).read_metadata()
    with pytest.raises(CheckpointError, match="does not match its hash"):
        reader = DCPReader(store)
        reader.read_metadata()
        (item,) = reader.commit["items"]  # type: ignore[index]
        reader._item_bytes(item, {})


def test_a_commit_raced_by_another_writer_takes_the_next_free_place(tmp_path, monkeypatch) -> None:
    """The DCP commit retries under the Checkpointer's bound (save/order.py's ``COMMIT_TRIES``), listing the
    commits again at every try: places other writers took between the listing and the write are skipped at once;
    a store where every try is lost fails the save after ``COMMIT_TRIES`` tries, with no commit."""
    store = tmp_path / "store"
    writer = DCPWriter(store)
    real_put = writer.store.put
    lost: list[str] = []

    def racing_put(key: str, data: bytes | memoryview, create_only: bool = True) -> bool:
        if key.startswith(COMMITS) and not lost:  # two commits of another writer land first
            doc = json.loads(bytes(data))
            for seq in (1, 2):
                other = json.dumps({**doc, "seq": seq, "label": "other"}).encode()
                assert real_put(f"{COMMITS}{seq:010d}.json", other, create_only=True)
            lost.append(key)
            return False
        return real_put(key, data, create_only=create_only)

    monkeypatch.setattr(writer.store, "put", racing_put)
    _save({"w": torch.arange(10.0)}, writer, checkpoint_id="mine")
    assert lost == [f"{COMMITS}0000000001.json"]
    assert [(c.seq, c.label) for c in list_commits(store)] == [(1, "other"), (2, "other"), (3, "mine")]

    tries: list[str] = []

    def losing_put(key: str, data: bytes | memoryview, create_only: bool = True) -> bool:
        if key.startswith(COMMITS):
            tries.append(key)
            return False
        return real_put(key, data, create_only=create_only)

    monkeypatch.setattr(writer.store, "put", losing_put)
    with pytest.raises(CheckpointException, match=f"{COMMIT_TRIES} places were taken by other writers"):
        _save({"w": torch.arange(10.0)}, writer)
    assert len(tries) == COMMIT_TRIES
    assert len(list_commits(store)) == 3


def test_on_s3(tmp_path) -> None:
    with serving() as s3:
        s3.client().create_bucket(Bucket="dcp")
        url = "s3://dcp/runs/a"
        state = _state()
        writer = DCPWriter(url, endpoint_url=s3.endpoint)
        _save(state, writer)
        state["w"][-3:] -= 1e-3
        _save(state, writer)
        assert 0 < writer.last_written_bytes < 0.05 * writer.last_logical_bytes
        _same(state, _load(_zeros(state), DCPReader(url, endpoint_url=s3.endpoint)))
        assert [c.seq for c in list_commits(writer.store)] == [1, 2]


@pytest.mark.timeout(600)
def test_fsdp2_saved_at_4_ranks_loads_at_2_ranks_and_in_one_process(tmp_path) -> None:
    store = str(tmp_path / "store")

    def ranks(phase: str, world: int) -> str:
        r = subprocess.run(
            [
                sys.executable,
                "-W",
                "ignore",
                str(HERE / "_dcp_ranks.py"),
                phase,
                str(world),
                store,
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=280,
        )
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
        return r.stdout

    assert "exit codes [0, 0, 0, 0]" in ranks("save", 4)
    saved = json.loads((tmp_path / "save.json").read_text())
    (seq1, written1, logical1), (seq2, written2, logical2) = saved["first"], saved["second"]
    assert (seq1, seq2) == (1, 2) and logical1 == logical2
    # only the first layer's weight changed (a third of the state): its delta, the rest not written again
    assert 0 < written2 < 0.35 * written1, saved
    assert "exit codes [0, 0]" in ranks("load", 2)
    assert "single ok" in ranks("single", 1)


SAVE_CELL = """%%distributed
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from gpu_notebook.checkpoint.dcp import DCPReader, DCPWriter

def build(seed):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    full = {k: v.clone() for k, v in net.state_dict().items()}
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in (net[0], net[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net, full

net, full = build(0)
writer = DCPWriter(STORE)
dcp.save({"model": net.state_dict(), "step": 1}, storage_writer=writer)
"""

LOAD_CELL = """%%distributed -o dcp_ok
other, _ = build(1)
state = {"model": other.state_dict(), "step": 0}
dcp.load(state, storage_reader=DCPReader(STORE))
got = {k: v.full_tensor() for k, v in other.state_dict().items()}
all(torch.equal(got[k], full[k]) for k in full) and state["step"] == 1
"""


@pytest.mark.timeout(300)
def test_fsdp2_from_a_notebook_with_dcp_through_our_store(ip, shared, tmp_path) -> None:
    """The journey: %%distributed cells on the shared cluster shard a model with fully_shard, dcp.save it through
    DCPWriter, load it into a model built with other weights, and the notebook reads it in one process."""
    from IPython.utils.capture import capture_output

    store = str(tmp_path / "store")
    with capture_output() as cap:
        res = ip.run_cell(SAVE_CELL.replace("STORE", repr(store)))
    assert res.success, cap.stdout + cap.stderr
    with capture_output() as cap:
        res = ip.run_cell(LOAD_CELL.replace("STORE", repr(store)))
    assert res.success, cap.stdout + cap.stderr
    assert list(ip.user_ns["dcp_ok"]) == [True, True]
    with capture_output():
        assert ip.run_cell("%gpu_pull full").success
    full = ip.user_ns["full"]
    plain = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    state = {"model": plain.state_dict(), "step": 0}
    _load(state, DCPReader(store))
    assert all(torch.equal(state["model"][k], full[k]) for k in full) and state["step"] == 1
    assert [c.seq for c in list_commits(store)] == [1]
