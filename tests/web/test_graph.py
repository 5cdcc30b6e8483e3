"""The workflow graph's layout and SVG (jobrun.web.graph), without a database.

Layers are depths (longest path from a root); the picture is the same for
the same graph whatever order its jobs come in; boxes of a layer never
overlap; a large workflow is drawn bounded, the rest counted; every text
written is escaped.
"""

from __future__ import annotations

import itertools
import random
import uuid

from jobrun.job.model import State
from jobrun.web.graph import (
    MAX_EDGES,
    MAX_LAYERS,
    MAX_PER_LAYER,
    NODE_HEIGHT,
    NODE_WIDTH,
    Graph,
    Vertex,
    depths,
    layout,
    render_svg,
)
from tests.web.test_app_support import parse


def ids(n: int, seed: int = 1) -> list[uuid.UUID]:
    rng = random.Random(seed)
    return [uuid.UUID(int=rng.getrandbits(128)) for _ in range(n)]


def link(job_id: uuid.UUID) -> str:
    return f"/jobs/{job_id}"


def overlaps(graph: Graph) -> list[tuple[str, str]]:
    found = []
    boxes = list(graph.boxes)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if abs(a.x - b.x) < NODE_WIDTH and abs(a.y - b.y) < NODE_HEIGHT:
                found.append((a.key, b.key))
    return found


def test_a_jobs_layer_is_its_longest_path_from_a_root() -> None:
    a, b, c, d = ids(4)
    vertices = [Vertex(x, n, State.QUEUED) for x, n in zip((a, b, c, d), "abcd", strict=True)]
    # a -> b -> c, a -> c, d alone: c is two deep (its longest path), not one.
    assert depths(vertices, [(a, b), (b, c), (a, c)]) == {a: 0, b: 1, c: 2, d: 0}
    outside = uuid.uuid4()
    assert depths(vertices, [(outside, a)])[a] == 0  # a parent outside the workflow


def test_every_edge_goes_rightwards_and_no_boxes_overlap() -> None:
    n = ids(40, seed=3)
    rng = random.Random(7)
    vertices = [Vertex(x, f"job-{i}", State.SUCCEEDED) for i, x in enumerate(n)]
    edges = [(n[i], n[j]) for j in range(1, 40) for i in rng.sample(range(j), min(j, 2))]
    graph = layout(vertices, edges)
    assert overlaps(graph) == []
    at = {b.key: b for b in graph.boxes}
    for e in graph.edges:
        assert at[e.parent].layer < at[e.child].layer
        assert at[e.parent].x + NODE_WIDTH < at[e.child].x
    assert all(b.x >= 0 and b.x + NODE_WIDTH <= graph.width for b in graph.boxes)
    assert all(b.y >= 0 and b.y + NODE_HEIGHT <= graph.height for b in graph.boxes)
    assert len(graph.edges) == len(edges) and graph.hidden == 0


