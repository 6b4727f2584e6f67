"""What a simulation assumed, stated beside its result: the physical times and bandwidths, the market's
prices and its reading of the input, the stated job. Printed under the table and written to the JSON
(``assumptions``), so a number never travels without the assumptions that produced it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spotrelay.domain.cost import SPOT_FREE_INTERRUPTION_S
from spotrelay.placement import catalog
from spotrelay.sim.market import Market

if TYPE_CHECKING:
    from spotrelay.sim.runner import SimOptions

BOOT_SPREAD = Market.__dataclass_fields__["boot_spread"].default  # (the market's own default)


def _span(values: list[float]) -> list[float]:
    return [round(min(values), 4), round(max(values), 4)] if values else []


def _prices(opts: SimOptions) -> dict[str, dict[str, Any]]:
    m = opts.market
    out: dict[str, dict[str, Any]] = {}
    for itype in m.instance_types:
        od = [m.on_demand_price if m.on_demand_price is not None else catalog.on_demand_price(r, itype)
              for r in m.regions]
        od_known = [p for p in od if p is not None]
        sp = [m.spot_price if m.spot_price is not None else catalog.typical_spot_price(r, itype) for r in m.regions]
        spot: Any = _span([p for p in sp if p is not None])
        if m.trace_format == "pools-csv":  # the table prices each slot
            spot = "per slot, from the input"
        elif m.trace_format == "synthetic":  # drawn per slot around it (build.synthetic_tables)
            spot = {"per_slot_around": spot, "spread": 0.1}
        out[itype] = {"on_demand": _span(od_known), "spot": spot}
    return out


def assumptions(opts: SimOptions) -> dict[str, Any]:
    job, m = opts.job, opts.market
    types = list(m.instance_types)
    return {
        "job": {"nodes": job.nodes, "job_hours": job.job_hours, "total_steps": job.total_steps,
                "step_s": {t: round(job.step_s(t), 3) for t in types if catalog.instance(t)},
                "checkpoint_minutes": job.checkpoint_minutes, "deadline_hours": job.deadline_hours,
                "checkpoint_gb_per_node": round(job.bytes_per_node() / 1e9, 3)},
        "times_s": {"boot": m.boot_s, "boot_by_type": {t: m.boot_s_by_type.get(t, m.boot_s) for t in types},
                    "boot_spread": BOOT_SPREAD, "bringup": job.bringup_s,
                    "restore": round(job.restore_s(), 3), "notice": job.notice_s,
                    "notice_flush": round(job.flush_s(), 3), "persist": round(job.persist_s(), 3),
                    "stall": {t: round(job.stall_s(t), 3) for t in types if catalog.instance(t)}},
        "bandwidth_gb_per_s": {"s3_per_node": job.s3_gbps, "snapshot_per_gpu": job.snapshot_gbps},
        "market": {"format": m.trace_format,
                   "trace_semantics": m.trace_semantics if m.trace_format == "bamboo" else None,
                   "regions": list(m.regions), "instance_types": types,
                   "unannounced_share": m.unannounced_share, "rebalance_share": m.rebalance_share,
                   "price_source": "flags" if (m.on_demand_price is not None or m.spot_price is not None)
                   else "catalog",
                   "usd_per_node_hour": _prices(opts)},
        # how EC2 bills (engine.end_node): per second from the launch call (pending included), except a
        # spot node EC2 interrupts within this long of its launch, which costs nothing (EC2 User Guide)
        "billing": {"per_second_from": "launch", "spot_interrupted_free_within_s": SPOT_FREE_INTERRUPTION_S,
                    # checkpoints sent between their region and a gang elsewhere (sim/training.py)
                    "checkpoint_region": job.checkpoint_region or (m.regions[0] if m.regions else None),
                    "transfer_usd_per_gb": job.transfer_usd_per_gb},
        "spotrelay": _spotrelay(opts.spotrelay_switches),
        # spotrelay:NAME -> its switches over spotrelay's (--variant; sim/variants.py)
        **({"variants": {name: _plain(switches) for name, switches in opts.variants.items()}} if opts.variants else {}),
    }


def _plain(switches: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, int | float | str | bool) else repr(v) for k, v in sorted(switches.items())}


def _spotrelay(switches: dict[str, Any]) -> dict[str, Any]:
    """Which spec spotrelay ran: a user's (``--spec``: its name and hash) or the stated job's, and the
    switches on top of it."""
    from spotrelay.spec.load import spec_hash

    given = switches.get("spec")
    named = None if given is None else {"name": given.name, "spec_hash": spec_hash(given),
                                        "budget_usd": given.budget.max_total_cost}  # (sim/budget.py: stops it)
    return {"spec": named if named is not None else "the stated job's",
            "switches": _plain({k: v for k, v in switches.items() if k != "spec"})}


def _text(price: Any) -> str:
    if isinstance(price, str):
        return price
    if isinstance(price, dict):
        return f"{_text(price['per_slot_around'])} +-{price['spread']:.0%} per slot"
    return "-".join(f"{x:g}" for x in dict.fromkeys(price))


def summary(a: dict[str, Any]) -> list[str]:
    """The assumptions in two lines of text (the terminal's)."""
    t, j, b, mk = a["times_s"], a["job"], a["bandwidth_gb_per_s"], a["market"]
    prices = "; ".join(
        f"{itype} on-demand {_text(p['on_demand'])}, spot {_text(p['spot'])}"
        for itype, p in mk["usd_per_node_hour"].items())
    boots = t.get("boot_by_type") or {}
    boot = (f"{t['boot']:g} s" if len(set(boots.values()) | {t["boot"]}) == 1
            else ", ".join(f"{itype} {s:g} s" for itype, s in boots.items()))
    return [
        f"assumed: boot {boot} (+-{t['boot_spread']:.0%}), bring-up {t['bringup']:g} s, restore "
        f"{t['restore']:g} s ({j['checkpoint_gb_per_node']:g} GB per node from S3 at {b['s3_per_node']:g} GB/s), "
        f"notice {t['notice']:g} s (flush {t['notice_flush']:g} s), checkpoint every {j['checkpoint_minutes']:g} min, "
        f"{mk['unannounced_share']:.0%} of reclaims unannounced, {mk['rebalance_share']:.0%} with a rebalance "
        f"recommendation",
        f"prices USD per node-hour ({mk['price_source']}): {prices}; billed per second from launch, a spot "
        f"node EC2 interrupts in its first {a['billing']['spot_interrupted_free_within_s'] / 3600:g} h not billed; "
        f"checkpoints in {a['billing']['checkpoint_region']}, each save and restore from another region "
        f"${a['billing']['transfer_usd_per_gb']:g}/GB",
        *_spotrelay_line(a.get("spotrelay") or {}),
        *(["variants (their switches over spotrelay's): " + "; ".join(
            f"{name} {_switches_text(sw)}" for name, sw in a["variants"].items())]
          if a.get("variants") else []),
    ]


def _switches_text(switches: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in switches.items())


def _spotrelay_line(sr: dict[str, Any]) -> list[str]:
    """A line only when spotrelay ran something else than the stated job's defaults."""
    spec, switches = sr.get("spec"), sr.get("switches") or {}
    if not isinstance(spec, dict) and not switches:
        return []
    what = "the stated job's spec"
    if isinstance(spec, dict):
        budget = spec.get("budget_usd")
        what = (f"spec '{spec['name']}' ({spec['spec_hash'][:12]}"
                f"{'' if budget is None else f', its ${budget:,.0f} budget for spotrelay only'})")
    more = _switches_text(switches)
    tail = "; the baselines its gang size, regions and types at the cadence above" if isinstance(spec, dict) else ""
    return [f"spotrelay ran {what}{' with ' + more if more else ''}{tail}"]
