"""A job's flow: the graph of its dependencies (upstream, transitively) and its dependents
(downstream, transitively), each job with its state, read in one call of ``lua/flow.lua`` and
bounded, for the dashboard's Flow section. A job depends only on jobs of its own queue and, on
a partitioned queue, of its own partition, so the whole graph is read where the job is
(``producer.on_job``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from panqueue._job import JobState
from panqueue._keys import QueueKeys
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops.base import script_call
from panqueue._store.transport import Op
from panqueue.errors import ConfigError, JobNotFound

__all__ = ["FLOW_LOOK", "FLOW_NODES", "Flow", "FlowNode", "read_flow"]

#: The most jobs a flow shows (the job itself included).
FLOW_NODES = 200
#: The most jobs a flow's read looks at to count those it does not show: past it the count is
#: a lower bound (``Flow.counted_all`` is False). About three commands a job, all in one script:
#: 500 keep a read under about 3 ms of the server's time (docs/dashboard.md#a-jobs-flow).
FLOW_LOOK = 500


@dataclass(frozen=True)
class FlowNode:
    """One job of a flow: its ``state`` (None: it no longer exists) and its ``depth``, the
    length of the shortest path from the flow's job (negative: a dependency of it, transitively;
    0: the job; positive: a dependent)."""

    id: str
    state: JobState | None
    depth: int

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state.value if self.state else "removed",
                "depth": self.depth}


@dataclass(frozen=True)
class Flow:
    """The graph around ``job_id`` of ``queue``: ``nodes`` nearest first (the job itself
    first), ``edges`` as (dependency, dependent) pairs between them, and ``hidden``, how many
    jobs of the graph are not shown (at least that many when ``counted_all`` is False)."""

    queue: str
    job_id: str
    nodes: tuple[FlowNode, ...]
    edges: tuple[tuple[str, str], ...]
    hidden: int
    counted_all: bool

    @property
    def empty(self) -> bool:
        """Whether the job has neither dependencies nor dependents."""
        return len(self.nodes) <= 1 and self.hidden == 0

    def to_dict(self) -> dict[str, Any]:
        return {"queue": self.queue, "job_id": self.job_id,
                "nodes": [node.to_dict() for node in self.nodes],
                "edges": [{"dependency": a, "dependent": b} for a, b in self.edges],
                "hidden": self.hidden, "counted_all": self.counted_all}


def read_flow(keys: QueueKeys, job_id: str, most: int = FLOW_NODES, look: int = FLOW_LOOK
              ) -> Op[Flow]:
    """The flow of ``job_id``: at most ``most`` jobs shown, the nearest first, and those
    beyond counted up to ``look`` jobs looked at. :class:`JobNotFound` if the job does not
    exist."""
    if most < 1 or look < most:
        raise ConfigError(f"a flow shows at least 1 job and looks at no fewer than it shows, "
                          f"got most={most}, look={look}")
    reply = yield script_call(SCRIPTS.flow, keys, job_id, most, look)
    if reply is None:
        raise JobNotFound(keys.name, job_id)
    flat, edges, hidden, counted = reply
    nodes = tuple(
        FlowNode(flat[i].decode(), JobState(flat[i + 1].decode()) if flat[i + 1] else None,
                 int(flat[i + 2]))
        for i in range(0, len(flat), 3))
    pairs = tuple((edges[i].decode(), edges[i + 1].decode()) for i in range(0, len(edges), 2))
    return Flow(keys.name, job_id, nodes, pairs, int(hidden), bool(counted))
