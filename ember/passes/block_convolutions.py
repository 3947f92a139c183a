"""Dense convolutions run on channels blocked by the vector width, and stay blocked between them.

ember's NCHW convolution is an im2col GEMM: the weights are the broadcast rows, the image's
pixels the vector columns, and every task first gathers its panels of the image (a copy of
``C * KH * KW`` rows per pixel block; with a stride, one float at a time).  Blocking the
channels by the target's vector width ``L`` -- ``(N, C, H, W)`` seen as
``(N, C/L, H, W, L)``, oneDNN's and ONNX Runtime's NCHWc -- makes the convolution a product
per output row with nothing to copy: its rows are the row's pixels (each input element
broadcast from where it lies, through a table of the reduction's offsets), its columns the
``L`` output channels of one block (one vector, contiguous in the weights and the output)::

    Conv(x, w, b)                  Reshape(x, (N, C/Li, Li, H, W)), Transpose(0 1 3 4 2)
                          ->       [Pad(H and W)]
                                   ConvBlocked(., w', b')            (N, M/L, OH, OW, L)
                                   Transpose(0 1 4 2 3), Reshape((N, M, OH, OW))

with ``w'`` = ``w`` as ``(M/L, C/Li, KH, KW, Li, L)`` and ``b'`` = ``b`` as ``(M/L, L)``,
constants.  ``Li`` is ``L``, or all the input's channels when they are fewer than ``L`` (an
image's three: its blocked form is NHWC).  Measured on Zen 4 (AVX-512, 2 threads, FMA peak
231 GFLOP/s): 64 -> 64 channels 3x3 at 56x56 228 GFLOP/s, 256 -> 256 at 14x14 227, a
stride-2 16 -> 32 at 8x8 (batch 8) 218 against 119 for the NCHW kernel.

The conversions cost a pass over the tensor each, so the layout is kept across what does not
care about it: the region of blocked values grows through elementwise and broadcasting ops
(an activation, a residual Add, a per-channel scale), pools (a 2-D pool of a blocked value is
a 3-D one whose window along the lanes is one wide), depthwise convolutions
(``DepthwiseConvBlocked``), Splits along whole vectors of channels (horizontally fused 1x1
convolutions) and into the next convolution; a value goes back to NCHW only where something
else reads it (a reshape, a graph output) -- once, however many such readers it has.  An
elementwise op joins the region when one of its inputs is blocked; its other inputs join as
they are (a scalar), blocked at compile time (a per-channel constant), or converted (a
tensor of the output's shape: a residual branch from outside the region).

Channels that are not whole vectors (MobileNetV2's 24 of AVX-512's 16 lanes) are padded with
zero channels up to whole vectors when that adds at most half again the work
(``MAX_PADDED_CHANNELS``): a convolution's weights and bias are zero there, so its padded
channels are 0, the next convolution's zero weights cancel them, and they are dropped (a
Slice) where the value leaves the region.  Only ops that keep finite values finite
(``KEEPS_PADDING_FINITE``) run on a padded value: ``0 * inf`` would not cancel.

Measured in one process against the NCHW build (``block_convolutions`` off), interleaved:
ResNet-18 b1 17.9 vs 20.7 ms, ResNet-50 b1 40.0 vs 47.5 ms, MobileNetV2 b1 4.3 vs 5.0 ms and
b16 78 vs 90 ms.

Only plain convolutions qualify: 2-D, float32, static shapes, constant weights (and bias),
explicit ``pads`` (no ``auto_pad``), one group with output channels at least ``L`` and padding
well and input channels fewer than ``L`` or padding well -- or groups of whole vectors of
channels, in and out (a ResNeXt's or RegNet's grouped convolution: ``ConvBlocked`` with
``group``, one product per group), or one filter per channel (in the region) -- and only
when they chain to another blockable convolution (see :func:`_chained_convolutions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ember.core.dtypes import DType
from ember.core.target import Target
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType
from ember.ops.compute.nn import MAX_WRITTEN_OUT_TAPS
from ember.passes.block_depthwise import (blocked_depthwise_weights, blocked_layouts_pay,
                                          plain_conv_weights)
from ember.ops.registry import PatternKind, get_op


# Channels that are not whole vectors are padded with zero channels to whole ones when that
# adds at most this share of work (see _pads_well).
MAX_PADDED_CHANNELS = 1.5

# Elementwise ops that give finite results for finite inputs: the zero channels a padded
# value carries stay finite through them, so the next convolution's zero weights cancel them
# (0 * inf would not).  A value with padded channels joins no other op.
KEEPS_PADDING_FINITE = frozenset({
    "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "HardSigmoid", "Tanh", "HardSwish",
    "Swish", "Gelu", "Elu", "Selu", "Celu", "Softsign", "Softplus", "Mish", "Identity", "Neg",
    "Abs", "Add", "Sub", "Mul", "Max", "Min", "Sum", "Mean"})


def block_convolutions(graph: Graph, target: Target | None) -> int:
    """Rewrite in place; returns how many convolutions were blocked."""
    lanes = (target or Target.native()).lanes_for(DType.FLOAT32)
    if not blocked_layouts_pay(target):
        return 0
    chained = _chained_convolutions(graph, lanes)
    if not chained:
        return 0
    region = _Region(graph, lanes)
    for node in graph.nodes:
        if id(node) in chained:
            region.convolution(node)
        elif node.inputs and node.inputs[0] in region.blocked and \
                _blockable_depthwise(graph, node, lanes):
            region.depthwise(node)
        elif not (region.elementwise(node) or region.pool(node) or region.split(node)):
            region.keep(node)
    for name in graph.outputs:
        region.need_plain(name)
    graph.nodes = region.nodes
    return region.convolutions


# Ops a blocked value may flow through on its way to the next convolution (see _Region).
_PASS_THROUGH_OPS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
                               "Split"})


def _chained_convolutions(graph: Graph, lanes: int) -> set[int]:
    """The convolutions worth blocking (by ``id``): those whose result reaches another
    blockable convolution, or which read one's, through ops the region runs blocked
    (elementwise ops, pools, depthwise convolutions, channel Splits).  A lone convolution
    between NCHW neighbours would pay two conversions for itself alone: measured on Zen 4,
    a 64-channel 3x3 over 128x128 ran at 0.87x ONNX Runtime's speed blocked against 0.98x
    in NCHW, a 16 -> 96 1x1 over 112x112 at 0.39x against 1.31x."""
    blockable = {id(node) for node in graph.nodes if _blockable(graph, node, lanes)}
    if len(blockable) < 2:
        return set()
    readers: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for name in node.inputs:
            if name:
                readers.setdefault(name, []).append(node)
    chained: set[int] = set()
    for node in graph.nodes:
        if id(node) not in blockable:
            continue
        seen, frontier = set(), list(node.outputs)
        while frontier:
            value = frontier.pop()
            for reader in readers.get(value, ()):
                if id(reader) in seen:
                    continue
                seen.add(id(reader))
                if id(reader) in blockable and reader.inputs[0] == value:
                    chained |= {id(node), id(reader)}
                elif _passes_through(reader) or _blockable_depthwise(graph, reader, lanes):
                    frontier.extend(name for name in reader.outputs if name)
    return chained


def _passes_through(node: Node) -> bool:
    """Whether a blocked value may flow through ``node`` staying blocked (by its op alone:
    the region checks shapes when it gets there)."""
    if node.domain not in ("", "ai.onnx", "ember"):
        return False
    if node.op in _PASS_THROUGH_OPS:
        return True
    definition = get_op(node.op)
    return definition is not None and definition.pattern <= PatternKind.BROADCAST and \
        not definition.random


def _blockable(graph: Graph, node: Node, lanes: int) -> bool:
    """A convolution ``ConvBlocked`` runs: one group of output channels at least a vector
    and padding well, and input channels fewer than a vector or padding well; or groups of
    whole vectors of channels, in and out."""
    weights = plain_conv_weights(graph, node)
    if weights is None:
        return False
    channels, outputs = int(graph.types[node.inputs[0]].shape[1]), int(weights.shape[0])
    group = int(node.attrs.get("group", 1))
    if group > 1:  # (no padding of grouped channels)
        return group * int(weights.shape[1]) == channels and \
            (channels // group) % lanes == 0 and outputs % group == 0 and \
            (outputs // group) % lanes == 0
    return group == 1 and weights.shape[1] == channels and _pads_well(outputs, lanes) and \
        (channels < lanes or _pads_well(channels, lanes))


def _pads_well(channels: int, lanes: int) -> bool:
    """Whether ``channels`` fill their vectors well enough to run blocked: whole vectors, or
    padded with zero channels to whole vectors at most ``MAX_PADDED_CHANNELS`` times as many
    (24 channels as 32 of AVX-512's 16 lanes; 8 channels would be 16, twice the work)."""
    padded = -(-channels // lanes) * lanes
    return channels >= lanes and padded <= MAX_PADDED_CHANNELS * channels


def _blockable_depthwise(graph: Graph, node: Node, lanes: int) -> bool:
    """A depthwise convolution ``DepthwiseConvBlocked`` runs: one filter per channel, the
    channels padding well, at most ``MAX_WRITTEN_OUT_TAPS`` taps, constant weights."""
    weights = plain_conv_weights(graph, node)
    if weights is None:
        return False
    channels = int(graph.types[node.inputs[0]].shape[1])
    return int(node.attrs.get("group", 1)) == channels and _pads_well(channels, lanes) and \
        weights.shape[:2] == (channels, 1) and \
        weights.shape[2] * weights.shape[3] <= MAX_WRITTEN_OUT_TAPS


def _static_4d(value_type: object) -> bool:
    return isinstance(value_type, TensorType) and value_type.is_static and \
        len(value_type.shape) == 4


@dataclass
class _Region:
    """The rewritten node list, and which NCHW values have blocked twins so far."""

    graph: Graph
    lanes: int
    nodes: list[Node] = field(default_factory=list)
    blocked: dict[str, str] = field(default_factory=dict)  # NCHW value -> its blocked twin
    pending: set[str] = field(default_factory=set)  # NCHW values not written yet
    convolutions: int = 0

    # ------------------------------------------------------------------ the ops

    def convolution(self, node: Node) -> None:
        g, lanes = self.graph, self.lanes
        x, y = node.inputs[0], node.outputs[0]
        out_shape = tuple(int(d) for d in g.types[y].shape)
        weights = g.constants[node.inputs[1]]
        outputs, channels, kh, kw = weights.shape  # (channels: of one group)
        group = int(node.attrs.get("group", 1))
        in_lanes = lanes if channels >= lanes else channels
        stem = node.name or "conv"
        source = self._padded(node, self.blocked_twin(x, in_lanes), stem)
        in_blocks = int(g.types[source].shape[1]) // group
        out_blocks = -(-outputs // lanes)
        # zero weights for the padded channels, in and out (a padded output channel is 0)
        w = np.zeros((out_blocks * lanes, in_blocks * in_lanes, kh, kw), np.float32)
        w[:outputs, :channels] = weights
        w_blocked = w.reshape(out_blocks, lanes, in_blocks, in_lanes, kh, kw)\
            .transpose(0, 2, 4, 5, 3, 1)
        inputs = [source, g.add_constant(np.ascontiguousarray(w_blocked),
                                         hint=f"{stem}_weights_blocked")]
        if len([i for i in node.inputs if i]) > 2:
            inputs.append(g.add_constant(self._per_channel(g.constants[node.inputs[2]],
                                                           out_blocks),
                                         hint=f"{stem}_bias_blocked"))
        out = self._value(f"{stem}_blocked_out", self._blocked_shape(out_shape))
        attrs = {"strides": list(node.attrs.get("strides") or [1, 1]),
                 "dilations": list(node.attrs.get("dilations") or [1, 1])}
        if group > 1:
            attrs["group"] = group
        self.nodes.append(Node("ConvBlocked", inputs, [out], attrs, name=stem))
        self.blocked[y] = out
        self.pending.add(y)
        self.convolutions += 1

    def depthwise(self, node: Node) -> None:
        """A depthwise convolution of a blocked value: ``DepthwiseConvBlocked``, one vector
        of channels per pixel (``passes/block_depthwise.py`` has the op's measurements)."""
        g, lanes = self.graph, self.lanes
        y = node.outputs[0]
        out_shape = tuple(int(d) for d in g.types[y].shape)
        stem = node.name or "dwconv"
        source = self._padded(node, self.blocked[node.inputs[0]], stem)
        blocks = int(g.types[source].shape[1])
        inputs = [source, g.add_constant(
            blocked_depthwise_weights(g.constants[node.inputs[1]], blocks, lanes),
            hint=f"{stem}_weights_blocked")]
        if len([i for i in node.inputs if i]) > 2:
            inputs.append(g.add_constant(self._per_channel(g.constants[node.inputs[2]], blocks),
                                         hint=f"{stem}_bias_blocked"))
        out = self._value(f"{stem}_blocked_out", self._blocked_shape(out_shape))
        self.nodes.append(Node("DepthwiseConvBlocked", inputs, [out],
                               {"strides": list(node.attrs.get("strides") or [1, 1]),
                                "dilations": list(node.attrs.get("dilations") or [1, 1])},
                               name=stem))
        self.blocked[y] = out
        self.pending.add(y)

    def _padded(self, node: Node, source: str, stem: str) -> str:
        """The blocked value ``source`` with the convolution's pads around its image (a Pad
        node, which the producer's kernel may store into), or itself when there are none."""
        g = self.graph
        pads = [int(p) for p in node.attrs.get("pads") or [0, 0, 0, 0]]
        if not any(pads):
            return source
        n, blocks, height, width, lanes = (int(d) for d in g.types[source].shape)
        padded = self._value(f"{stem}_blocked_padded", (n, blocks, height + pads[0] + pads[2],
                                                        width + pads[1] + pads[3], lanes))
        amounts = g.add_constant(np.asarray([0, 0, pads[0], pads[1], 0,
                                             0, 0, pads[2], pads[3], 0], dtype=np.int64),
                                 hint=f"{stem}_pads")
        zero = g.add_constant(np.asarray(0.0, dtype=np.float32), hint=f"{stem}_pad_value")
        self.nodes.append(Node("Pad", [source, amounts, zero], [padded], {"mode": "constant"},
                               name=f"{stem}_pad"))
        return padded

    def elementwise(self, node: Node) -> bool:
        """Run an elementwise node on blocked values where one of its inputs is blocked;
        False (nothing done) where it cannot be."""
        g = self.graph
        if len(node.outputs) != 1 or node.domain not in ("", "ai.onnx", "ember") or \
                node.implicit_inputs() or not any(name in self.blocked for name in node.inputs):
            return False
        definition = get_op(node.op)
        if definition is None or definition.pattern > PatternKind.BROADCAST or \
                definition.random:
            return False
        out_type = g.types.get(node.outputs[0])
        if not _static_4d(out_type) or not _pads_well(int(out_type.shape[1]), self.lanes):
            return False
        shape = tuple(int(d) for d in out_type.shape)
        if shape[1] % self.lanes and node.op not in KEEPS_PADDING_FINITE:
            return False
        plan = [self._operand(name, shape) for name in node.inputs]
        if any(step is None for step in plan):
            return False
        inputs = [step() for step in plan]
        out = self._value(f"{node.name or node.op}_blocked", self._blocked_shape(shape),
                          out_type.dtype)
        self.nodes.append(Node(node.op, inputs, [out], dict(node.attrs), name=node.name,
                               domain=node.domain))
        self.blocked[node.outputs[0]] = out
        self.pending.add(node.outputs[0])
        return True

    def pool(self, node: Node) -> bool:
        """Run a 2-D pool on a blocked value as a 3-D one whose last axis (the lanes) has a
        window of one; False (nothing done) where it cannot be."""
        g = self.graph
        if node.op not in ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool") or \
                node.domain not in ("", "ai.onnx") or len(node.outputs) != 1 or \
                node.inputs[0] not in self.blocked:
            return False
        in_type, out_type = g.types[node.inputs[0]], g.types.get(node.outputs[0])
        if not _static_4d(out_type):
            return False
        height, width = (int(d) for d in in_type.shape[2:])
        if node.op.startswith("Global"):
            op = node.op.removeprefix("Global")
            attrs = {"kernel_shape": [height, width, 1]}
        else:
            attrs = dict(node.attrs)
            pads = list(attrs.get("pads") or [0, 0, 0, 0])
            if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "") or len(pads) != 4 or \
                    len(attrs.get("kernel_shape") or ()) != 2:
                return False
            op = node.op
            attrs["kernel_shape"] = [*attrs["kernel_shape"], 1]
            attrs["pads"] = [pads[0], pads[1], 0, pads[2], pads[3], 0]
            for name in ("strides", "dilations"):
                attrs[name] = [*(attrs.get(name) or [1, 1]), 1]
        shape = tuple(int(d) for d in out_type.shape)
        out = self._value(f"{node.name or op}_blocked", self._blocked_shape(shape),
                          out_type.dtype)
        self.nodes.append(Node(op, [self.blocked[node.inputs[0]]], [out], attrs,
                               name=node.name))
        self.blocked[node.outputs[0]] = out
        self.pending.add(node.outputs[0])
        return True

    def split(self, node: Node) -> bool:
        """Split a blocked value along its channels (horizontally fused 1x1 convolutions:
        ResNet's first projection and shortcut of a stage) where every part is whole
        vectors of channels; False (nothing done) where it cannot be."""
        g = self.graph
        if node.op != "Split" or node.domain not in ("", "ai.onnx") or \
                not node.inputs or node.inputs[0] not in self.blocked or \
                len(node.inputs) < 2 or node.inputs[1] not in g.constants:
            return False
        in_type = g.types[node.inputs[0]]
        axis = int(node.attrs.get("axis", 0))
        sizes = [int(s) for s in g.constants[node.inputs[1]].reshape(-1)]
        if axis not in (1, -3) or int(in_type.shape[1]) % self.lanes or \
                any(size % self.lanes for size in sizes) or len(sizes) != len(node.outputs) or \
                sum(sizes) != int(in_type.shape[1]) or not all(node.outputs):
            return False
        outs = [self._value(f"{name}_blocked",
                            self._blocked_shape(tuple(int(d) for d in g.types[name].shape)),
                            in_type.dtype) for name in node.outputs]
        blocks = g.add_constant(np.asarray([size // self.lanes for size in sizes], np.int64),
                                hint=f"{node.name or 'split'}_blocks")
        self.nodes.append(Node("Split", [self.blocked[node.inputs[0]], blocks], outs,
                               {"axis": 1}, name=node.name))
        for name, out in zip(node.outputs, outs):
            self.blocked[name] = out
            self.pending.add(name)
        return True

    def keep(self, node: Node) -> None:
        """A node that reads NCHW values: the blocked ones it reads are written back first."""
        for name in [*node.inputs, *node.implicit_inputs()]:
            self.need_plain(name)
        self.nodes.append(node)

    # ------------------------------------------------------------------ conversions

    def need_plain(self, name: str) -> None:
        """Write the NCHW value ``name`` from its blocked twin, if it has not been."""
        if name not in self.pending:
            return
        self.pending.discard(name)
        g = self.graph
        shape = tuple(int(d) for d in g.types[name].shape)
        n, channels, height, width = shape
        dtype = g.types[name].dtype
        twin_shape = tuple(int(d) for d in g.types[self.blocked[name]].shape)
        blocks, lanes = twin_shape[1], twin_shape[4]
        split = self._value(f"{name}_channel_blocks", (n, blocks, lanes, height, width), dtype)
        padded = (n, blocks * lanes, height, width)
        joined = self._value(f"{name}_padded_channels", padded, dtype) \
            if padded != shape else name
        self.nodes += [
            Node("Transpose", [self.blocked[name]], [split], {"perm": [0, 1, 4, 2, 3]},
                 name=f"{name}_from_blocked"),
            Node("Reshape", [split, g.add_shape_constant(padded, hint=f"{name}_shape")],
                 [joined], name=f"{name}_join_channels"),
        ]
        if joined != name:  # the zero channels dropped
            self.nodes.append(Node("Slice", [joined, *self._constants(
                name, starts=[0], ends=[channels], axes=[1])], [name],
                name=f"{name}_drop_padding"))

    def blocked_twin(self, name: str, lanes: int) -> str:
        """The value ``name`` as ``(N, C/lanes, H, W, lanes)``: its twin in the region, or a
        conversion (kept as its twin when ``lanes`` is the region's)."""
        if lanes == self.lanes and name in self.blocked:
            return self.blocked[name]
        g = self.graph
        n, channels, height, width = (int(d) for d in g.types[name].shape)
        dtype = g.types[name].dtype
        blocks = -(-channels // lanes)
        source = name
        if blocks * lanes != channels:  # zero channels up to whole vectors
            source = self._value(f"{name}_padded_channels", (n, blocks * lanes, height, width),
                                 dtype)
            amounts = g.add_constant(np.asarray([0, 0, 0, 0, 0, blocks * lanes - channels, 0, 0],
                                                dtype=np.int64), hint=f"{name}_channel_pads")
            self.nodes.append(Node("Pad", [name, amounts], [source], {"mode": "constant"},
                                   name=f"{name}_pad_channels"))
        split = self._value(f"{name}_channel_blocks", (n, blocks, lanes, height, width), dtype)
        twin = self._value(f"{name}_blocked", (n, blocks, height, width, lanes), dtype)
        self.nodes += [
            Node("Reshape", [source, g.add_shape_constant((n, blocks, lanes, height, width),
                                                          hint=f"{name}_split_shape")],
                 [split], name=f"{name}_split_channels"),
            Node("Transpose", [split], [twin], {"perm": [0, 1, 3, 4, 2]},
                 name=f"{name}_to_blocked"),
        ]
        if lanes == self.lanes:
            self.blocked[name] = twin
        return twin

    def _operand(self, name: str, shape: tuple[int, ...]):
        """How input ``name`` of an elementwise node with output ``shape`` is read in the
        blocked layout (a function giving the value to read), or None if it cannot be."""
        g = self.graph
        if not name:
            return lambda: name
        if name in self.blocked:
            return lambda: self.blocked[name]
        constant = g.constants.get(name)
        if constant is not None:
            if constant.size == 1 and constant.ndim <= 4:
                return lambda: name  # a scalar broadcasts against any layout
            channels = shape[1]
            if constant.ndim in (3, 4) and constant.shape[-3:] == (channels, 1, 1) and \
                    (constant.ndim == 3 or constant.shape[0] == 1):
                blocks = -(-channels // self.lanes)
                blocked = self._per_channel(constant.reshape(channels), blocks)
                blocked = blocked.reshape(1, blocks, 1, 1, self.lanes)
                return lambda: g.add_constant(blocked, hint=f"{name}_blocked")
            return None
        value_type = g.types.get(name)
        if _static_4d(value_type) and tuple(int(d) for d in value_type.shape) == shape:
            return lambda: self.blocked_twin(name, self.lanes)
        return None

    def _blocked_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        n, channels, height, width = shape
        return (n, -(-channels // self.lanes), height, width, self.lanes)

    def _per_channel(self, values: np.ndarray, blocks: int) -> np.ndarray:
        """Per-channel ``values`` as ``(blocks, lanes)``, zero for the padded channels."""
        padded = np.zeros(blocks * self.lanes, dtype=values.dtype)
        padded[:values.size] = values.reshape(-1)
        return padded.reshape(blocks, self.lanes)

    def _constants(self, stem: str, **arrays: list[int]) -> list[str]:
        return [self.graph.add_constant(np.asarray(values, dtype=np.int64),
                                        hint=f"{stem}_{key}") for key, values in arrays.items()]

    def _value(self, hint: str, shape: tuple[int, ...],
               dtype: DType = DType.FLOAT32) -> str:
        name = self.graph.fresh_name(hint)
        self.graph.types[name] = TensorType(dtype, shape)
        return name
