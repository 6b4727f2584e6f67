"""Build a ``Market`` from the CLI's inputs: Bamboo traces, a pools CSV, or the synthetic generator.

Offsets and synthetic draws come from ``random.Random(f"{seed}/...")``: the same seed gives the same
market to every policy, a different seed a different one.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from spotrelay.placement import catalog
from spotrelay.placement.policy import DEFAULT_CONFIG, band_rate
from spotrelay.sim.bounds import MAX_BOOT_S
from spotrelay.sim.inputs import SimInputError, Slot, Trace, read_bamboo, read_pools_csv
from spotrelay.sim.market import (
    Market,
    SimPool,
    SlotCapacity,
    TraceCapacity,
    match_trace,
    pool_glob_matches,
    slot_pools,
)

TraceFormat = Literal["bamboo", "pools-csv", "synthetic"]


@dataclass
class MarketOptions:
    traces: list[str] = field(default_factory=list)  # FILE or POOL=FILE (POOL: a glob over pool keys)
    trace_format: TraceFormat = "bamboo"
    regions: list[str] = field(default_factory=lambda: list(catalog.DEFAULT_REGIONS))
    instance_types: list[str] = field(default_factory=lambda: ["p5.48xlarge", "p4d.24xlarge"])
    boot_s: float = 300.0
    boot_s_by_type: dict[str, float] = field(default_factory=dict)  # instance type -> its boot (else boot_s)
    on_demand_price: float | None = None  # overrides the catalog for every pool
    spot_price: float | None = None  # overrides the catalog for every spot pool
    unannounced_share: float = DEFAULT_CONFIG.unannounced_share
    rebalance_share: float = 0.5
    trace_semantics: Literal["capacity", "nodes"] = "capacity"
    synthetic_slot_s: float = 6 * 3600.0
    synthetic_days: float = 30.0
    gang_scores: bool = True  # placement scores sized for the gang where capacity is known (sim/market.py)


def split_trace(item: str) -> tuple[str, str, str]:
    """``--trace``'s value as (pool glob, "=", file), or ("", "", file) for a file that drives every pool:
    a file that exists is read as one even when its path holds "=" (``runs/lr=0.1/trace.csv``)."""
    if "=" not in item or Path(item).is_file():
        return "", "", item
    return item.partition("=")


def _load_traces(opts: MarketOptions) -> tuple[Trace | None, list[tuple[str, Trace]]]:
    default: Trace | None = None
    mapping: list[tuple[str, Trace]] = []
    for item in opts.traces:
        pattern, sep, path = split_trace(item)
        if sep and not (pattern.strip() and path.strip()):
            raise SimInputError(f"--trace {item!r}: expected POOL=FILE with both a pool glob and a file")
        if sep:
            mapping.append((pattern, read_bamboo(path)))
        elif default is not None:
            raise SimInputError(f"{item}: only one --trace FILE may drive every pool; map others with POOL=FILE")
        else:
            default = read_bamboo(item)
    return default, mapping


def _price(opts: MarketOptions, region: str, itype: str) -> tuple[float, float]:
    od = opts.on_demand_price if opts.on_demand_price is not None else catalog.on_demand_price(region, itype)
    spot = opts.spot_price if opts.spot_price is not None else catalog.typical_spot_price(region, itype)
    if od is None or spot is None:
        raise SimInputError(f"no catalog price for {itype} in {region}; pass --on-demand-price and --spot-price")
    return od, spot


def synthetic_tables(opts: MarketOptions, seed: int) -> dict[tuple[str, str, str], SlotCapacity]:
    """Spot Advisor bands as truth: each pool's reclaim rate is its band's rate times a seeded
    log-normal factor (sigma 0.5); capacity per slot is drawn around 8 x a seeded placement score, the
    price within 10% of the typical spot price and at most on-demand."""
    out = {}
    for pool in catalog.pools(opts.regions, opts.instance_types, ["spot"]):
        rng = random.Random(f"{seed}/synthetic/{pool.key}")
        band = catalog.advisor_band(pool.region, pool.instance_type)
        rate = band_rate(DEFAULT_CONFIG.unknown_band if band is None else band) * math.exp(rng.gauss(0.0, 0.5))
        score = rng.uniform(3.0, 10.0)
        od, spot = _price(opts, pool.region, pool.instance_type)
        slots = []
        for i in range(max(1, int(opts.synthetic_days * 86400 / opts.synthetic_slot_s))):
            cap = int(rng.uniform(0.0, 16.0 * score))
            # +-10% around the typical spot price, never above on-demand (EC2 bills spot at most that;
            # binds only where --spot-price sits within 10% of on-demand)
            price = min(od, spot * (1.0 + rng.uniform(-0.1, 0.1)))
            slots.append(Slot(i * opts.synthetic_slot_s, round(price, 4), round(score, 1), cap, rate))
        out[(pool.region, pool.az, pool.instance_type)] = SlotCapacity(slots, len(slots) * opts.synthetic_slot_s,
                                                                        derived_score=True)
    return out


def _check_catalog(opts: MarketOptions) -> None:
    """Every region and instance type asked for is one the catalog offers: name the one that is not."""
    known_types = catalog.instance_types()
    known_regions = sorted({r for r, _ in catalog.AZS})
    for itype in opts.instance_types:
        if itype not in known_types:
            raise SimInputError(f"--instance-types: unknown instance type {itype!r} (the catalog has "
                                f"{', '.join(known_types)})")
    for region in opts.regions:
        if region not in known_regions:
            raise SimInputError(f"--regions: unknown region {region!r} (the catalog has {', '.join(known_regions)})")
    if not catalog.pools(opts.regions, opts.instance_types, ["spot"]):
        raise SimInputError(f"the catalog offers no {' or '.join(opts.instance_types)} in {', '.join(opts.regions)}")


def _check_prices(opts: MarketOptions) -> None:
    """A price override is a price: finite and above 0 (at 0 every pool of the market ties, price-limit's
    cost is 0 and every captured saving reads 1.0)."""
    for flag, price in (("--on-demand-price", opts.on_demand_price), ("--spot-price", opts.spot_price)):
        if price is not None and not (math.isfinite(price) and price > 0):
            raise SimInputError(f"{flag} {price:g}: a price must be above 0 (USD per node-hour)")


def _check_spot_below_on_demand(opts: MarketOptions, region: str, itype: str, od: float, spot: float) -> None:
    """An override that puts spot above on-demand describes no market EC2 runs: a spot instance's default
    maximum price is the on-demand price, so EC2 interrupts it rather than bill more (and price-limit,
    the cheapest spot pool, would then cost more than on-demand: no bound)."""
    if spot <= od:
        return
    given = " ".join(f"{f} {v:g}" for f, v in (("--spot-price", opts.spot_price),
                                                 ("--on-demand-price", opts.on_demand_price)) if v is not None)
    raise SimInputError(f"{given or 'the catalog'}: spot at {spot:g} USD per node-hour is above {itype}'s on-demand "
                        f"price in {region} ({od:g}): EC2 does not bill spot above on-demand (a spot instance's "
                        "default maximum price is the on-demand price); each pool's spot must be at most its on-demand")


def _check_file_below_on_demand(opts: MarketOptions, pool_key: str, od: float, top: float) -> None:
    """A pools CSV that prices a spot pool above its on-demand price: EC2 bills spot at most that, so
    either the file or the on-demand price is not the market's (real price history stays under the
    catalog's; a stale catalog price is fixed with ``--on-demand-price``)."""
    where = f"{opts.traces[0]} prices {pool_key} up to {top:g} USD per node-hour"
    if opts.on_demand_price is not None:
        raise SimInputError(f"--on-demand-price {od:g}: {where}, above it (EC2 does not bill spot above on-demand)")
    raise SimInputError(f"{where}, above its on-demand price in the catalog ({od:g}): EC2 does not bill spot above "
                        "on-demand; pass --on-demand-price with the price you pay, or check the file's spot_price "
                        "column")


