"""Lower ConvTranspose with constant weights to a regular Conv plus a pixel interleave.

Why: ConvTranspose's own kernel gathers, for every output position, over every input
position and tap whose stride arithmetic lands there (most of which do not), which makes it
hundreds of times slower than a Conv of the same work.  The polyphase (sub-pixel)
decomposition turns it into the ops ember compiles well.

Along one spatial axis (stride ``s``, dilation ``d``, input size ``H``), output ``o`` is the
"canvas" position ``p = o + crop`` (``crop``: what pads, ``output_shape`` or ``auto_pad`` cut
from the start), and ``canvas[p] = sum of x[i] * W[t] over i * s + t * d = p``.  Split the
outputs by their phase ``r = o mod s``: for ``o = v * s + r`` the taps that can reach it are
those with ``t * d = (r + crop) (mod s)``, each reading ``x[v + delta_t]`` with a fixed offset
``delta_t``.  So every phase is a stride-1 Conv of ``x`` with its taps (flipped, in/out channel
axes swapped), all of length ``V = ceil(out / s)``; the phase results interleave into
``V * s`` outputs (a DepthToSpace), cropped to ``out``.  Positions whose canvas index lies
outside the canvas read only the zero padding, so they come out as 0 (+ bias) as they must.

Two layouts of the phase convolutions:

* **stacked** -- one Conv with ``M * prod(s)`` output channels whose kernel spans every
  phase's offsets (zero where a phase has no tap).  For kernel == stride without padding
  (every U-Net/decoder upsampling) each phase has exactly one tap at offset 0: a 1x1 Conv, the
  GEMM ``(M * k * k, C) @ (C, H * W)``, wasting nothing.
* **per phase** -- one Conv per phase with exactly its taps, concatenated on the channel axis
  (a phase that no tap reaches, when the kernel is smaller than the stride, is its bias
  broadcast).  Used when the stacked kernel would multiply by many zeros (kernel 3 or 4 with
  stride 2 and padding: the phases' offsets differ, so the common kernel is wider than each
  phase's).

The interleave is a DepthToSpace for 2-D with equal strides, else Reshape/Transpose/Reshape.
Any bias that is a constant goes into the Conv(s); a bias that is not is added at the end.

Applies to ConvTranspose nodes of any spatial rank, stride, dilation, pads, output_padding,
output_shape, auto_pad and group, with constant float weights of the input's type and static
spatial input dims; anything else is left as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

import numpy as np

from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType
from ember.ops.conv import kernel_of, transpose_plan, transpose_window

# Use one Conv per phase when the stacked kernel would do at least this many times their
# multiply-adds.  Per phase pays a Concat (one more pass over the output), a Pad per phase
# and more kernel launches.  Measured (one thread, 64->32 channels on 56x56): kernel 3,
# stride 2, pad 1 (stacked waste 16/9) ran in 11.0 ms per phase against 13.3 ms stacked;
# kernel 4, stride 2, pad 1 (waste 2.25) about the same either way; kernel == stride (no
# waste) must stay one Conv.
PER_PHASE_WASTE = 1.5
# At most this many per-phase Convs: the Concat that joins them picks each output element
# from one of its inputs, which grows slower with every input (stride 4 in 2-D, 16 phases,
# measured slower per phase than stacked), and every Conv is a kernel to compile.
MAX_PHASE_CONVS = 8


class _Skip(Exception):
    """The node cannot be lowered (its attributes or shapes do not fit): leave it as it is."""

    @staticmethod
    def error(message: str) -> "_Skip":
        return _Skip(message)


@dataclass(frozen=True)
class AxisPlan:
    """How one spatial axis decomposes: per output phase ``r`` (``0 <= r < stride``) the taps
    that reach it and the input offset each reads (output ``v * stride + r`` reads
    ``x[v + offset]`` for tap ``t``)."""

    stride: int
    in_size: int
    out_size: int
    taps: tuple[tuple[tuple[int, int], ...], ...]  # per phase: (tap, offset) pairs

    @property
    def length(self) -> int:
        """Outputs per phase: every phase computes ``ceil(out / stride)`` (the interleave
        needs equal lengths; the surplus is cropped)."""
        return -(-self.out_size // self.stride)

    def offsets(self, phases: range | list[int] | None = None) -> list[int]:
        chosen = range(self.stride) if phases is None else phases
        return [offset for r in chosen for _, offset in self.taps[r]]


def plan_axis(stride: int, dilation: int, kernel: int, crop: int, in_size: int,
              out_size: int) -> AxisPlan:
    """The taps of each output phase along one axis (see the module docstring)."""
    taps = []
    for r in range(stride):
        base, canvas_phase = divmod(r + crop, stride)
        taps.append(tuple((t, base - (t * dilation - canvas_phase) // stride)
                          for t in range(kernel) if (t * dilation) % stride == canvas_phase))
    return AxisPlan(stride, in_size, out_size, tuple(taps))


@dataclass(frozen=True)
class ConvGeometry:
    """A stride-1 Conv reading ``x[v + offset]`` for offsets ``low + kappa * dilation``:
    its kernel size, dilation and pads, and the input crop that replaces negative pads."""

    low: int
    size: int
    dilation: int
    pad_begin: int
    pad_end: int
    slice_begin: int
    slice_end: int  # exclusive, in input coordinates

    def index(self, offset: int) -> int:
        return (offset - self.low) // self.dilation


def conv_geometry(offsets: list[int], in_size: int, length: int) -> ConvGeometry | None:
    """The Conv that covers ``offsets`` and yields ``length`` outputs from an input of
    ``in_size``; None when the outputs read no input at all (nothing left to convolve)."""
    low, high = min(offsets), max(offsets)
    dilation = math.gcd(*(o - low for o in offsets)) or 1
    size = (high - low) // dilation + 1
    pad_begin = -low
    # So that in_size + pad_begin + pad_end - (size - 1) * dilation == length:
    pad_end = length - 1 + (size - 1) * dilation - (in_size - 1) - pad_begin
    # A negative pad is a crop of the input (ONNX Conv pads must not be negative).
    slice_begin, slice_end = max(-pad_begin, 0), in_size - max(-pad_end, 0)
    if slice_end <= slice_begin:
        return None
    return ConvGeometry(low, size, dilation, max(pad_begin, 0), max(pad_end, 0),
                        slice_begin, slice_end)


@dataclass(frozen=True)
class Lowering:
    """Everything the rewrite of one ConvTranspose node needs, computed before any edit."""

    node: Node
    weight: np.ndarray  # (C, M / group, k...)
    bias: np.ndarray | None  # constant bias, or None (then ``bias_input`` if any)
    bias_input: str
    group: int
    axes: tuple[AxisPlan, ...]
    per_phase: bool
    batch: int | None  # static batch dim, or None

    @property
    def rank(self) -> int:
        return len(self.axes)

    @property
    def out_channels(self) -> int:
        return self.weight.shape[1] * self.group

    @property
    def phases(self) -> list[tuple[int, ...]]:
        return list(product(*(range(a.stride) for a in self.axes)))


def lower_conv_transpose(graph: Graph) -> int:
    """Rewrite ConvTranspose nodes with constant weights as Conv + interleave (in place);
    returns how many were rewritten."""
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "ConvTranspose" or node.domain:
            continue
        lowering = _plan(graph, node)
        if lowering is None:
            continue
        _replace(graph, node, _build(graph, lowering))
        rewritten += 1
    return rewritten


# ---------------------------------------------------------------------- planning


def _plan(graph: Graph, node: Node) -> Lowering | None:
    """The lowering of ``node``, or None when it does not apply."""
    if len(node.inputs) < 2 or len(node.outputs) != 1 or not node.outputs[0]:
        return None
    x_type, y_type = graph.types.get(node.inputs[0]), graph.types.get(node.outputs[0])
    weight = graph.constants.get(node.inputs[1])
    if weight is None or not _usable(x_type) or not isinstance(y_type, TensorType) or \
            y_type.shape is None or weight.dtype.kind != "f" or \
            weight.dtype != x_type.dtype.numpy:
        return None
    rank = len(x_type.shape) - 2
    if rank < 1 or weight.ndim != rank + 2:
        return None
    group = int(node.attrs.get("group", 1) or 1)
    channels, in_dims = x_type.shape[1], [int(d) for d in x_type.shape[2:]]
    if group < 1 or not isinstance(channels, int) or channels != weight.shape[0] or \
            channels % group:
        return None
    bias_name = node.inputs[2] if len(node.inputs) > 2 else ""
    bias = graph.constants.get(bias_name) if bias_name else None
    if bias is not None and (bias.dtype != weight.dtype or bias.size != weight.shape[1] * group):
        return None
    axes = _plan_axes(node, weight, in_dims, y_type)
    if axes is None:
        return None
    batch = x_type.shape[0] if isinstance(x_type.shape[0], int) else None
    per_phase = _choose_layout(axes, batch)
    if per_phase is None:
        return None
    return Lowering(node, weight, bias, bias_name if bias is None else "", group, axes,
                    per_phase, batch)


def _usable(x_type: object) -> bool:
    """A float input of known rank with static channel and spatial dims."""
    return isinstance(x_type, TensorType) and x_type.shape is not None and \
        len(x_type.shape) >= 3 and x_type.dtype.is_float and \
        all(isinstance(d, int) for d in x_type.shape[1:])


def _plan_axes(node: Node, weight: np.ndarray, in_dims: list[int],
               y_type: TensorType) -> tuple[AxisPlan, ...] | None:
    """Per-axis phase plans from the node's attributes, with the crop and output size that
    the op's own shape rules (``ember.ops.conv.transpose_plan``) give."""
    try:
        kernel = kernel_of(_Skip, node.attrs, weight.shape)
        window, output_padding = transpose_window(_Skip, node.attrs, kernel)
        plan = transpose_plan(_Skip, in_dims, window, output_padding,
                              node.attrs.get("output_shape"))
    except _Skip:
        return None
    if any(not isinstance(d, int) for d in plan.out) or \
            any(not isinstance(c, int) for c in plan.crop_begin) or \
            tuple(plan.out) != tuple(y_type.shape[2:]):
        return None
    return tuple(plan_axis(window.strides[a], window.dilations[a], window.kernel[a],
                           plan.crop_begin[a], in_dims[a], plan.out[a])
                 for a in range(window.rank))


