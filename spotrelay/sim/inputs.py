"""Market inputs for the simulator: Bamboo preemption traces and per-pool price/capacity tables.

Both readers are strict: a bad row raises ``SimInputError`` naming the file and the line, so the
CLI can print one line and stop. Formats (docs/simulator.md has the full description):

- Bamboo trace: ``ms,add|remove,node`` per line, milliseconds from the trace start (a decimal is rounded to one), as in
  uclasystem/bamboo's ``project_pactum/simulation`` data (no header there; a first row of column names,
  one whose time is not a number nor its action ``add`` or ``remove``, is read as a header). A node
  must be added before it is removed; nodes still alive at the end are removed when the trace wraps.
- Pools CSV (header required): ``timestamp,region,availability_zone,instance_type,spot_price`` and
  optionally ``placement_score,capacity,interruptions_per_hour,product_description``. One row per
  pool and time slot: the slot lasts until that pool's next row. ``timestamp`` is seconds from the
  start or ISO 8601 (what DescribeSpotPriceHistory returns); ``spot_price`` is USD per
  instance-hour (``SpotPrice``); ``placement_score`` is 1-10 (GetSpotPlacementScores, single AZ);
  ``capacity`` is how many instances a launch can get in the slot (empty: unlimited);
  ``interruptions_per_hour`` is the reclaim rate per instance-hour (empty: the Spot Advisor band's).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from spotrelay.files import read_bounded

MAX_INPUT_BYTES = 256 << 20  # a trace or table beyond this is refused (~13 million trace rows)
SHOWN_CHARS = 60  # of a value an error quotes: a line of 50 MB is not echoed whole


class SimInputError(ValueError):
    """A trace or table the simulator cannot read; the message names the file and the line."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    add_s: float
    remove_s: float  # the trace's end when the node outlived it


@dataclass(frozen=True, slots=True)
class Trace:
    """A Bamboo trace as node lifetimes within one period (seconds from the trace start)."""

    source: str
    period_s: float
    nodes: tuple[TraceNode, ...]

    def mean_capacity(self) -> float:
        return sum(n.remove_s - n.add_s for n in self.nodes) / self.period_s

    def removals_per_node_hour(self) -> float:
        removed = sum(1 for n in self.nodes if n.remove_s < self.period_s)
        hours = sum(n.remove_s - n.add_s for n in self.nodes) / 3600.0
        return removed / hours if hours else 0.0


def _read_text(path: Path, what: str) -> str:
    """The file as UTF-8 text; a file that is not (a binary, another encoding) names its line. Read up
    to ``MAX_INPUT_BYTES``: a path to a device or a pipe that never ends is refused, not read for ever."""
    try:
        data = read_bounded(path, MAX_INPUT_BYTES)
    except OSError as exc:
        raise SimInputError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    if len(data) > MAX_INPUT_BYTES:
        raise SimInputError(f"{path}: longer than {MAX_INPUT_BYTES >> 20} MiB; is this the {what}?")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        lineno = data[:exc.start].count(b"\n") + 1
        raise SimInputError(f"{path}:{lineno}: not UTF-8 text (byte 0x{data[exc.start]:02x}); "
                            f"is this the {what}?") from None


def _shown(text: str) -> str:
    """``text`` quoted as an error shows it, cut to ``SHOWN_CHARS`` with its length."""
    return repr(text) if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]!r}... ({len(text):,} characters)"


def read_bamboo(path: str | Path) -> Trace:
    path = Path(path)
    text = _read_text(path, "trace")
    alive: dict[str, float] = {}
    done: list[TraceNode] = []
    last = 0.0
    first = True
    # lines as an editor counts them: \n, \r\n or \r (str.splitlines also breaks at \f, \x1c, \x85, ...)
    for lineno, line in enumerate(io.StringIO(text, newline=None), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            raise SimInputError(f"{path}:{lineno}: expected 'ms,add|remove,node', got {_shown(line.strip())}")
        ms, action, node = parts
        if first and _header(ms, action):
            first = False
            continue
        first = False
        try:  # (whole milliseconds in Bamboo's files; "480000.0" from a dataframe is the same time)
            t = float(ms)
        except ValueError:
            t = math.nan
        if not (math.isfinite(t) and t >= 0):
            raise SimInputError(f"{path}:{lineno}: time {_shown(ms)} is not a number of milliseconds >= 0")
        t = round(t) / 1000.0  # to the millisecond: the engine takes trace times as whole ms (engine._watch)
        if t < last:
            raise SimInputError(f"{path}:{lineno}: time {_shown(ms)} goes backwards (previous row was later)")
        if not node:
            raise SimInputError(f"{path}:{lineno}: empty node name")
        last = t
        if action == "add":
            if node in alive:
                raise SimInputError(f"{path}:{lineno}: node {_shown(node)} added twice without a removal")
            alive[node] = t
        elif action == "remove":
            if node not in alive:
                raise SimInputError(f"{path}:{lineno}: node {_shown(node)} removed but never added")
            done.append(TraceNode(alive.pop(node), t))
        else:
            raise SimInputError(f"{path}:{lineno}: action {_shown(action)} is not 'add' or 'remove'")
    if not done and not alive:
        raise SimInputError(f"{path}: the trace has no rows")
    period = max(last, 1.0)
    done.extend(TraceNode(t, period) for t in alive.values())
    return Trace(source=str(path), period_s=period, nodes=tuple(sorted(done, key=lambda n: (n.add_s, n.remove_s))))


def _header(ms: str, action: str) -> bool:
    """A row of column names ("ms,add|remove,node", "time,event,node"): neither a time nor an action."""
    try:
        float(ms)
    except ValueError:
        return action not in ("add", "remove")
    return False


@dataclass(slots=True)
class Slot:
    start_s: float
    spot_price: float
    placement_score: float | None = None
    capacity: int | None = None  # None: unlimited
    interruptions_per_hour: float | None = None


@dataclass(slots=True)
class PoolTable:
    """Slots of one spot pool, sorted by start."""

    region: str
    az: str
    instance_type: str
    slots: list[Slot] = field(default_factory=list)


REQUIRED = ("timestamp", "region", "availability_zone", "instance_type", "spot_price")
OPTIONAL = ("placement_score", "capacity", "interruptions_per_hour", "product_description")


def _timestamp(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"timestamp {_shown(value)} is neither seconds nor an ISO 8601 time") from None
    try:
        return when.timestamp()
    except (ValueError, OverflowError, OSError):  # (a time without a zone is read as local: year 1 is out of range)
        raise ValueError(f"timestamp {_shown(value)} is out of range") from None


def _opt_float(row: dict[str, str], name: str) -> float | None:
    """The column's number, None when empty; a ValueError naming the column and the value (float's own
    named neither the column nor, past the csv module's field limit, a value of readable length)."""
    value = (row.get(name) or "").strip()
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name} {_shown(value)} is not a number") from None


