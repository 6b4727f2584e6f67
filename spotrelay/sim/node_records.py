"""The node records the services read (``Node``), built from a simulated gang: the verdicts
(``waits``), ``classify_nodes`` and Recover take the records the DynamoDB store would hold."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from typing import Any

from spotrelay.domain.models import Node, NodeState, Pool
from spotrelay.sim.records import SimNode

_STATES = {s.value: s for s in NodeState}  # NodeState(value), looked up
_RANK = operator.attrgetter("rank")
_RECORD_FIELDS = frozenset({"node_id", "attempt", "rank", "instance_id", "pool", "state", "exit_code", "reclaim_at"})

_new_node = Node.__new__
_set = object.__setattr__


def copy_node(template: Node, update: dict[str, Any], fields: set[str] | None = None) -> Node:
    """``template.model_copy(update=update)`` for a record without extra or private attributes (a Node),
    minus pydantic's generic copy: the records of a stormy run's gangs are rebuilt ~70 times a recovery.
    ``fields``: the template's set fields and the update's keys, when the caller has them already."""
    node = _new_node(Node)
    values = template.__dict__.copy()
    values.update(update)
    _set(node, "__dict__", values)
    _set(node, "__pydantic_fields_set__", set(fields) if fields is not None
         else template.__pydantic_fields_set__ | update.keys())
    _set(node, "__pydantic_extra__", None)
    _set(node, "__pydantic_private__", None)
    return node


def template_for(pool: Pool) -> Node:
    """One validated record the others are copied from: the values are typed already, and validating
    each record was a third of a stormy run's CPU."""
    return Node(job_id="sim", node_id="a0-r0", attempt=0, rank=0, instance_id="i-0", pool=pool,
                state=NodeState.PENDING)


def gang_records(template: Node, gang: Iterable[SimNode], attempt: int, noticed: Iterable[str],
                 voluntary: Mapping[str, float]) -> list[Node]:
    """The gang's records by rank, for the job's attempt ``attempt``. A node's record is built again
    only when a field of it changed (the services only read records): it is cached on the node.
    ``noticed``: instance ids EC2 (or a move) gave a reclaim time; ``voluntary``: a move's own times."""
    fields = template.__pydantic_fields_set__ | _RECORD_FIELDS
    out = []
    for n in sorted(gang, key=_RANK):
        noticed_now = n.state == "DOOMED" or n.instance_id in noticed  # reclaim_at stays after the exit
        reclaim_at = voluntary.get(n.instance_id, n.removal_t) if noticed_now else None
        built_from = (n.attempt, attempt, n.rank, n.state, n.exit_code, reclaim_at)
        record = n.record
        if record is None or record[0] != built_from:
            record = n.record = (built_from, copy_node(template, {
                "node_id": f"a{n.attempt}-r{n.rank}", "attempt": attempt, "rank": n.rank,
                "instance_id": n.instance_id, "pool": n.pool.pool, "state": _STATES[n.state],
                "exit_code": n.exit_code, "reclaim_at": reclaim_at}, fields))
        out.append(record[1])
    return out
