"""Should a rank run its cells through a headless IPython ``InteractiveShell``? What it costs, measured.

Prints, in fresh processes of this Python (a rank is one): the time to import IPython and to create a headless
shell (history in memory), and the median per-cell time of a trivial cell (``x = 1``, and ``x`` as a value)
run three ways: the rank's own exec (parse, split off the last expression, compile, exec/eval, as
``RankWorker.run_cell`` does), ``InteractiveShell.run_cell`` (silent, no history), and IPython's input
transformation (``transform_cell``, what turns ``!ls`` and ``%time`` into Python) followed by the rank's exec.

Usage: .venv/bin/python benchmarks/rank_shell.py [--reps 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import ast, json, sys, time
    t0 = time.perf_counter()
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config
    t1 = time.perf_counter()
    cfg = Config()
    cfg.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell(config=cfg)
    t2 = time.perf_counter()
    ns = shell.user_ns
    REPS = int(sys.argv[1])

    def ours(code):
        tree = ast.parse(code, "<cell>", "exec")
        tail = tree.body[-1] if tree.body else None
        last = None
        if isinstance(tail, ast.Expr):
            tree.body.pop()
            last = ast.Expression(tail.value)
        exec(compile(tree, "<cell>", "exec"), ns)
        return eval(compile(last, "<cell>", "eval"), ns) if last is not None else None

    def median_us(fn, code):
        for _ in range(20):
            fn(code)
        times = []
        for _ in range(REPS):
            a = time.perf_counter(); fn(code); times.append(time.perf_counter() - a)
        times.sort()
        return times[len(times) // 2] * 1e6

    out = {"import_s": t1 - t0, "create_s": t2 - t1}
    for code in ("x = 1\\n", "x = 1\\nx\\n"):
        out[code] = {
            "exec": median_us(ours, code),
            "run_cell": median_us(lambda c: shell.run_cell(c, store_history=False, silent=True), code),
            "transform+exec": median_us(lambda c: ours(shell.transform_cell(c)), code),
        }
    print(json.dumps(out))
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200, help="cells timed per way, per round")
    parser.add_argument("--rounds", type=int, default=5, help="fresh processes (the medians are over rounds)")
    args = parser.parse_args()
    rounds = []
    for _ in range(args.rounds):
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, str(args.reps)], capture_output=True, text=True, check=True
        )
        rounds.append(json.loads(proc.stdout.strip().splitlines()[-1]))

    def med(get):
        return statistics.median(get(r) for r in rounds)

    print(f"IPython {_ipython_version()}, Python {sys.version.split()[0]}, {args.rounds} fresh processes")
    print(f"  import IPython:              {med(lambda r: r['import_s']) * 1e3:8.1f} ms")
    print(f"  create a headless shell:     {med(lambda r: r['create_s']) * 1e3:8.1f} ms")
    for code in ("x = 1\n", "x = 1\nx\n"):
        print(f"  per cell {code!r} (median of {args.reps}):")
        for way in ("exec", "run_cell", "transform+exec"):
            print(f"    {way:16s} {med(lambda r, w=way, c=code: r[c][w]):8.1f} us")


def _ipython_version() -> str:
    import IPython

    return IPython.__version__


if __name__ == "__main__":
    main()
