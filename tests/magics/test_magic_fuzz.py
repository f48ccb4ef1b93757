"""Every option of every magic fed nan, inf, negative, zero, huge, empty, unicode and quoted-with-spaces values:
a usage error or a correct result, never a traceback of ours, a hang (pytest-timeout) or a half-done action.

The magics run through a real IPython shell (``%load_ext gpu_notebook``) and start nothing: what would start
something (``Cluster.start``, a cloud plan, a monitor's samplers, a price refresh over the network, the local
doctor) is replaced by a spy that records its arguments and stops the magic there (:class:`Reached`), so a line
either fails its cell before anything starts, or reaches the action with values that make sense. After every
line, the kernel's registry (clusters, monitors, cost meters, policy watchers) is as it was: nothing is left
half-started. No cluster is current (a fresh manager), so magics that need one fail with our one-line
``NoClusterError`` once their arguments are checked.

``%gpu_checkpoint`` runs against a real store: a tmp folder with one small checkpoint, made current (``use``
fuzzes that folder). The coverage test fails when a magic gains an option this table does not know.
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import sys
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from gpu_notebook import _registry
from gpu_notebook.errors import GpuNotebookError
from gpu_notebook.magics import MAGICS

pytest.importorskip("plotly")
# a hang is a failure: each test takes seconds here; the whole file must stay under a minute in CI
pytestmark = pytest.mark.timeout(60)

#: magics this test does not cover yet, with the reason
NOT_COVERED: dict[str, str] = {}
#: where ``{store}`` in a line points: the fuzz's checkpoint store (set by the ``shell`` fixture)
CKPT_STORE: list[str] = []

#: the values every option is fed (each as the shell would quote it, and as typed, unquoted)
NASTY = [
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e308",
    "-1e308",
    "1e400",
    "99999999999999999999",
    "-5",
    "-1",
    "0",
    "0.0",
    "-0",
    "1e-320",
    "",
    " ",
    "é",
    "名前 空白",
    "a b",
    "'a b'",
    '"a b"',
    "'",
    '"',
    "\\",
    "--",
    "-x",
    "0-3",
    "3-0",
    "1,2",
    "1,2,",
    "0-99999999999",
    "all",
    "8",
    "2",
    "64M",
    "A100:8",
    "\t",
]
#: a magic's line ends at a line break: values are single lines
ONE_LINE = st.text(
    alphabet=st.characters(
        exclude_categories=("Cs",), exclude_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
    ),
    max_size=12,
)
#: numbers every numeric option must refuse
NOT_FINITE_OR_HUGE = {"nan", "NaN", "inf", "-inf", "1e308", "-1e308", "1e400", "99999999999999999999"}


@dataclass(frozen=True)
class Opt:
    """One option of one magic, where it applies."""

    magic: str  # gpu_cluster, distributed, ...
    prefix: str  # what comes before it: the subcommand and what that needs ("start --cloud aws --dry-run")
    flag: str  # --budget
    kind: str  # number (refuses NOT_FINITE_OR_HUGE and negatives), text, flag (takes no value), refused (any value)


def _cluster_opts() -> list[Opt]:
    from gpu_notebook.magics import _cluster

    out = []
    for command, opts in _cluster.OPTIONS.items():
        prefixes = {"scale": "scale 2", "use": "use x", "bench": "bench allreduce"}
        prefix = {**prefixes, "workshop": "workshop start w"}.get(command, command)
        for o in opts:
            p = prefix
            if command == "bench" and o.flag == "--steps":
                p = "bench scaling"
            if o.flag in {c.flag for c in _cluster.CLOUD_ARGS} - {"--cloud"}:
                cloud = {"--project": "gcp", "--namespace": "kubernetes"}.get(o.flag, "aws")
                p = (
                    f"start --cloud {cloud} --gpu A100:1 --dry-run"
                    if o.flag != "--gpu"
                    else "start --cloud aws"
                )
            out.append(Opt("gpu_cluster", p, o.flag, _kind(o)))
            aliases = [f for f in o.flags if f.startswith("--") and f != o.flag]  # --cluster, as --name
            out += [Opt("gpu_cluster", p, f, _kind(o)) for f in aliases]
    return out


def _kind(o: Any) -> str:
    if o.kwargs.get("help") == argparse.SUPPRESS:  # refused with a message naming the option to use
        return "refused"
    if o.kwargs.get("action") in ("store_true", "store_false"):
        return "flag"
    parser = o.kwargs.get("type")
    name = getattr(parser, "__name__", "")
    numeric = ("seconds", "minutes", "US dollars", "CPUs", "GPUs", "workers", "worker nodes", "iterations")
    numeric += ("steps", "rank", "lines", "percent", "size", "TCP port (0: any free one)", "checkpoints")
    return "number" if name in numeric else "text"


def _subcommand_opts(magic: str, module: Any) -> list[Opt]:
    return [Opt(magic, command, o.flag, _kind(o)) for command, opts in module.OPTIONS.items() for o in opts]


def _rank_opts() -> list[Opt]:
    from gpu_notebook.magics import _distributed

    out = []
    for o in _distributed.RANK_ARGS:
        out.append(Opt("distributed", "", o.flag, _kind(o)))
        out.append(Opt("gpu_run", "", o.flag, _kind(o)))
    for o in _distributed.RANK_SELECTION:
        out.append(Opt("gpu_push", "x", o.flag, _kind(o)))
        for alias in set(o.flags) - {o.flag}:  # --targets; -w, refused as --workers is
            out += [
                Opt(magic, p, alias, _kind(o))
                for magic, p in (("distributed", ""), ("gpu_run", ""), ("gpu_push", "x"))
            ]
    out += [
        Opt("distributed", "", "--out", "text"),
        Opt("distributed", "", "--max-result", "number"),
        Opt("distributed", "", "--noblock", "flag"),
        Opt("distributed", "", "--no-block", "flag"),
        Opt("distributed", "", "--output-ranks", "text"),
        Opt("gpu_result", "", "--timeout", "number"),
        Opt("gpu_result", "", "--cancel", "flag"),
        Opt("gpu_result", "", "--out", "text"),
        Opt("gpu_result", "", "", "text"),
        Opt("gpu_run", "", "--module", "flag"),
        Opt("gpu_pull", "x", "--rank", "number"),
        Opt("gpu_pull", "x", "--as", "text"),
        Opt("gpu_pull", "x", "--out", "text"),
        Opt("gpu_pull", "x", "-o", "text"),
        Opt("gpu_pull", "x", "--device", "flag"),
        Opt("gpu_push", "x", _distributed.CLUSTER.flag, _kind(_distributed.CLUSTER)),
        Opt("gpu_pull", "x", _distributed.CLUSTER.flag, _kind(_distributed.CLUSTER)),
        Opt("gpu_debug", "", "--rank", "number"),
        Opt("gpu_debug", "", "-r", "number"),
        Opt("gpu_debug", "", _distributed.CLUSTER.flag, _kind(_distributed.CLUSTER)),
        # the positionals: a value where the magic takes a name or a script
        Opt("gpu_push", "", "", "text"),
        Opt("gpu_pull", "", "", "text"),
        Opt("gpu_run", "", "", "text"),
        Opt("gpu_cluster", "use", "", "text"),
        Opt("gpu_cluster", "scale", "", "number"),
        Opt("gpu_cluster", "status", "", "text"),
    ]
    return out


def _checkpoint_opts() -> list[Opt]:
    from gpu_notebook.magics import _checkpoint

    prefix = {"diff": "diff c0000000000 latest", "use": "use {store}"}
    out = [
        Opt("gpu_checkpoint", prefix.get(command, command), o.flag, _kind(o))
        for command, opts in _checkpoint.OPTIONS.items()
        for o in opts
    ]
    # the positionals: a checkpoint id, a store
    return out + [Opt("gpu_checkpoint", c, "", "text") for c in ("show", "restore", "use")]


def every_option() -> list[Opt]:
    from gpu_notebook.magics import _cost, _monitor

    return (
        _cluster_opts()
        + _subcommand_opts("gpu_cost", _cost)
        + _subcommand_opts("gpu_monitor", _monitor)
        + _rank_opts()
        + _checkpoint_opts()
    )


OPTS = every_option()


class Reached(GpuNotebookError):
    """Raised by a spy: the magic got to its action (what would start something) with these values."""

    def __init__(self, what: str, values: dict[str, Any]) -> None:
        super().__init__(f"reached {what}")
        self.what = what
        self.values = values

    def _render_traceback_(self) -> list[str]:
        return [f"Reached: {self.what}"]


def _finite(values: dict[str, Any]) -> bool:
    return all(
        math.isfinite(v) and v >= 0 for v in values.values() if isinstance(v, (int, float)) and v is not True
    )


@pytest.fixture
def shell(ip, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, fresh_manager):
    """``ip`` with no cluster (a fresh manager) and spies in place of everything that would start something;
    a current checkpoint store with one small checkpoint."""
    import torch

    from gpu_notebook.catalog import _catalog
    from gpu_notebook.checkpoint import Checkpointer
    from gpu_notebook.cluster import _cluster
    from gpu_notebook.cluster.providers import cloud_spec
    from gpu_notebook.cluster.workshop import Workshop
    from gpu_notebook.magics import _cluster as cluster_magics
    from gpu_notebook.magics import _monitor as monitor_magics

    def start(self: Any, progress: Any = None) -> None:
        if self.options.get("cloud"):
            cloud_spec(self)  # what would be launched is a valid request
        raise Reached("Cluster.start", _cluster_values(self))

    def plan(self: Any) -> None:
        raise Reached("Cluster.plan", _cluster_values(self))

    def monitor_for(cluster: Any = None, **kwargs: Any) -> None:
        raise Reached("monitor_for", kwargs)

    def refresh(self: Any, **kwargs: Any) -> None:
        raise Reached("Catalog.refresh", {})

    def diagnose_local(*a: Any, **k: Any) -> None:
        raise Reached("diagnose_local", {})

    monkeypatch.setattr(_cluster.Cluster, "start", start)
    monkeypatch.setattr(_cluster.Cluster, "plan", plan)
    monkeypatch.setattr(monitor_magics, "monitor_for", monitor_for)
    monkeypatch.setattr(_catalog.Catalog, "refresh", refresh)
    monkeypatch.setattr(cluster_magics, "diagnose_local", diagnose_local)

    def workshop_start(cls: Any, name: str, **kwargs: Any) -> None:
        raise Reached("Workshop.start", {k: v for k, v in kwargs.items() if isinstance(v, (int, float))})

    monkeypatch.setattr(Workshop, "start", classmethod(workshop_start))
    ip.user_ns["x"] = 1  # %gpu_push x gets as far as needing a cluster
    mag = ip.magics_manager.registry["CheckpointMagics"]
    for attr, fresh in (("_used", None), ("_used_over", None), ("_opened", {})):
        monkeypatch.setattr(mag, attr, fresh)  # the store of an earlier `use` is not this test's
    ck = Checkpointer(tmp_path / "ck", preemption=None)
    ck.save({"w": torch.ones(4), "step": 0}, block=True)
    monkeypatch.setattr(sys.modules[__name__], "CKPT_STORE", [str(tmp_path / "ck")])
    yield ip
    ck.close()


def _cluster_values(c: Any) -> dict[str, Any]:
    values = {
        "workers": c.settings.resources.workers,
        "cpus_per_worker": c.settings.resources.cpus_per_worker,
        "gpus_per_worker": c.settings.resources.gpus_per_worker,
    }
    values.update({k: v for k, v in c.options.items() if isinstance(v, (int, float))})
    return {k: v for k, v in values.items() if v is not None}


def _registries() -> tuple[Any, ...]:
    """The per-cluster registries a magic may add to: monitors, cost meters, policy watchers."""
    return (_registry.monitors, _registry.cost_meters, _registry.policy_watchers)


def _state(shell: Any) -> tuple[Any, ...]:
    """What a magic may register: clusters, per cluster a monitor, a cost meter, a policy watcher; and the
    live views the magics keep (a cost view, a monitor dashboard)."""
    maps = _registries()
    views = [getattr(m, "_widgets", ()) for m in shell.magics_manager.registry.values()]
    return (
        tuple(id(c) for c in _registry.get_manager().list()),
        *(tuple(sorted(id(v) for v in m._items.values())) for m in maps),  # noqa: SLF001 - the test's view
        tuple(id(v) for vs in views for v in vs),
    )


def _ray_up() -> bool:
    ray = sys.modules.get("ray")  # not imported: not started
    return bool(ray is not None and ray.is_initialized())


def _line(opt: Opt, value: str, quoted: bool) -> str:
    token = shlex.quote(value) if quoted else value
    return " ".join(p for p in (opt.prefix, opt.flag, token if opt.kind != "flag" else "") if p)


def run(shell: Any, opt: Opt, line: str) -> tuple[str, BaseException | None]:
    """Run the line as a cell; fail the test unless it ended in a usage error, one of our one-line errors, a
    spy, or a result; and unless it left the registry as it was. Returns ('usage'|'ours'|'reached'|'ok')."""
    ray_before = _ray_up()
    # The registries are weak-keyed by cluster: an earlier test's cluster that the collector frees during this
    # cell would take its entries with it. Holding the keys keeps the comparison about what this cell did.
    held = [list(m._items.keys()) for m in _registries()]  # noqa: SLF001 - the test's view
    before = _state(shell)
    line = line.replace("{store}", CKPT_STORE[0]) if CKPT_STORE else line
    cell = f"%%{opt.magic} {line}\n1\n" if opt.magic == "distributed" else f"%{opt.magic} {line}"
    with capture_output() as cap:
        res = shell.run_cell(cell)
    exc = res.error_in_exec or res.error_before_exec
    shown = cap.stdout + cap.stderr
    assert "Traceback" not in shown and 'File "/' not in shown, (cell, shown)
    assert _state(shell) == before, f"{cell!r} left something registered"
    assert _ray_up() == ray_before, f"{cell!r} started Ray"
    del held
    if exc is None:
        return "ok", None
    if type(exc) is UsageError:
        assert shown.startswith("UsageError: ") and "Try %" in shown, (cell, shown)
        return "usage", exc
    if isinstance(exc, Reached):
        assert _finite(exc.values), (cell, exc.values)
        return "reached", exc
    assert isinstance(exc, GpuNotebookError) and hasattr(exc, "_render_traceback_"), (cell, repr(exc))
    return "ours", exc


_NEGATIVE = re.compile(r"-\d+(\.\d*)?(e\d+)?")


def _check(opt: Opt, value: str, outcome: str) -> None:
    """A number option refuses what is not finite, huge or negative (before anything starts); a refused option
    refuses every value."""
    v = value.strip()
    if opt.kind == "refused":
        assert outcome == "usage", (opt, value, outcome)
    if opt.kind == "number" and (v in NOT_FINITE_OR_HUGE or (_NEGATIVE.fullmatch(v) and float(v) != 0)):
        assert outcome == "usage", (opt, value, outcome)


def test_every_option_of_every_magic_is_fuzzed(ip) -> None:
    """The table covers each option each magic's usage lists (a new option must be added here)."""
    covered: dict[str, set[str]] = {}
    for o in OPTS:
        covered.setdefault(o.magic, set()).add(o.flag)
    for part in MAGICS:
        for name in part.line + part.cell:
            if name in NOT_COVERED:
                continue
            kind = "cell" if name in part.cell else "line"
            func = ip.magics_manager.magics[kind][name]
            flags = set(re.findall(r"(--[a-z][a-z-]*)", func.parser.format_usage()))
            assert flags <= covered.get(name, set()), (name, flags - covered.get(name, set()))
    assert set(NOT_COVERED) <= {n for p in MAGICS for n in p.line + p.cell}


