"""A layered (Sugiyama-style) drawing of a DAG whose nodes may be bound into blocks.

``ember inspect --html`` draws the compiled graph with every fused kernel as a rectangle
around its member nodes.  A generic layered layout would scatter a kernel's members among
other nodes, and no rectangle could enclose them alone; so each block (a kernel) is laid out
first on its own -- its members in rows by their longest internal path -- and then placed as
one item of the layered layout of the condensed graph.  Two blocks of a layer never overlap
and every layer is a horizontal band, so a block's rectangle contains its members only.

The steps, each kept simple and deterministic:

1. layers: longest path from the sources, over blocks (sources other than the ``top`` ones
   move down next to their first successor, so a node fed only by constants does not pull a
   long edge from the top of the page);
2. an edge spanning several layers gets one dummy item per layer it crosses, shared by all
   long edges leaving the same node, so it is routed between the items instead of through
   them;
3. order within each layer: barycenter of the neighbours in the layer above, then below,
   sweeping a few times and keeping the order with the fewest crossings;
4. x: each item wants the mean position of its neighbours' ports; the closest placement that
   keeps the order and the gaps is an isotonic regression (pool adjacent violators), solved
   per layer over a few sweeps;
5. edges: from the bottom of the source node, through its dummies, to the top of the target
   node, the entry points of a node spread by where its edges come from.

Everything is pure Python over string ids: no ember types, testable on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Mapping, Sequence

Point = tuple[float, float]
# Item keys: a block the caller gave, a node of no block, the dummy of a long edge.
_BLOCK, _SINGLE, _DUMMY = "b:", "n:", "d:"
# Weights of the x placement, against the pull 1 of each neighbour: a long edge's dummies
# hold together (_pull); every item leans slightly to the axis x = 0, else following the
# neighbours lets the graph drift sideways layer after layer (each residual Add moving half
# way to its skip connection); an item with no neighbour in the layer looked at stays put.
# Tuned on BERT-base and ResNet-18 drawings (width, total sideways run of the edges).
DUMMY_CHAIN_PULL, CENTER_PULL, STAY_PULL = 4.0, 0.02, 0.25


@dataclass(frozen=True)
class Box:
    """A rectangle: ``x``, ``y`` its top-left corner."""

    x: float
    y: float
    width: float
    height: float

    @property
    def center_x(self) -> float:
        return self.x + self.width / 2

    @property
    def bottom(self) -> float:
        return self.y + self.height

    @property
    def right(self) -> float:
        return self.x + self.width

    def contains(self, other: Box) -> bool:
        return (self.x <= other.x and self.y <= other.y and other.right <= self.right and
                other.bottom <= self.bottom)

    def overlaps(self, other: Box) -> bool:
        return (self.x < other.right and other.x < self.right and self.y < other.bottom and
                other.y < self.bottom)


@dataclass(frozen=True)
class Spacing:
    node_gap: float = 22.0  # between neighbours in a layer
    layer_gap: float = 46.0  # between layers
    row_gap: float = 20.0  # between the rows inside a block
    block_pad: float = 8.0  # inside a block's rectangle, around its members
    block_label: float = 14.0  # above the members, for the block's label
    dummy_width: float = 6.0  # the room a long edge takes where it crosses a layer
    margin: float = 16.0
    sweeps: int = 8  # of the ordering and of the x placement


@dataclass(frozen=True)
class Route:
    source: str
    target: str
    points: tuple[Point, ...]  # first on the source's bottom, last on the target's top


@dataclass
class Layout:
    nodes: dict[str, Box]
    blocks: list[Box]  # one per block given, in order
    edges: list[Route]
    width: float
    height: float
    layers: int = 0


@dataclass
class _Item:
    """What a layer holds: a block (its members placed relative to its corner) or a dummy."""

    key: str
    width: float
    height: float
    members: dict[str, Box] = field(default_factory=dict)  # relative boxes
    rows: dict[str, int] = field(default_factory=dict)  # the row of each member
    layer: int = 0
    x: float = 0.0  # center

    @property
    def last_row(self) -> int:
        return max(self.rows.values(), default=0)

    def port(self, node: str | None) -> float:
        """Where an edge to or from ``node`` attaches, relative to the item's center."""
        if node is None or node not in self.members:
            return 0.0
        return self.members[node].center_x - self.width / 2


