"""The Checkpointer's option dataclasses: their defaults are the documented ones, the flat keywords and the
dataclasses make the same Checkpointer (the same bytes saved), and a keyword named wrong or given twice is a
TypeError."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_notebook import checkpoint
from gpu_notebook.checkpoint import (
    Checkpointer,
    DistributedOptions,
    PolicyOptions,
    RuntimeOptions,
    SaveOptions,
    StorageOptions,
)
from gpu_notebook.checkpoint.options import GROUPS, KEYWORDS, gather

DOCS = Path(__file__).resolve().parents[2] / "docs" / "checkpoint.md"

#: what a Checkpointer resolves its settings to (the attributes saves, restores and policies read)
RESOLVED = (
    "hash full_every max_restore_ratio chunk_bytes pack_bytes pack_max level on_busy every_steps every_minutes "
    "retries retry_backoff_s threads allow_pickle progress commit_timeout_s rank world_size sharded rng spread "
    "read_only on_preemption"
).split()


def _defaults(cls: type[Any]) -> dict[str, Any]:
    """Each field's default (made fresh where it is a factory's)."""
    return {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(cls)
    }


def _documented(cls: type[Any]) -> dict[str, Any]:
    """The defaults ``docs/checkpoint.md`` gives for ``cls``: its ``Name(field=value, ...)`` in the API table."""
    (args,) = re.findall(rf"\| `{cls.__name__}\(([^`]*)\)`", DOCS.read_text())
    call = ast.parse(f"f({args})", mode="eval").body
    assert isinstance(call, ast.Call)
    return {str(k.arg): ast.literal_eval(k.value) for k in call.keywords}


@pytest.mark.parametrize("cls", list(GROUPS.values()), ids=lambda c: c.__name__)
def test_defaults_are_the_documented_ones(cls: type[Any]) -> None:
    assert _defaults(cls) == _documented(cls)


def test_every_field_is_one_keyword_of_one_group() -> None:
    names = [f.name for cls in GROUPS.values() for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names))  # no setting in two groups: a keyword maps onto one place
    assert set(KEYWORDS) == set(names) - {"s3"}  # StorageOptions.s3 takes what no keyword names
    assert not set(KEYWORDS) & set(GROUPS)
    for group, cls in GROUPS.items():
        assert {n for n, g in KEYWORDS.items() if g == group} <= {f.name for f in dataclasses.fields(cls)}


def test_the_dataclasses_are_public_and_frozen() -> None:
    for cls in GROUPS.values():
        assert cls.__name__ in checkpoint.__all__ and getattr(checkpoint, cls.__name__) is cls
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(cls(), dataclasses.fields(cls)[0].name, None)
    code = "import sys; from gpu_notebook.checkpoint import SaveOptions; print('numpy' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False"  # as cheap to import as the package


def _resolved(ck: Checkpointer) -> dict[str, Any]:
    return {name: getattr(ck, name) for name in RESOLVED}


def test_defaults_flat_and_grouped_resolve_alike(tmp_path: Path) -> None:
    """No settings, every setting as a keyword at its default, and every group's dataclass as made: the same."""
    flat = {name: _defaults(GROUPS[group])[name] for name, group in KEYWORDS.items()}
    flat["preemption"] = None  # (no watcher thread: the same on a cloud VM)
    with (
        Checkpointer(tmp_path / "a", preemption=None) as plain,
        Checkpointer(tmp_path / "b", **flat) as keywords,
        Checkpointer(
            tmp_path / "c",
            **{g: cls() for g, cls in GROUPS.items() if g != "policy"},
            policy=PolicyOptions(preemption=None),
        ) as grouped,
    ):
        assert _resolved(plain) == _resolved(keywords) == _resolved(grouped)
        assert plain._options == keywords._options == grouped._options


def _run(ck: Checkpointer) -> list[tuple[Any, ...]]:
    """Five saves of a changing state; what each wrote."""
    torch.manual_seed(0)
    w, out = torch.randn(64, 1024), []
    for step in range(5):
        w[step] += 1.0
        info = ck.save({"w": w, "b": torch.full((3,), float(step)), "step": step}, block=True).result()
        assert info is not None
        out.append((info.id, info.step, info.is_base, info.new_bytes, info.restore_bytes, info.n_tensors))
    return out


