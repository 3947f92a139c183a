"""Fusion: group nodes into kernels, by their op's pattern kind (TVM's FuseOps, simplified).

A kernel is a fused group, not a node: every value a group keeps inside is computed in
registers (inlined into its readers) or in scratch, never written out and read back by
another kernel.  Which nodes may share a kernel follows from their :class:`PatternKind`:

* **epilogues** -- an elementwise or broadcast node joins the group that produced its input
  when it is that value's only reader: a bias, an activation, a residual Add, a Clip, a
  cast after a matmul, a convolution or a reduction is applied before the one store;
* **padded stores** -- a Pad that surrounds a convolution's result with one known value (the
  explicit padding of the next convolution, or of a max pool) joins the convolution's group
  last when its window is larger than one pixel: it stores straight into the padded buffer
  and small nests fill the border (``ember.lower.group``), instead of a Pad kernel copying
  the whole tensor; nothing joins the group after it;
* **chains** -- elementwise, broadcast and injective nodes (transposes, reshapes, gathers)
  join their producer's group the same way, and a reduction joins a group of elementwise
  and injective nodes (and other reductions) that only it reads: Sigmoid+Mul (SiLU), the
  statistics of a LayerNorm or GroupNorm written as many small ops, Exp/ReduceSum/Div;
* **prologues** -- a group whose every output is read by one other group moves into it, so
  the elementwise producers of a reduction are computed where the reduction reads them;
* **siblings** -- a pointwise group (elementwise, broadcast and injective nodes) that reads a
  pointwise group's results, and nothing that group does not read too, joins it when its
  results have the shapes of that group's: an LSTM step's new cell state and the hidden
  state computed from it are one pass, though the cell state has a reader elsewhere.

When fusing does not pay, it is not done:

* nothing fuses *into* an anchor (matmul, conv) as a prologue: its operands are read many
  times per output element, so an inlined producer would be recomputed that many times;
  anchors start their own group and take epilogues only, of their own output shape;
* a Pad is not a prologue of a pool either (a window reads each element several times, and
  the padding was made explicit so that the pool needs no bounds tests);
* a Concat of more than two pieces takes no computing producer (anything but injective
  nodes) as a chain or a prologue: it selects its piece per element, and a vector select
  evaluates every side, so an inlined producer would be computed over the whole output
  (the last step of an unrolled LSTM, fused into the Concat of its 32 steps' states, took
  110 us instead of 1);
* a value with several readers is not fused into any one of them by the epilogue rule (the
  value must be written for the others anyway); a group that feeds several groups stays a
  kernel of its own;
* inside a group, lowering materializes what would be recomputed too often (an expensive
  stage read twice, a reduction read at other indices than its own) in scratch memory
  (``ember.lower.inline``) -- fusion still saves the round trip through the arena and the
  kernel launch;
* an index input that the kernel must range-check before it runs (Gather's) is never
  computed inside the kernel that checks it;
* opaque nodes (control flow, ops without a kernel for this configuration) stay alone, and
  no merge may create a cycle between groups (a path from one group through another back).

The pass records the groups on ``graph.groups``; lowering turns each into one PrimFunc.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable

from ember.ir.graph import FusedGroup, Graph, Node
from ember.ops.registry import PatternKind, get_op


@dataclass(frozen=True)
class NodeSupport:
    """Whether a node can be compiled into a kernel (else it runs its reference, alone), and
    which of its inputs the kernel range-checks before it runs."""

    kernel: bool
    reason: str = ""
    checked_inputs: frozenset[int] = frozenset()


SupportFn = Callable[[Node], NodeSupport]
_FUSABLE_TAILS = (PatternKind.ELEMENTWISE, PatternKind.BROADCAST)
_CHAIN_KINDS = (PatternKind.ELEMENTWISE, PatternKind.BROADCAST, PatternKind.INJECTIVE)


# The most nodes one kernel takes: past it a chain starts a new group.  Real fused patterns
# have tens of nodes; the bound keeps one generated C function (and the C compiler's time on
# it, which grows faster than its size) bounded on a graph of thousands of elementwise nodes.
MAX_GROUP_NODES = 128

# A pointwise convolution stores into the padded buffer of the next one (instead of leaving
# the padding to a Pad kernel) when its output takes at least this many bytes: the Pad kernel
# would read and write the tensor from memory.  Measured per op, padded store against Conv
# and Pad kernels (Zen 4): 16->96 channels at 112x112, batch 4 (18 MiB) 2.34 vs 3.18 ms; at
# 4.6-6.9 MiB a wash; at 28x28 and below 10-20 % slower.  MobileNetV2 at batch 16: 97 -> 93 ms.
POINTWISE_PADDED_STORE_BYTES = 8 << 20


@dataclass(eq=False)
class _Group:
    nodes: list[Node] = field(default_factory=list)  # in graph order
    opaque: bool = False
    anchored: bool = False  # holds a matmul or a convolution (takes epilogues only)
    sealed: bool = False  # ends in a Pad its anchor stores into: nothing more joins


def fuse(graph: Graph, support: SupportFn) -> int:
    """Form the kernels of ``graph`` (``graph.groups``); returns how many nodes joined a group
    with another node (0: every node is its own kernel)."""
    fusion = _Fusion(graph, support)
    fusion.epilogues_and_chains()
    fusion.prologues()
    fusion.siblings()
    graph.groups = fusion.groups()
    return sum(len(g.nodes) for g in graph.groups if len(g.nodes) > 1)


def op_has_compute(node: Node) -> NodeSupport:
    """The support of a node when no compile driver says otherwise: its op's compute."""
    opdef = get_op(node.op)
    if opdef is None or opdef.compute is None:
        return NodeSupport(False, f"{node.op} has no compute definition")
    return NodeSupport(True)


