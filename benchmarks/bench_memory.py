"""Anonymous memory and wall time of `allocsim replay` and `allocsim info` as a trace grows.

Each command runs in a fresh subprocess (``python -m allocsim ... --json``, output
discarded) on `allocsim synth alloc-heavy` traces of about 1M and 10M events,
generated into a temporary folder (``--dir``), not the repository. Memory is the
peak of ``RssAnon`` (/proc/self/status: anonymous pages only; the trace's memmap
pages are file-backed and not counted), sampled every 2 ms by a thread in the child,
minus nothing: it includes the interpreter and its imports (about the same in every
run; the ``import`` row shows it). The last column is the 10M/1M ratio (target <= 1.5).

``--huge 1e8`` then streams a trace of that many events to the folder (4 GB at 10^8;
`synth` writes it a block at a time), replays it once per ``--huge-only`` command, one
at a time, prints each one's peak RssAnon, peak RSS (``VmHWM``: the memmap's file pages
too, which the kernel can drop under pressure) and wall time, and deletes the trace.

    python3 benchmarks/bench_memory.py [--events 1000000,10000000] [--dir /tmp/x] [--only replay-split,info]
    python3 benchmarks/bench_memory.py --only info --huge 1e8 [--huge-only replay-split,replay-torch]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Runs in the child: sample RssAnon on a thread, run the CLI, print {"rss_anon": bytes, "hwm": bytes, "seconds": s}.
CHILD = r"""
import os, sys, threading, time
def anon(field="RssAnon:"):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
peak = [anon()]
stop = threading.Event()
def sample():
    while not stop.wait(0.002):
        peak[0] = max(peak[0], anon())
threading.Thread(target=sample, daemon=True).start()
t0 = time.perf_counter()
argv = sys.argv[1:]
if argv:
    from allocsim.cli import main
    out = sys.stdout
    sys.stdout = open(os.devnull, "w")
    rc = main(argv)
    sys.stdout = out
else:
    import allocsim, numpy
    rc = 0
secs = time.perf_counter() - t0
stop.set()
peak[0] = max(peak[0], anon())
print('{"rss_anon": %d, "hwm": %d, "seconds": %.4f, "rc": %d}' % (peak[0], anon("VmHWM:"), secs, rc))
"""

COMMANDS = {
    "import": [],
    "info": ["info", "{trace}", "--json"],
    **{f"replay-{p}": ["replay", "{trace}", "--policy", p, "--json", "--quiet"]
       for p in ("split", "torch", "bestfit", "binned", "cupy")},
}


def make_trace(folder: str, events: int) -> str:
    """An alloc-heavy trace of ``events`` events (two per allocation), made once per folder."""
    path = os.path.join(folder, f"alloc-heavy-{events}.bin")
    if not os.path.exists(path):
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        subprocess.run([sys.executable, "-m", "allocsim", "synth", "alloc-heavy", "-o", path, "-q",
                        "--param", f"n_allocs={events // 2}"], check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    return path


def measure(args: list[str], trace: str) -> dict:
    """Peak anonymous memory and seconds of one command in a fresh interpreter."""
    argv = [a.format(trace=trace) for a in args]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, cwd=ROOT, env=env)
    if p.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", default="1000000,10000000", help="comma-separated trace sizes (events)")
    ap.add_argument("--dir", help="folder for the generated traces (default: a fresh temporary one)")
    ap.add_argument("--only", help="comma-separated rows: " + ", ".join(COMMANDS))
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    ap.add_argument("--huge", type=float, help="then replay one trace of this many events (e.g. 1e8), and delete it")
    ap.add_argument("--huge-only", default="replay-split,replay-torch", help="the rows run on the --huge trace")
    args = ap.parse_args(argv)
    sizes = [int(float(x)) for x in args.events.split(",")]
    names = args.only.split(",") if args.only else list(COMMANDS)
    folder = args.dir or tempfile.mkdtemp(prefix="allocsim-mem-")
    os.makedirs(folder, exist_ok=True)
    results = {"events": sizes, "rows": table(names, sizes, folder)}
    if args.huge:
        results["huge"] = huge(int(args.huge), args.huge_only.split(","), folder)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def table(names: list[str], sizes: list[int], folder: str) -> dict:
    """The rows: each command on each trace size, with the last/first memory ratio."""
    traces = {n: make_trace(folder, n) for n in sizes}
    print(f"{'command':16}" + "".join(f" {f'{n / 1e6:g}M MiB':>9} {'s':>6}" for n in sizes) + f" {'ratio':>6}")
    rows = {}
    for name in names:
        rows[name] = [measure(COMMANDS[name], traces[n]) for n in sizes]
        cells = "".join(f" {r['rss_anon'] / 2**20:9.1f} {r['seconds']:6.2f}" for r in rows[name])
        ratio = rows[name][-1]["rss_anon"] / rows[name][0]["rss_anon"]
        print(f"{name:16}{cells} {ratio:6.2f}", flush=True)
    return rows


def huge(events: int, names: list[str], folder: str) -> dict:
    """Stream a trace of ``events`` events to ``folder``, run each of ``names`` on it once, delete it."""
    t0 = time.perf_counter()
    path = make_trace(folder, events)
    made = time.perf_counter() - t0
    print(f"\n{events / 1e6:g}M events: {os.path.getsize(path) / 2**30:.2f} GiB, synth {made:.0f} s")
    print(f"{'command':16} {'RssAnon MiB':>12} {'peak RSS MiB':>13} {'s':>8}")
    rows = {"synth_seconds": made, "bytes": os.path.getsize(path)}
    try:
        for name in names:
            r = rows[name] = measure(COMMANDS[name], path)
            print(f"{name:16} {r['rss_anon'] / 2**20:12.1f} {r['hwm'] / 2**20:13.1f} {r['seconds']:8.1f}", flush=True)
    finally:
        os.unlink(path)
    return rows


if __name__ == "__main__":
    sys.exit(main())
