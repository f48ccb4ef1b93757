"""Interrupt latency: the stop button on a ``%%distributed`` cell blocked in each kind of wait, now and before.

For each kind (``time.sleep``, ``queue.get``, ``Event.wait``, ``future.result``, ``Thread.join``, a DataLoader's
wait for its worker, and a busy Python loop as the reference every version could interrupt), a cell on 2 local
workers blocks in it; one second later the kernel is interrupted (``_thread.interrupt_main``, what the stop button
sends) and the time until the cell's report is back is measured, with whether the variable set before it survived.
"now": the sliced waits of ``gpu_notebook/distributed/_interruptible.py``; "before": the same cluster started with
``--env GPU_NOTEBOOK_INTERRUPTIBLE_WAITS=0`` (the waits as they were), where a blocked rank is given up on after
the interrupt grace (5 s) and the group is rebuilt, its state lost.

Run: ``python benchmarks/interrupt.py`` (about 3 minutes on 2 cores; ``--repeat N`` runs of each "now" case, the
median shown with its [min-max]; "before" runs once per kind, since each costs a rebuild).
"""

from __future__ import annotations

import _thread
import argparse
import statistics
import threading
import time

KINDS = {
    "busy loop (reference)": "while True:\n    sum(range(1000))",
    "time.sleep(600)": "time.sleep(600)",
    "queue.Queue().get()": "queue.Queue().get()",
    "threading.Event().wait()": "threading.Event().wait()",
    "Future().result()": "concurrent.futures.Future().result()",
    "Thread.join()": "t = threading.Thread(target=time.sleep, args=(600,), daemon=True); t.start(); t.join()",
    "DataLoader worker wait": (
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Slow(Dataset):\n"
        "    def __len__(self):\n"
        "        return 4\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(600)\n"
        "next(iter(DataLoader(Slow(), num_workers=1)))"
    ),
}
PRELUDE = "%%distributed\nimport concurrent.futures, queue, threading, time\n"


def _ip():  # type: ignore[no-untyped-def]
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gpu_notebook")
    return ip


def _quiet(ip, src: str):  # type: ignore[no-untyped-def]
    from IPython.utils.capture import capture_output

    with capture_output():
        return ip.run_cell(src)


def measure(ip, code: str) -> tuple[float, bool]:  # type: ignore[no-untyped-def]
    """(seconds from the interrupt to the cell's end, whether `keep` survived)."""
    _quiet(ip, "%%distributed\nkeep = 'me'\n")
    sent: list[float] = []

    def interrupt() -> None:
        sent.append(time.perf_counter())
        _thread.interrupt_main()

    timer = threading.Timer(1.0, interrupt)
    timer.start()
    res = _quiet(ip, PRELUDE + code + "\n")
    end = time.perf_counter()
    timer.cancel()
    assert res.error_in_exec is not None and sent, "the cell was not interrupted"
    kept = _quiet(ip, "%%distributed -o k\nkeep\n")
    ok = bool(kept.success) and list(ip.user_ns.get("k", [])) == ["me", "me"]
    return end - sent[0], ok


def run(repeat: int) -> dict[str, dict[str, tuple[list[float], bool]]]:
    ip = _ip()
    out: dict[str, dict[str, tuple[list[float], bool]]] = {"now": {}, "before": {}}
    for mode, env, n in (("now", "", repeat), ("before", " --env GPU_NOTEBOOK_INTERRUPTIBLE_WAITS=0", 1)):
        _quiet(ip, f"%gpu_cluster start --workers 2 --name bench-{mode}{env}")
        try:
            for kind, code in KINDS.items():
                runs = [measure(ip, code) for _ in range(n)]
                out[mode][kind] = ([t for t, _ in runs], all(ok for _, ok in runs))
                print(f"{mode:6s} {kind}: {statistics.median(t for t, _ in runs):.2f} s", flush=True)
        finally:
            _quiet(ip, "%gpu_cluster stop")
    return out


def table(out: dict[str, dict[str, tuple[list[float], bool]]]) -> str:
    rows = [
        "| blocked in | now: interrupt to report | state kept | before | state kept | before / now |",
        "| --- | ---: | :---: | ---: | :---: | ---: |",
    ]
    for kind in KINDS:
        now, now_ok = out["now"][kind]
        before, before_ok = out["before"][kind]
        m, b = statistics.median(now), statistics.median(before)
        rows.append(
            f"| {kind} | {m:.2f} s [{min(now):.2f}-{max(now):.2f}] | {'yes' if now_ok else 'no'} | {b:.2f} s | "
            f"{'yes' if before_ok else 'no'} | {b / m:.1f}x |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs of each 'now' case (default 3)")
    args = ap.parse_args()
    t0 = time.monotonic()
    out = run(max(1, args.repeat))
    print()
    print(table(out))
    print(f"\n{time.monotonic() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