def singleton_groups(graph: Graph, support: SupportFn | None = None) -> list[FusedGroup]:
    """Every node its own kernel (no fusion: opt level 0)."""
    readers = readers_by_value(graph)
    return [single_node_group(graph, node, readers) for node in graph.nodes]


def single_node_group(graph: Graph, node: Node,
                      readers: dict[str, list[Node]] | None = None) -> FusedGroup:
    """The group of ``node`` alone (``readers``: :func:`readers_by_value` of the graph, to
    reuse it across nodes)."""
    readers = readers_by_value(graph) if readers is None else readers
    return _describe(graph, [node], readers, set(graph.outputs))


class _Fusion:
    def __init__(self, graph: Graph, support: SupportFn):
        self.graph = graph
        self.supports = {id(n): support(n) for n in graph.nodes}
        self.kinds = {id(n): (get_op(n.op).pattern if self.supports[id(n)].kernel
                              and get_op(n.op) is not None else PatternKind.OPAQUE)
                      for n in graph.nodes}
        self.producer = {o: n for n in graph.nodes for o in n.outputs if o}
        self.readers = readers_by_value(graph)
        self.position = {id(n): i for i, n in enumerate(graph.nodes)}
        self.graph_outputs = set(graph.outputs)
        self.group_of: dict[int, _Group] = {}
        self.order: dict[int, _Group] = {}  # live groups by id, in creation order

    # ------------------------------------------------------------------ forward
    def epilogues_and_chains(self) -> None:
        for node in self.graph.nodes:
            group = self._joinable_producer_group(node)
            if group is None:
                group = _Group(opaque=self.kinds[id(node)] is PatternKind.OPAQUE)
                self.order[id(group)] = group
            group.sealed |= group.anchored and node.op == "Pad"
            group.nodes.append(node)
            group.anchored |= self.kinds[id(node)] is PatternKind.ANCHOR
            self.group_of[id(node)] = group

    def _joinable_producer_group(self, node: Node) -> _Group | None:
        kind = self.kinds[id(node)]
        if kind in (PatternKind.OPAQUE, PatternKind.ANCHOR):
            return None
        checked = {node.inputs[i] for i in self.supports[id(node)].checked_inputs}
        for name in node.inputs:
            producer = self.producer.get(name) if name else None
            if producer is None or name in checked:
                continue
            group = self.group_of[id(producer)]
            if group.opaque or group.sealed or self._readers_of(name) != [node] or \
                    name in self.graph_outputs:
                continue
            if len(group.nodes) >= MAX_GROUP_NODES:
                continue
            if group.anchored:
                if not (kind in _FUSABLE_TAILS and self._same_shape(name, node.outputs[0]) or
                        name == node.inputs[0] and self._pads_with_constant(node) and
                        self._stores_padded_cheaply(group)):
                    continue
            elif kind not in _CHAIN_KINDS + (PatternKind.REDUCTION,):
                continue
            elif _pads_a_pool(group.nodes, [node]) or \
                    _computes_into_concat(group.nodes, [node], self.kinds):
                continue
            if self._would_cycle(group, [node]):
                continue
            return group
        return None

    # ------------------------------------------------------------------ backward
    def prologues(self) -> None:
        """Move producer groups into their consumers, last consumers first, until no move is
        left (a merge changes only the consumer's neighbours, so one sweep does nearly all
        of it; the next confirms that nothing moved)."""
        while self._prologue_sweep():
            pass

    def _prologue_sweep(self) -> bool:
        moved = False
        for consumer in reversed(list(self.order.values())):
            if consumer.opaque or consumer.anchored or id(consumer) not in self.order:
                continue  # (or merged away during this sweep)
            while True:
                producer = next((p for p in self._producer_groups(consumer)
                                 if self._can_move_into(p, consumer)), None)
                if producer is None:
                    break
                self._merge(producer, consumer)
                moved = True
        return moved

    def _can_move_into(self, producer: _Group, consumer: _Group) -> bool:
        if producer.opaque or producer.anchored:
            return False
        if len(producer.nodes) + len(consumer.nodes) > MAX_GROUP_NODES:
            return False
        if _pads_a_pool(producer.nodes, consumer.nodes) or \
                _computes_into_concat(producer.nodes, consumer.nodes, self.kinds):
            return False
        for name in self._outputs_of(producer):
            outside = [r for r in self._readers_of(name) if self.group_of[id(r)] is not producer]
            if outside and name in self.graph_outputs:
                return False
            if any(self.group_of[id(r)] is not consumer for r in outside):
                return False
        if self._checks_results_of(consumer, producer):
            return False
        return not self._would_cycle(consumer, producer.nodes)

    def _merge(self, producer: _Group, consumer: _Group) -> None:
        consumer.nodes = list(heapq.merge(producer.nodes, consumer.nodes,
                                          key=lambda n: self.position[id(n)]))
        for node in producer.nodes:
            self.group_of[id(node)] = consumer
        del self.order[id(producer)]

    # ------------------------------------------------------------------ siblings
    def siblings(self) -> None:
        """Join a pointwise group to the pointwise group whose results it reads, when it
        reads nothing that group does not read or compute too and computes values of the
        same shapes: the two make one pass over the same data.  (An unrolled LSTM step's
        cell state ``c = f * c' + i * g`` is read by the next step and by ``h = o * tanh(c)``,
        so the epilogue and prologue rules leave the two apart: two launches per step, ``c``
        and the gates read twice.)"""
        for group in list(self.order.values()):
            if id(group) not in self.order or not self._pointwise(group):
                continue
            for consumer in self._consumer_groups(group):
                if id(consumer) in self.order and self._can_join_as_sibling(consumer, group):
                    self._merge(consumer, group)

    def _pointwise(self, group: _Group) -> bool:
        return not (group.opaque or group.anchored or group.sealed) and \
            all(self.kinds[id(n)] in _CHAIN_KINDS for n in group.nodes)

    def _can_join_as_sibling(self, consumer: _Group, group: _Group) -> bool:
        if not self._pointwise(consumer) or \
                len(group.nodes) + len(consumer.nodes) > MAX_GROUP_NODES or \
                _computes_into_concat(group.nodes, consumer.nodes, self.kinds):
            return False
        available = set(self._reads_of(group)) | set(self._outputs_of(group))
        if not set(self._reads_of(consumer)) <= available:
            return False
        shapes = {self._shape(o) for o in self._outputs_of(group)}
        if any(self._shape(o) not in shapes for o in self._outputs_of(consumer)):
            return False
        if self._checks_results_of(consumer, group):
            return False
        return not self._would_cycle(group, consumer.nodes)

    # ------------------------------------------------------------------ queries
    def _checks_results_of(self, reader: _Group, group: _Group) -> bool:
        """Whether ``reader`` range-checks a value ``group`` computes (an index input must
        exist before the kernel that checks it runs)."""
        checked = {n.inputs[i] for n in reader.nodes for i in self.supports[id(n)].checked_inputs}
        return bool(checked & set(self._outputs_of(group)))

    def _reads_of(self, group: _Group) -> list[str]:
        """The values ``group`` reads that it does not compute."""
        produced = set(self._outputs_of(group))
        return [name for n in group.nodes for name in _node_reads(n) if name not in produced]

    def _shape(self, name: str) -> tuple | None:
        vtype = self.graph.types.get(name)
        shape = getattr(vtype, "shape", None)
        return None if shape is None else tuple(shape)

    def _readers_of(self, name: str) -> list[Node]:
        return self.readers.get(name, [])

    def _same_shape(self, a: str, b: str) -> bool:
        ta, tb = self.graph.types.get(a), self.graph.types.get(b)
        return getattr(ta, "shape", None) is not None and \
            getattr(ta, "shape", None) == getattr(tb, "shape", None)

    def _pads_with_constant(self, node: Node) -> bool:
        """Whether ``node`` is a Pad that only surrounds its input with one value known at
        compile time (constant pads, none negative): its producer can store into the padded
        buffer directly (``ember.lower.group``)."""
        if node.op != "Pad" or node.attrs.get("mode", "constant") != "constant":
            return False
        optional = [name for name in node.inputs[2:] if name]
        pads = self.graph.constants.get(node.inputs[1]) if len(node.inputs) > 1 else None
        return pads is not None and pads.dtype.kind in "iu" and bool((pads >= 0).all()) and \
            all(name in self.graph.constants for name in optional)

    def _stores_padded_cheaply(self, group: _Group) -> bool:
        """Whether the anchor of ``group`` pays for storing into a padded buffer: a
        convolution over a window larger than one pixel.  Its tiles are then stored run by run
        through a scratch (the output's rows are apart), which costs about what the Pad kernel
        it saves does; a convolution computing that much per stored element hides it
        (ResNet-18's 3x3 convolutions: a wash or better, the model 2-3 % faster), a pointwise
        one (1x1, MobileNet's expansions) does not: 5-25 us slower per convolution at 28x28
        and below, measured in one process against the separate Pad -- unless its output is
        too large for the caches (``POINTWISE_PADDED_STORE_BYTES``)."""
        anchor = next((n for n in group.nodes if n.op in ("Conv", "ConvBlocked")), None)
        if anchor is None:
            return False
        if anchor.op == "ConvBlocked":
            return True  # its rows of pixels are stored where they belong, no scratch
        kernel = anchor.attrs.get("kernel_shape")
        if not kernel:
            weights = self.graph.types.get(anchor.inputs[1]) if len(anchor.inputs) > 1 else None
            kernel = getattr(weights, "shape", None)
            kernel = kernel[2:] if kernel is not None else None
        if not kernel or not all(isinstance(k, int) for k in kernel):
            return False
        if math.prod(kernel) > 1:
            return True
        output = self.graph.types.get(anchor.outputs[0])
        shape = getattr(output, "shape", None)
        return shape is not None and all(isinstance(d, int) for d in shape) and \
            math.prod(shape) * output.dtype.itemsize >= POINTWISE_PADDED_STORE_BYTES

    def _outputs_of(self, group: _Group) -> list[str]:
        return [o for n in group.nodes for o in n.outputs if o]

    def _producer_groups(self, group: _Group) -> list[_Group]:
        found: dict[int, _Group] = {}
        for node in group.nodes:
            for name in _node_reads(node):
                producer = self.producer.get(name)
                if producer is not None:
                    other = self.group_of[id(producer)]
                    if other is not group:
                        found.setdefault(id(other), other)
        return list(found.values())

    def _consumer_groups(self, group: _Group) -> list[_Group]:
        found: dict[int, _Group] = {}
        for name in self._outputs_of(group):
            for reader in self._readers_of(name):
                other = self.group_of.get(id(reader))
                if other is not None and other is not group:
                    found.setdefault(id(other), other)
        return list(found.values())

    def _would_cycle(self, target: _Group, joining: list[Node]) -> bool:
        """Whether putting ``joining`` into ``target`` makes a cycle: some other group that
        ``joining`` reads from (directly or not) depends on ``target``."""
        sources: dict[int, _Group] = {}
        for node in joining:
            for name in _node_reads(node):
                producer = self.producer.get(name)
                group = self.group_of.get(id(producer)) if producer is not None else None
                if group is not None and group is not target and \
                        not any(group is self.group_of.get(id(j)) for j in joining):
                    sources[id(group)] = group
        if not sources:
            return False
        # Does target reach any of the sources?  Nodes are in topological order, so a group
        # whose first node comes after every source's last node reaches none of them: the
        # search stays among the groups between target and the sources.
        horizon = max(self.position[id(g.nodes[-1])] for g in sources.values())
        seen: set[int] = set()
        pending = [target]
        while pending:
            current = pending.pop()
            for nxt in self._consumer_groups(current):
                if id(nxt) in sources:
                    return True
                if id(nxt) not in seen and nxt is not target and \
                        self.position[id(nxt.nodes[0])] <= horizon:
                    seen.add(id(nxt))
                    pending.append(nxt)
        return False

    def groups(self) -> list[FusedGroup]:
        ordered = sorted(self.order.values(), key=lambda g: self.position[id(g.nodes[0])])
        groups = [_describe(self.graph, g.nodes, self.readers, self.graph_outputs, self.kinds)
                  for g in _topological(ordered, self)]
        return groups


