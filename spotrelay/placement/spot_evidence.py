"""Did the job's own spot attempts pay? Their bill against what on-demand would have charged for the
same useful steps. Pure: the attempts, the quotes and the clock are given.

Each attempt records where its training resumed (``resumed_from_step`` at ``resumed_at``, the
trainers' TrainingResumed) and the newest checkpoint its ranks committed (``saved_step`` at
``saved_at``, CheckpointCommitted). So the controller knows, without a model:

- the useful steps of an attempt: ``saved_step - resumed_from_step`` (what the next attempt resumes
  from; work after the last commit is redone and does not count);
- the job's training speed: an attempt that trained from its resume to a later commit did
  ``steps / (saved_at - resumed_at)`` steps an hour on ``world_size`` nodes of its type; the global
  batch is kept at every size, so one step takes ``world x throughput(type) / rate``
  throughput-weighted node-hours on any gang (``step_node_hours``);
- what on-demand would have charged for a spot attempt's steps: steps x that x the cheapest allowed
  on-demand pool's price per unit of work (``spot_wait.work_price``).

Spot *paid* when the settled spot attempts among the job's last ``EVIDENCE_ATTEMPTS`` attempts cost
at most ``PAID_SHARE`` of what on-demand would have charged for their useful steps, and *lost* when
they cost more than ``LOST_SHARE`` of it (between the two: no verdict either way). Boots, restores,
short gangs, lost work and failed saves are all in it: it is the realized cost per useful step, not the
score's model.

A job that states ``recovery.max_slowdown`` L also keeps a schedule (``WallLimit``): ``h`` hours after it
was submitted (the job record's ``created_at``: a wait for capacity before the first launch is wall time
its user waits too), it should have committed the steps a full on-demand gang (of the cheapest
on-demand pool per unit of work) trains in ``h / L`` hours. More than ``SCHEDULE_GRACE_HOURS`` of such
training behind, spot did not pay either (Plan places on on-demand, and a review moves a spot gang there:
``review.catch_up``), and a review moves it back to spot only once it is on schedule again: the job
mixes spot and on-demand to finish within about L times
on-demand's wall time, at the least cost the market allows. Cost alone would not: EC2 bills nothing of a
gang it takes in its first hour, so a market whose gangs die within minutes can cost less than on-demand
and take three times as long.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from spotrelay.contracts.cadence import AUTO
from spotrelay.domain.models import Attempt, Earlier
from spotrelay.placement import catalog
from spotrelay.placement.policy import DEFAULT_CONFIG, PlacementConfig
from spotrelay.ports.market import PoolQuote
from spotrelay.spec.models import JobSpec, Recovery

EVIDENCE_ATTEMPTS = 48  # the job's last this many attempts are weighed (the spot ones among them)
MIN_SPOT_ATTEMPTS = 10  # fewer settled spot attempts than this: no verdict
MIN_SPOT_SPAN_HOURS = 3.0  # nor when they span less than this (first start to last end): a stormy market's
#                           first ten gangs can all die within 3 h on a bad start (the g4dn trace at 16 nodes,
#                           seed 3: 42 steps in 2.7 h, then on-demand for 13 h of a market spot saves 44% on)
PAID_SHARE = 0.8  # spot paid when it cost at most this share of on-demand's price for the same steps: the
#                  rest pays each return to on-demand (a new on-demand gang's boot and restore) and the noise
LOST_SHARE = 1.1  # spot lost when it cost more than this share: a window of a stormy market's attempts swings
#                   by a tenth around parity, and a verdict of "lost" on noise parks the job on on-demand for
#                   the hold, while one more spot spell near parity costs at most this margin
HOLD_HOURS = 6.0  # after spot did not pay, a gang on on-demand stays there this long after its last spot
#                   attempt, doubled for each earlier return to on-demand (up to HOLD_DOUBLINGS times); a
#                   retry is cheap (the window remembers: one settled spot attempt that loses again ends it)
HOLD_DOUBLINGS = 3
# the job's last this many ended attempts all spot and none trained a step: spot lost, no price needed
# (``stall_limit`` of the default spec: one less than the stall budget, so a market whose gangs die before
# they save sends the job to on-demand, not to failure)
STALLED_SPOT_ATTEMPTS = max(1, Recovery.model_fields["max_stalled_recoveries"].default - 1)
# recovery.max_slowdown: how far (hours of full on-demand training) a job may fall behind its schedule,
# beyond the steps its trainers have not saved yet (up to one checkpoint interval: WallLimit.lag), before its
# gang goes on on-demand: about a spot gang's boot and restore
SCHEDULE_GRACE_HOURS = 1.0
SAVE_GRACE_S = 900.0  # an attempt closed this recently may still be committing its final save (a notice's,
#                       a move's by the target's boot): it counts once it saved after its end, or after this


@dataclass(frozen=True)
class SpotEvidence:
    attempts: int  # settled spot attempts weighed
    cost: float  # USD they were billed
    on_demand_cost: float  # USD on-demand would have charged for the useful steps they did

    @property
    def paid(self) -> bool:
        """Clearly: worth waiting for (the share leaves room for the returns to on-demand and noise)."""
        return self.cost <= PAID_SHARE * self.on_demand_cost

    @property
    def lost(self) -> bool:
        """Spot cost clearly more than on-demand would have for the same steps (past ``LOST_SHARE``)."""
        return self.cost > LOST_SHARE * self.on_demand_cost


@dataclass(frozen=True)
class WallLimit:
    """A spec's ``recovery.max_slowdown``, the gang on-demand would run (``resources.nodes``) and its
    checkpoint cadence: the committed steps trail training by up to ``lag_minutes`` (``every_minutes``, or
    ``auto_max_minutes`` for ``auto``) or ``lag_steps`` (``every_steps``). ``since``: when the job was
    submitted (its record's ``created_at``), where the schedule starts; None: its first attempt's start.
    ``earlier``: the record's folded attempts (the step its training began from)."""

    max_slowdown: float
    nodes: int
    lag_minutes: float = 0.0
    lag_steps: int = 0
    since: float | None = None
    earlier: Earlier | None = None

    def standing(self, attempts: Sequence[Attempt], quotes: Sequence[PoolQuote], now: float,
                 config: PlacementConfig = DEFAULT_CONFIG) -> tuple[float, bool] | None:
        """(hours of full on-demand training the job's committed steps are short of its schedule, negative
        when ahead; whether that is past the grace and the cadence's lag); None as ``progress``."""
        measured = progress(attempts, quotes, now, self.nodes, config, self.since, self.earlier)
        if measured is None:
            return None
        elapsed_h, done_h, step_h = measured
        short = elapsed_h / self.max_slowdown - done_h
        return short, short > SCHEDULE_GRACE_HOURS + self.lag_minutes / 60.0 + self.lag_steps * step_h

    def hours_behind(self, attempts: Sequence[Attempt], quotes: Sequence[PoolQuote], now: float,
                     config: PlacementConfig = DEFAULT_CONFIG) -> float | None:
        """``standing``'s hours alone."""
        standing = self.standing(attempts, quotes, now, config)
        return None if standing is None else standing[0]

    def behind(self, attempts: Sequence[Attempt], quotes: Sequence[PoolQuote], now: float,
               config: PlacementConfig = DEFAULT_CONFIG) -> bool:
        """Past the grace and the lag: the next gang goes on on-demand, and a review moves a spot gang or a
        shrunk one there (``review.catch_up``)."""
        standing = self.standing(attempts, quotes, now, config)
        return standing is not None and standing[1]

    def on_schedule(self, attempts: Sequence[Attempt], quotes: Sequence[PoolQuote], now: float,
                    config: PlacementConfig = DEFAULT_CONFIG) -> bool:
        """Not behind at all (or not measured yet): a review may move the job back to spot."""
        short = self.hours_behind(attempts, quotes, now, config)
        return short is None or short <= 0.0


def progress(attempts: Sequence[Attempt], quotes: Sequence[PoolQuote], now: float, nodes: int,
             config: PlacementConfig = DEFAULT_CONFIG, since: float | None = None,
             earlier: Earlier | None = None) -> tuple[float, float, float] | None:
    """(hours since ``since``, the job's submission, or without one since its first attempt started; hours a
    full gang of ``nodes`` on the cheapest on-demand pool per unit of work would have trained its committed
    steps in; such hours per step); None before a measured step rate, without on-demand quoted, or before
    its first attempt. ``earlier``: the job record's folded attempts. The schedule's measure (``WallLimit``)
    and describe's advice (services/describe.slowdown_line) read it."""
    cheapest = _cheapest_on_demand(quotes, config)
    per_step = step_node_hours(attempts, config)
    if per_step is None and earlier is not None and earlier.measured is not None:
        per_step = step_node_hours([earlier.measured], config)
    starts = [a.started_at for a in attempts if a.started_at is not None]
    if earlier is not None and earlier.first_started_at is not None:
        starts.append(earlier.first_started_at)
    if cheapest is None or per_step is None or not starts:
        return None
    first = earlier.first_resumed_from_step if earlier is not None else None
    if first is None:
        first = next((a.resumed_from_step for a in attempts if a.resumed_from_step is not None), 0)
    saved = max((a.saved_step for a in attempts if a.saved_step is not None), default=first)
    if earlier is not None and earlier.saved_step is not None:
        saved = max(saved, earlier.saved_step)
    step_h = per_step / (nodes * cheapest[1])
    # (a record without a creation time holds 0.0, the model's default: the first start then)
    start = min(starts) if not since else min(since, *starts)
    return (now - start) / 3600.0, max(0, saved - first) * step_h, step_h


def wall_limit(spec: JobSpec, since: float | None = None, earlier: Earlier | None = None) -> WallLimit | None:
    """The spec's limit on spot's wall time (None: unset, cost alone decides); ``since``: the job's
    submission (its record's ``created_at``), where its schedule starts; ``earlier``: its folded attempts."""
    limit = spec.recovery.max_slowdown
    if limit is None:
        return None
    ckpt = spec.checkpoint
    if ckpt.every_steps is not None:
        return WallLimit(limit, spec.resources.nodes, lag_steps=ckpt.every_steps, since=since, earlier=earlier)
    minutes = ckpt.auto_max_minutes if ckpt.every_minutes in (None, AUTO) else float(ckpt.every_minutes or 0.0)
    return WallLimit(limit, spec.resources.nodes, lag_minutes=minutes, since=since, earlier=earlier)


def _throughput(instance_type: str, config: PlacementConfig) -> float:
    info = catalog.instance(instance_type)
    return config.throughput.get(instance_type) or (info.throughput if info else 1.0)


def useful_steps(a: Attempt) -> int:
    """Steps the attempt's ranks trained and committed (0 when it never got past its resume)."""
    if a.saved_step is None or a.resumed_from_step is None:
        return 0
    return max(0, a.saved_step - a.resumed_from_step)


def step_node_hours(attempts: Sequence[Attempt], config: PlacementConfig = DEFAULT_CONFIG) -> float | None:
    """Throughput-weighted node-hours one training step takes, measured on the newest attempt that
    trained from its resume to a later commit (None: no such attempt yet)."""
    for a in reversed(attempts):
        if a.pool is None or a.resumed_at is None or a.saved_at is None or a.world_size <= 0:
            continue
        steps, hours = useful_steps(a), (a.saved_at - a.resumed_at) / 3600.0
        if steps > 0 and hours > 0:
            return a.world_size * _throughput(a.pool.instance_type, config) * hours / steps
    return None


def _cheapest_on_demand(quotes: Sequence[PoolQuote], config: PlacementConfig) -> tuple[float, float] | None:
    """(USD per node-hour over throughput, throughput) of the cheapest on-demand pool quoted."""
    offers = [(q.price_per_hour / t, t) for q in quotes if q.pool.market == "on-demand"
              for t in (_throughput(q.pool.instance_type, config),)]
    return min(offers) if offers else None


def billed(a: Attempt, following: Attempt | None = None) -> float:
    """USD the attempt's instances cost, an upper bound: its recorded cost (launch to close) plus the
    time they stayed billed after the close. Those the next attempt did not carry over (``kept``): until
    their final save (a notice's or a move's); those it carried (survivors kept while the lost ranks
    were replaced, through any capacity backoff): until it started, when its own cost takes them on.
    (Counting every node until both, survivors were billed twice: a job keeping 7 of 8 nodes at each
    notice saw its spot attempts cost 43% more than they did, gave spot up and paid on-demand.)"""
    if a.ended_at is None:
        return a.cost
    saved = max(a.ended_at, a.saved_at) if a.saved_at is not None else a.ended_at
    carried = 0
    node_s = 0.0
    if following is not None and following.started_at is not None and following.kept > 0:
        carried = min(a.nodes, following.kept)
        node_s = carried * max(0.0, following.started_at - a.ended_at)
    node_s += (a.nodes - carried) * (saved - a.ended_at)
    return a.cost + a.billed_price() * node_s / 3600.0


def _settled(a: Attempt, now: float) -> bool:
    if a.ended_at is None:
        return False
    return now - a.ended_at >= SAVE_GRACE_S or (a.saved_at is not None and a.saved_at >= a.ended_at)


def spot_evidence(attempts: Sequence[Attempt], quotes: Sequence[PoolQuote], now: float,
                  config: PlacementConfig = DEFAULT_CONFIG, last: int = EVIDENCE_ATTEMPTS) -> SpotEvidence | None:
    """The job's settled spot attempts among its last ``last`` against on-demand's price for their
    useful steps; None without on-demand to compare with, a measured step, ``MIN_SPOT_ATTEMPTS`` or
    ``MIN_SPOT_SPAN_HOURS`` of them."""
    cheapest = _cheapest_on_demand(quotes, config)
    per_step = step_node_hours(attempts, config)
    if cheapest is None or per_step is None:
        return None
    od_price = cheapest[0]
    recent = list(attempts[-last:])
    count, cost, steps = 0, 0.0, 0  # (one pass: Plan asks this on every call of a stormy job)
    first: float | None = None  # the first weighed attempt's start, the last one's end
    last_end: float | None = None
    for i, a in enumerate(recent):
        if a.pool is None or a.pool.market != "spot" or not _settled(a, now):
            continue
        if first is None:
            first = a.started_at
        last_end = a.ended_at
        count += 1
        cost += billed(a, recent[i + 1] if i + 1 < len(recent) else None)
        steps += useful_steps(a)
    if count < MIN_SPOT_ATTEMPTS:
        return None
    if first is None or last_end is None or last_end - first < MIN_SPOT_SPAN_HOURS * 3600.0:
        return None
    return SpotEvidence(attempts=count, cost=cost, on_demand_cost=steps * per_step * od_price)


def stall_limit(spec: JobSpec) -> int:
    """Spot attempts in a row that trained nothing before the job gives spot up: one less than its
    ``recovery.max_stalled_recoveries``, which fails the job at the next stalled recovery."""
    return max(1, spec.recovery.max_stalled_recoveries - 1)


def last_chance(spec: JobSpec, stalled: int) -> bool:
    """With ``stalled`` recoveries in a row without progress counted (this one included), the stall
    budget fails the job at the next: the next gang is not bet on spot (a recovery keeps no spot
    survivors, Plan offers on-demand), whatever the attempts' records say."""
    return stalled >= spec.recovery.max_stalled_recoveries


def trained_nothing_on_spot(a: Attempt) -> bool:
    """A spot gang that committed no step after its resume."""
    return a.pool is not None and a.pool.market == "spot" and useful_steps(a) == 0


def stalled_on_spot(attempts: Sequence[Attempt], count: int = STALLED_SPOT_ATTEMPTS,
                    earlier: Earlier | None = None) -> bool:
    """The job's last ``count`` ended attempts were spot gangs that committed no step after their
    resume (a save still in flight is not waited for: the stall budget would not wait either);
    ``earlier``: the job record's folded attempts, whose newest ``stalled_run`` were."""
    ended = [a for a in attempts if a.ended_at is not None][-count:]
    if not all(trained_nothing_on_spot(a) for a in ended):
        return False
    return len(ended) == count or (earlier is not None and earlier.stalled_run >= count - len(ended))


def spot_did_not_pay(attempts: Sequence[Attempt], quotes: Sequence[PoolQuote], now: float,
                     config: PlacementConfig = DEFAULT_CONFIG, stalled: int = STALLED_SPOT_ATTEMPTS,
                     wall: WallLimit | None = None, earlier: Earlier | None = None) -> bool:
    """The job's own evidence says spot cost more than on-demand per useful step: its spot attempts
    were billed more than ``LOST_SHARE`` of what on-demand would have charged for their steps
    (``SpotEvidence.lost``), or its last ``stalled``
    (``stall_limit``) trained none, or (``wall``: the spec's ``wall_limit``) the job is behind the schedule
    of its ``max_slowdown`` (False without a verdict: a job that has not measured it yet keeps trying
    spot)."""
    if stalled_on_spot(attempts, stalled, earlier) or (wall is not None and wall.behind(attempts, quotes, now, config)):
        return True
    evidence = spot_evidence(attempts, quotes, now, config)
    return evidence is not None and evidence.lost


def spot_given_up(spec: JobSpec, attempts: Sequence[Attempt], stalled_recoveries: int,
                  quotes: Sequence[PoolQuote], now: float, config: PlacementConfig = DEFAULT_CONFIG,
                  since: float | None = None, earlier: Earlier | None = None) -> bool:
    """Plan's verdict (the services' and the simulator's): no new gang on spot, because the job is one
    stalled recovery from its budget (``last_chance``) or its own spot attempts did not pay
    (``spot_did_not_pay`` at the spec's ``stall_limit``; ``since`` and ``earlier``: the job's submission,
    where the schedule of its ``wall_limit`` starts, and its folded attempts)."""
    return last_chance(spec, stalled_recoveries) or spot_did_not_pay(
        attempts, quotes, now, config, stall_limit(spec), wall_limit(spec, since, earlier), earlier)


def returns_to_on_demand(attempts: Sequence[Attempt], earlier: Earlier | None = None) -> int:
    """How many times the job went back to on-demand after spot (on-demand attempts after a spot one);
    ``earlier``: the job record's folded attempts, counted too (and the step from the newest of them)."""
    markets = [a.pool.market if a.pool is not None else None for a in attempts]
    if earlier is not None and earlier.count:
        markets.insert(0, earlier.last_market)
    back = sum(1 for a, b in pairwise(markets) if a == "spot" and b is not None and b != "spot")
    return back + (earlier.returns_to_on_demand if earlier is not None else 0)


def off_on_demand_allowed(target_market: str, current_market: str, attempts: Sequence[Attempt],
                          quotes: Sequence[PoolQuote], now: float, config: PlacementConfig = DEFAULT_CONFIG,
                          stalled: int = STALLED_SPOT_ATTEMPTS, wall: WallLimit | None = None,
                          earlier: Earlier | None = None) -> bool:
    """A review's move from on-demand to spot, unless the job's own spot attempts did not pay and the
    last of them ended less than the hold ago: ``HOLD_HOURS``, doubled for each earlier return to
    on-demand (a market where spot keeps not paying is tried less and less often; one where an
    unlucky start said so is tried again). ``earlier``: the job record's folded attempts."""
    if current_market == "spot" or target_market != "spot":
        return True
    if wall is not None and not wall.on_schedule(attempts, quotes, now, config):
        return False  # (behind the spec's max_slowdown: on-demand until the job is on schedule again)
    ends = [a.ended_at for a in attempts if a.pool is not None and a.pool.market == "spot" and a.ended_at]
    if earlier is not None and earlier.last_spot_end:
        ends.append(earlier.last_spot_end)
    if not ends or not spot_did_not_pay(attempts, quotes, now, config, stalled, wall, earlier):
        return True
    doublings = min(HOLD_DOUBLINGS, max(0, returns_to_on_demand(attempts, earlier) - 1))
    return now - max(ends) >= HOLD_HOURS * 3600.0 * 2 ** doublings
