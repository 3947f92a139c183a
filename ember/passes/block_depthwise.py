"""Depthwise convolutions over small images run with their channels blocked by the vector width.

A depthwise convolution (one filter per channel) in NCHW vectorizes along the output row,
and on the last layers of a MobileNet a row is 7 pixels: less than one AVX2 vector,
with a scalar tail, each output loaded and stored again for every tap.  Blocking the channels
by the target's vector width ``L`` -- ``(N, C, H, W)`` seen as ``(N, C/L, H, W, L)``, the NCHWc
layout of oneDNN and ONNX Runtime -- makes every output vector ``L`` channels of one pixel:
``KH * KW`` multiply-adds of contiguous loads in registers, one store, no tail.

The rewrite keeps the graph's layout NCHW at its boundaries (the layout is local to the
convolution)::

    Conv(x, w, b) {group = C}                      Reshape(x, (N, C/L, L, H, W))
                                          ->       Transpose(perm 0 1 3 4 2)     (N, C/L, H, W, L)
                                                   [Pad(the conv's pads, on H and W)]
                                                   DepthwiseConvBlocked(., w', b')
                                                   Transpose(perm 0 1 4 2 3)     (N, C/L, L, OH, OW)
                                                   Reshape((N, C, OH, OW))

with ``w'`` = ``w`` as ``(C/L, KH, KW, L)`` and ``b'`` = ``b`` as ``(C/L, L)``, both
constants.  The two transposes cost a pass over the input and the output each, and the one
back to NCHW reads with a stride of ``L``.  Measured on MobileNetV2's layers (one process, interleaved with
ONNX Runtime), that pays only on images ``MAX_BLOCKED_WIDTH`` pixels wide: 960 channels at
7x7 went from 216 to 76 us, the stride-2 576-channel layer into 7x7 from 139 to 88 us, while
at 14x14 (576 channels) the transpose back alone took longer than the whole NCHW kernel
(170 us against 199).  Writing the blocked result straight into NCHW from the convolution's
own kernel would remove that pass; until then wider images keep the NCHW kernel.

The padding is applied after the transpose, in the blocked layout, so that the copy that
transposes the input also pads it with plain bounds on its own loops (this pass runs before
``make_padding_explicit``; padded before the transpose, the bounds would be tested on indices
recovered by division from the reshape).

Only plain depthwise convolutions qualify: 2-D, float32, one output channel per input channel
(``group == C == M``), constant weights (and bias), explicit ``pads`` (no ``auto_pad``), ``C``
a multiple of ``L``, and a kernel of at most ``MAX_WRITTEN_OUT_TAPS`` taps.
"""

from __future__ import annotations

import numpy as np

from ember.core.dtypes import DType
from ember.core.target import Target
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType
from ember.ops.compute.nn import MAX_WRITTEN_OUT_TAPS

# Output rows up to this many pixels wide are blocked; wider ones vectorize along the row
# (see the module docstring for the measurements behind it).
MAX_BLOCKED_WIDTH = 7


def blocked_layouts_pay(target: Target | None) -> bool:
    """Whether channel-blocked layouts (this pass and ``block_convolutions``) pay on
    ``target``: where it has vectors to block for, and not for WebAssembly.  There the blocked
    kernels run slower than the NCHW ones once a wasm runtime has compiled them -- in
    wasmtime, on an AMD EPYC (Zen 3), ResNet-18 358 ms blocked against 231 ms not, MobileNetV2
    75 against 43 ms -- while the same C built natively for SSE2 (the same 4 lanes) gains from
    blocking (MobileNetV2 32 against 47 ms)."""
    target = target or Target.native()
    return target.lanes_for(DType.FLOAT32) >= 4 and target.arch != "wasm32"


def block_depthwise_convolutions(graph: Graph, target: Target | None) -> int:
    """Rewrite in place; returns how many convolutions were blocked."""
    lanes = (target or Target.native()).lanes_for(DType.FLOAT32)
    if not blocked_layouts_pay(target):
        return 0
    changed = 0
    new_nodes: list[Node] = []
    for node in graph.nodes:
        if _blockable(graph, node, lanes):
            new_nodes.extend(_blocked(graph, node, lanes))
            changed += 1
        else:
            new_nodes.append(node)
    graph.nodes = new_nodes
    return changed


def plain_conv_weights(graph: Graph, node: Node) -> np.ndarray | None:
    """The weights of ``node`` if it is a 2-D float32 Conv of static shapes whose weights
    (and bias) are constants, with explicit non-negative ``pads`` (no ``auto_pad``) and a
    ``kernel_shape`` that is the weights'; else None.  What both blocked layouts (this pass
    and ``block_convolutions``) ask of a convolution before its groups and channels."""
    if node.op != "Conv" or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return None
    inputs = [name for name in node.inputs if name]
    if len(inputs) < 2 or inputs != node.inputs[:len(inputs)]:
        return None
    x_type, y_type = graph.types.get(node.inputs[0]), graph.types.get(node.outputs[0])
    weights = graph.constants.get(node.inputs[1])
    bias = graph.constants.get(node.inputs[2]) if len(inputs) > 2 else None
    if not all(isinstance(t, TensorType) and t.is_static and t.shape is not None and
               len(t.shape) == 4 and t.dtype is DType.FLOAT32 for t in (x_type, y_type)) or \
            weights is None or weights.dtype != np.float32 or weights.ndim != 4:
        return None
    if len(inputs) > 2 and (bias is None or bias.shape != (weights.shape[0],)
                            or bias.dtype != np.float32):
        return None
    attrs = node.attrs
    pads = list(attrs.get("pads") or [0, 0, 0, 0])
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "") or len(pads) != 4 or \
            min(pads) < 0 or \
            tuple(attrs.get("kernel_shape") or weights.shape[2:]) != tuple(weights.shape[2:]):
        return None
    return weights


