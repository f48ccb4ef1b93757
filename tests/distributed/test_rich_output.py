"""Rich output from ranks (real ranks of the shared gloo cluster): ``display()`` of HTML reprs and a pandas
DataFrame, images, and tqdm bars come to the cell with rank labels; identical displays of both ranks are shown
once; ``--output-ranks 0`` hides rank 1's output (kept for ``%gpu_cluster logs``); a background cell keeps and
shows them too.

A rank's ``display()`` used to print the object's text form into the rank's output, and the ranks' tqdm
redraws shared one line while they ran.
"""

from __future__ import annotations

import pytest
from IPython.utils.capture import capture_output

pytestmark = pytest.mark.timeout(240)

# the same table and DataFrame on both ranks (shown once), a different image on each (shown once per rank)
_CELL = """
import pandas as pd
from IPython.display import Image
class Table:
    def _repr_html_(self):
        return "<table><tr><td>same on every rank</td></tr></table>"
display(Table())
display(pd.DataFrame({"loss": [0.5, 0.25]}))
try:  # a figure where matplotlib is installed (the ranks' backend sends it as a PNG), else PNG bytes
    import matplotlib.pyplot as plt
except ImportError:
    display(Image(data=b"\\x89PNG\\r\\n\\x1a\\n" + bytes([rank]) * 32, format="png"))
else:
    plt.plot([0, rank + 1])
    plt.show()
print(f"printed by {rank}")
"""

_TQDM = """
import time
from tqdm.auto import tqdm
for _ in tqdm(range(25), desc=f"bar{rank}", mininterval=0):
    time.sleep(0.03)
tqdm.__module__
"""


def _labels(cap):
    """The rank labels of displays, as last updated (each is a display of its own)."""
    final: dict[str, str] = {}
    for o in cap.outputs:
        text, did = o.data.get("text/plain", ""), (o.transient or {}).get("display_id")
        if did and text.endswith(" display]"):
            final[did] = text
    return sorted(final.values())


def _displays(cap):
    """(mime data, transient) of every display published in ``cap``."""
    return [(o.data, o.transient or {}) for o in cap.outputs]


def test_displays_from_ranks_labelled_deduplicated_filtered_and_tqdm_in_place(ip, shared):
    with capture_output() as cap:
        ip.run_cell_magic("distributed", "", _CELL)
    shown = [data for data, _ in _displays(cap)]
    tables = [d for d in shown if "same on every rank" in d.get("text/html", "")]
    frames = [d for d in shown if "loss" in d.get("text/html", "")]
    images = sorted(d["image/png"] for d in shown if "image/png" in d)
    assert len(tables) == 1 and len(frames) == 1, shown  # identical on both ranks: once
    assert len(images) == 2 and images[0] != images[1]  # different: once per rank
    # the table and the DataFrame once, naming both ranks; an image per rank
    assert _labels(cap) == [
        "[rank 0 display]",
        "[rank 1 display]",
        "[ranks 0-1 display]",
        "[ranks 0-1 display]",
    ]
    assert "[rank 0] printed by 0" in cap.stdout and "[rank 1] printed by 1" in cap.stdout
    assert "Table object" not in cap.stdout  # no longer printed as text by the rank

    shared.log.clear()
    with capture_output() as cap:
        ip.run_cell_magic("distributed", "--output-ranks 0", _CELL)
    shown = [data for data, _ in _displays(cap)]
    assert len([d for d in shown if "image/png" in d]) == 1 and "[rank 1" not in cap.stdout
    assert _labels(cap) == ["[rank 0 display]"] * 3 and "[rank 0] printed by 0" in cap.stdout
    assert "output of ranks 1 not shown (1 line(s) and 3 display(s)" in cap.stderr
    assert "%gpu_cluster logs --rank 1" in cap.stderr
    with capture_output() as cap:
        ip.run_line_magic("gpu_cluster", "logs --rank 1 --tail 10")
    assert "printed by 1" in cap.stdout and "<display: image/png, text/plain>" in cap.stdout

    with capture_output() as cap:
        ip.run_cell_magic("distributed", "", _TQDM)
    assert (
        "Out[ranks 0-1]: 'tqdm.asyncio'" in cap.stdout
    )  # tqdm.auto on a rank: the text bar, not tqdm.notebook
    ids: dict[int, set[str]] = {0: set(), 1: set()}
    last: dict[int, str] = {}
    for data, transient in _displays(cap):
        for rank in (0, 1):
            if data.get("text/plain", "").startswith(f"[rank {rank}] bar{rank}"):
                ids[rank].add(transient["display_id"])
                last[rank] = data["text/plain"]
    assert all(len(ids[r]) == 1 for r in (0, 1)) and ids[0] != ids[1], ids  # one display per rank
    assert all("25/25" in last[r] for r in (0, 1)), last  # each updated to its final line
    assert "\r[rank" not in cap.stdout  # no redraws sharing one line


def test_a_background_cell_keeps_and_shows_its_rich_output(ip, shared):
    with capture_output() as cap:
        bg = ip.run_cell_magic("distributed", "--noblock", _CELL)
        assert bg.wait(120), bg
    assert bg.state == "done", repr(bg)
    assert len(bg.displays) == 4  # the table and the DataFrame once, an image per rank
    view = bg._repr_html_()
    assert "same on every rank" in view and view.count("data:image/png;base64,") == 2
    assert "[ranks 0-1 display]" in view and "printed by 1" in view
    assert len([o for o in cap.outputs if "image/png" in o.data]) == 2  # outside a kernel: published too


def test_a_rank_sends_bounded_displays_and_says_what_it_dropped(monkeypatch):
    from gpu_notebook.distributed import _rich

    sent: list[str] = []
    monkeypatch.setattr(_rich._RANK, "write", sent.append)
    _rich.begin_cell()
    _rich.publish({"text/plain": "<big image>", "image/png": b"\x00" * (_rich.MAX_BUNDLE_BYTES + 1)})
    (big,) = _rich.split(sent.pop())
    assert isinstance(big, dict) and list(big["data"]) == ["text/plain"]
    assert big["data"]["text/plain"].startswith("<big image>\n[image/png not sent: ")
    for i in range(_rich.MAX_BUNDLES + 5):
        _rich.publish({"text/plain": str(i)})
    _rich.end_cell()
    assert len(sent) == _rich.MAX_BUNDLES  # the big one counted too
    assert (
        sent[-1]
        == f"gpu_notebook: 6 display(s) of this cell not sent (a rank sends at most {_rich.MAX_BUNDLES} per cell)\n"
    )
