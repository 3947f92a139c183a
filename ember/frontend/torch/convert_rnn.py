"""Converters for PyTorch's recurrent layers (``aten.lstm``, ``aten.gru``, ``aten.rnn_tanh``,
``aten.rnn_relu``): one ember ``LSTM``/``GRU``/``RNN`` node per layer.

Why: core ATen decomposes a recurrent layer into its time steps, each with its own copies of
the weight transposes and of the input projection broadcast over time -- an LSTM of two
layers over 24 steps became ~780 nodes and four times its parameters in weights.  Kept
whole, the layer is the same node the ONNX frontend makes, and ``passes/unroll_recurrent``
writes it out the way ember compiles best (one input projection for all steps, one packed
copy of each weight).  :func:`convertible` says which layers the AOT route keeps whole
(``frontend/torch/export.py`` leaves those out of the decompositions).

PyTorch and ONNX order the gates differently: an LSTM's rows are (i, f, g, o) in PyTorch and
(i, o, f, c) in ONNX, a GRU's (r, z, n) and (z, r, h); PyTorch's GRU applies the reset gate
after the recurrent product (ONNX ``linear_before_reset=1``).  The weights are reordered with
Split/Concat nodes, which constant folding evaluates once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ember.core.dtypes import DType
from ember.frontend.torch.context import ImportContext, Unsupported, static_int


@dataclass(frozen=True)
class _Cell:
    """How one PyTorch recurrent op maps onto its ONNX counterpart."""

    op: str                          # the ember op
    gates: int                       # gate blocks stacked in each weight
    onnx_order: tuple[int, ...]      # PyTorch gate block at each ONNX position
    has_cell_state: bool = False
    attrs: tuple[tuple[str, Any], ...] = ()


_LSTM = _Cell("LSTM", 4, (0, 3, 1, 2), has_cell_state=True)
_GRU = _Cell("GRU", 3, (1, 0, 2), attrs=(("linear_before_reset", 1),))
_RNN_TANH = _Cell("RNN", 1, (0,), attrs=(("activations", ("Tanh",)),))
_RNN_RELU = _Cell("RNN", 1, (0,), attrs=(("activations", ("Relu",)),))

CELLS: dict[str, _Cell] = {
    "aten.lstm.input": _LSTM,
    "aten.gru.input": _GRU,
    "aten.rnn_tanh.input": _RNN_TANH,
    "aten.rnn_relu.input": _RNN_RELU,
}


def recurrent_overloads() -> list["torch._ops.OpOverload"]:
    """The ATen overloads these converters take."""
    return [torch.ops.aten.lstm.input, torch.ops.aten.gru.input, torch.ops.aten.rnn_tanh.input,
            torch.ops.aten.rnn_relu.input]


def convertible(node: "torch.fx.Node", max_steps: int) -> bool:
    """Whether ``node`` (a call of one of :data:`CELLS`) becomes ember nodes that compile:
    float32, no LSTM projection (``proj_size``), inference (no dropout between layers), a
    static number of steps, at most ``max_steps`` over all directions (the limit of
    ``passes/unroll_recurrent``; past it a layer would run as a numpy reference, slower than
    PyTorch's own time steps)."""
    cell = CELLS.get(str(node.target))
    if cell is None or len(node.args) < 9:
        return False
    x, _, params, has_biases, num_layers, dropout, train, bidirectional, _ = node.args[:9]
    value = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float32 or value.dim() != 3:
        return False
    steps = value.shape[1] if node.args[8] else value.shape[0]
    if not isinstance(steps, int):  # (a dynamic batch is fine: the steps are written out)
        return False
    directions = 2 if bidirectional else 1
    per_direction = 4 if has_biases else 2
    if not isinstance(params, (list, tuple)) or len(params) != num_layers * directions * \
            per_direction:
        return False
    return not (train and dropout) and steps * directions <= max_steps


def lstm(ctx: ImportContext, node, x, hx, params, has_biases, num_layers, dropout, train,
         bidirectional, batch_first) -> list[str]:
    return _layers(ctx, _LSTM, x, list(hx), params, has_biases, num_layers, dropout, train,
                   bidirectional, batch_first)


def gru(ctx: ImportContext, node, x, hx, params, has_biases, num_layers, dropout, train,
        bidirectional, batch_first) -> list[str]:
    return _layers(ctx, _GRU, x, [hx], params, has_biases, num_layers, dropout, train,
                   bidirectional, batch_first)


def rnn_tanh(ctx: ImportContext, node, x, hx, params, has_biases, num_layers, dropout, train,
             bidirectional, batch_first) -> list[str]:
    return _layers(ctx, _RNN_TANH, x, [hx], params, has_biases, num_layers, dropout, train,
                   bidirectional, batch_first)


def rnn_relu(ctx: ImportContext, node, x, hx, params, has_biases, num_layers, dropout, train,
             bidirectional, batch_first) -> list[str]:
    return _layers(ctx, _RNN_RELU, x, [hx], params, has_biases, num_layers, dropout, train,
                   bidirectional, batch_first)


# aten.mkldnn_rnn_layer's ``mode`` for an LSTM (oneDNN's numbering: RNN_RELU 0, RNN_TANH 1,
# LSTM 2, GRU 3); Dynamo with ``allow_rnn`` writes only LSTMs this way.
_MKLDNN_LSTM = 2


def mkldnn_rnn_layer(ctx: ImportContext, node, x, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse,
                     batch_sizes, mode, hidden_size, num_layers, has_biases, bidirectional,
                     batch_first, train) -> list[str]:
    """One direction of one LSTM layer, as ``torch.compile`` hands it over when Dynamo's
    ``allow_rnn`` is on: an ember ``LSTM`` node (``reverse`` for the backward direction);
    the oneDNN workspace output is empty."""
    if static_int(mode, "mode") != _MKLDNN_LSTM:
        raise Unsupported("a oneDNN recurrent layer other than an LSTM")
    if batch_sizes:
        raise Unsupported("a packed sequence (batch_sizes)")
    if train:
        raise Unsupported("a recurrent layer in training mode")
    if ctx.torch_dtype(x) != DType.FLOAT32 or ctx.rank(x) != 3:
        raise Unsupported("a recurrent layer over a float32 input of rank 3 (batched)")
    sequence = ctx.tensor(x)
    if batch_first:
        sequence = ctx.add("Transpose", [sequence], perm=[1, 0, 2])
    w = _stack(ctx, [_onnx_gate_order(ctx, _LSTM, ctx.tensor(w_ih))])
    r = _stack(ctx, [_onnx_gate_order(ctx, _LSTM, ctx.tensor(w_hh))])
    b = _stack(ctx, [ctx.add("Concat", [_onnx_gate_order(ctx, _LSTM, ctx.tensor(b_ih)),
                                        _onnx_gate_order(ctx, _LSTM, ctx.tensor(b_hh))],
                             axis=0)]) if has_biases else ""
    y, y_h, y_c = ctx.add("LSTM", [sequence, w, r, b, "", ctx.tensor(hx), ctx.tensor(cx)],
                          outputs=3, hidden_size=static_int(hidden_size, "hidden_size"),
                          direction="reverse" if reverse else "forward")
    output = ctx.add("Squeeze", [y, ctx.ints([1])])  # (steps, 1, batch, hidden)
    if batch_first:
        output = ctx.add("Transpose", [output], perm=[1, 0, 2])
    workspace = ctx.constant(np.zeros((0,), dtype=np.uint8))
    return [output, y_h, y_c, workspace]


def _layers(ctx: ImportContext, cell: _Cell, x, states: list, params: Sequence[Any],
            has_biases: bool, num_layers: int, dropout: float, train: bool,
            bidirectional: bool, batch_first: bool) -> list[str]:
    """Stack ``num_layers`` ember nodes of ``cell.op``; returns (output, h_n[, c_n]) in
    PyTorch's layout."""
    if ctx.torch_dtype(x) != DType.FLOAT32 or ctx.rank(x) != 3:
        raise Unsupported("a recurrent layer over a float32 input of rank 3 (batched)")
    if train and dropout:
        raise Unsupported("dropout between recurrent layers while training")
    num_layers = static_int(num_layers, "num_layers")
    directions = 2 if bidirectional else 1
    per_direction = 4 if has_biases else 2
    if len(params) != num_layers * directions * per_direction:
        raise Unsupported("an LSTM with projections (proj_size)")
    hidden = ctx.static_shape(params[1])[1]
    sequence = ctx.tensor(x)
    if batch_first:
        sequence = ctx.add("Transpose", [sequence], perm=[1, 0, 2])
    finals: list[list[str]] = [[] for _ in states]
    for layer in range(num_layers):
        weights = [_direction_weights(ctx, cell, params, (layer * directions + d) *
                                      per_direction, has_biases) for d in range(directions)]
        w, r, b = (_stack(ctx, [parts[i] for parts in weights]) for i in range(3))
        initial = [ctx.add("Slice", [ctx.tensor(state),
                                     ctx.ints([layer * directions]),
                                     ctx.ints([(layer + 1) * directions]), ctx.ints([0])])
                   for state in states]
        inputs = [sequence, w, r, b, ""] + initial
        outputs = ctx.add(cell.op, inputs, outputs=2 + cell.has_cell_state,
                          hidden_size=hidden,
                          direction="bidirectional" if bidirectional else "forward",
                          **{name: list(value) if isinstance(value, tuple) else value
                             for name, value in cell.attrs})
        # Y (steps, directions, batch, hidden) -> (steps, batch, directions * hidden)
        steps_first = ctx.add("Transpose", [outputs[0]], perm=[0, 2, 1, 3])
        sequence = ctx.add("Reshape", [steps_first, ctx.ints([0, 0, -1])])
        for index, final in enumerate(outputs[1:]):
            finals[index].append(final)
    if batch_first:
        sequence = ctx.add("Transpose", [sequence], perm=[1, 0, 2])
    return [sequence] + [ctx.add("Concat", names, axis=0) if len(names) > 1 else names[0]
                         for names in finals]


def _direction_weights(ctx: ImportContext, cell: _Cell, params: Sequence[Any], first: int,
                       has_biases: bool) -> tuple[str, str, str | None]:
    """W, R and B (Wb then Rb, or None) of one direction of one layer, gates in ONNX order."""
    w = _onnx_gate_order(ctx, cell, ctx.tensor(params[first]))
    r = _onnx_gate_order(ctx, cell, ctx.tensor(params[first + 1]))
    if not has_biases:
        return w, r, None
    biases = [_onnx_gate_order(ctx, cell, ctx.tensor(params[first + i])) for i in (2, 3)]
    return w, r, ctx.add("Concat", biases, axis=0)


def _onnx_gate_order(ctx: ImportContext, cell: _Cell, weight: str) -> str:
    if cell.gates == 1:
        return weight
    blocks = ctx.add("Split", [weight], outputs=cell.gates, axis=0, num_outputs=cell.gates)
    return ctx.add("Concat", [blocks[i] for i in cell.onnx_order], axis=0)


def _stack(ctx: ImportContext, per_direction: list[str | None]) -> str:
    """One direction's tensors as (directions, ...): "" where the layer has no biases."""
    if per_direction[0] is None:
        return ""
    expanded = [ctx.add("Unsqueeze", [name, ctx.ints([0])]) for name in per_direction]
    return ctx.add("Concat", expanded, axis=0) if len(expanded) > 1 else expanded[0]