def test_every_nasty_value_in_every_option(shell) -> None:
    """The whole matrix, once: each option, each value, quoted as a shell would and as typed."""
    seen = set()
    for opt in OPTS:
        for value in NASTY if opt.kind != "flag" else [""]:
            for quoted in (True, False):
                line = _line(opt, value, quoted)
                if (opt.magic, line) in seen:
                    continue
                seen.add((opt.magic, line))
                outcome, _ = run(shell, opt, line)
                _check(opt, value, outcome)


@settings(
    max_examples=150,
    deadline=None,
    database=None,  # nothing kept between runs: CI starts fresh, and the repository gets no .hypothesis/ examples
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_random_values_and_combinations(shell, data: st.DataObject) -> None:
    """Random text in one option, and a second option of the same subcommand with a nasty value."""
    opt = data.draw(st.sampled_from(OPTS))
    value = data.draw(st.one_of(st.sampled_from(NASTY), ONE_LINE))
    quoted = data.draw(st.booleans())
    line = _line(opt, value, quoted)
    others = [o for o in OPTS if o.magic == opt.magic and o.prefix == opt.prefix and o.flag and o != opt]
    if others and data.draw(st.booleans()):
        other = data.draw(st.sampled_from(others))
        line += " " + _line(
            Opt(other.magic, "", other.flag, other.kind), data.draw(st.sampled_from(NASTY)), True
        )
    outcome, _ = run(shell, opt, line)
    if line == _line(opt, value, quoted):
        _check(opt, value, outcome)