def _choose_layout(axes: tuple[AxisPlan, ...], batch: int | None) -> bool | None:
    """True for one Conv per phase, False for the stacked Conv, None if neither applies.

    Per phase is exact (a phase without taps, or whose outputs all lie outside the canvas, is
    its bias broadcast: an Expand, which needs a static batch dim) but pays for a Concat;
    stacked is one Conv but multiplies by zeros where a phase lacks a tap of the common
    kernel.  Per phase wins once the stacked kernel does PER_PHASE_WASTE times its work."""
    stacked = _geometries(axes, None)
    phases = [_geometries(axes, p) for p in product(*(range(a.stride) for a in axes))]
    per_phase_ok = 1 < len(phases) <= MAX_PHASE_CONVS and (batch is not None or all(phases))
    if stacked is None:
        return True if per_phase_ok else None
    if not per_phase_ok:
        return False
    stacked_work = len(phases) * math.prod(g.size for g in stacked)
    per_phase_work = sum(math.prod(g.size for g in p) for p in phases if p is not None)
    return stacked_work >= PER_PHASE_WASTE * max(per_phase_work, 1)


def _geometries(axes: tuple[AxisPlan, ...],
                phases: tuple[int, ...] | None) -> list[ConvGeometry] | None:
    """Per axis, the geometry of the Conv of one phase tuple (None: all phases stacked);
    None when some axis has nothing to convolve."""
    result = []
    for axis, a in enumerate(axes):
        offsets = a.offsets() if phases is None else a.offsets([phases[axis]])
        geometry = conv_geometry(offsets, a.in_size, a.length) if offsets else None
        if geometry is None:
            return None
        result.append(geometry)
    return result


