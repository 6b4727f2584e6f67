"""The review's payback test for a move off on-demand (placement/payback.py): when the job's recent
spot attempts no longer speak, its stints away from on-demand say how long a move lasts, and the move
must pay for its round trip within that."""

from __future__ import annotations

from spotrelay.domain.models import Attempt
from spotrelay.placement.payback import round_trip_cost, spot_stint_hours
from spotrelay.placement.review import better_placement
from spotrelay.ports.market import PoolQuote
from tests.unit.test_placement_policy import NOW, make_spec, quotes_for

H = 3600.0


def _pick(quotes: list[PoolQuote], market: str) -> PoolQuote:
    return next(q for q in quotes if q.pool.market == market and q.pool.instance_type == "p5.48xlarge")


def _attempts(quotes: list[PoolQuote], plan: list[tuple[str, float]]) -> list[Attempt]:
    """Back-to-back attempts: (market, hours) each."""
    out, t = [], NOW
    for i, (market, hours) in enumerate(plan):
        out.append(Attempt(number=i + 1, pool=_pick(quotes, market).pool, started_at=t, ended_at=t + hours * H))
        t += hours * H
    return out


def test_a_stint_runs_from_the_first_spot_attempt_to_the_return_to_on_demand() -> None:
    quotes = quotes_for(make_spec())
    walk = [("spot", 2.0), ("on-demand", 5.0), ("spot", 0.25), ("spot", 0.5), ("on-demand", 12.0),
            ("spot", 1.0), ("on-demand", 3.0), ("spot", 0.1)]  # the last stint is still going: not counted
    hours = spot_stint_hours(_attempts(quotes, walk))
    assert hours is not None and abs(hours - (2.0 + 0.75 + 1.0) / 3) < 1e-9  # the job began on spot: a stint
    assert abs(spot_stint_hours(_attempts(quotes, walk), last=2) - (0.75 + 1.0) / 2) < 1e-9  # type: ignore[operator]
    assert spot_stint_hours(_attempts(quotes, [("on-demand", 5.0), ("spot", 1.0)])) is None  # never came back
    assert spot_stint_hours(_attempts(quotes, [("spot", 5.0)])) is None
    assert spot_stint_hours([]) is None
    assert round_trip_cost(10.0, 100.0, 0.25, 0.5) == 10.0 + 75.0


def test_a_move_off_on_demand_that_cannot_pay_its_round_trip_within_the_jobs_stints_stays() -> None:
    spec = make_spec()
    quotes = quotes_for(spec)
    od = _pick(quotes, "on-demand")
    plain = better_placement(spec, od, 4, quotes, {}, NOW)  # no evidence: the review's plain test moves
    assert plain is not None and plain.target.pool.market == "spot"
    # the job came back to on-demand within an hour when it left: the saving over such a stint pays
    # for the move alone, not for the move, its restore and the return's restore
    short = spot_stint_hours(_attempts(quotes, [("on-demand", 5.0), ("spot", 0.5), ("spot", 0.5),
                                                ("on-demand", 5.0)]))
    assert short == 1.0 and plain.gain_per_hour * short > plain.move_cost * 1.5
    assert better_placement(spec, od, 4, quotes, {}, NOW, stint_hours=short) is None
    # stints that last: the saving pays the round trip, the gang moves
    long = better_placement(spec, od, 4, quotes, {}, NOW, stint_hours=12.0)
    assert long is not None and long.horizon_hours == 12.0 and long.target == plain.target
    # recent spot attempts of its own (fresh evidence) price the gain already: the stints do not apply
    assert (better_placement(spec, od, 4, quotes, {}, NOW, spot_hours=12.0, stint_hours=short)
            == better_placement(spec, od, 4, quotes, {}, NOW, spot_hours=12.0))
