"""``spotrelay demo --scenario elastic``: capacity for the full gang disappears, the job trains on
fewer nodes, and grows back when capacity returns.

The script: when attempt 1 reaches ``notice_step``, every pool of the twin's market shrinks to
``nodes - 1`` instances (the survivors keep theirs) and one node gets a spot notice. Neither the
replacement nor a new full gang can be placed anywhere, so the controller runs the job on the
survivors (``resources.min_nodes``): they restart at the smaller world size and resume resharded from
the notice's checkpoint, keeping the global batch by gradient accumulation. ``grow_after_steps``
steps after that resume, capacity returns and the controller grows the gang back at a checkpoint
boundary. Judged: some attempt trained on fewer nodes, the last one on all of them, and every step's
loss is within ``LOSS_RTOL`` (relative) of the uninterrupted reference at the same global batch
(not bit for bit: a different number of ranks sums the gradients in another order).

How long that can hold is the model's numerics, not the resume's: an uninterrupted run on the
smallest gang (``SMALL_REFERENCE``, run beside the reference) drifts from the full-size one by
rounding, which training amplifies (examples/tiny with DeepSpeed ZeRO-2: bit-identical at 1 and 2
ranks until step 143, then 4e-8, growing to 8e-4 by step 199). Steps from the first one where the two
uninterrupted runs themselves differ by more than ``APART_RTOL`` (1e-6: the drift has begun, and it
grows ~100x in 20 steps) are reported, not judged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spotrelay.contracts.control import read_events
from spotrelay.domain.models import Node
from spotrelay.local.market import ChaosAction, MarketModel
from spotrelay.local.reference import read_progress

if TYPE_CHECKING:
    from spotrelay.local.twin import Twin

LOSS_RTOL = 1e-4
# The smaller gang resumes ~75 steps after the notice at step 20 (it trained through the window), the
# capacity returns 25 steps later, the next review comes within 30 s (up to ~100 steps at the demo's
# pace) and the old gang saves by the new node's boot: 320 steps leave the grown gang ~90 to train.
ELASTIC_STEPS = 320
SMALL_REFERENCE = "reference-min"
APART_RTOL = LOSS_RTOL / 100  # the demo's folder for the uninterrupted run on the smallest gang
REVIEW_MINUTES = 0.5


def elastic_spec(data: dict[str, Any], min_nodes: int | None = None) -> dict[str, Any]:
    """The example job made elastic: ``min_nodes`` (default one node fewer), no dropout (its masks
    are drawn per rank, so they change with the world size), its global batch pinned, and a
    placement review every ``REVIEW_MINUTES`` (the controller grows the gang back at a review)."""
    nodes = int(data["resources"]["nodes"])
    data["resources"]["min_nodes"] = min_nodes or max(nodes - 1, 1)
    args = [str(a) for a in data["entrypoint"].get("args", [])]
    batch = int(args[args.index("--batch") + 1]) if "--batch" in args else 4
    if "--global-batch" not in args:
        args += ["--global-batch", str(batch * nodes)]
    if "--dropout" not in args:
        args += ["--dropout", "0"]
    data["entrypoint"]["args"] = args
    # the twin's waits are real seconds: review the placement every 30 s, so the grow-back comes soon
    data.setdefault("recovery", {}).setdefault("review_minutes", REVIEW_MINUTES)
    return data


@dataclass
class ElasticScript:
    """Shrinks the market at the notice and gives the capacity back ``grow_after_steps`` later."""

    market: MarketModel
    nodes: int
    notice_step: int
    grow_after_steps: int
    # no smaller gang resumed this long after the notice: give the capacity back anyway, so the job
    # finishes (and the summary says it never shrank) instead of waiting for the demo's timeout
    give_up_s: float = 300.0
    lift_at_step: int | None = None
    notice_at: float | None = None
    lifted: bool = False

    def chaos(self) -> list[ChaosAction]:
        return [ChaosAction("interrupt", str(self.nodes - 1), at_step=self.notice_step, attempt=1,
                            limit_nodes=self.nodes - 1)]

    def on_resumed(self, attempt: int, step: int, world: int) -> None:
        """Rank 0 of ``attempt`` resumed at ``step`` with ``world`` nodes: schedule the capacity's return."""
        if world < self.nodes and self.lift_at_step is None:
            self.lift_at_step = step + self.grow_after_steps

    def on_notice(self, at: float) -> None:
        self.notice_at = self.notice_at or at

    def tick(self, step: int | None, now: float) -> str | None:
        """Called with the running gang's step; a line to log when capacity returns."""
        if self.lifted:
            return None
        if self.lift_at_step is None:
            if self.notice_at is None or now - self.notice_at < self.give_up_s:
                return None
            why = f"no smaller gang resumed within {self.give_up_s:.0f} s of the notice"
        elif step is None or step < self.lift_at_step:
            return None
        else:
            why = f"step {step}"
        self.lifted = True
        self.market.lift_limits()
        return f"capacity returns: every pool has room for {self.nodes} nodes again ({why})"