# ---------------------------------------------------------------------- building


class _Builder:
    """Appends nodes that compute a ConvTranspose's output, naming every value afresh."""

    def __init__(self, graph: Graph, node: Node):
        self.graph = graph
        self.prefix = node.name or "convtranspose"
        self.nodes: list[Node] = []
        self.reserved: set[str] = set()

    def value(self, hint: str) -> str:
        while True:
            name = self.graph.fresh_name(f"{self.prefix}_{hint}")
            if name not in self.reserved:
                self.reserved.add(name)
                return name

    def constant(self, array: np.ndarray, hint: str) -> str:
        return self.graph.add_constant(array, hint=f"{self.prefix}_{hint}")

    def ints(self, values: list[int], hint: str) -> str:
        return self.constant(np.asarray(values, dtype=np.int64), hint)

    def add(self, op: str, inputs: list[str], hint: str, attrs: dict | None = None) -> str:
        out = self.value(hint)
        self.nodes.append(Node(op, inputs, [out], attrs or {},
                               name=f"{self.prefix}_{hint}"))
        return out


def _build(graph: Graph, lowering: Lowering) -> list[Node]:
    """The nodes replacing ``lowering.node``; the last one writes its output."""
    node = lowering.node
    builder = _Builder(graph, node)
    x = node.inputs[0]
    if lowering.per_phase:
        results = [_phase_conv(builder, lowering, x, phases) or _bias_fill(builder, lowering)
                   for phases in lowering.phases]
        stacked = builder.add("Concat", results, "phases", {"axis": 1})
        phase_major = True
    else:
        stacked = _phase_conv(builder, lowering, x, None)
        phase_major = False
    y = _interleave(builder, lowering, stacked, phase_major)
    y = _crop(builder, lowering, y)
    if lowering.bias_input:
        shape = builder.ints([lowering.out_channels] + [1] * lowering.rank, "bias_shape")
        bias = builder.add("Reshape", [lowering.bias_input, shape], "bias")
        y = builder.add("Add", [y, bias], "add_bias")
    # Every step returns what the node it added last writes: that node writes the output.
    last = builder.nodes[-1]
    assert last.outputs == [y]
    last.outputs = [node.outputs[0]]
    return builder.nodes


