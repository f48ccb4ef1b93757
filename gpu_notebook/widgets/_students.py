"""The teacher's live view of a workshop: each student's workers, usage, utilisation, cost and state.

:class:`StudentsWidget` is a cached view of a :class:`~gpu_notebook.cluster.workshop.Workshop`: a stock
ipywidgets ``HTML`` table that a daemon thread refreshes every few seconds (only when it changed), above a row
to stop one student or all. Its mime bundle carries the same table as static ``text/html`` and as
``text/plain``, so a saved notebook, VS Code without the widget manager or GitHub show the last numbers.
Without ipywidgets, :func:`students_view` returns the static report instead.
"""

from __future__ import annotations

import time
from typing import Any

from gpu_notebook.widgets._live import LiveView, RateCap

__all__ = ["StudentsWidget", "students_view"]


class StudentsWidget(LiveView):
    """Live view of a workshop's students, with stop buttons.

    Parameters
    ----------
    workshop
        The :class:`~gpu_notebook.cluster.workshop.Workshop` to show.
    interval
        Seconds between refreshes (default 3).
    autostart
        Start the refresh thread now (default True).

    Examples
    --------
    In [1]: StudentsWidget(Workshop.connect("ml101")).show()
    """

    thread_name = "gpu_notebook-live-students"

    def __init__(self, workshop: Any, *, interval: float = 3.0, autostart: bool = True) -> None:
        import ipywidgets as W

        self.workshop = workshop
        self.interval = max(0.5, float(interval))
        self._init_live(RateCap(4.0, time.monotonic))
        self._report: Any = None
        self._html = ""
        self.table = W.HTML(value="")
        self.who = W.Text(placeholder="student ID", layout=W.Layout(width="160px"))
        self.stop_one = W.Button(description="stop student", button_style="warning")
        self.stop_every = W.Button(description="stop all", button_style="danger")
        self.note = W.HTML(value="")
        self.stop_one.on_click(lambda _: self._stop_clicked(self.who.value.strip()))
        self.stop_every.on_click(lambda _: self._stop_clicked(None))
        self.box = W.VBox([self.table, W.HBox([self.who, self.stop_one, self.stop_every, self.note])])
        self.box.add_class("gpu-notebook-students")
        for w in (self.table, self.note, self.box):
            self._count(w)
        self.refresh(force=True)
        if autostart:
            self.start()

    def _parts(self) -> tuple[Any, ...]:
        return (self.table, self.who, self.stop_one, self.stop_every, self.note, self.box)

    def _stop_clicked(self, student: str | None) -> None:
        try:
            if student is None:
                msgs = self.workshop.stop_all()
                self.note.value = f"{len(msgs)} student group(s) stopping"
            elif student:
                self.note.value = self.workshop.stop_student(student)
        except Exception as exc:  # noqa: BLE001 - a button's failure is shown beside it, never raised into a cell
            self.note.value = f"<span style='color:#c0392b'>{exc}</span>"
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> bool:
        """Fetch the students from the broker and send the table if it changed."""
        with self._lock:
            try:
                self._report = self.workshop.students()
                html = self._report._repr_html_()
            except Exception as exc:  # noqa: BLE001 - the broker gone is shown, not raised into a cell
                html = f"<div>workshop {self.workshop.name!r}: {exc}</div>"
            if html == self._html and not force:
                return False
            if not force and not self.rate.allows(1):
                return False
            self._html = html
            self.table.value = html
            return True

    def snapshot_html(self) -> str:
        return self._html

    def snapshot_text(self) -> str:
        return self._report.text() if self._report is not None else self._text_plain()

    def _text_plain(self) -> str:
        return (
            self.snapshot_text() if self._report is not None else f"<StudentsWidget {self.workshop.name!r}>"
        )

    def show(self) -> Any:
        """Display the view (a stop leaves its last table behind)."""
        return self._show()


def students_view(workshop: Any, **kwargs: Any) -> Any:
    """A live :class:`StudentsWidget`, or the workshop's static report where ipywidgets is missing."""
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return workshop.students()
    return StudentsWidget(workshop, **kwargs)
