"""Spec parsing benchmark: every hostile file, each in a fresh process, time and memory.

    .venv/bin/python bench/spec_parse.py          # a few seconds

The target (issue 17): the worst file parses (is refused) in < 1 s and < 50 MB. Each file runs in
its own subprocess so one file's garbage does not inflate the next; it reports wall time of the
``parse_spec`` call, the tracemalloc peak of a second call and the growth of max RSS over an
interpreter that imported the loader and parsed one other good spec (lazy imports are not parsing).
The same measurement of ``examples/tiny.yaml`` (a good spec) runs in the same
batch, so the ratios are side by side on the same machine load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import json, resource, sys, time, tracemalloc
from spotrelay.errors import SpecError
from spotrelay.spec import parse_spec
data = sys.stdin.buffer.read()
parse_spec(open("examples/llm-pretrain-p5.yaml", "rb").read())  # warm: lazy imports are not parsing
def once():
    try:
        parse_spec(data, "bench")
        return "accepted"
    except SpecError as exc:
        return str(exc)[:70]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
outcome = once()  # timed without tracemalloc, which slows allocation several times
elapsed = time.perf_counter() - start
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
tracemalloc.start()
once()
peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({"s": elapsed, "peak": peak, "rss_kb": rss, "outcome": outcome}))
"""


def measure(data: bytes) -> dict[str, float | str]:
    out = subprocess.run([sys.executable, "-c", CHILD], input=data, capture_output=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT)})
    result: dict[str, float | str] = json.loads(out.stdout)
    return result


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from tests.hostile_corpus import corpus

    files = {"examples/tiny.yaml (good)": (ROOT / "examples" / "tiny.yaml").read_bytes(), **corpus()}
    rows = {name: measure(data) for name, data in files.items()}
    base = float(rows["examples/tiny.yaml (good)"]["s"])
    print(f"{'file':30} {'bytes':>8} {'time s':>8} {'x good':>7} {'peak MB':>8} {'RSS+ MB':>8}  outcome")
    for name, row in rows.items():
        print(f"{name:30} {len(files[name]):8d} {float(row['s']):8.4f} {float(row['s']) / base:7.1f} "
              f"{float(row['peak']) / 1e6:8.2f} {float(row['rss_kb']) / 1e3:8.2f}  {row['outcome']}")
    worst_s = max(rows.items(), key=lambda kv: float(kv[1]["s"]))
    worst_m = max(rows.items(), key=lambda kv: float(kv[1]["peak"]))
    print(f"worst time: {worst_s[0]} {float(worst_s[1]['s']):.3f} s (target < 1 s)")
    print(f"worst memory: {worst_m[0]} {float(worst_m[1]['peak']) / 1e6:.1f} MB traced (target < 50 MB)")


if __name__ == "__main__":
    main()