def parse_boot_for(texts: list[str] | None) -> dict[str, float]:
    """``--boot-s-for TYPE=S`` values (``simulate``'s and bench/economics.py's) -> {type: seconds};
    ValueError names the value. ``_check_boots`` judges the types and times when the market is built."""
    out: dict[str, float] = {}
    for text in texts or []:
        itype, sep, raw = text.partition("=")
        try:
            if not sep or not itype.strip():
                raise ValueError
            out[itype.strip()] = float(raw)
        except ValueError:
            raise ValueError(f"--boot-s-for {text!r}: expected TYPE=SECONDS (p5.48xlarge=420)") from None
    return out


def _check_boots(opts: MarketOptions) -> None:
    """A boot per type names a type the run simulates, and is a time a node can take (0 s to a day)."""
    for itype, boot in opts.boot_s_by_type.items():
        if itype not in opts.instance_types:
            raise SimInputError(f"--boot-s-for {itype}=...: {itype!r} is not an instance type of this run "
                                f"({', '.join(opts.instance_types)})")
        if not (math.isfinite(boot) and 0 <= boot <= MAX_BOOT_S):
            raise SimInputError(f"--boot-s-for {itype}={boot:g}: a boot takes 0 to {MAX_BOOT_S:g} s")


def build_market(opts: MarketOptions, seed: int) -> Market:
    _check_catalog(opts)
    _check_prices(opts)
    _check_boots(opts)
    default, mapping = (None, []) if opts.trace_format != "bamboo" else _load_traces(opts)
    if opts.trace_format == "bamboo" and default is None and not mapping:
        raise SimInputError("--trace FILE (or POOL=FILE) is required with --trace-format bamboo")
    slots: dict[tuple[str, str, str], SlotCapacity] = {}
    if opts.trace_format == "pools-csv":
        if len(opts.traces) != 1:
            raise SimInputError("--trace-format pools-csv takes exactly one --trace FILE")
        if opts.spot_price is not None:  # (it would be silently unused)
            raise SimInputError("--spot-price: a pools CSV prices each slot itself (its spot_price column)")
        slots = slot_pools(read_pools_csv(opts.traces[0]))
    elif opts.trace_format == "synthetic":
        if opts.traces:  # (a file given and silently not read would look like a run on it)
            raise SimInputError(f"--trace {opts.traces[0]}: --trace-format synthetic reads no file (the market "
                                "is generated from the seed); leave --trace out, or name the file's format")
        slots = synthetic_tables(opts, seed)
    pools: list[SimPool] = []
    spot_keys: list[str] = []  # every spot pool asked for, driven or not
    first = True
    for pool in catalog.pools(opts.regions, opts.instance_types, ["spot", "on-demand"]):
        od, spot = _price(opts, pool.region, pool.instance_type)
        if opts.trace_format != "pools-csv":  # (a pools CSV's own prices are checked with its slots below)
            _check_spot_below_on_demand(opts, pool.region, pool.instance_type, od, spot)
        info = catalog.instance(pool.instance_type)
        band = catalog.advisor_band(pool.region, pool.instance_type)
        sp = SimPool(pool=pool, key=pool.key, on_demand_price=od, spot_price=spot if pool.market == "spot" else None,
                     band=band, gpus=info.gpus if info else 8)
        if pool.market == "spot":
            spot_keys.append(pool.key)
            if opts.trace_format == "bamboo":
                trace = match_trace(pool.key, mapping, default)
                if trace is None:
                    continue  # a pool no trace drives is not part of this market
                offset = 0.0 if first else random.Random(f"{seed}/offset/{pool.key}").uniform(0, trace.period_s)
                first = False
                sp.capacity = TraceCapacity(trace, offset, opts.trace_semantics)
            else:
                table = slots.get((pool.region, pool.az, pool.instance_type))
                if table is None:
                    continue
                sp.capacity = table
                sp.spot_price = None
                top = max((s.spot_price for s in table.slots if s.spot_price is not None), default=0.0)
                if opts.trace_format == "pools-csv" and top > od:  # (the file's prices against on-demand's)
                    _check_file_below_on_demand(opts, pool.key, od, top)
                sp.default_rate = band_rate(DEFAULT_CONFIG.unknown_band if band is None else band)
        pools.append(sp)
    _check_globs_drive(mapping, spot_keys)
    if not any(p.spot for p in pools):
        raise SimInputError("no spot pool of the given regions and instance types is driven by the input")
    return Market(pools=pools, unannounced_share=opts.unannounced_share, rebalance_share=opts.rebalance_share,
                  boot_s=opts.boot_s, boot_by_type=dict(opts.boot_s_by_type), seed=seed,
                  gang_scores=opts.gang_scores)


