"""Every transition of the job status table, allowed and refused."""

from __future__ import annotations

import itertools

import pytest

from spotrelay.domain.status import TERMINAL, TRANSITIONS, JobStatus, can_transition, transition
from spotrelay.errors import InvalidTransitionError

ALLOWED = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
ALL_PAIRS = list(itertools.product(JobStatus, JobStatus))


def test_table_covers_every_status() -> None:
    assert set(TRANSITIONS) == set(JobStatus)


@pytest.mark.parametrize(("current", "target"), sorted(ALLOWED))
def test_allowed(current: JobStatus, target: JobStatus) -> None:
    assert transition(current, target) is target


@pytest.mark.parametrize(("current", "target"), sorted(set(ALL_PAIRS) - ALLOWED))
def test_refused(current: JobStatus, target: JobStatus) -> None:
    assert not can_transition(current, target)
    with pytest.raises(InvalidTransitionError, match=f"from {current} to {target}"):
        transition(current, target)


def test_terminal_states_have_no_way_out() -> None:
    for status in TERMINAL:
        assert status.terminal and TRANSITIONS[status] == frozenset()


def test_lifecycle_paths_exist() -> None:
    happy = ["SUBMITTED", "VALIDATED", "PLACING", "PROVISIONING", "STARTING", "RUNNING", "SUCCEEDED"]
    recover = ["RUNNING", "CHECKPOINTING", "RECOVERING", "PLACING"]
    cancel = ["RUNNING", "CANCELLING", "CANCELLED"]
    for path in (happy, recover, cancel):
        for a, b in itertools.pairwise(path):
            assert can_transition(JobStatus(a), JobStatus(b)), (a, b)


def test_every_non_terminal_status_can_reach_a_terminal_one() -> None:
    for start in JobStatus:
        seen, frontier = {start}, [start]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen & TERMINAL, start
