"""Bamboo-format traces unlike the shipped ones, to check target (c) on markets we do not have.

    .venv/bin/python bench/trace_variants.py [--out bench-traces] [--trace spotrelay/local/data/bamboo-g4dn-trace.csv]
    .venv/bin/python bench/seed_scan.py --trace bench-traces/g4dn-x0.5.csv --trace bench-traces/osc.csv --nodes 8,16,32

Writes, deterministically (fixed seeds), ``ms,add|remove,node`` files that ``--trace`` reads:

- ``g4dn-xK.csv``: the given trace with its time axis scaled by K (0.33, 0.5, 0.75, 2: every lifetime and
  gap K times as long; K < 1 is a stormier market), tiled to at least 24 h;
- ``osc.csv``: 48 h, a pool swinging between about 20 and 60 nodes over 8 h, node lifetimes 3 h on average;
- ``drops.csv``: 48 h, a pool of 40 with light churn that loses 15 nodes at once every 5-7 h and gets one
  back every 4 minutes;
- ``small.csv`` / ``mid.csv``: 36 h, a pool wandering between 6 and 14 (12 and 22) nodes, lifetimes 2 h.

They are shapes, not recordings: what they are for is a miss the shipped traces do not show
(docs/simulator-tuning.md, "Traces we do not have").
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
G4DN = ROOT / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv"
Row = tuple[int, str, str]  # (ms, "add" | "remove", node)
SCALES = (0.33, 0.5, 0.75, 2.0)


def _rows(path: Path) -> list[Row]:
    from spotrelay.sim.inputs import read_bamboo

    read_bamboo(path)  # (a bad file is named with its line before anything is written)
    out = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            ms, action, node = (p.strip() for p in line.split(","))
            out.append((int(ms), action, node))
    return out


def scaled(base: list[Row], factor: float, min_hours: float = 24.0) -> list[Row]:
    """``base`` with every time x ``factor``, repeated (nodes renamed per copy, the survivors of a copy
    removed at its end, as the wrap does) until it lasts ``min_hours``."""
    period, k = base[-1][0], 0
    out: list[Row] = []
    while k == 0 or out[-1][0] < min_hours * 3_600_000:
        offset, alive = round(k * period * factor), set[str]()
        for ms, action, node in base:
            name = f"c{k}-{node}"
            out.append((offset + round(ms * factor), action, name))
            (alive.add if action == "add" else alive.discard)(name)
        out.extend((offset + round(period * factor), "remove", n) for n in sorted(alive))
        k += 1
    return out


def driven(seed: int, hours: float, target: Callable[[float], float], mean_life_h: float, prefix: str,
           add_batch: int, add_every_s: int) -> list[Row]:
    """A pool that follows ``target(hour)``: each node reclaimed at random (mean life ``mean_life_h``), the
    excess over the target reclaimed at once, the shortfall refilled ``add_batch`` at a time."""
    rng, alive, rows, count = random.Random(seed), [], [], 0

    def add(ms: int, n: int) -> None:
        nonlocal count
        for _ in range(n):
            count += 1
            alive.append(f"{prefix}{count}")
            rows.append((ms, "add", alive[-1]))

    def remove(ms: int, n: int) -> None:
        for _ in range(min(n, len(alive))):
            rows.append((ms, "remove", alive.pop(rng.randrange(len(alive)))))

    add(0, round(target(0.0)))
    hazard = 1 - math.exp(-60 / 3600 / mean_life_h)
    for s in range(60, int(hours * 3600) + 1, 60):
        churn = sum(1 for _ in alive if rng.random() < hazard)
        goal = round(target(s / 3600))
        remove(s * 1000, churn + max(0, len(alive) - churn - goal))
        if s % add_every_s == 0 and len(alive) < goal:
            add(s * 1000, min(add_batch, goal - len(alive)))
    return rows


def oscillating() -> list[Row]:
    rng = random.Random(11)
    phase, jitter = rng.uniform(0, 2 * math.pi), [rng.uniform(-4, 4) for _ in range(200)]
    return driven(12, 48, lambda h: 40 + 20 * math.sin(2 * math.pi * h / 8 + phase) + jitter[int(h * 2) % 200],
                  3.0, "o", add_batch=5, add_every_s=240)


def drops() -> list[Row]:
    rng = random.Random(21)
    starts, t = [], rng.uniform(5, 7)
    while t < 48:
        starts.append(t)
        t += rng.uniform(5, 7)

    def target(h: float) -> float:  # 15 gone at a drop, back one per 4 minutes
        since = [h - s for s in starts if 0 <= h - s < 1]
        return 40 - max(0.0, 15 - since[0] * 15) if since else 40

    return driven(22, 48, target, 12.0, "d", add_batch=1, add_every_s=240)


def wandering(lo: int, hi: int, prefix: str) -> list[Row]:
    rng = random.Random(31)
    level, walk = (lo + hi) / 2, []
    for _ in range(36 * 4 + 2):  # a new level every 15 minutes
        level = min(hi, max(lo, level + rng.choice([-2, -1, -1, 0, 0, 1, 1, 2])))
        walk.append(level)
    return driven(32, 36, lambda h: walk[int(h * 4)], 2.0, prefix, add_batch=2, add_every_s=300)


def write(path: Path, rows: list[Row]) -> None:
    rows = sorted(rows, key=lambda r: r[0])  # (stable: a node's add stays before its removal)
    path.write_text("".join(f"{ms},{action},{node}\n" for ms, action, node in rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-traces"))
    parser.add_argument("--trace", type=Path, default=G4DN, help="the trace to time-scale (default: the g4dn one)")
    args = parser.parse_args()
    from spotrelay.sim.inputs import SimInputError, read_bamboo

    try:
        base = _rows(args.trace)
    except SimInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.trace.stem.removeprefix("bamboo-").removesuffix("-trace")
    made = {f"{stem}-x{k:g}": scaled(base, k) for k in SCALES}
    made.update(osc=oscillating(), drops=drops(), small=wandering(6, 14, "s"), mid=wandering(12, 22, "m"))
    for name, rows in made.items():
        path = args.out / f"{name}.csv"
        write(path, rows)
        trace = read_bamboo(path)  # every file written reads back
        print(f"{path}: {trace.period_s / 3600:.1f} h, mean pool {trace.mean_capacity():.1f} nodes, "
              f"{trace.removals_per_node_hour():.2f} removals per node-hour")
    return 0


if __name__ == "__main__":
    sys.exit(main())
