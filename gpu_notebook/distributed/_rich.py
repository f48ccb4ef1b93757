"""Rich output from ranks: ``display()``, images, HTML reprs and matplotlib figures, shown in the cell.

On a rank, a display (``display(df)``, ``IPython.display.Image``, a figure shown by ``plt.show()`` or left open
at the end of the cell) becomes a mime bundle (``text/plain``, ``text/html``, ``image/png``, ...; binary data
base64-encoded, as a kernel sends it) that is written into the rank's output capture as one marker
(:func:`publish`), so it travels with the rank's text, in order, through the same batched drain and the cell's
reply, and survives in the output spool of a rank that dies. Bounded: a bundle over :data:`MAX_BUNDLE_BYTES`
keeps only its ``text/plain`` with a note, and a cell sends at most :data:`MAX_BUNDLES` bundles per rank (the
others are counted in a note at the end of the cell).

matplotlib on a rank uses this module as its backend (``MPLBACKEND=module://gpu_notebook.distributed._rich``,
set when the worker starts unless the environment sets a backend): Agg drawing, ``plt.show()`` and the end of a
cell send every open figure as PNG and close it, as the notebook's inline backend does.

On the driver, :class:`Router` takes the bundles out of a rank's text (:func:`split`) and shows each one after a
``[rank N display]`` label; identical bundles from several ranks (the same mime data, the n-th of each rank's)
are shown once as ``[ranks 0-3 display]``, as identical values are. Where displays can be updated (a kernel),
a bundle is shown at once with its label as a display of its own, and the same bundle from another rank later
in the cell only updates the label. Elsewhere (a terminal, a background cell's view) the bundle and that rank's
later output are held up to :data:`HOLD_S` for the same bundle from the other ranks. It also keeps each
rank's ``\\r`` line (a tqdm bar) in a display of its own, updated in place, when a frontend can update displays.
``--output-ranks`` (:func:`output_ranks`) hides the other ranks' output in the cell; their lines still go to the
group's log (``%gpu_cluster logs``).
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import hashlib
import json
import os
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpu_notebook._display import fmt_bytes, format_ranks, rank_label

__all__ = [
    "HOLD_S",
    "MAX_BUNDLES",
    "MAX_BUNDLE_BYTES",
    "OutputFilter",
    "Router",
    "output_ranks",
    "publish",
    "publishing_to",
    "split",
]

#: the largest bundle a rank sends (its JSON, base64 data included); a larger one keeps only its text/plain
MAX_BUNDLE_BYTES = 2 * 2**20
#: the most bundles one rank sends in one cell; later ones are counted in a note at the end of the cell
MAX_BUNDLES = 200
#: how long the driver holds a rank's bundle (and that rank's later output) waiting for the same one from others
HOLD_S = 1.0

BACKEND = "module://gpu_notebook.distributed._rich"
_START = "\x00gpu_notebook:rich:"
_END = "\x00"
#: the bundle a rank sends when its code pauses in the debugger or runs on (``{"paused": bool}``; see _debug)
PAUSED_MIME = "application/vnd.gpu-notebook.debugger+json"
_MARKER = re.compile(re.escape(_START) + r"([A-Za-z0-9+/=]*)" + re.escape(_END))


# ---- on a rank --------------------------------------------------------------------------------------------
class _RankState:
    write: Callable[[str], None] | None = None
    sent = 0
    dropped = 0


_RANK = _RankState()


def install(write: Callable[[str], None]) -> None:
    """On a rank worker: send bundles into ``write`` (the output capture); matplotlib draws for us."""
    _RANK.write = write
    if not os.environ.get("MPLBACKEND"):
        os.environ["MPLBACKEND"] = BACKEND


def begin_cell() -> None:
    _RANK.sent = _RANK.dropped = 0


def end_cell() -> None:
    """At the end of a rank's cell: send the figures still open; say how many bundles were dropped."""
    show()
    if _RANK.dropped and _RANK.write is not None:
        _RANK.write(
            f"gpu_notebook: {_RANK.dropped} display(s) of this cell not sent (a rank sends at most "
            f"{MAX_BUNDLES} per cell)\n"
        )
    _RANK.sent = _RANK.dropped = 0


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mime, value in data.items():
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = base64.b64encode(bytes(value)).decode("ascii")
        out[str(mime)] = value
    return out