def world_sizes(nodes: list[Node]) -> dict[int, int]:
    """attempt -> nodes that trained in it, from the controller's node records (spares excluded)."""
    sizes: dict[int, int] = {}
    for node in nodes:
        if not node.spare:
            sizes[node.attempt] = sizes.get(node.attempt, 0) + 1
    return sizes


def losses_by_attempt(twin: Twin, nodes: list[Node]) -> dict[int, dict[int, float]]:
    """attempt -> step -> loss, from rank 0's per-step file on each instance. A survivor appends every
    run it trains to the same file; its runs are its node records' attempts in order. A run starts
    where the step goes back (a rollback) or at a step a later run resumed from (its trainer's
    ``resumed`` events) when that step does not come again (a grow-back resumes right after the save)."""
    from spotrelay.local.demo_summary import RESULT

    assert twin.compute is not None
    out: dict[int, dict[int, float]] = {}
    for li in twin.compute.instances():
        served = sorted(n.attempt for n in nodes if n.instance_id == li.instance.instance_id and n.rank == 0
                        and not n.spare)  # fmt: skip
        pairs = read_progress(li.work_dir / RESULT).get(0, [])
        resumed = [e.step for e in read_events(li.work_dir / "control")[0] if e.kind == "resumed"]
        for (step, loss), run in zip(pairs, split_runs([int(s) for s, _ in pairs], resumed, len(served)),
                                     strict=True):
            out.setdefault(served[run], {})[int(step)] = float(loss)
    return out


def split_runs(steps: list[int], resumed: list[int], runs: int) -> list[int]:
    """The run (0-based, at most ``runs - 1``) each step in ``steps`` belongs to."""
    starts: list[int | None] = [None] * max(runs - len(resumed), 0) + list(resumed[-runs:] if runs else [])
    out: list[int] = []
    run, last = 0, None
    for i, step in enumerate(steps):
        nxt = starts[run + 1] if run + 1 < len(starts) else None
        if run + 1 < runs and last is not None and (step <= last or (step == nxt and step not in steps[i + 1:])):
            run += 1
        out.append(run)
        last = step
    return out


def every_loss(twin: Twin) -> list[tuple[int, float]]:
    """(step, loss) of every step any rank computed, in any attempt (each rank logs the global mean)."""
    from spotrelay.local.demo_summary import RESULT

    assert twin.compute is not None
    return [(int(step), float(loss)) for li in twin.compute.instances()
            for pairs in read_progress(li.work_dir / RESULT).values() for step, loss in pairs]  # fmt: skip


def _rel(value: float, ref: float) -> float:
    return abs(value - ref) / max(abs(ref), 1e-12)


def judge(
    losses: list[tuple[int, float]], reference: dict[int, float], sizes: dict[int, int], nodes: int,
    small_reference: dict[int, float] | None = None, last_trained: int | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Facts for the summary and the problems: the world sizes, the loss agreement with the reference
    (up to the step where the uninterrupted runs on the full and the smallest gang part, if they do).
    ``last_trained``: steps the last attempt trained (0: the grown gang never trained)."""
    problems: list[str] = []
    ran = [sizes[a] for a in sorted(sizes)]
    if not any(n < nodes for n in ran):
        problems.append(f"no attempt trained on fewer than {nodes} nodes (world sizes {ran})")
    if not ran or ran[-1] != nodes:
        problems.append(f"the job did not grow back to {nodes} nodes (world sizes {ran})")
    elif last_trained == 0:  # it grew back after the smaller gang had trained every step
        problems.append(f"the gang grew back to {nodes} nodes only after the last step (it trained no step)")
    shared = sorted(s for s in (small_reference or {}) if s in reference)
    apart = next((s for s in shared if _rel((small_reference or {})[s], reference[s]) > APART_RTOL), None)
    within = [(step, value) for step, value in losses if step in reference]
    compared = [(step, value) for step, value in within if apart is None or step < apart]
    worst = max((_rel(v, reference[s]) for s, v in compared), default=0.0)
    if not compared:
        problems.append("no step's loss could be compared with the reference")
    elif worst > LOSS_RTOL:
        problems.append(f"a step's loss is {worst:.2e} (relative) off the reference; the target is {LOSS_RTOL:.0e}")
    facts = {"world_sizes": ran, "losses_compared": len(compared), "loss_max_rel_diff": worst,
             "loss_rtol": LOSS_RTOL, "numerics_apart_at_step": apart,
             "loss_max_rel_diff_all_steps": max((_rel(v, reference[s]) for s, v in within), default=0.0),
             "straight_runs_max_rel_diff": max((_rel((small_reference or {})[s], reference[s]) for s in shared),
                                               default=None)}  # fmt: skip
    return facts, problems