def layered_layout(sizes: Mapping[str, tuple[float, float]], edges: Sequence[tuple[str, str]],
                   blocks: Sequence[Sequence[str]] = (), *, top: Collection[str] = (),
                   spacing: Spacing = Spacing()) -> Layout:
    """Place the nodes (``sizes``: id -> (width, height), in a topological order if possible)
    so that every edge points down; ``blocks`` are groups of nodes drawn together inside one
    rectangle; ``top`` nodes (the graph inputs) stay in the first layer."""
    edges = _unique_edges(sizes, edges)
    block_of = _block_membership(sizes, blocks)
    members = _members(sizes, block_of)
    if _condensed_order(members, block_of, edges) is None:  # blocks that are not convex
        block_of = {node: _SINGLE + node for node in sizes}
        members = _members(sizes, block_of)
    items = {key: _block_item(key, nodes, sizes, edges, key.startswith(_BLOCK), spacing)
             for key, nodes in members.items()}
    order = _condensed_order(members, block_of, edges) or list(members)
    _assign_layers(items, order, block_of, edges, set(top))
    layers, chains = _with_dummies(items, block_of, edges, spacing)
    links = _links(items, block_of, edges, chains)
    _order_layers(layers, links, spacing.sweeps)
    _place_x(layers, links, spacing)
    tops = _place_y(layers, spacing)
    node_boxes = _node_boxes(items, tops)
    routes = _routes(items, block_of, edges, chains, node_boxes, tops, layers, spacing)
    block_boxes = [_block_box(items, block_of, list(nodes), node_boxes, tops) for nodes in blocks]
    width = max((box.right for box in node_boxes.values()), default=0.0) + spacing.margin
    width = max([width] + [b.right + spacing.margin for b in block_boxes] +
                [x + spacing.margin for r in routes for x, _ in r.points])
    height = max((box.bottom for box in node_boxes.values()), default=0.0) + spacing.margin
    return Layout(node_boxes, block_boxes, routes, width, height, len(layers))


# ---------------------------------------------------------------------- blocks


