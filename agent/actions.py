"""Decide and act: turn a new notice into a request to the trainer, follow the trainer's commit
events, report them against the deadline, and classify how training ended.

The request goes to this node's ``request.json`` only. The trainer's ranks agree on it with an
all-reduce(MAX) at the next step boundary (spotrelay.contracts.control), so every rank of the job,
on every node, saves the same step even when only the doomed node was told.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.monitors import Notice, NoticeKind
from agent.reporting import Reporter, info, warn
from spotrelay.contracts import control
from spotrelay.contracts.control import REQUEST_CODE, RequestKind, StopRequest, TrainerEvent
from spotrelay.contracts.events import DEADLINE_AT_RISK, DirectiveKind
from spotrelay.contracts.exit_codes import ExitCode

_DIRECTIVE_REQUEST = {
    DirectiveKind.CHECKPOINT_NOW: RequestKind.CHECKPOINT_AND_STOP,
    DirectiveKind.CHECKPOINT: RequestKind.CHECKPOINT,
    DirectiveKind.STOP: RequestKind.STOP,
}


@dataclass(frozen=True)
class Decision:
    request: RequestKind | None  # what to ask the trainer for
    restart: bool  # restart the training command (RESTART directive)
    deadline: float | None
    reason: str


def decide(notice: Notice) -> Decision:
    """Pure: what a new notice calls for."""
    if notice.kind is NoticeKind.SPOT_INTERRUPTION:  # terminate, stop and hibernate all end training here
        return Decision(RequestKind.CHECKPOINT_AND_STOP, False, notice.deadline, notice.reason)
    if notice.kind is NoticeKind.REBALANCE:  # elevated risk: save now, keep training
        return Decision(RequestKind.CHECKPOINT, False, None, notice.reason)
    kind = DirectiveKind(notice.action)
    if kind is DirectiveKind.RESTART:
        return Decision(None, True, None, notice.reason)
    return Decision(_DIRECTIVE_REQUEST[kind], False, notice.deadline, notice.reason)


def classify_exit(
    launcher_code: int, workers: dict[int, int], request: StopRequest | None, committed: bool, killed: bool
) -> tuple[int, str]:
    """The node's exit code (spotrelay.contracts.exit_codes) and a reason.

    Ranks' own codes (recorded by the per-rank wrapper) win over the launcher's, which only says
    "something failed". With no record at all the ranks died under us (signal, OOM, rendezvous).
    """
    nonzero = [c for c in workers.values() if c != 0]
    if workers and not nonzero:
        if launcher_code == 0:
            return ExitCode.DONE, "done"
        return ExitCode.INFRA_ERROR, f"launcher failed ({launcher_code}) after every rank finished"
    if nonzero:
        known = {int(c) for c in ExitCode}
        user = [c for c in nonzero if c not in known or c in (ExitCode.USER_ERROR, ExitCode.REFUSED)]
        if user:
            return user[0], f"user-error: a rank exited {user[0]}"
        for code in (ExitCode.INFRA_ERROR, ExitCode.PREEMPTED_UNSAVED, ExitCode.CANCELLED, ExitCode.PREEMPTED_SAVED):
            if code in nonzero:
                return code, ExitCode.describe(code)
    if launcher_code == 0:
        return ExitCode.DONE, "done"
    if request is not None and request.kind is RequestKind.STOP:
        return ExitCode.CANCELLED, "cancelled" + (" (killed after the grace period)" if killed else "")
    if request is not None and request.kind is RequestKind.CHECKPOINT_AND_STOP:
        if committed:
            return ExitCode.PREEMPTED_SAVED, "preempted-saved (ranks killed after the commit)"
        return ExitCode.PREEMPTED_UNSAVED, "preempted-unsaved: no checkpoint committed for the stop request"
    return ExitCode.INFRA_ERROR, f"ranks died without an exit code (launcher exited {launcher_code})"


class Responder:
    """Acts on decisions for one node and follows what the trainer reports back."""

    def __init__(self, control_dir: Path, reporter: Reporter, clock: Callable[[], float] = time.time) -> None:
        self.control_dir = control_dir
        self.reporter = reporter
        self.clock = clock
        self.pending: StopRequest | None = None
        self.requested_at: float | None = None
        self.committed_since_request = False
        self.last_committed: TrainerEvent | None = None
        self.deadline_reported = False

    # --- act ----------------------------------------------------------------------------------
    def ask(self, kind: RequestKind, deadline: float | None, reason: str) -> StopRequest:
        """Write a request unless a stronger or equal one is pending (then keep the earliest deadline)."""
        pending = self.pending
        if pending is not None and REQUEST_CODE[pending.kind] >= REQUEST_CODE[kind]:
            if deadline is not None and (pending.deadline is None or deadline < pending.deadline):
                pending = pending.model_copy(update={"deadline": deadline})
                control.write_request(self.control_dir, pending)
                self.pending = pending
            return pending
        request = StopRequest(request_id=uuid.uuid4().hex, kind=kind, deadline=deadline, reason=reason)
        control.write_request(self.control_dir, request)
        self.pending, self.requested_at, self.committed_since_request = request, self.clock(), False
        info("asked the trainer", request=request.model_dump(mode="json"))
        self._warn_if_at_risk(request)
        return request

    def _warn_if_at_risk(self, request: StopRequest) -> None:
        last = self.last_committed
        if request.deadline is None or last is None or not last.duration_s:
            return
        left = request.deadline - self.clock()
        if left < last.duration_s:
            self.reporter.anomaly(
                DEADLINE_AT_RISK,
                f"{left:.0f}s left, the last save took {last.duration_s:.0f}s; durable: step {last.step} {last.uri}",
            )

    def apply(self, notice: Notice) -> Decision:
        decision = decide(notice)
        info(
            "notice",
            kind=notice.kind.value,
            source=notice.source,
            action=notice.action,
            deadline=notice.deadline,
            request=decision.request,
            restart=decision.restart,
        )
        if decision.request is not None:
            self.ask(decision.request, decision.deadline, decision.reason)
        return decision

    def reset(self) -> None:
        """A restarted training command starts with no request pending."""
        control.clear_request(self.control_dir)
        self.pending = self.requested_at = None
        self.deadline_reported = False

    # --- follow -------------------------------------------------------------------------------
    def on_events(self, events: list[TrainerEvent]) -> None:
        for event in events:
            if event.kind != "checkpoint_committed":
                info("trainer event", event=event.model_dump(mode="json"))
                continue
            self._committed(event)

    def _committed(self, event: TrainerEvent) -> None:
        when = event.time or self.clock()
        pending = self.pending
        # a periodic save that happens to finish after a notice is not the emergency save
        answers = (
            pending is not None
            and self.requested_at is not None
            and when >= self.requested_at
            and (event.emergency if pending.kind is RequestKind.CHECKPOINT_AND_STOP else event.request_id is not None)
        )
        deadline = event.deadline
        if deadline is None and answers and pending is not None and event.emergency:
            deadline = pending.deadline
        met = None if deadline is None else when <= deadline
        self.reporter.checkpoint_committed(event.step, event.uri, event.duration_s, event.emergency, deadline, met,
                                           event.total_bytes)
        if self.last_committed is None or event.step >= self.last_committed.step:
            self.last_committed = event  # background uploads may commit out of order: keep the newest step
        if answers and pending is not None:
            self.committed_since_request = True
            if pending.kind is RequestKind.CHECKPOINT:
                control.clear_request(self.control_dir)  # done: training goes on
                self.pending = self.requested_at = None
        if met is False:
            self._report_missed(f"committed step {event.step} {when - (deadline or when):.1f}s late")

    def check_deadline(self, now: float) -> None:
        request = self.pending
        if request is None or request.deadline is None or self.committed_since_request:
            return
        if now > request.deadline and not self.deadline_reported:
            self._report_missed("no checkpoint committed by the deadline")

    def _report_missed(self, what: str) -> None:
        if self.deadline_reported:
            return
        self.deadline_reported = True
        last = self.last_committed
        durable = f"durable: step {last.step} {last.uri}" if last else "durable: nothing from this attempt"
        warn("deadline missed", what=what, durable=durable)
        self.reporter.anomaly("deadline-missed", f"{what}; {durable}")

    def kill_due(self, now: float, grace_s: float) -> bool:
        """Past the deadline (or a STOP's grace) the trainer has had its chance."""
        request = self.pending
        if request is None or request.kind is RequestKind.CHECKPOINT or self.requested_at is None:
            return False
        limit = request.deadline if request.deadline is not None else self.requested_at
        return now > limit + grace_s