def read_pools_csv(path: str | Path) -> list[PoolTable]:
    path = Path(path)
    reader = csv.DictReader(io.StringIO(_read_text(path, "pools table"), newline=""))
    try:
        tables = _pool_tables(path, reader)
    except csv.Error as exc:  # a line the csv module itself refuses (a field past its size limit)
        raise SimInputError(f"{path}:{reader.line_num + 1}: {exc}") from None  # (the line it refused)
    if not tables:
        raise SimInputError(f"{path}: the pools table has no rows")
    t0 = min(t.slots[0].start_s for t in tables.values())
    for table in tables.values():  # times relative to the table's start
        for slot in table.slots:
            slot.start_s -= t0
    return list(tables.values())


def _pool_tables(path: Path, reader: csv.DictReader[str]) -> dict[tuple[str, str, str], PoolTable]:
    tables: dict[tuple[str, str, str], PoolTable] = {}
    header = reader.fieldnames or []
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise SimInputError(f"{path}:1: header lacks column(s) {', '.join(missing)} (needs {', '.join(REQUIRED)})")
    unknown = [c for c in header if c not in REQUIRED + OPTIONAL]
    if unknown:
        raise SimInputError(f"{path}:1: unknown column(s) {', '.join(unknown)}")
    for row in reader:
        lineno = reader.line_num
        if None in row:  # (DictReader keeps a row's fields past the header's under the key None)
            raise SimInputError(f"{path}:{lineno}: {len(header) + len(row[None])} fields, "
                                f"the header has {len(header)}")
        short = [c for c in header if row[c] is None]
        if short:
            raise SimInputError(f"{path}:{lineno}: {len(header) - len(short)} fields, the header has "
                                f"{len(header)} (no {', '.join(short)})")
        try:
            start = _timestamp(row["timestamp"].strip())
            price = _opt_float(row, "spot_price")
            if price is None:
                raise ValueError("spot_price is empty")
            score = _opt_float(row, "placement_score")
            cap = _opt_float(row, "capacity")
            rate = _opt_float(row, "interruptions_per_hour")
        except (ValueError, AttributeError) as exc:
            raise SimInputError(f"{path}:{lineno}: {exc}") from None
        if not math.isfinite(start):
            raise SimInputError(f"{path}:{lineno}: timestamp {_shown(row['timestamp'])} is not a finite time")
        if not (math.isfinite(price) and price > 0):  # (a free pool ties every placement and bound at 0)
            raise SimInputError(f"{path}:{lineno}: spot_price {_shown(row['spot_price'])} must be a finite price "
                                "above 0 (USD per node-hour)")
        if score is not None and not 1 <= score <= 10:
            raise SimInputError(f"{path}:{lineno}: placement_score {score} is not within 1..10")
        if cap is not None and not (math.isfinite(cap) and cap >= 0 and cap == int(cap)):
            raise SimInputError(f"{path}:{lineno}: capacity {cap} is not a whole number >= 0")
        if rate is not None and not (math.isfinite(rate) and rate >= 0):
            raise SimInputError(f"{path}:{lineno}: interruptions_per_hour {rate} must be a finite rate >= 0")
        key = (row["region"].strip(), row["availability_zone"].strip(), row["instance_type"].strip())
        if not all(key):
            raise SimInputError(f"{path}:{lineno}: region, availability_zone and instance_type are required")
        table = tables.setdefault(key, PoolTable(*key))
        if table.slots and start <= table.slots[-1].start_s:
            raise SimInputError(f"{path}:{lineno}: timestamp does not increase for pool {'/'.join(key)}")
        table.slots.append(Slot(start, price, score, None if cap is None else int(cap), rate))
    return tables
