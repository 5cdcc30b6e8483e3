"""A workflow's graph as inline SVG: one box per job, coloured by its state, in layers.

Drawn on the server like the throughput chart (:mod:`jobrun.web.chart`):
plain ``<svg>`` markup in the page, no script, no external library, under
the dashboard's Content-Security-Policy. :func:`layout` does the geometry,
pure and deterministic (the same graph always gives the same picture);
:func:`render_svg` writes it, escaping every text it writes (a node's name
is whatever the workflow's author chose: it is data, never markup).

The layers are columns, left to right: a job's layer is its depth, the
longest path to it from a root (a job without parents in the workflow), so
every edge goes rightwards and a job is drawn after all its parents. In a
layer, jobs are ordered by the mean position of their parents in the layers
before (the barycenter heuristic: fewer crossings), then by name.

What is drawn is bounded whatever the workflow's size (100,000 jobs at
most): a layer shows at most :data:`MAX_PER_LAYER` jobs, the rest collapsed
into one "N more" box (jobs that need attention first: dead, running,
cancelled, before the queued, waiting and succeeded ones), and at most
:data:`MAX_LAYERS` layers are drawn, the deeper ones summed up in a last
box. A fan-out of 10,000 is then a root, 24 children, a box "9,976 more"
and its fan-in; a chain of 1,000 is 30 boxes and "970 more in 970 layers".
Edges are drawn between boxes (an edge to a collapsed job goes to its
layer's "more" box, once), at most :data:`MAX_EDGES` of them.
"""

from __future__ import annotations

import collections
import dataclasses
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

from markupsafe import Markup

from jobrun.job.model import State

MAX_PER_LAYER = 25
"""Boxes of one layer, its "more" box included."""
MAX_LAYERS = 30
"""Layers drawn; deeper jobs are summed up in one last box."""
MAX_EDGES = 2000
"""Edges drawn (between the boxes drawn)."""
LABEL_CHARS = 22
"""A box's label: the node's name cut to this many characters (the whole name in its
tooltip)."""

NODE_WIDTH = 168
NODE_HEIGHT = 30
LAYER_GAP = 56
ROW_GAP = 12
MARGIN = 8

ATTENTION = (
    State.DEAD,
    State.LEASED,
    State.CANCELLED,
    State.QUEUED,
    State.WAITING,
    State.SUCCEEDED,
)
"""Which jobs a crowded layer shows first."""


@dataclasses.dataclass(frozen=True, slots=True)
class Vertex:
    """A job of the workflow, as the graph needs it."""

    id: uuid.UUID
    name: str
    state: State


