"""How an attempt ended, from what the ranks reported and what happened to their nodes: the one
classifier (``services/waits.settle`` calls it when a wait ends; the result is an ``AttemptEnd``).

Precedence, highest first (the first that applies names the verdict):

1. cancelled (asked for, or any rank exited CANCELLED) -> CANCELLED
2. every rank of the gang exited DONE -> SUCCEEDED, even when a node was doomed or lost after
   its rank finished: training is over and there is nothing to resume (before, a notice near the
   end made it an interruption and cost a relaunch that resumed the final checkpoint and ended at once)
3. a spot notice for any node, or a rank exited PREEMPTED_SAVED/UNSAVED -> INTERRUPTED
4. a node gone without notice (state change, stale heartbeat) -> NODE_LOST
5. a rank refused to start (REFUSED: a checkpoint it cannot use, a batch its world cannot split),
   or exited with a user code (1, or any code without a meaning of its own) -> USER_ERROR;
   other ranks usually die of the broken collective then, so this outranks infra errors. A refusal
   is named first and keeps its code, so the retry budget can fail it at once
6. a rank exited INFRA_ERROR or was killed by a signal -> INFRA_ERROR (its node is suspect)

``lost_ranks`` are the ranks whose nodes must be replaced: doomed and lost nodes, and for an
infra error the ranks that reported it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.contracts.recovery import AttemptEnd, Verdict
from spotrelay.domain.models import Node, NodeState

_PREEMPTED = {int(ExitCode.PREEMPTED_SAVED), int(ExitCode.PREEMPTED_UNSAVED)}
_OWN_MEANING = {int(c) for c in ExitCode}


def _first(codes: Mapping[int, int], wanted: set[int] | None = None, user: bool = False) -> tuple[int, int] | None:
    for rank in sorted(codes):
        code = codes[rank]
        if wanted is not None and code in wanted:
            return rank, code
        if user and code > 0 and (code == int(ExitCode.USER_ERROR) or code not in _OWN_MEANING):
            return rank, code
    return None


def classify_attempt(
    exit_codes: Mapping[int, int], doomed_ranks: Iterable[int] = (), lost_ranks: Iterable[int] = (),
    cancelled: bool = False, attempt: int = 0, ranks: Iterable[int] | None = None,
) -> AttemptEnd:
    """Classify from per-rank exit codes (rank -> code; negative = killed by that signal).

    ``ranks``: every rank of the gang (default: those with a code, doomed or lost); SUCCEEDED needs
    an exit 0 from each of them, so a doomed rank that has not reported keeps the end an interruption.
    """
    doomed, lost = sorted(set(doomed_ranks)), sorted(set(lost_ranks))
    gone = tuple(sorted(set(doomed) | set(lost)))
    hit = _first(exit_codes, {int(ExitCode.CANCELLED)})
    if cancelled or hit:
        return AttemptEnd(outcome=Verdict.CANCELLED, attempt=attempt, reason="cancelled",
                          exit_code=hit[1] if hit else None, rank=hit[0] if hit else None, lost_ranks=gone)
    gang = set(exit_codes) | set(gone) if ranks is None else set(ranks)
    if exit_codes and all(exit_codes.get(r) == 0 for r in gang):
        note = f" (nodes of ranks {list(gone)} were leaving after)" if gone else ""
        return AttemptEnd(outcome=Verdict.SUCCEEDED, attempt=attempt, reason=f"every rank exited 0{note}", exit_code=0)
    hit = _first(exit_codes, _PREEMPTED)
    if doomed or hit:
        unsaved = any(c == int(ExitCode.PREEMPTED_UNSAVED) for c in exit_codes.values())
        what = "spot interruption" + (" (checkpoint missed the deadline)" if unsaved else "")
        ranks = list(gone) if gone else [hit[0]] if hit else []
        return AttemptEnd(outcome=Verdict.INTERRUPTED, attempt=attempt, reason=f"{what} of ranks {ranks}",
                          exit_code=hit[1] if hit else None, rank=hit[0] if hit else None, lost_ranks=gone,
                          saved=not unsaved)
    if lost:
        return AttemptEnd(outcome=Verdict.NODE_LOST, attempt=attempt,
                          reason=f"nodes of ranks {lost} lost without notice", lost_ranks=gone)
    hit = _first(exit_codes, {int(ExitCode.REFUSED)})
    if hit:
        return AttemptEnd(outcome=Verdict.USER_ERROR, attempt=attempt, reason=f"the trainer refused to start on "
                          f"rank {hit[0]} (exit {hit[1]})", exit_code=hit[1], rank=hit[0])  # fmt: skip
    hit = _first(exit_codes, user=True)
    if hit:
        return AttemptEnd(outcome=Verdict.USER_ERROR, attempt=attempt,
                          reason=f"training code exited {hit[1]} on rank {hit[0]}", exit_code=hit[1], rank=hit[0])
    infra = sorted(r for r, c in exit_codes.items() if c == int(ExitCode.INFRA_ERROR) or c < 0)
    if infra:
        code = exit_codes[infra[0]]
        what = f"killed by signal {-code}" if code < 0 else "infrastructure error"
        return AttemptEnd(outcome=Verdict.INFRA_ERROR, attempt=attempt, reason=f"{what} on ranks {infra}",
                          exit_code=code, rank=infra[0], lost_ranks=tuple(infra))
    raise ValueError(f"cannot classify an attempt from exit codes {dict(exit_codes)} with no lost node")


def classify_nodes(nodes: Iterable[Node], cancelled: bool = False) -> AttemptEnd:
    """Classify from the gang's node records (state and exit code as the handlers stored them).

    A TERMINATED node that never reported an exit code was reclaimed after its notice (the state
    change of a DOOMED node): it counts as doomed, so the end stays an interruption. So does a node
    with a reclaim time that exited after saving: its instance is going, whatever its state says.
    """
    codes: dict[int, int] = {}
    ranks: list[int] = []
    doomed: list[int] = []
    lost: list[int] = []
    tails: dict[int, str] = {}
    attempt = 0
    for node in nodes:
        if node.output_tail:
            tails[node.rank] = node.output_tail
        attempt = max(attempt, node.attempt)
        ranks.append(node.rank)
        if node.exit_code is not None:
            codes[node.rank] = node.exit_code
        # reclaim_at stays after a doomed rank exits cleanly (75): it is leaving, never a survivor
        leaving = node.state is NodeState.DOOMED or node.reclaim_at is not None
        if leaving or (node.state is NodeState.TERMINATED and node.exit_code is None):
            doomed.append(node.rank)
        elif node.state is NodeState.LOST:
            lost.append(node.rank)
    end = classify_attempt(codes, doomed, lost, cancelled, attempt, ranks)
    tail = tails.get(end.rank) if end.rank is not None else None
    if tail and end.outcome in (Verdict.USER_ERROR, Verdict.INFRA_ERROR):
        # quoted into the reason, so the job's reasons and its notifications say why
        end = end.model_copy(update={"reason": f"{end.reason}; its output ended with:\n{tail}"})
    return end