def _check_globs_drive(mapping: list[tuple[str, Trace]], spot_keys: list[str]) -> None:
    """Every ``--trace POOL=FILE`` drives a pool: a glob that matches none is a typo, and one whose every
    pool an earlier glob already takes (the first match drives a pool) would be silently unread."""
    for i, (pattern, _) in enumerate(mapping):
        matched = [k for k in spot_keys if pool_glob_matches(k, pattern)]
        if spot_keys and not matched:
            raise SimInputError(f"--trace {pattern}=...: {pattern!r} matches no spot pool of the given regions "
                                f"and instance types (pool keys read like {spot_keys[0]})")
        earlier = [p for p, _ in mapping[:i]]
        if matched and all(any(pool_glob_matches(k, e) for e in earlier) for k in matched):
            taken = next(e for e in earlier if pool_glob_matches(matched[0], e))
            raise SimInputError(f"--trace {pattern}=...: drives no pool: every pool {pattern!r} matches is "
                                f"taken by an earlier --trace ({taken!r}; the first glob that matches a pool "
                                "drives it): give the narrower glob first")


def trace_label(opts: MarketOptions) -> str:
    if opts.trace_format == "synthetic":
        return "synthetic"
    return ",".join(Path(split_trace(t)[2]).name for t in opts.traces)