def _phase_conv(builder: _Builder, lowering: Lowering, x: str,
                phases: tuple[int, ...] | None) -> str | None:
    """The Conv computing ``phases`` (one phase tuple, or None for all of them stacked with
    channel index ``m * P + phase``) on input ``x``; None for a phase no tap reaches."""
    geometries = _geometries(lowering.axes, phases)
    if geometries is None:
        assert phases is not None, "the stacked layout is only chosen when it has taps"
        return None
    hint = "conv" if phases is None else "conv_" + "_".join(map(str, phases))
    if any(g.slice_begin > 0 or g.slice_end < a.in_size
           for g, a in zip(geometries, lowering.axes)):
        axes = list(range(2, 2 + lowering.rank))
        x = builder.add("Slice", [x, builder.ints([g.slice_begin for g in geometries], "starts"),
                                  builder.ints([g.slice_end for g in geometries], "ends"),
                                  builder.ints(axes, "axes")], f"{hint}_input")
    weight = _conv_weight(lowering, geometries, phases)
    inputs = [x, builder.constant(weight, f"{hint}_w")]
    if lowering.bias is not None:
        copies = 1 if phases is not None else len(lowering.phases)
        inputs.append(builder.constant(np.repeat(lowering.bias.reshape(-1), copies), f"{hint}_b"))
    attrs = {"kernel_shape": [g.size for g in geometries],
             "dilations": [g.dilation for g in geometries],
             "strides": [1] * lowering.rank,
             "pads": [g.pad_begin for g in geometries] + [g.pad_end for g in geometries],
             "group": lowering.group}
    return builder.add("Conv", inputs, hint, attrs)


def _bias_fill(builder: _Builder, lowering: Lowering) -> str:
    """A phase that no tap reaches: its bias (or zeros, when the bias is added later) at
    every position, ``(N, M, V...)``."""
    assert lowering.batch is not None, "per-phase fills need a static batch dim"
    rank, m = lowering.rank, lowering.out_channels
    value = lowering.bias if lowering.bias is not None else \
        np.zeros(m, dtype=lowering.weight.dtype)
    channel = builder.constant(value.reshape((1, m) + (1,) * rank), "fill_value")
    shape = builder.ints([lowering.batch, m] + [a.length for a in lowering.axes], "fill_shape")
    return builder.add("Expand", [channel, shape], "fill")