def test_the_layout_is_the_same_whatever_the_order_of_jobs_and_edges() -> None:
    n = ids(30, seed=5)
    vertices = [Vertex(x, f"n{i:02}", State.QUEUED) for i, x in enumerate(n)]
    edges = [(n[i // 2], n[i]) for i in range(1, 30)]
    first = layout(vertices, edges)
    rng = random.Random(11)
    shuffled_v, shuffled_e = vertices[:], edges[:]
    rng.shuffle(shuffled_v)
    rng.shuffle(shuffled_e)
    again = layout(shuffled_v, shuffled_e)
    assert sorted(first.boxes, key=lambda b: b.key) == sorted(again.boxes, key=lambda b: b.key)
    assert sorted(first.edges, key=lambda e: (e.parent, e.child)) == sorted(
        again.edges, key=lambda e: (e.parent, e.child)
    )
    assert render_svg(layout(vertices, edges), link) == render_svg(first, link)


def test_a_fan_out_of_ten_thousand_is_drawn_bounded_failures_first() -> None:
    root, fan_in, *children = ids(10_002, seed=9)
    vertices = [Vertex(root, "load", State.SUCCEEDED), Vertex(fan_in, "total", State.WAITING)]
    vertices += [
        Vertex(c, f"line.{i}", State.DEAD if i in (9000, 9001) else State.SUCCEEDED)
        for i, c in enumerate(children)
    ]
    edges = [(root, c) for c in children] + [(c, fan_in) for c in children]
    graph = layout(vertices, edges)
    assert graph.jobs == 10_002 and graph.layers == 3
    middle = [b for b in graph.boxes if b.layer == 1]
    assert len(middle) == MAX_PER_LAYER
    more = [b for b in middle if b.job is None]
    assert len(more) == 1 and more[0].hidden == 10_000 - (MAX_PER_LAYER - 1)
    assert more[0].label == f"{10_000 - (MAX_PER_LAYER - 1):,} more"
    assert dict(more[0].hidden_states) == {"succeeded": 10_000 - (MAX_PER_LAYER - 1)}
    shown = {b.label for b in middle if b.job is not None}
    assert {"line.9000", "line.9001"} <= shown  # the dead ones are never the hidden ones
    assert graph.hidden == more[0].hidden
    assert overlaps(graph) == []
    # One edge root -> "more" and one "more" -> fan-in, not ten thousand each.
    assert len(graph.edges) == 2 * MAX_PER_LAYER
    assert len(render_svg(graph, link)) < 60_000


def test_a_long_chain_draws_its_first_layers_and_sums_up_the_rest() -> None:
    chain = ids(1000, seed=13)
    vertices = [Vertex(x, f"step {i}", State.QUEUED) for i, x in enumerate(chain)]
    graph = layout(vertices, list(itertools.pairwise(chain)))
    assert graph.layers == 1000
    deeper = [b for b in graph.boxes if b.key == "more-deeper"]
    assert len(deeper) == 1 and deeper[0].hidden == 1000 - MAX_LAYERS
    assert deeper[0].label == f"{1000 - MAX_LAYERS} more in {1000 - MAX_LAYERS} layers"
    assert len(graph.boxes) == MAX_LAYERS + 1
    assert graph.edges[-1].child == "more-deeper"


def test_edges_past_the_cap_are_counted_not_drawn() -> None:
    # Two full layers of 24 jobs each, every one of the first the parent of every one
    # of the second: 576 edges, under the cap; a third and fourth layer add more.
    layers = [ids(MAX_PER_LAYER - 1, seed=s) for s in range(20, 26)]
    vertices = [
        Vertex(x, f"{i}.{j}", State.QUEUED)
        for i, layer in enumerate(layers)
        for j, x in enumerate(layer)
    ]
    edges = [(p, c) for a, b in itertools.pairwise(layers) for p in a for c in b]
    graph = layout(vertices, edges)
    assert len(edges) > MAX_EDGES
    assert len(graph.edges) == MAX_EDGES and graph.edges_hidden == len(edges) - MAX_EDGES


def test_every_text_of_the_svg_is_escaped() -> None:
    hostile = '<script>alert(1)</script>"><img src=x onerror=alert(2)>&'
    a, b = ids(2, seed=17)
    graph = layout([Vertex(a, hostile, State.DEAD), Vertex(b, "child", State.CANCELLED)], [(a, b)])
    svg = str(render_svg(graph, lambda job_id: f'/jobs/{job_id}?x="<b>'))
    assert "<script>" not in svg and "<img" not in svg and '"<b>' not in svg
    doc = parse(svg)
    node = doc.one("a", data_job_id=str(a))
    assert node.attrs["href"] == f'/jobs/{a}?x="<b>'  # an attribute, escaped, read back whole
    assert node.one("title").text == " ".join(f"{hostile}: dead".split())
    assert node.one("text").text.startswith("<script>alert(1)")
    assert node.one("text").text.endswith("…")  # cut to the box, whole in the title


def test_an_empty_workflow_draws_an_empty_picture() -> None:
    graph = layout([], [])
    assert graph.boxes == () and graph.edges == () and graph.jobs == 0
    assert str(render_svg(graph, link)).startswith('<svg id="workflow-graph"')