def plain(text: str) -> str:
    """``text`` with each rich output's marker as ``[display]``: what a rank's log file keeps of it."""
    return _MARKER.sub("[display]", text) if _START in text else text


def encode(bundle: dict[str, Any]) -> str:
    """The marker for ``bundle`` in a rank's text (the inverse of :func:`split`)."""
    raw = json.dumps(bundle, default=repr, separators=(",", ":")).encode()
    return _START + base64.b64encode(raw).decode("ascii") + _END


def publish(
    data: dict[str, Any],
    metadata: dict[str, Any] | None = None,
    transient: dict[str, Any] | None = None,
    update: bool = False,
) -> None:
    """Send a mime bundle from this rank to the cell (bounded; see the module docstring)."""
    if _RANK.write is None:  # not a rank worker
        return
    if _RANK.sent >= MAX_BUNDLES and not update:
        _RANK.dropped += 1
        return
    bundle: dict[str, Any] = {"data": _jsonable(data), "metadata": metadata or {}}
    if transient and transient.get("display_id"):
        bundle["display_id"], bundle["update"] = str(transient["display_id"]), bool(update)
    text = encode(bundle)
    if len(text) > MAX_BUNDLE_BYTES:
        plain = str(bundle["data"].get("text/plain", ""))[:10_000]
        kinds = ", ".join(m for m in bundle["data"] if m != "text/plain")
        note = (
            f"{plain}\n[{kinds} not sent: {fmt_bytes(len(text), unit='MiB')}, over "
            f"{fmt_bytes(MAX_BUNDLE_BYTES, binary=True)}]"
        )
        text = encode({"data": {"text/plain": note}, "metadata": {}})
    _RANK.sent += 0 if update else 1
    _RANK.write(text)


def rank_publisher(shell: Any) -> Any:
    """A display publisher for a rank's headless IPython shell: ``display()`` goes to :func:`publish`."""
    from IPython.core.displaypub import DisplayPublisher

    class RankDisplayPublisher(DisplayPublisher):  # type: ignore[misc]
        def publish(  # type: ignore[override]
            self,
            data: dict[str, Any],
            metadata: dict[str, Any] | None = None,
            source: Any = None,
            *,
            transient: dict[str, Any] | None = None,
            update: bool = False,
            **kwargs: Any,
        ) -> None:
            publish(data, metadata, transient, update)

        def clear_output(self, wait: bool = False) -> None:  # another rank's output is not ours to clear
            pass

    return RankDisplayPublisher(shell=shell, parent=shell)


# matplotlib backend (MPLBACKEND=module://gpu_notebook.distributed._rich): Agg canvases; show() sends PNGs
def __getattr__(name: str) -> Any:
    if name == "FigureCanvas":
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        globals()["FigureCanvas"] = FigureCanvasAgg  # matplotlib copies the module's globals
        return FigureCanvasAgg
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def show(*args: Any, **kwargs: Any) -> None:
    """``plt.show()`` on a rank: send every open figure as a PNG, then close them (the inline backend's way)."""
    import sys

    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or _RANK.write is None:
        return
    try:
        if plt.get_backend() != BACKEND:
            return
        import io

        from matplotlib._pylab_helpers import Gcf

        for manager in Gcf.get_all_fig_managers():
            fig = manager.canvas.figure
            buf = io.BytesIO()
            fig.savefig(buf, format="png", bbox_inches="tight")
            publish({"text/plain": repr(fig), "image/png": buf.getvalue()})
        plt.close("all")
    except Exception as exc:  # noqa: BLE001 - a figure that cannot be drawn must not fail the cell
        _RANK.write(f"gpu_notebook: a figure could not be sent: {type(exc).__name__}: {exc}\n")


