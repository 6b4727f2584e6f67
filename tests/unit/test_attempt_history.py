"""A job record keeps its newest attempts and folds the older ones (services/history.py): every reader of
the whole history answers over (the kept attempts, ``Earlier``) what it answers over every attempt; and a
job with thousands of attempts stays under DynamoDB's 400 KB item limit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotrelay.domain.models import Attempt, Job, Pool
from spotrelay.domain.status import JobStatus
from spotrelay.placement.payback import spot_stint_hours
from spotrelay.placement.spot_evidence import (
    EVIDENCE_ATTEMPTS,
    off_on_demand_allowed,
    progress,
    returns_to_on_demand,
    stalled_on_spot,
)
from spotrelay.services import history, savings
from spotrelay.services.describe import cost_report
from spotrelay.services.notify import total_downtime
from tests.unit.test_placement_policy import NOW, make_spec, quotes_for

H = 3600.0
SPOT = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
OD = Pool(region="us-east-1", az="us-east-1a", instance_type="p4d.24xlarge", market="on-demand")


@st.composite
def histories(draw: st.DrawFn) -> list[Attempt]:
    """Closed attempts one after another: spot, on-demand or none (a launch that never got a pool), some
    resumed and committing, gaps between them, costs."""
    n = draw(st.integers(1, 90))
    stormy = draw(st.booleans())  # spot gangs that mostly train nothing (the stall limit's runs)
    t = NOW - 400 * H
    step = draw(st.integers(0, 50))
    out = []
    for number in range(1, n + 1):
        pool = draw(st.sampled_from([SPOT] * 12 + [OD] if stormy else [SPOT, SPOT, OD, None]))
        t += draw(st.floats(0, 2 * H))  # the gap before it
        life = draw(st.floats(0, 5 * H))
        trains = draw(st.integers(0, 9)) == 0 if stormy else draw(st.booleans())
        trained = draw(st.integers(0, 300)) if pool is not None and trains else None
        resumed = t + min(600.0, life) if trained is not None else None
        out.append(Attempt(
            number=number, pool=pool, started_at=t, ended_at=t + life, end_reason="interrupted",
            resumed_from_step=step if trained is not None else None, resumed_at=resumed,
            saved_step=step + trained if trained else None,
            saved_at=(resumed or t) + life / 2 if trained else None, world_size=4, nodes=4,
            cost=draw(st.floats(0, 500)), drain_cost=draw(st.floats(0, 20)), unbilled=draw(st.floats(0, 5)),
            price_per_hour=30.0 if pool is not None else 0.0))
        step += trained or 0
        t += life
    return out


# the readers of the newest attempts read this many at most (the cost verdict: spot_evidence.EVIDENCE_ATTEMPTS)
NEWEST_READ = 48
assert NEWEST_READ >= EVIDENCE_ATTEMPTS and history.ATTEMPTS_KEPT >= NEWEST_READ


@settings(max_examples=300, deadline=None)
@given(histories(), st.integers(1, 90), st.integers(1, 60))
def test_every_reader_of_the_whole_history_answers_the_same_over_the_folded_record(
        attempts: list[Attempt], keep: int, stall: int) -> None:
    kept, earlier = history.kept(attempts, None, keep)
    assert len(kept) == min(keep, len(attempts)) and kept == attempts[-len(kept):]
    assert (earlier is None) == (len(attempts) <= keep)
    assert returns_to_on_demand(kept, earlier) == returns_to_on_demand(attempts)
    for last in (1, 2, 3):
        assert spot_stint_hours(kept, last, earlier) == pytest.approx(spot_stint_hours(attempts, last))
    assert stalled_on_spot(kept, stall, earlier) == stalled_on_spot(attempts, stall)
    quotes = quotes_for(make_spec())
    now = attempts[-1].ended_at or NOW
    assert progress(kept, quotes, now, 4, earlier=earlier) == pytest.approx(progress(attempts, quotes, now, 4))
    since = attempts[0].started_at - H
    assert progress(kept, quotes, now, 4, since=since, earlier=earlier) == pytest.approx(
        progress(attempts, quotes, now, 4, since=since))
    if keep >= NEWEST_READ:  # (the cost verdict reads the newest EVIDENCE_ATTEMPTS: ATTEMPTS_KEPT holds them)
        for later in (now, now + 3 * H, now + 40 * H):
            assert off_on_demand_allowed("spot", "on-demand", kept, quotes, later, stalled=stall, earlier=earlier) \
                == off_on_demand_allowed("spot", "on-demand", attempts, quotes, later, stalled=stall)
    assert history.downtime_s(kept, earlier) == pytest.approx(history.downtime_s(attempts, None))
    paid, on_demand = history.paid_and_on_demand(kept, earlier)
    want = savings.finished_job(attempts)
    assert paid == pytest.approx(want[0]) and on_demand == pytest.approx(want[1])
    job = Job(job_id="j", name="j", status=JobStatus.SUCCEEDED, attempts=attempts, attempt=len(attempts))
    folded = job.model_copy(update={"attempts": kept, "earlier": earlier})
    assert total_downtime(folded) == pytest.approx(total_downtime(job), abs=0.11)
    full, short = cost_report(job, now), cost_report(folded, now)
    assert short.saved == pytest.approx(full.saved, abs=1e-4) and short.unbilled == pytest.approx(full.unbilled)
    assert short.on_demand == pytest.approx(full.on_demand, abs=1e-3)
    assert short.earlier_attempts == len(attempts) - len(kept)


def test_the_fold_keeps_the_newest_spot_end_and_the_stalled_run() -> None:
    """What off_on_demand_allowed's hold and the stall limit read of the folded attempts."""
    def attempt(number: int, pool: Pool, trained: int | None) -> Attempt:
        t = NOW + number * H
        return Attempt(number=number, pool=pool, started_at=t, ended_at=t + 0.5 * H, world_size=4, nodes=4,
                       resumed_from_step=0 if trained is not None else None, resumed_at=t + 60,
                       saved_step=trained, saved_at=t + 0.4 * H if trained else None, price_per_hour=30.0)

    attempts = [attempt(1, SPOT, 10), attempt(2, SPOT, None), attempt(3, SPOT, 0), *(
        attempt(n, OD, 50) for n in range(4, 10))]
    _, earlier = history.kept(attempts, None, 6)
    assert earlier is not None and earlier.last_spot_end == NOW + 3.5 * H and earlier.stalled_run == 2
    assert earlier.returns_to_on_demand == 0 and earlier.last_market == "spot" and earlier.count == 3
    _, later = history.kept(attempts, None, 5)
    assert later is not None and later.stalled_run == 0 and later.returns_to_on_demand == 1
    assert later.last_spot_end == NOW + 3.5 * H


@settings(max_examples=50, deadline=None)
@given(histories())
def test_folding_in_steps_is_folding_at_once(attempts: list[Attempt]) -> None:
    """A record folds one attempt per write: the same as folding them all at the end."""
    stepwise: tuple[list[Attempt], object] = ([], None)
    for a in attempts:
        stepwise = history.kept([*stepwise[0], a], stepwise[1], 5)  # type: ignore[arg-type]
    assert stepwise == history.kept(attempts, None, 5)
