"""A job's flow laid out for its page: the graph that ``ops.read_flow`` reads, in layers by
depth (its dependencies left, the job, its dependents right), each node placed in its layer so
that edges cross little, for the template to draw as SVG. Only numbers and the ids' text come
out; the template escapes every text."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from panqueue._store.ops import Flow

__all__ = ["NODE_HEIGHT", "NODE_WIDTH", "DrawnEdge", "DrawnNode", "FlowDrawing", "draw"]

NODE_WIDTH = 190
NODE_HEIGHT = 46
_COLUMN = NODE_WIDTH + 80  # from one layer's left side to the next one's
_ROW = NODE_HEIGHT + 18
_MARGIN = 12
_LABEL_CHARS = 24  # an id longer than this shows its start and "…" (its title: the whole)
_SWEEPS = 4  # passes of the ordering heuristic, each way


@dataclass(frozen=True)
class DrawnNode:
    """One job's box: where it is, its label (the id, cut to fit), and its state ("removed":
    no longer there, and then no link)."""

    id: str
    label: str
    state: str
    depth: int
    x: int
    y: int

    @property
    def removed(self) -> bool:
        return self.state == "removed"


@dataclass(frozen=True)
class DrawnEdge:
    """An arrow from a dependency to its dependent: an SVG path of numbers only."""

    dependency: str
    dependent: str
    path: str


@dataclass(frozen=True)
class FlowDrawing:
    queue: str
    job_id: str
    width: int
    height: int
    nodes: tuple[DrawnNode, ...]
    edges: tuple[DrawnEdge, ...]
    hidden: int
    counted_all: bool

    def to_dict(self) -> dict[str, Any]:
        return {"queue": self.queue, "job_id": self.job_id,
                "nodes": [{"id": n.id, "state": n.state, "depth": n.depth} for n in self.nodes],
                "edges": [{"dependency": e.dependency, "dependent": e.dependent}
                          for e in self.edges],
                "hidden": self.hidden, "counted_all": self.counted_all}


def _label(job_id: str) -> str:
    return job_id if len(job_id) <= _LABEL_CHARS else job_id[:_LABEL_CHARS - 1] + "…"


def _ordered(layers: dict[int, list[str]], edges: tuple[tuple[str, str], ...]
             ) -> dict[int, list[str]]:
    """Each column's jobs in an order that keeps edges short: a few sweeps out from the job's
    column, each job placed at the mean place of its neighbours in the layer it was reached
    from (the barycenter heuristic; ties keep the order read, nearest first)."""
    neighbours: dict[str, list[str]] = defaultdict(list)
    for dependency, dependent in edges:
        neighbours[dependency].append(dependent)
        neighbours[dependent].append(dependency)
    order = {column: list(ids) for column, ids in layers.items()}
    place = {job: i for ids in order.values() for i, job in enumerate(ids)}
    outward = sorted(c for c in order if c > 0) + sorted((c for c in order if c < 0),
                                                         reverse=True)
    for _ in range(_SWEEPS):
        for column in outward:
            inner = set(order.get(column - 1 if column > 0 else column + 1, ()))

            def key(job: str, inner: set[str] = inner) -> float:
                near = [place[n] for n in neighbours[job] if n in inner]
                return sum(near) / len(near) if near else float(place[job])

            order[column].sort(key=key)
            place.update((job, i) for i, job in enumerate(order[column]))
    return order


def _columns(flow: Flow) -> dict[str, int]:
    """Each job's column: its depth, moved out until every edge points right (a dependency of
    a job may also be a dependency of that job's dependency: the shortest path puts both in
    one column). The job stays in column 0; a job upstream moves left, one downstream right."""
    column = {node.id: node.depth for node in flow.nodes}
    for _ in range(len(column)):  # a longest path is no longer than the jobs shown
        moved = False
        for dependency, dependent in flow.edges:
            if column[dependency] >= column[dependent]:
                if column[dependent] > 0:
                    column[dependent] = column[dependency] + 1
                else:
                    column[dependency] = column[dependent] - 1
                moved = True
        if not moved:
            break
    return column


def draw(flow: Flow) -> FlowDrawing:
    """``flow`` laid out: dependencies left of their dependents, each column centred."""
    layers: dict[int, list[str]] = defaultdict(list)
    columns = _columns(flow)
    for node in flow.nodes:
        layers[columns[node.id]].append(node.id)
    order = _ordered(layers, flow.edges)
    first = min(order)
    tallest = max(len(ids) for ids in order.values())
    states = {n.id: (n.state.value if n.state else "removed", n.depth) for n in flow.nodes}
    drawn: dict[str, DrawnNode] = {}
    for column, ids in order.items():
        top = _MARGIN + (tallest - len(ids)) * _ROW // 2
        for row, job in enumerate(ids):
            state, depth = states[job]
            drawn[job] = DrawnNode(job, _label(job), state, depth,
                                   _MARGIN + (column - first) * _COLUMN, top + row * _ROW)
    edges = []
    for dependency, dependent in flow.edges:
        a, b = drawn[dependency], drawn[dependent]
        x1, y1 = a.x + NODE_WIDTH, a.y + NODE_HEIGHT // 2
        x2, y2 = b.x - 4, b.y + NODE_HEIGHT // 2  # the arrowhead ends at the box
        bend = (x2 - x1) // 2
        edges.append(DrawnEdge(dependency, dependent,
                               f"M {x1} {y1} C {x1 + bend} {y1}, {x2 - bend} {y2}, {x2} {y2}"))
    nodes = tuple(drawn[n.id] for n in flow.nodes)
    return FlowDrawing(
        flow.queue, flow.job_id,
        width=2 * _MARGIN + (max(order) - first) * _COLUMN + NODE_WIDTH,
        height=2 * _MARGIN + (tallest - 1) * _ROW + NODE_HEIGHT,
        nodes=nodes, edges=tuple(edges), hidden=flow.hidden, counted_all=flow.counted_all)
