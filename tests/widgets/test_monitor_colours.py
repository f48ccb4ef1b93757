"""Each GPU keeps one colour on every chart of the dashboard (utilisation, memory, power), with one legend."""

from __future__ import annotations

from collections import defaultdict

import pytest

from gpu_notebook.monitor import Monitor, NodeSampler
from gpu_notebook.testing.nvml import FakeNVML

pytest.importorskip("plotly")
pytest.importorskip("ipywidgets")


def _colours(w) -> dict[str, set]:
    by_name: dict[str, set] = defaultdict(set)
    for tr in w.fig.data:
        if tr.type == "scatter":
            by_name[tr.name].add(tr.line.color)
    return by_name


def test_every_gpu_has_one_colour_on_every_chart_and_one_legend_entry() -> None:
    from gpu_notebook.widgets import MonitorWidget

    samplers = [NodeSampler(f"node-{n}", nvml=FakeNVML(3), host=False) for n in range(2)]
    mon = Monitor(samplers=samplers, autopull=False).start()
    try:
        for s in samplers:
            s.tick()
        mon.pull()
        w = MonitorWidget(mon, autostart=False)
        scatters = [tr for tr in w.fig.data if tr.type == "scatter"]
        assert len(scatters) == 3 * 6  # utilisation, memory and power lines of 6 GPUs
        colours = _colours(w)
        assert len(colours) == 6
        for name, cs in colours.items():
            assert len(cs) == 1 and None not in cs, (name, cs)  # the same colour, set here, on every chart
        assert len({c for cs in colours.values() for c in cs}) == 6  # and one GPU's is not another's
        legend = [tr.name for tr in scatters if tr.showlegend is not False]
        assert sorted(legend) == sorted(colours)  # one legend: each GPU once
    finally:
        mon.stop()