# ---- on the driver -----------------------------------------------------------------------------------------
def split(text: str) -> list[str | dict[str, Any]]:
    """``text`` from a rank as its parts in order: text (str) and bundles (dict)."""
    if _START not in text:
        return [text]
    parts: list[str | dict[str, Any]] = []
    pos = 0
    for m in _MARKER.finditer(text):
        if m.start() > pos:
            parts.append(text[pos : m.start()])
        try:
            bundle = json.loads(base64.b64decode(m.group(1)))
            if not isinstance(bundle, dict) or not isinstance(bundle.get("data"), dict):
                raise ValueError("not a bundle")
            parts.append(bundle)
        except ValueError:  # cut by the capture's own truncation
            parts.append("[a display from this rank could not be read]\n")
        pos = m.end()
    if pos < len(text):
        parts.append(text[pos:])
    return parts


def summary(bundle: dict[str, Any]) -> str:
    """The line a bundle leaves in the log: ``<display: text/html, text/plain>``."""
    return f"<display: {', '.join(sorted(bundle.get('data', {})))}>"


@dataclass
class OutputFilter:
    """``--output-ranks``: the ranks whose output is shown in the cell, and what was hidden."""

    shown: frozenset[int]
    hidden_lines: dict[int, int] = field(default_factory=dict)
    hidden_displays: dict[int, int] = field(default_factory=dict)

    def note(self, cluster: str | None = None) -> str:
        ranks = sorted(set(self.hidden_lines) | set(self.hidden_displays))
        if not ranks:
            return ""
        lines, displays = sum(self.hidden_lines.values()), sum(self.hidden_displays.values())
        what = f"{lines:,} line(s)" + (f" and {displays} display(s)" if displays else "")
        one = f" --rank {ranks[0]}" if len(ranks) == 1 else ""
        return (
            f"output of ranks {format_ranks(ranks)} not shown ({what}; --output-ranks "
            f"{format_ranks(sorted(self.shown))}): %gpu_cluster logs{' ' + cluster if cluster else ''}{one} has it"
        )


_FILTER: contextvars.ContextVar[OutputFilter | None] = contextvars.ContextVar(
    "gnb_output_ranks", default=None
)
_PUBLISHER: contextvars.ContextVar[Callable[[dict[str, Any]], None] | None] = contextvars.ContextVar(
    "gnb_rich_publisher", default=None
)


@contextlib.contextmanager
def output_ranks(ranks: list[int] | None) -> Iterator[OutputFilter | None]:
    """Within this block (and the background cells it starts), show only ``ranks``' output (None: all)."""
    filt = OutputFilter(frozenset(ranks)) if ranks is not None else None
    token = _FILTER.set(filt)
    try:
        yield filt
    finally:
        _FILTER.reset(token)


def current_filter() -> OutputFilter | None:
    return _FILTER.get()


@contextlib.contextmanager
def publishing_to(publisher: Callable[[dict[str, Any]], None] | None) -> Iterator[None]:
    """Within this block, bundles from ranks go to ``publisher`` (a background cell's view), not the kernel."""
    token = _PUBLISHER.set(publisher)
    try:
        yield
    finally:
        _PUBLISHER.reset(token)


def _shell() -> Any:
    import sys

    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    return get_ipython()


def _can_update() -> bool:
    """Whether displays can be updated in place here: a kernel, or a publisher that keeps outputs (capture)."""
    shell = _shell()
    if shell is None:
        return False
    if getattr(shell, "kernel", None) is not None:
        return True
    from IPython.core.displaypub import DisplayPublisher

    return type(shell.display_pub) is not DisplayPublisher