def _conv_weight(lowering: Lowering, geometries: list[ConvGeometry],
                 phases: tuple[int, ...] | None) -> np.ndarray:
    """Conv weights ``(M * P, C / group, K...)`` for ``phases`` (P = 1 for one phase tuple):
    tap ``t`` of phase ``r`` at kernel index ``(offset - low) / dilation``, its channel axes
    swapped (ConvTranspose's W is ``(C, M / group, k...)``), zero where a phase has no tap."""
    weight, group = lowering.weight, lowering.group
    channels, m_group = weight.shape[0], weight.shape[1]
    c_group = channels // group
    # (group, M/G, C/G, k...): output channels first, as Conv wants them.
    grouped = weight.reshape((group, c_group, m_group) + weight.shape[2:]).swapaxes(1, 2)
    chosen = lowering.phases if phases is None else [phases]
    strides = tuple(1 if phases is not None else a.stride for a in lowering.axes)
    result = np.zeros((group, m_group) + strides + (c_group,) +
                      tuple(g.size for g in geometries), dtype=weight.dtype)
    for phase in chosen:
        slot = tuple(0 if phases is not None else r for r in phase)
        per_axis = [a.taps[r] for a, r in zip(lowering.axes, phase)]
        for combo in product(*per_axis):
            taps = tuple(t for t, _ in combo)
            kappa = tuple(g.index(offset) for g, (_, offset) in zip(geometries, combo))
            result[(slice(None), slice(None)) + slot + (slice(None),) + kappa] = \
                grouped[(slice(None),) * 3 + taps]
    return result.reshape((group * m_group * math.prod(strides), c_group) +
                          tuple(g.size for g in geometries))


def _interleave(builder: _Builder, lowering: Lowering, stacked: str, phase_major: bool) -> str:
    """``(N, channels, V...)`` phase results -> ``(N, M, V1 * s1, ...)``: output ``v * s + r``
    is phase ``r``'s ``v`` (a DepthToSpace, in any rank and with per-axis block sizes).
    Channels are ``phase * M + m`` when ``phase_major``, else ``m * P + phase``."""
    rank, m = lowering.rank, lowering.out_channels
    strides = [a.stride for a in lowering.axes]
    lengths = [a.length for a in lowering.axes]
    if all(s == 1 for s in strides):
        return stacked
    if rank == 2 and strides[0] == strides[1]:
        # DepthToSpace's own kernel indexes directly; the Reshape/Transpose/Reshape chain,
        # fused into one kernel, re-derives every index from a flat one (many times slower).
        return builder.add("DepthToSpace", [stacked], "interleave",
                           {"blocksize": strides[0], "mode": "DCR" if phase_major else "CRD"})
    if phase_major:  # (N, s..., M, V...)
        split = [0] + strides + [m] + lengths
        channel, phase_axis = 1 + rank, 1
    else:  # (N, M, s..., V...)
        split = [0, m] + strides + lengths
        channel, phase_axis = 1, 2
    perm = [0, channel]
    for axis in range(rank):
        perm += [2 + rank + axis, phase_axis + axis]
    split_name = builder.add("Reshape", [stacked, builder.ints(split, "split_shape")],
                             "split_phases")
    moved = builder.add("Transpose", [split_name], "interleave", {"perm": perm})
    merged = [0, m] + [v * s for v, s in zip(lengths, strides)]
    return builder.add("Reshape", [moved, builder.ints(merged, "merged_shape")], "merge")


def _crop(builder: _Builder, lowering: Lowering, y: str) -> str:
    """Drop the surplus of the last phases: ``V * s`` outputs per axis down to the real size."""
    axes = [a for a in range(lowering.rank)
            if lowering.axes[a].length * lowering.axes[a].stride != lowering.axes[a].out_size]
    if not axes:
        return y
    return builder.add("Slice", [y, builder.ints([0] * len(axes), "crop_starts"),
                                 builder.ints([lowering.axes[a].out_size for a in axes],
                                              "crop_ends"),
                                 builder.ints([2 + a for a in axes], "crop_axes")], "crop")


def _replace(graph: Graph, node: Node, new_nodes: list[Node]) -> None:
    """Put ``new_nodes`` where ``node`` was (its output keeps its name, so no reader and no
    graph output has to change)."""
    index = next(i for i, n in enumerate(graph.nodes) if n is node)
    graph.nodes[index:index + 1] = new_nodes