def _blockable(graph: Graph, node: Node, lanes: int) -> bool:
    weights = plain_conv_weights(graph, node)
    if weights is None:
        return False
    channels = int(graph.types[node.inputs[0]].shape[1])
    if int(node.attrs.get("group", 1)) != channels or weights.shape[:2] != (channels, 1) or \
            channels % lanes or weights.shape[2] * weights.shape[3] > MAX_WRITTEN_OUT_TAPS:
        return False
    return int(graph.types[node.outputs[0]].shape[3]) <= MAX_BLOCKED_WIDTH


def blocked_depthwise_weights(weights: np.ndarray, blocks: int, lanes: int) -> np.ndarray:
    """A depthwise convolution's weights ``(C, 1, KH, KW)`` as ``DepthwiseConvBlocked``
    reads them, ``(blocks, KH, KW, lanes)``; channels past ``C`` (padding up to whole
    vectors) get zero weights."""
    channels, _, kh, kw = weights.shape
    padded = np.zeros((blocks * lanes, kh, kw), np.float32)
    padded[:channels] = weights[:, 0]
    return np.ascontiguousarray(padded.reshape(blocks, lanes, kh, kw).transpose(0, 2, 3, 1))


def _blocked(graph: Graph, node: Node, lanes: int) -> list[Node]:
    x, y = node.inputs[0], node.outputs[0]
    n, channels, height, width = (int(d) for d in graph.types[x].shape)
    out_shape = tuple(int(d) for d in graph.types[y].shape)
    dtype = graph.types[x].dtype
    blocks = channels // lanes
    stem = node.name or "dwconv"
    weights = graph.constants[node.inputs[1]]

    def value(hint: str, shape: tuple[int, ...]) -> str:
        name = graph.fresh_name(f"{stem}_{hint}")
        graph.types[name] = TensorType(dtype, shape)
        return name

    def shape_constant(shape: tuple[int, ...], hint: str) -> str:
        return graph.add_shape_constant(shape, hint=f"{stem}_{hint}")

    pads = [int(p) for p in node.attrs.get("pads") or [0, 0, 0, 0]]
    split = value("channel_blocks", (n, blocks, lanes, height, width))
    blocked = value("blocked", (n, blocks, height, width, lanes))
    padded_shape = (n, blocks, height + pads[0] + pads[2], width + pads[1] + pads[3], lanes)
    padded = value("blocked_padded", padded_shape) if any(pads) else blocked
    out_blocked = value("blocked_out", (n, blocks, out_shape[2], out_shape[3], lanes))
    out_split = value("out_channel_blocks", (n, blocks, lanes, out_shape[2], out_shape[3]))
    w_blocked = graph.add_constant(blocked_depthwise_weights(weights, blocks, lanes),
                                   hint=f"{stem}_weights_blocked")
    conv_inputs = [padded, w_blocked]
    if len([i for i in node.inputs if i]) > 2:
        bias = graph.constants[node.inputs[2]]
        conv_inputs.append(graph.add_constant(np.ascontiguousarray(bias.reshape(blocks, lanes)),
                                              hint=f"{stem}_bias_blocked"))
    attrs = node.attrs
    padding: list[Node] = []
    if any(pads):
        pad_amounts = graph.add_constant(
            np.asarray([0, 0, pads[0], pads[1], 0, 0, 0, pads[2], pads[3], 0], dtype=np.int64),
            hint=f"{stem}_pads")
        zero = graph.add_constant(np.asarray(0.0, dtype=np.float32), hint=f"{stem}_pad_value")
        padding.append(Node("Pad", [blocked, pad_amounts, zero], [padded], {"mode": "constant"},
                            name=f"{stem}_pad"))
    return [
        Node("Reshape", [x, shape_constant((n, blocks, lanes, height, width), "split_shape")],
             [split], name=f"{stem}_split_channels"),
        Node("Transpose", [split], [blocked], {"perm": [0, 1, 3, 4, 2]},
             name=f"{stem}_to_blocked"),
        *padding,
        Node("DepthwiseConvBlocked", conv_inputs, [out_blocked],
             {"strides": list(attrs.get("strides") or [1, 1]),
              "dilations": list(attrs.get("dilations") or [1, 1])}, name=stem),
        Node("Transpose", [out_blocked], [out_split], {"perm": [0, 1, 4, 2, 3]},
             name=f"{stem}_from_blocked"),
        Node("Reshape", [out_split, shape_constant(out_shape, "out_shape")], [y],
             name=f"{stem}_join_channels"),
    ]