def _unique_edges(sizes: Mapping[str, tuple[float, float]],
                  edges: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    unique = []
    seen = set()
    for source, target in edges:
        if source not in sizes or target not in sizes:
            raise ValueError(f"edge {source!r} -> {target!r} names an unknown node")
        if source != target and (source, target) not in seen:
            seen.add((source, target))
            unique.append((source, target))
    return unique


def _block_membership(sizes: Mapping[str, tuple[float, float]],
                      blocks: Sequence[Sequence[str]]) -> dict[str, str]:
    block_of = {}
    for number, nodes in enumerate(blocks):
        for node in nodes:
            if node not in sizes:
                raise ValueError(f"block {number} names an unknown node {node!r}")
            if node in block_of:
                raise ValueError(f"node {node!r} is in two blocks")
            block_of[node] = f"{_BLOCK}{number}"
    return {node: block_of.get(node, _SINGLE + node) for node in sizes}


def _members(sizes: Mapping[str, tuple[float, float]],
             block_of: Mapping[str, str]) -> dict[str, list[str]]:
    members: dict[str, list[str]] = {}
    for node in sizes:
        members.setdefault(block_of[node], []).append(node)
    return members


def _condensed_order(members: Mapping[str, list[str]], block_of: Mapping[str, str],
                     edges: list[tuple[str, str]]) -> list[str] | None:
    """A topological order of the blocks, or None if binding them made a cycle."""
    successors: dict[str, set[str]] = {key: set() for key in members}
    indegree = dict.fromkeys(members, 0)
    for source, target in edges:
        a, b = block_of[source], block_of[target]
        if a != b and b not in successors[a]:
            successors[a].add(b)
            indegree[b] += 1
    rank = {key: i for i, key in enumerate(members)}
    ready = sorted((k for k, d in indegree.items() if d == 0), key=rank.__getitem__)
    order = []
    while ready:
        key = ready.pop(0)
        order.append(key)
        for nxt in sorted(successors[key], key=rank.__getitem__):
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
        ready.sort(key=rank.__getitem__)
    return order if len(order) == len(members) else None


def _block_item(key: str, nodes: list[str], sizes: Mapping[str, tuple[float, float]],
                edges: list[tuple[str, str]], framed: bool, spacing: Spacing) -> _Item:
    """Lay out a block's members in rows (longest internal path) and size its rectangle."""
    inside = set(nodes)
    internal = [(s, t) for s, t in edges if s in inside and t in inside]
    row_of = dict.fromkeys(nodes, 0)
    for _ in nodes:  # longest path; blocks are small, a fixed point is cheap enough
        changed = False
        for source, target in internal:
            if row_of[target] < row_of[source] + 1:
                row_of[target] = row_of[source] + 1
                changed = True
        if not changed:
            break
    rows: list[list[str]] = [[] for _ in range(max(row_of.values()) + 1)]
    for node in nodes:
        rows[row_of[node]].append(node)
    position = {node: float(i) for row in rows for i, node in enumerate(row)}
    for row in rows[1:]:  # follow the row above, so internal edges do not cross
        preds = {t: [position[s] for s, t2 in internal if t2 == t] for t in row}
        row.sort(key=lambda n: sum(preds[n]) / len(preds[n]) if preds[n] else position[n])
        position.update({node: float(i) for i, node in enumerate(row)})

    pad = spacing.block_pad if framed else 0.0
    label = spacing.block_label if framed else 0.0
    widths = [sum(sizes[n][0] for n in row) + spacing.node_gap * (len(row) - 1) for row in rows]
    inner = max(widths)
    boxes: dict[str, Box] = {}
    y = pad + label
    for row, row_width in zip(rows, widths):
        x = pad + (inner - row_width) / 2
        row_height = max(sizes[n][1] for n in row)
        for node in row:
            w, h = sizes[node]
            boxes[node] = Box(x, y + (row_height - h) / 2, w, h)
            x += w + spacing.node_gap
        y += row_height + spacing.row_gap
    height = y - spacing.row_gap + pad
    return _Item(key, inner + 2 * pad, height, boxes, dict(row_of))


def _block_box(items: Mapping[str, _Item], block_of: Mapping[str, str], nodes: list[str],
               node_boxes: Mapping[str, Box], tops: list[float]) -> Box:
    if not nodes:
        return Box(0, 0, 0, 0)
    item = items[block_of[nodes[0]]]
    if all(block_of[n] == item.key for n in nodes) and len(item.members) == len(nodes):
        return Box(item.x - item.width / 2, tops[item.layer], item.width, item.height)
    # the blocks were dissolved (they made a cycle): the members' bounding box
    boxes = [node_boxes[n] for n in nodes]
    x, y = min(b.x for b in boxes), min(b.y for b in boxes)
    return Box(x - 6, y - 6, max(b.right for b in boxes) - x + 12,
               max(b.bottom for b in boxes) - y + 12)


# ---------------------------------------------------------------------- layers


def _assign_layers(items: Mapping[str, _Item], order: list[str], block_of: Mapping[str, str],
                   edges: list[tuple[str, str]], top: set[str]) -> None:
    preds: dict[str, set[str]] = {key: set() for key in items}
    succs: dict[str, set[str]] = {key: set() for key in items}
    for source, target in edges:
        a, b = block_of[source], block_of[target]
        if a != b:
            preds[b].add(a)
            succs[a].add(b)
    for key in order:
        items[key].layer = max((items[p].layer + 1 for p in preds[key]), default=0)
    pinned = {block_of[node] for node in top}
    for key in reversed(order):  # sources other than the inputs: next to their successors
        if not preds[key] and succs[key] and key not in pinned:
            items[key].layer = max(0, min(items[s].layer for s in succs[key]) - 1)


def _with_dummies(items: Mapping[str, _Item], block_of: Mapping[str, str],
                  edges: list[tuple[str, str]], spacing: Spacing
                  ) -> tuple[list[list[_Item]], dict[str, dict[int, _Item]]]:
    """The items of each layer, with the dummies of long edges (one chain per source node)."""
    depth = max((item.layer for item in items.values()), default=0) + 1
    layers: list[list[_Item]] = [[] for _ in range(depth)]
    for item in items.values():
        layers[item.layer].append(item)
    chains: dict[str, dict[int, _Item]] = {}
    for source, target in edges:
        start, end = items[block_of[source]].layer, items[block_of[target]].layer
        if block_of[source] == block_of[target]:
            continue
        chain = chains.setdefault(source, {})
        for layer in range(start + 1, end):
            if layer not in chain:
                dummy = _Item(f"{_DUMMY}{layer}:{source}", spacing.dummy_width, 0.0,
                              layer=layer)
                chain[layer] = dummy
                layers[layer].append(dummy)
    return layers, chains


@dataclass
class _Link:
    """Two items of adjacent layers that an edge joins, and where it attaches to each."""

    upper: _Item
    lower: _Item
    upper_port: float
    lower_port: float


def _links(items: Mapping[str, _Item], block_of: Mapping[str, str],
           edges: list[tuple[str, str]], chains: Mapping[str, Mapping[int, _Item]]
           ) -> list[_Link]:
    links: dict[tuple[str, str, float, float], _Link] = {}
    for source, target in edges:
        upper, lower = items[block_of[source]], items[block_of[target]]
        if upper is lower:
            continue
        path = [upper] + [chains[source][layer] for layer in range(upper.layer + 1, lower.layer)]
        path.append(lower)
        for a, b in zip(path, path[1:]):
            pa = a.port(source) if a is upper else 0.0
            pb = b.port(target) if b is lower else 0.0
            links.setdefault((a.key, b.key, pa, pb), _Link(a, b, pa, pb))
    return list(links.values())


# ---------------------------------------------------------------------- order


def _order_layers(layers: list[list[_Item]], links: list[_Link], sweeps: int) -> None:
    up: dict[str, list[_Link]] = {}
    down: dict[str, list[_Link]] = {}
    for link in links:
        down.setdefault(link.upper.key, []).append(link)
        up.setdefault(link.lower.key, []).append(link)

    def positions() -> dict[str, float]:
        return {item.key: float(i) for layer in layers for i, item in enumerate(layer)}

    best = [list(layer) for layer in layers]
    best_crossings = _crossings(layers, links)
    for sweep in range(sweeps):
        downward = sweep % 2 == 0
        indices = range(1, len(layers)) if downward else range(len(layers) - 2, -1, -1)
        for i in indices:
            pos = positions()
            keys = {}
            for item in layers[i]:
                ends = [link.upper.key if downward else link.lower.key
                        for link in (up if downward else down).get(item.key, [])]
                keys[item.key] = sum(pos[k] for k in ends) / len(ends) if ends else \
                    pos[item.key]
            layers[i].sort(key=lambda item: keys[item.key])
        crossings = _crossings(layers, links)
        if crossings < best_crossings:
            best, best_crossings = [list(layer) for layer in layers], crossings
    layers[:] = best


def _crossings(layers: list[list[_Item]], links: list[_Link]) -> int:
    pos = {item.key: i for layer in layers for i, item in enumerate(layer)}
    by_layer: dict[int, list[tuple[int, int]]] = {}
    for link in links:
        by_layer.setdefault(link.upper.layer, []).append((pos[link.upper.key],
                                                          pos[link.lower.key]))
    total = 0
    for pairs in by_layer.values():
        pairs.sort()
        lowers = [b for _, b in pairs]
        total += _inversions(lowers)
    return total


def _inversions(values: list[int]) -> int:
    """Pairs i < j with values[i] > values[j] (merge sort: layers can be wide)."""
    if len(values) < 2:
        return 0
    middle = len(values) // 2
    left, right = values[:middle], values[middle:]
    count = _inversions(left) + _inversions(right)
    left.sort()
    right.sort()
    j = 0
    for value in left:
        while j < len(right) and right[j] < value:
            j += 1
        count += j
    return count


# ---------------------------------------------------------------------- coordinates


def _place_x(layers: list[list[_Item]], links: list[_Link], spacing: Spacing) -> None:
    for layer in layers:  # packed around the axis x = 0 to start with
        x = -(sum(item.width for item in layer) + spacing.node_gap * (len(layer) - 1)) / 2
        for item in layer:
            item.x = x + item.width / 2
            x += item.width + spacing.node_gap
    up: dict[str, list[_Link]] = {}
    down: dict[str, list[_Link]] = {}
    for link in links:
        down.setdefault(link.upper.key, []).append(link)
        up.setdefault(link.lower.key, []).append(link)
    for sweep in range(spacing.sweeps):
        downward = sweep % 2 == 0
        indices = range(1, len(layers)) if downward else range(len(layers) - 2, -1, -1)
        for i in indices:
            wanted, weights = [], []
            for item in layers[i]:
                if downward:
                    pulls = [(link.upper.x + link.upper_port - link.lower_port,
                              _pull(item, link.upper)) for link in up.get(item.key, [])]
                else:
                    pulls = [(link.lower.x + link.lower_port - link.upper_port,
                              _pull(item, link.lower)) for link in down.get(item.key, [])]
                pulls = pulls or [(item.x, STAY_PULL)]
                pulls.append((0.0, CENTER_PULL))  # the axis: against a sideways drift
                total = sum(weight for _, weight in pulls)
                wanted.append(sum(x * w for x, w in pulls) / total)
                weights.append(total)
            gaps = [(a.width + b.width) / 2 + spacing.node_gap
                    for a, b in zip(layers[i], layers[i][1:])]
            for item, x in zip(layers[i], _closest_ordered(wanted, weights, gaps)):
                item.x = x
    left = min((item.x - item.width / 2 for layer in layers for item in layer), default=0.0)
    for layer in layers:
        for item in layer:
            item.x += spacing.margin - left


def _pull(item: _Item, neighbour: _Item) -> float:
    """How strongly ``item`` follows ``neighbour``: the dummies of a long edge follow each
    other more, so that the edge runs straight instead of wandering with the nodes beside."""
    if item.key.startswith(_DUMMY) and neighbour.key.startswith(_DUMMY):
        return DUMMY_CHAIN_PULL
    return 1.0


def _closest_ordered(wanted: list[float], weights: list[float], gaps: list[float]
                     ) -> list[float]:
    """The x minimizing sum(w * (x - wanted)^2) with x[i+1] - x[i] >= gaps[i]: shifted by
    the cumulative gaps this is an isotonic regression, solved by pooling adjacent
    violators."""
    offsets = [0.0]
    for gap in gaps:
        offsets.append(offsets[-1] + gap)
    pools: list[list[float]] = []  # [weight, weighted sum, count]
    for target, weight, offset in zip(wanted, weights, offsets):
        pools.append([weight, weight * (target - offset), 1])
        while len(pools) > 1 and pools[-2][1] / pools[-2][0] > pools[-1][1] / pools[-1][0]:
            weight2, total2, count2 = pools.pop()
            pools[-1][0] += weight2
            pools[-1][1] += total2
            pools[-1][2] += count2
    result = []
    for weight, total, count in pools:
        result.extend([total / weight] * int(count))
    return [y + offset for y, offset in zip(result, offsets)]


def _place_y(layers: list[list[_Item]], spacing: Spacing) -> list[float]:
    tops = []
    y = spacing.margin
    for layer in layers:
        tops.append(y)
        y += max((item.height for item in layer), default=0.0) + spacing.layer_gap
    tops.append(y - spacing.layer_gap)  # the bottom of the last layer
    return tops


def _node_boxes(items: Mapping[str, _Item], tops: list[float]) -> dict[str, Box]:
    boxes = {}
    for item in items.values():
        left, top = item.x - item.width / 2, tops[item.layer]
        for node, box in item.members.items():
            boxes[node] = Box(left + box.x, top + box.y, box.width, box.height)
    return boxes


def _routes(items: Mapping[str, _Item], block_of: Mapping[str, str],
            edges: list[tuple[str, str]], chains: Mapping[str, Mapping[int, _Item]],
            boxes: Mapping[str, Box], tops: list[float], layers: list[list[_Item]],
            spacing: Spacing) -> list[Route]:
    """The points of every edge.  Edges bend only in the gaps between layers and cross a
    layer's band vertically (through their dummies), so they never cut through a box of the
    band; an edge that leaves a block member above the block's last row, or enters one below
    its first row, runs down a channel beside the block instead of across its other members."""
    bands = [(tops[i], tops[i] + max((it.height for it in layer), default=0.0))
             for i, layer in enumerate(layers)]
    heads: list[list[Point]] = []  # up to where the edge enters its target
    tails: list[list[Point] | None] = []  # the entry; None: through the top, spread later
    for source, target in edges:
        upper, lower = items[block_of[source]], items[block_of[target]]
        u, v = boxes[source], boxes[target]
        if upper is lower:
            head, tail = _internal_route(upper, source, target, u, v, spacing)
        else:
            middle = [(chains[source][layer].x, y) for layer in range(upper.layer + 1,
                                                                        lower.layer)
                      for y in bands[layer]]
            head = _exit(upper, source, u, middle[0][0] if middle else lower.x,
                         bands[upper.layer][1], spacing) + middle
            tail = _entry(lower, target, v, head[-1][0], bands[lower.layer][0], spacing)
        heads.append(head)
        tails.append(tail)
    _spread_entries(edges, heads, tails, boxes, items, block_of, bands)
    return [Route(s, t, _deduplicated(head + (tail or [])))
            for (s, t), head, tail in zip(edges, heads, tails)]


def _side(item: _Item, toward: float, spacing: Spacing) -> tuple[float, bool]:
    """The x of the channel beside ``item`` nearer ``toward``, and whether it is the right."""
    left, right = item.x - item.width / 2, item.x + item.width / 2
    if toward >= item.x:
        return right + spacing.node_gap / 3, True
    return left - spacing.node_gap / 3, False


def _exit(item: _Item, node: str, box: Box, toward: float, band_bottom: float,
          spacing: Spacing) -> list[Point]:
    if item.rows.get(node, 0) == item.last_row:
        return [(box.center_x, box.bottom), (box.center_x, band_bottom)]
    x, right = _side(item, toward, spacing)
    y = box.y + box.height / 2
    return [(box.right if right else box.x, y), (x, y), (x, band_bottom)]


def _entry(item: _Item, node: str, box: Box, came_from: float, band_top: float,
           spacing: Spacing) -> list[Point] | None:
    if item.rows.get(node, 0) == 0:
        return None
    x, right = _side(item, came_from, spacing)
    y = box.y + box.height / 2
    return [(x, band_top), (x, y), (box.right if right else box.x, y)]


def _internal_route(item: _Item, source: str, target: str, u: Box, v: Box, spacing: Spacing
                    ) -> tuple[list[Point], list[Point] | None]:
    """An edge inside a block: straight to the next row, or down the block's inner margin
    when it skips rows."""
    if item.rows[target] == item.rows[source] + 1:
        return [(u.center_x, u.bottom)], None
    right = u.center_x >= item.x
    x = item.x + (item.width / 2 - spacing.block_pad / 2) * (1 if right else -1)
    uy, vy = u.y + u.height / 2, v.y + v.height / 2
    return [(u.right if right else u.x, uy), (x, uy), (x, vy)], \
        [(v.right if right else v.x, vy)]


def _spread_entries(edges: list[tuple[str, str]], heads: list[list[Point]],
                    tails: list[list[Point] | None], boxes: Mapping[str, Box],
                    items: Mapping[str, _Item], block_of: Mapping[str, str],
                    bands: list[tuple[float, float]]) -> None:
    """Give the edges entering a node from the top their entry points, spread over its top
    edge in the order they come from (the two inputs of an Add arrive side by side)."""
    incoming: dict[str, list[int]] = {}
    for i, (_, target) in enumerate(edges):
        if tails[i] is None:
            incoming.setdefault(target, []).append(i)
    for target, indices in incoming.items():
        box = boxes[target]
        band_top = bands[items[block_of[target]].layer][0]
        indices.sort(key=lambda i: heads[i][-1][0])
        step = box.width / (len(indices) + 1)
        for rank, i in enumerate(indices, start=1):
            x = box.x + rank * step if len(indices) > 1 else box.center_x
            internal = block_of[edges[i][0]] == block_of[target]
            tails[i] = [(x, box.y)] if internal else [(x, band_top), (x, box.y)]


def _deduplicated(points: list[Point]) -> tuple[Point, ...]:
    kept = [points[0]]
    for point in points[1:]:
        if abs(point[0] - kept[-1][0]) > 1e-6 or abs(point[1] - kept[-1][1]) > 1e-6:
            kept.append(point)
    return tuple(kept)
