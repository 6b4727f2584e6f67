"""Hot spares (``resources.spares``) in the simulator, through the shipped decisions.

The spares a provision launches (``spare_ranks_to_launch``, in the same all-or-none launch as the
ranks, as ``workflow_tasks.provision`` asks EC2) wait on the run's bench: booted, billed, holding
pool capacity, out of training. At a recovery ``spare_takeovers`` (what ``recovery_flow.recover``
runs) says which standing spare takes which lost rank; ``_result`` turns that into the plan's
``promoted``, and the next provision moves those spares into the gang (like survivors: no launch,
no boot). A notice or loss of a spare only takes it off the bench (``interruptions._spare``).

Rebalance prewarm (``recovery.prewarm_on_rebalance``, services/prewarm.py): a recommendation for a
training rank ends the outcome wait with ``Verdict.REBALANCE``; the ASL's Prewarm state launches one
standby in that node's pool (a spare with ``release_after``); a notice that follows promotes it like
any spare, else it is released when its wait runs out (reconcile's ``release_expired``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotrelay.contracts.recovery import AttemptEnd, Promotion, Verdict
from spotrelay.domain.models import Node, NodeState, Pool
from spotrelay.recovery.spares import spare_ranks_to_launch, spare_takeovers

if TYPE_CHECKING:
    from spotrelay.sim.controller import SpotrelayRun
    from spotrelay.sim.records import SimNode

_LIVE = ("PENDING", "READY", "RUNNING")


def records(run: SpotrelayRun) -> list[Node]:
    """The job's spare records still on the bench (the store's ``spare_nodes`` view plus takers)."""
    return [Node(job_id="sim", node_id=f"s{n.instance_id}", attempt=n.attempt, rank=n.rank,
                 instance_id=n.instance_id, pool=n.pool.pool, state=NodeState(n.state), spare=True,
                 takes_rank=n.takes_rank, release_after=n.release_after)
            for n in sorted(run.bench.values(), key=lambda n: n.rank) if n.end_t is None]


def standing(run: SpotrelayRun) -> list[Node]:
    """``services.controller.spare_nodes``: live, not yet promoted."""
    return [r for r in records(run) if r.state.value in _LIVE and r.takes_rank is None]


def on_recover(run: SpotrelayRun, home: Pool | None, nodes: list[Node], keep: list[str]) -> None:
    """``recovery_flow._promote_spares``: spares in the survivors' pool take the lost ranks; the others go."""
    takeovers, released = spare_takeovers(standing(run), home, nodes, keep, run.spec.resources.nodes)
    for spare, rank in takeovers:
        run.bench[spare.instance_id].takes_rank = rank
    for spare in released:
        node = run.bench.pop(spare.instance_id)
        run.end_node(node)


def to_launch(run: SpotrelayRun, promoted: list[Promotion]) -> list[int]:
    res = run.spec.resources
    return spare_ranks_to_launch(standing(run), [p.instance_id for p in promoted], res.nodes, res.spares)


def left(run: SpotrelayRun, promoted: list[Promotion]) -> list[int]:
    """``workflow_tasks._left_spares``: ranks given to spares that left the bench since."""
    live = {i for i, n in run.bench.items() if n.state in _LIVE and n.end_t is None}
    return [p.rank for p in promoted if p.instance_id not in live]


def join(run: SpotrelayRun, launched: list[SimNode], spare_ranks: list[int], promoted: list[Promotion],
         attempt: int) -> dict[int, SimNode]:
    """After a launch: new spares go to the bench; promoted ones leave it and take their ranks
    (``workflow_tasks.promote_spares``; one EC2 took meanwhile is skipped, the ready wait sees the gap).
    Returns the launched gang ranks and the promoted spares by rank."""
    gang: dict[int, SimNode] = {}
    for node in launched:
        if node.rank in spare_ranks:
            node.spare = True
            run.bench[node.instance_id] = node
        else:
            gang[node.rank] = node
    for take in promoted:
        spare = run.bench.get(take.instance_id)
        if spare is None or spare.end_t is not None or spare.state not in _LIVE:
            continue
        node = run.bench.pop(take.instance_id)
        node.spare, node.takes_rank, node.rank, node.attempt = False, None, take.rank, attempt
        node.exit_code = None
        gang[take.rank] = node
        run.note(node.pool.key, f"spare takes rank {take.rank}")
    return gang


def off_bench(run: SpotrelayRun, node: SimNode) -> bool:
    """A notice or loss of a spare: it leaves the bench (the next provision launches another)."""
    if not node.spare or node.instance_id not in run.bench:
        return False
    if node.end_t is not None:
        del run.bench[node.instance_id]
    elif node.state in _LIVE:
        node.state = "DOOMED"
    return True


def _standby_standing(run: SpotrelayRun) -> bool:
    return any(n.release_after is not None and n.takes_rank is None and n.state in _LIVE and n.end_t is None
               for n in run.bench.values())


def request_standby(run: SpotrelayRun, node: SimNode) -> AttemptEnd | None:
    """``prewarm.request_standby``: the verdict that ends the outcome wait, or None (off, or one stands by)."""
    policy = run.spec.recovery
    if not policy.prewarm_on_rebalance or run.waiting != "outcome" or _standby_standing(run):
        return None
    return AttemptEnd(outcome=Verdict.REBALANCE, attempt=run.attempt, lost_ranks=(node.rank,),
                      deadline=run.now + policy.prewarm_wait_s, reason=f"rebalance recommendation for rank {node.rank}")


def prewarm(run: SpotrelayRun, ask: AttemptEnd) -> dict[str, object]:
    """``prewarm.prewarm``: one standby in the at-risk node's pool; no capacity only skips it."""
    at_risk = [n for r, n in run.gang.items() if r in ask.lost_ranks and n.end_t is None]
    if ask.attempt != run.attempt or not at_risk or _standby_standing(run):
        return {"launched": []}
    taken = {n.rank for n in run.bench.values() if n.state in _LIVE and n.end_t is None}
    gang = run.spec.resources.nodes
    rank = next(r for r in range(gang, gang + len(taken) + 1) if r not in taken)
    launched = run.launch(at_risk[0].pool, [rank], run.attempt)
    if launched is None:
        return {"launched": [], "error": "InsufficientCapacityError"}
    for node in launched:
        node.spare, node.release_after = True, ask.deadline
        run.bench[node.instance_id] = node
        run.at(float(ask.deadline or run.now), _expire, (run, node))
    return {"launched": [n.instance_id for n in launched], "until": ask.deadline}


def _expire(arg: tuple[SpotrelayRun, SimNode]) -> None:
    """``prewarm.release_expired``: no notice came; the standby goes."""
    run, node = arg
    if node.instance_id in run.bench and node.takes_rank is None:
        run.end_node(run.bench.pop(node.instance_id))