@dataclasses.dataclass(frozen=True, slots=True)
class Box:
    """One drawn box: a job, or (``job`` None) the jobs of a layer not drawn one by one."""

    key: str
    """Unique in the graph: the job's id, or ``more-<layer>``."""
    layer: int
    row: int
    x: float
    y: float
    label: str
    title: str
    state: str
    """The job's state; ``more`` for a collapsed box."""
    job: uuid.UUID | None = None
    hidden: int = 0
    """Jobs this box stands for (collapsed boxes only)."""
    hidden_states: tuple[tuple[str, int], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Edge:
    """A line from a parent's box to a child's box (right side to left side)."""

    parent: str
    child: str
    path: str
    """The SVG path's ``d``: a cubic curve."""


@dataclasses.dataclass(frozen=True, slots=True)
class Graph:
    boxes: tuple[Box, ...]
    edges: tuple[Edge, ...]
    width: int
    height: int
    jobs: int
    """Jobs in the workflow (as read)."""
    layers: int
    """Layers in the workflow (drawn or not)."""
    hidden: int
    """Jobs not drawn one by one (in "more" boxes)."""
    edges_hidden: int
    """Edges not drawn past :data:`MAX_EDGES`."""


def depths(
    vertices: Sequence[Vertex], edges: Iterable[tuple[uuid.UUID, uuid.UUID]]
) -> dict[uuid.UUID, int]:
    """Each job's layer: the longest path to it from a root (Kahn's order).

    ``edges`` are (parent, child); edges to or from jobs not in ``vertices``
    (a parent outside the workflow) are left out. A cycle cannot be stored
    (the enqueue refuses it); should one be read, its jobs go one layer
    past the deepest, so that the page still draws.
    """
    ids = {v.id for v in vertices}
    children: dict[uuid.UUID, list[uuid.UUID]] = {v.id: [] for v in vertices}
    waiting = dict.fromkeys(ids, 0)
    for parent, child in edges:
        if parent in ids and child in ids and parent != child:
            children[parent].append(child)
            waiting[child] += 1
    depth = dict.fromkeys(ids, 0)
    ready = collections.deque(v.id for v in vertices if waiting[v.id] == 0)
    placed = 0
    while ready:
        node = ready.popleft()
        placed += 1
        for child in children[node]:
            depth[child] = max(depth[child], depth[node] + 1)
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    if placed < len(ids):
        stuck = max(depth.values(), default=0) + 1
        for node, left in waiting.items():
            if left > 0:
                depth[node] = stuck
    return depth


def layout(vertices: Sequence[Vertex], edges: Iterable[tuple[uuid.UUID, uuid.UUID]]) -> Graph:
    """The boxes and edges to draw for ``vertices`` (the workflow's jobs) and ``edges``
    ((parent, child) pairs), bounded as the module docstring says."""
    edge_list = [(p, c) for p, c in edges]
    depth = depths(vertices, edge_list)
    by_id = {v.id: v for v in vertices}
    layers: dict[int, list[Vertex]] = collections.defaultdict(list)
    for v in vertices:
        layers[depth[v.id]].append(v)
    parents: dict[uuid.UUID, list[uuid.UUID]] = collections.defaultdict(list)
    for p, c in edge_list:
        if p in by_id and c in by_id:
            parents[c].append(p)

    count = max(layers, default=-1) + 1
    drawn_layers = min(count, MAX_LAYERS)
    position: dict[uuid.UUID, float] = {}
    box_of: dict[uuid.UUID, str] = {}
    boxes: list[Box] = []
    rows_max = 0
    for layer in range(drawn_layers):
        members = layers.get(layer, [])
        shown, rest = _crowd(members)
        shown.sort(key=lambda v: (_barycenter(v, parents, position), v.name, v.id))
        row = 0
        for row, v in enumerate(shown):
            position[v.id] = float(row)
            box_of[v.id] = str(v.id)
            boxes.append(
                Box(
                    key=str(v.id),
                    layer=layer,
                    row=row,
                    x=_x(layer),
                    y=_y(row),
                    label=_cut(v.name),
                    title=f"{v.name}: {v.state.value}",
                    state=v.state.value,
                    job=v.id,
                )
            )
        if rest:
            row = len(shown)
            key = f"more-{layer}"
            for v in rest:
                position[v.id] = float(row)
                box_of[v.id] = key
            boxes.append(_more(key, layer, row, rest, f"{len(rest):,} more"))
        rows_max = max(rows_max, row + 1 if members else 0)
    deeper = [v for layer in range(drawn_layers, count) for v in layers[layer]]
    if deeper:
        key = "more-deeper"
        for v in deeper:
            box_of[v.id] = key
        label = f"{len(deeper):,} more in {count - drawn_layers:,} layers"
        boxes.append(_more(key, drawn_layers, 0, deeper, label))
        rows_max = max(rows_max, 1)

    placed = {b.key: b for b in boxes}
    pairs: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for p, c in edge_list:
        if p not in box_of or c not in box_of:
            continue
        pair = (box_of[p], box_of[c])
        if pair[0] != pair[1] and pair not in seen:
            seen.add(pair)
            pairs.append(pair)
    pairs.sort(
        key=lambda pc: (
            placed[pc[0]].layer,
            placed[pc[0]].row,
            placed[pc[1]].layer,
            placed[pc[1]].row,
        )
    )
    drawn = [
        Edge(parent=p, child=c, path=_curve(placed[p], placed[c])) for p, c in pairs[:MAX_EDGES]
    ]
    columns = drawn_layers + (1 if deeper else 0)
    return Graph(
        boxes=tuple(boxes),
        edges=tuple(drawn),
        width=int(2 * MARGIN + max(columns, 1) * NODE_WIDTH + max(columns - 1, 0) * LAYER_GAP),
        height=int(2 * MARGIN + max(rows_max, 1) * NODE_HEIGHT + max(rows_max - 1, 0) * ROW_GAP),
        jobs=len(vertices),
        layers=count,
        hidden=sum(b.hidden for b in boxes),
        edges_hidden=max(len(pairs) - MAX_EDGES, 0),
    )


def _crowd(members: list[Vertex]) -> tuple[list[Vertex], list[Vertex]]:
    """The jobs of a layer drawn one by one, and those collapsed (attention first)."""
    if len(members) <= MAX_PER_LAYER:
        return list(members), []
    rank = {state: i for i, state in enumerate(ATTENTION)}
    ordered = sorted(members, key=lambda v: (rank.get(v.state, len(rank)), v.name, v.id))
    keep = MAX_PER_LAYER - 1
    return ordered[:keep], ordered[keep:]


def _barycenter(
    v: Vertex, parents: Mapping[uuid.UUID, list[uuid.UUID]], position: Mapping[uuid.UUID, float]
) -> float:
    placed = [position[p] for p in parents.get(v.id, ()) if p in position]
    return sum(placed) / len(placed) if placed else float("inf")


def _more(key: str, layer: int, row: int, jobs: Sequence[Vertex], label: str) -> Box:
    states = collections.Counter(v.state.value for v in jobs)
    ordered = tuple((s.value, states[s.value]) for s in ATTENTION if states[s.value])
    detail = ", ".join(f"{n:,} {s}" for s, n in ordered)
    return Box(
        key=key,
        layer=layer,
        row=row,
        x=_x(layer),
        y=_y(row),
        label=label,
        title=f"{label}: {detail}",
        state="more",
        hidden=len(jobs),
        hidden_states=ordered,
    )


def _x(layer: int) -> float:
    return float(MARGIN + layer * (NODE_WIDTH + LAYER_GAP))


def _y(row: int) -> float:
    return float(MARGIN + row * (NODE_HEIGHT + ROW_GAP))


def _cut(name: str) -> str:
    return name if len(name) <= LABEL_CHARS else name[: LABEL_CHARS - 1] + "…"


def _curve(parent: Box, child: Box) -> str:
    x1, y1 = parent.x + NODE_WIDTH, parent.y + NODE_HEIGHT / 2
    x2, y2 = child.x, child.y + NODE_HEIGHT / 2
    mid = (x1 + x2) / 2
    return f"M{x1:g},{y1:g} C{mid:g},{y1:g} {mid:g},{y2:g} {x2:g},{y2:g}"


def render_svg(graph: Graph, link: Callable[[uuid.UUID], str]) -> Markup:
    """``graph`` as an ``<svg id="workflow-graph">`` element; ``link(job_id)`` is a job's page.

    Every text and attribute value is escaped here (names, titles, links):
    the result is Markup a template inserts as it is.
    """
    out = [
        Markup(
            '<svg id="workflow-graph" class="graph" xmlns="http://www.w3.org/2000/svg" '
            'width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
            'aria-label="the workflow\'s jobs, parents left of their children" '
            'data-jobs="{jobs}" data-layers="{layers}" data-hidden="{hidden}" '
            'data-edges-hidden="{eh}">'
        ).format(
            w=graph.width,
            h=graph.height,
            jobs=graph.jobs,
            layers=graph.layers,
            hidden=graph.hidden,
            eh=graph.edges_hidden,
        ),
        Markup('<g class="edges">'),
    ]
    for e in graph.edges:
        out.append(
            Markup('<path class="edge" d="{}" data-parent="{}" data-child="{}"></path>').format(
                e.path, e.parent, e.child
            )
        )
    out.append(Markup("</g>"))
    for b in graph.boxes:
        inner = Markup(
            '<title>{title}</title><rect x="{x:g}" y="{y:g}" width="{w}" height="{h}" rx="4">'
            '</rect><text x="{tx:g}" y="{ty:g}">{label}</text>'
        ).format(
            title=b.title,
            x=b.x,
            y=b.y,
            w=NODE_WIDTH,
            h=NODE_HEIGHT,
            tx=b.x + 8,
            ty=b.y + NODE_HEIGHT / 2 + 4,
            label=b.label,
        )
        if b.job is not None:
            out.append(
                Markup(
                    '<a class="node state-{state}" href="{href}" data-job-id="{id}" '
                    'data-state="{state}" data-layer="{layer}" data-row="{row}">{inner}</a>'
                ).format(
                    state=b.state,
                    href=link(b.job),
                    id=b.job,
                    layer=b.layer,
                    row=b.row,
                    inner=inner,
                )
            )
        else:
            out.append(
                Markup(
                    '<g class="node more" id="{key}" data-hidden="{hidden}" data-layer="{layer}" '
                    'data-row="{row}">{inner}</g>'
                ).format(key=b.key, hidden=b.hidden, layer=b.layer, row=b.row, inner=inner)
            )
    out.append(Markup("</svg>"))
    return Markup("").join(out)


__all__ = [
    "MAX_EDGES",
    "MAX_LAYERS",
    "MAX_PER_LAYER",
    "Box",
    "Edge",
    "Graph",
    "Vertex",
    "depths",
    "layout",
    "render_svg",
]