def _digest(bundle: dict[str, Any]) -> str:
    """What makes two displays the same: their data, but for ``text/plain`` when there is a richer type (a
    frontend shows that one; the default repr of an object names its address, different on every rank)."""
    data = dict(bundle.get("data") or {})
    if len(data) > 1:
        data.pop("text/plain", None)
    return hashlib.sha1(json.dumps(data, sort_keys=True, default=repr).encode()).hexdigest()


@dataclass
class _Group:
    key: tuple[str, int]
    bundle: dict[str, Any]
    first_at: float
    ranks: set[int] = field(default_factory=set)


class Router:
    """The driver's side for one cell: bundles shown once per identical group, held briefly (see the module).

    ``write(rank, lines)`` writes a rank's complete lines to the cell; ``sink`` is the cell's text sink (for the
    labels, and for bundles where there is no IPython).
    """

    def __init__(
        self, ranks: list[int], sink: Callable[[str], None], write: Callable[[int, list[str]], None]
    ) -> None:
        self.ranks = list(ranks)
        self.sink = sink
        self.write = write
        self.publisher = _PUBLISHER.get()
        self.queue: dict[int, deque[tuple[str, Any]]] = {}
        self.groups: dict[tuple[str, int], _Group] = {}
        self.count: dict[tuple[int, str], int] = {}
        self.merged: dict[
            tuple[str, int], tuple[list[int], str]
        ] = {}  # shown bundles: ranks, label's display
        self.handles: dict[tuple[int, str], str] = {}  # (rank, the rank's display id) -> the cell's
        self.live: dict[int, Any] = {}  # rank -> the display showing its \r line
        self.done: set[int] = set()
        self._can_update: bool | None = None

    def held(self, rank: int) -> bool:
        return bool(self.queue.get(rank))

    def lines(self, rank: int, lines: list[str]) -> None:
        if self.held(rank):
            self.queue[rank].append(("lines", lines))
        else:
            self.write(rank, lines)

    def bundle(self, rank: int, bundle: dict[str, Any]) -> None:
        if self.updates_in_place() and "display_id" not in bundle:
            self._show_or_merge(rank, bundle)
            return
        if "display_id" in bundle:  # a display the rank updates: its own, never merged with another rank's
            self.queue.setdefault(rank, deque()).append(("own", bundle))
        else:
            digest = _digest(bundle)
            n = self.count.get((rank, digest), 0)
            self.count[(rank, digest)] = n + 1
            group = self.groups.setdefault((digest, n), _Group((digest, n), bundle, time.monotonic()))
            group.ranks.add(rank)
            self.queue.setdefault(rank, deque()).append(("rich", group))
        self.release()

    def finish(self, rank: int) -> None:
        self.done.add(rank)
        self.release(force=all(r in self.done for r in self.ranks))

    def release(self, force: bool = False) -> None:
        """Write what no longer waits: text at a queue's head, groups that are complete or waited long enough."""
        now = time.monotonic()
        moved = True
        while moved:
            moved = False
            for rank in list(self.queue):
                q = self.queue[rank]
                while q:
                    kind, item = q[0]
                    if kind == "lines":
                        q.popleft()
                        self.write(rank, item)
                    elif kind == "own":
                        q.popleft()
                        self._show_own(rank, item)
                    else:
                        heads = [r for r, rq in self.queue.items() if rq and rq[0][1] is item]
                        every = all(r in item.ranks or r in self.done for r in self.ranks)
                        ready = every and len(heads) == len(item.ranks)
                        if not (force or ready or now - item.first_at >= HOLD_S):
                            break
                        self._show(sorted(heads), item.bundle)
                        for r in heads:
                            self.queue[r].popleft()
                        item.ranks.difference_update(heads)  # copies still behind other output: later
                        moved = True
                        continue
                if not q:
                    del self.queue[rank]

    def _show_or_merge(self, rank: int, bundle: dict[str, Any]) -> None:
        """Where displays can be updated: show a bundle at once, its label a display of its own; the same
        bundle from another rank later in the cell only adds that rank to the label."""
        from IPython.display import publish_display_data

        digest = _digest(bundle)
        n = self.count.get((rank, digest), 0)
        self.count[(rank, digest)] = n + 1
        shown = self.merged.get((digest, n))
        if shown is not None and rank not in shown[0]:
            shown[0].append(rank)
            label = self._label(sorted(shown[0])).rstrip("\n")
            publish_display_data({"text/plain": label}, transient={"display_id": shown[1]}, update=True)
            return
        label_id = f"gpu-notebook-label-{uuid.uuid4().hex[:12]}"
        self.merged[(digest, n)] = ([rank], label_id)
        label = self._label([rank]).rstrip("\n")
        publish_display_data({"text/plain": label}, transient={"display_id": label_id})
        publish_display_data(bundle["data"], bundle.get("metadata") or None)

    def _label(self, ranks: list[int]) -> str:
        return f"[{rank_label(ranks)} display]\n"

    def _show(
        self, ranks: list[int], bundle: dict[str, Any], transient: dict[str, Any] | None = None
    ) -> None:
        if not ranks:
            return
        self.sink(self._label(ranks))
        if self.publisher is not None:
            self.publisher({**bundle, "ranks": ranks})
            return
        shell = _shell()
        if shell is None:
            text = str(bundle["data"].get("text/plain", summary(bundle)))
            self.sink("".join(f"[rank {ranks[0]}] {line}\n" for line in text.splitlines()))
            return
        from IPython.display import publish_display_data

        publish_display_data(bundle["data"], bundle.get("metadata") or None, transient=transient)

    def _show_own(self, rank: int, bundle: dict[str, Any]) -> None:
        key = (rank, str(bundle["display_id"]))
        if key not in self.handles:
            self.handles[key] = f"gpu-notebook-rank{rank}-{bundle['display_id']}"
            self._show([rank], bundle, {"display_id": self.handles[key]})
        elif self.publisher is None and _shell() is not None:
            from IPython.display import publish_display_data

            publish_display_data(
                bundle["data"],
                bundle.get("metadata") or None,
                transient={"display_id": self.handles[key]},
                update=True,
            )

    # ---- a rank's line redrawn with \r (a tqdm bar): a display of its own per rank -------------------------
    def updates_in_place(self) -> bool:
        if self._can_update is None:
            self._can_update = self.publisher is None and _can_update()
        return self._can_update

    def show_live(self, rank: int, text: str) -> None:
        """Show ``text`` as ``rank``'s line being redrawn, in its own display (created on first use)."""
        from IPython.display import DisplayHandle

        handle = self.live.get(rank)
        if handle is None:
            handle = self.live[rank] = DisplayHandle()
            handle.display(_Text(text))
        else:
            handle.update(_Text(text))

    def end_live(self, rank: int, text: str) -> bool:
        """The redrawn line ended as ``text``: its display shows it for good. False if it had no display."""
        handle = self.live.pop(rank, None)
        if handle is None:
            return False
        handle.update(_Text(text))
        return True


class _Text:
    """Plain text as a display shows it (no quotes, unlike a str's repr)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def view_html(bundle: dict[str, Any]) -> str:
    """A bundle as HTML, for a background cell's view (images inline, HTML as is, else its text)."""
    import html

    data = bundle.get("data", {})
    ranks = bundle.get("ranks") or []
    who = rank_label(ranks) if ranks else "rank ?"
    caption = f"<div style='font-size:smaller;color:#666'>[{who} display]</div>"
    for mime in ("image/png", "image/jpeg"):
        if isinstance(data.get(mime), str):
            return f"{caption}<img src='data:{mime};base64,{data[mime]}'/>"
    if "image/svg+xml" in data:
        return caption + str(data["image/svg+xml"])
    if "text/html" in data:
        return caption + str(data["text/html"])
    return f"{caption}<pre>{html.escape(str(data.get('text/plain', '')))}</pre>"