def test_flat_keywords_and_dataclasses_save_the_same_bytes(tmp_path: Path) -> None:
    settings: dict[str, Any] = {
        "save": SaveOptions(full_every=3, delta_against="previous", chunk_mb=0.0625, pack_kb=16, level=3),
        "policy": PolicyOptions(every_steps=2, on_busy="skip", retries=1, preemption=None),
        "distributed": DistributedOptions(rank=0, world_size=1, rng=False),
        "storage": StorageOptions(),
        "runtime": RuntimeOptions(threads=2, reuse_buffers=True, progress=False, current=False),
    }
    flat = {k: v for opts in settings.values() for k, v in dataclasses.asdict(opts).items() if k != "s3"}
    with Checkpointer(tmp_path / "flat", **flat) as a, Checkpointer(tmp_path / "grouped", **settings) as b:
        assert a._options == b._options and _resolved(a) == _resolved(b)
        assert a.chunk_bytes == 2**16 and a.threads == 2 and a.on_busy == "skip" and not a.rng
        assert _run(a) == _run(b)
        # (which frames share a pack depends on the order the encoding threads finish: compare what is stored)
        stored = [sum(o.size for o in ck.store.list("objects/")) for ck in (a, b)]
        assert stored[0] == stored[1] > 0
        for info in a.list():
            got = a.restore(info.id), b.restore(info.id)
            assert torch.equal(got[0]["w"], got[1]["w"]) and torch.equal(got[0]["b"], got[1]["b"])
        assert checkpoint.current() is None or checkpoint.current() not in (a, b)  # current=False, both ways


def test_a_keyword_that_names_no_setting_is_a_type_error(tmp_path: Path) -> None:
    with pytest.raises(
        TypeError, match=r"unexpected keyword argument 'fulll_every' \(did you mean 'full_every'\?\)"
    ):
        Checkpointer(tmp_path, fulll_every=3)
    with pytest.raises(TypeError, match="only an s3:// store takes"):
        Checkpointer(tmp_path, region_name="eu-west-1")
    # an s3:// store takes it: S3Store's own keywords and its boto3 client's (credentials), as before
    got = gather("s3://bucket/run", {}, {"region_name": "eu-west-1", "level": 3, "endpoint_url": "http://x"})
    assert got.storage.s3 == {"region_name": "eu-west-1"} and got.storage.endpoint_url == "http://x"
    assert got.save.level == 3
    assert got.storage.store_keywords() == {"endpoint_url": "http://x", "region_name": "eu-west-1"}


def test_a_setting_given_twice_is_a_type_error(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"got level both as a keyword and in save=SaveOptions\(\.\.\.\)"):
        Checkpointer(tmp_path, save=SaveOptions(level=3), level=3)
    # the dataclass holds every setting of its group: a keyword of that group beside it is one of them twice
    with pytest.raises(TypeError, match=r"got every_minutes, on_busy both as a keyword and in policy="):
        Checkpointer(tmp_path, policy=PolicyOptions(every_steps=5), on_busy="skip", every_minutes=3)
    with pytest.raises(TypeError, match="region_name both as a keyword and in storage=StorageOptions"):
        gather("s3://bucket/run", {"storage": StorageOptions(endpoint_url="http://x")}, {"region_name": "r"})
    with pytest.raises(TypeError, match="endpoint_url is given twice"):
        StorageOptions(endpoint_url="http://x", s3={"endpoint_url": "http://y"})
    with pytest.raises(
        TypeError, match=r"Checkpointer\(save=\.\.\.\) takes a SaveOptions, not PolicyOptions"
    ):
        Checkpointer(tmp_path, save=PolicyOptions())  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())  # refused before the store was opened


@pytest.mark.parametrize(
    ("cls", "name", "value", "message"),
    [
        (SaveOptions, "full_every", 0, "full_every must be between 1 and"),
        (SaveOptions, "max_restore_ratio", 0.5, "max_restore_ratio must be >= 1"),
        (SaveOptions, "delta_against", "parent", "delta_against must be 'base' or 'previous'"),
        (PolicyOptions, "on_busy", "queue", "on_busy must be 'wait' or 'skip'"),
        (PolicyOptions, "on_preemption", "now", "on_preemption must be 'auto', 'full' or 'delta'"),
    ],
)
def test_values_are_checked_when_made_as_by_the_checkpointer(
    cls: type[Any], name: str, value: Any, message: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=message):
        cls(**{name: value})
    with pytest.raises(ValueError, match=message):
        Checkpointer(tmp_path, **{name: value})


def test_storage_options_never_show_credentials() -> None:
    opts = StorageOptions(endpoint_url="http://minio:9000", s3={"aws_secret_access_key": "SECRETSECRET"})
    assert "SECRETSECRET" not in repr(opts) and "aws_secret_access_key" in repr(opts)
    given = {"region_name": "r"}
    opts = StorageOptions(s3=given)
    given["region_name"] = "changed"
    assert opts.s3 == {"region_name": "r"}  # a copy of what was given