def _topological(groups: list[_Group], fusion: _Fusion) -> list[_Group]:
    """Groups so that every group comes after the groups it reads from (a depth-first
    post-order from each group in turn, iterative: no recursion as deep as the graph)."""
    placed: set[int] = set()
    result: list[_Group] = []
    for root in groups:
        if id(root) in placed:
            continue
        on_path = {id(root)}
        stack = [(root, iter(fusion._producer_groups(root)))]
        while stack:
            group, producers = stack[-1]
            producer = next(producers, None)
            if producer is None:
                stack.pop()
                on_path.discard(id(group))
                placed.add(id(group))
                result.append(group)
            elif id(producer) in on_path:
                raise AssertionError("fusion made a cycle between groups")
            elif id(producer) not in placed:
                on_path.add(id(producer))
                stack.append((producer, iter(fusion._producer_groups(producer))))
    return result


def _node_reads(node: Node) -> list[str]:
    return [n for n in node.inputs if n] + node.implicit_inputs()


def readers_by_value(graph: Graph) -> dict[str, list[Node]]:
    """The nodes that read each value (each node once per value, in graph order)."""
    readers: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for name in dict.fromkeys(_node_reads(node)):
            readers.setdefault(name, []).append(node)
    return readers


def _describe(graph: Graph, nodes: list[Node], readers: dict[str, list[Node]],
              graph_outputs: set[str],
              kinds: dict[int, PatternKind] | None = None) -> FusedGroup:
    members = {id(n) for n in nodes}
    produced = {o for n in nodes for o in n.outputs if o}
    inputs = list(dict.fromkeys(name for n in nodes for name in _node_reads(n)
                                if name not in produced))
    outputs = [o for n in nodes for o in n.outputs if o and (
        o in graph_outputs or any(id(r) not in members for r in readers.get(o, [])))]
    master = ""
    if kinds is not None:
        ranked = sorted(nodes, key=lambda n: -int(kinds[id(n)]) if kinds[id(n)] in (
            PatternKind.ANCHOR, PatternKind.REDUCTION) else 0)
        if ranked and kinds[id(ranked[0])] in (PatternKind.ANCHOR, PatternKind.REDUCTION):
            master = ranked[0].name
    return FusedGroup(list(nodes), inputs, outputs, master)


# Pieces of a Concat from which computing producers stay out of it (see the module docstring).
CONCAT_PIECES_FOR_PRODUCERS = 2


def _computes_into_concat(producers: list[Node], consumers: list[Node],
                          kinds: dict[int, PatternKind]) -> bool:
    """Whether fusing would inline a computing producer into a Concat of many pieces."""
    return any(n.op == "Concat" and len([i for i in n.inputs if i]) >
               CONCAT_PIECES_FOR_PRODUCERS for n in consumers) and \
        any(kinds[id(n)] is not PatternKind.INJECTIVE for n in producers)


def _pads_a_pool(producers: list[Node], consumers: list[Node]) -> bool:
    """Whether fusing would put a Pad inside a pool: a window reads each element several
    times, and the padding was made explicit so that the pool needs no bounds tests."""
    return any(n.op == "Pad" for n in producers) and \
        any(get_op(n.op) is not None and get_op(n.op).family == "pool" for n in consumers)
