"""Recurrent layers: RNN, GRU and LSTM, with ONNX semantics.

All three share one driver (:func:`_run_recurrent`): it normalizes the ``layout``, splits the
weights per direction, walks the time steps (forward, reverse, or both for
``bidirectional``), honours per-batch ``sequence_lens`` (steps past an entry's length leave its
state unchanged and write zeros to Y; a reverse pass starts at the entry's last valid step),
and assembles Y / Y_h / Y_c.  Each op only supplies its cell: how one time step turns
(x_t, states) into new states.

Gate activations are named in the ``activations`` attribute (case-insensitive); the ones that
take parameters consume ``activation_alpha`` / ``activation_beta`` in order, falling back to
the defaults of the corresponding ONNX ops.  ``clip`` bounds the inputs of the gate
activations.  Arithmetic runs in the input's precision (float16 in float32) and results are
returned in the input's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ember.core.dims import Dim, dims_equal
from ember.ir.types import TensorType, ValueType
from ember.ops.registry import Attr, InferContext, RefContext, op
from ember.ops.shape_infer import tensor_input

Activation = Callable[[np.ndarray], np.ndarray]

# ----------------------------------------------------------------------------- activations


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


# name -> (function of (x, alpha, beta), default alpha, default beta); None: takes no such value.
_ACTIVATIONS: dict[str, tuple[Callable[..., np.ndarray], float | None, float | None]] = {
    "relu": (lambda x, a, b: np.maximum(x, 0), None, None),
    "tanh": (lambda x, a, b: np.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: _sigmoid(x), None, None),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: np.where(x > a, x, 0), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * np.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1)), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    "softplus": (lambda x, a, b: np.logaddexp(0, x), None, None),
}


@dataclass(frozen=True)
class ActivationSpec:
    """One gate function of a cell as the attributes name it: its lower-case name, its alpha
    and beta (None where the function takes none) and whether ``clip`` bounds its input."""

    name: str
    alpha: float | None
    beta: float | None
    clipped: bool


def activation_specs(error: Callable[[str], Exception], names: list[str] | None,
                     defaults: tuple[str, ...], alphas: list[float] | None,
                     betas: list[float] | None, num_directions: int
                     ) -> list[list[ActivationSpec]]:
    """Per direction, the gate functions of the cell (shared by the reference and by
    ``ember.passes.unroll_recurrent``).

    The functions that take parameters consume ``activation_alpha`` / ``activation_beta`` in
    order, falling back to their ONNX defaults.  ``clip`` bounds the inputs of the gate
    activations (f, g), not that of LSTM's output activation h, which sees the cell state
    (as ONNX Runtime does).
    """
    per_direction = len(defaults)
    names = list(names) if names else list(defaults) * num_directions
    if len(names) == per_direction and num_directions == 2:
        names = names * 2  # one list for both directions
    elif len(names) == 2 * per_direction and num_directions == 1:
        names = names[:per_direction]  # RNN's ONNX default lists two (one per direction)
    if len(names) != per_direction * num_directions:
        raise error(f"activations lists {len(names)} function(s); this cell needs "
                    f"{per_direction} per direction ({per_direction * num_directions})")
    alpha_iter, beta_iter = iter(alphas or []), iter(betas or [])
    specs: list[ActivationSpec] = []
    for position, name in enumerate(names):
        entry = _ACTIVATIONS.get(name.lower())
        if entry is None:
            raise error(f"unknown activation '{name}'; known: {sorted(_ACTIVATIONS)}")
        _, default_alpha, default_beta = entry
        alpha = next(alpha_iter, default_alpha) if default_alpha is not None else None
        beta = next(beta_iter, default_beta) if default_beta is not None else None
        specs.append(ActivationSpec(name.lower(), alpha, beta,
                                    clipped=position % per_direction < 2))
    return [specs[d * per_direction:(d + 1) * per_direction] for d in range(num_directions)]


def _activations(ctx: RefContext, names: list[str] | None, defaults: tuple[str, ...],
                 alphas: list[float] | None, betas: list[float] | None,
                 num_directions: int, clip: float | None) -> list[list[Activation]]:
    """Per direction, the activation functions of the cell (see :func:`activation_specs`)."""
    specs = activation_specs(ctx.error, names, defaults, alphas, betas, num_directions)
    return [[_bind(_ACTIVATIONS[spec.name][0], spec.alpha, spec.beta,
                   clip if spec.clipped else None) for spec in direction]
            for direction in specs]


def _bind(fn: Callable[..., np.ndarray], alpha: float | None, beta: float | None,
          clip: float | None) -> Activation:
    if clip is None:
        return lambda x: fn(x, alpha, beta)
    return lambda x: fn(np.clip(x, -clip, clip), alpha, beta)


# ----------------------------------------------------------------------------- the driver


@dataclass
class _Weights:
    """One direction's parameters, gates stacked along axis 0 as ONNX stores them."""

    w: np.ndarray  # [gates*hidden, input]
    r: np.ndarray  # [gates*hidden, hidden]
    wb: np.ndarray  # [gates*hidden]
    rb: np.ndarray  # [gates*hidden]
    p: np.ndarray | None  # LSTM peepholes [3*hidden] (i, o, f)
    f: list[Activation]


# cell(x_t [batch, input], states [batch, hidden] each, weights) -> (new states; first is H)
Cell = Callable[[np.ndarray, list[np.ndarray], _Weights], list[np.ndarray]]


@dataclass(frozen=True)
class CellKind:
    """What the driver needs to know of a cell type besides its step function."""

    gates: int  # gate blocks stacked in W, R and each half of B
    states: int  # H, or H and C
    activations: tuple[str, ...]  # the default activation of each gate function


_RNN = CellKind(gates=1, states=1, activations=("Tanh",))
_GRU = CellKind(gates=3, states=1, activations=("Sigmoid", "Tanh"))
_LSTM = CellKind(gates=4, states=2, activations=("Sigmoid", "Tanh", "Tanh"))

# op -> its cell kind (ember.passes.unroll_recurrent writes the cells out as graph nodes)
CELL_KINDS = {"RNN": _RNN, "GRU": _GRU, "LSTM": _LSTM}

_DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


def _num_directions(ctx: InferContext | RefContext, direction: str) -> int:
    if direction not in _DIRECTIONS:
        raise ctx.error(f"direction must be one of {sorted(_DIRECTIONS)}, got '{direction}'")
    return _DIRECTIONS[direction]


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.promote_types(dtype, np.float32)


def _run_recurrent(ctx: RefContext, kind: CellKind, cell: Cell, x: np.ndarray, w: np.ndarray,
                   r: np.ndarray, b: np.ndarray | None, sequence_lens: np.ndarray | None,
                   initial: list[np.ndarray | None], p: np.ndarray | None,
                   attrs: dict) -> tuple[np.ndarray, ...]:
    """Run a recurrent layer; returns (Y, final H) or (Y, final H, final C)."""
    n_gates, n_states = kind.gates, kind.states
    out_dtype = x.dtype
    dtype = _compute_dtype(x.dtype)
    layout = attrs["layout"]
    num_dir = _num_directions(ctx, attrs["direction"])
    if layout not in (0, 1):
        raise ctx.error(f"layout must be 0 or 1, got {layout}")
    if x.ndim != 3:
        raise ctx.error(f"X must have rank 3, got shape {x.shape}")
    if layout == 1:  # [batch, seq, input] -> [seq, batch, input]; states batch-major too
        x = x.transpose(1, 0, 2)
        initial = [None if s is None else s.transpose(1, 0, 2) for s in initial]
    seq_len, batch, input_size = x.shape
    hidden = attrs["hidden_size"] if attrs["hidden_size"] is not None else r.shape[-1]
    _check_weights(ctx, w, r, b, p, num_dir, n_gates, hidden, input_size)
    lengths = np.full(batch, seq_len, dtype=np.int64) if sequence_lens is None else \
        np.asarray(sequence_lens, dtype=np.int64).reshape(-1)
    if lengths.shape != (batch,) or np.any(lengths < 0) or np.any(lengths > seq_len):
        raise ctx.error(f"sequence_lens {lengths.tolist()} must hold one length in "
                        f"[0, {seq_len}] per batch entry ({batch})")
    functions = _activations(ctx, attrs["activations"], kind.activations,
                             attrs["activation_alpha"], attrs["activation_beta"], num_dir,
                             attrs["clip"])
    x = x.astype(dtype)
    b = np.zeros((num_dir, 2 * n_gates * hidden), dtype) if b is None else b.astype(dtype)
    y = np.zeros((seq_len, num_dir, batch, hidden), dtype)
    finals: list[list[np.ndarray]] = []
    for d in range(num_dir):
        weights = _Weights(w[d].astype(dtype), r[d].astype(dtype),
                           b[d, :n_gates * hidden], b[d, n_gates * hidden:],
                           None if p is None else p[d].astype(dtype), functions[d])
        states = [np.zeros((batch, hidden), dtype) if s is None else s[d].astype(dtype)
                  for s in (initial + [None] * n_states)[:n_states]]
        reverse = attrs["direction"] == "reverse" or d == 1
        finals.append(_run_direction(cell, x, lengths, states, weights, reverse, y[:, d]))
    outputs = [y] + [np.stack([f[k] for f in finals]) for k in range(n_states)]
    if layout == 1:
        outputs = [outputs[0].transpose(2, 0, 1, 3)] + [o.transpose(1, 0, 2)
                                                          for o in outputs[1:]]
    return tuple(o.astype(out_dtype) for o in outputs)


def _run_direction(cell: Cell, x: np.ndarray, lengths: np.ndarray, states: list[np.ndarray],
                   weights: _Weights, reverse: bool, y: np.ndarray) -> list[np.ndarray]:
    """Walk one direction, writing H of each valid step into ``y`` [seq, batch, hidden]."""
    seq_len, batch = x.shape[:2]
    entries = np.arange(batch)
    for step in range(seq_len):
        valid = step < lengths
        if not valid.any():
            break
        times = np.where(valid, lengths - 1 - step if reverse else step, 0)
        new = cell(x[times, entries], states, weights)
        states = [np.where(valid[:, None], n, s) for n, s in zip(new, states)]
        y[times[valid], entries[valid]] = new[0][valid]
    return states


def _check_weights(ctx: RefContext, w: np.ndarray, r: np.ndarray, b: np.ndarray | None,
                   p: np.ndarray | None, num_dir: int, n_gates: int, hidden: int,
                   input_size: int) -> None:
    expected = {"W": (w, (num_dir, n_gates * hidden, input_size)),
                "R": (r, (num_dir, n_gates * hidden, hidden))}
    if b is not None:
        expected["B"] = (b, (num_dir, 2 * n_gates * hidden))
    if p is not None:
        expected["P"] = (p, (num_dir, 3 * hidden))
    for name, (value, shape) in expected.items():
        if value.shape != shape:
            raise ctx.error(f"{name} has shape {value.shape}; with {num_dir} direction(s), "
                            f"hidden_size {hidden} and input size {input_size} it must be "
                            f"{shape}")


# ----------------------------------------------------------------------------- inference


def _recurrent_infer(kind: CellKind):
    """infer: Y [seq, dirs, batch, hidden] and the final states [dirs, batch, hidden]
    (batch-major with layout=1)."""

    def infer(ctx: InferContext) -> list[ValueType | None]:
        n_gates = kind.gates
        x = tensor_input(ctx, 0)
        w, r = tensor_input(ctx, 1), tensor_input(ctx, 2)
        num_dir = _num_directions(ctx, ctx.attrs["direction"])
        layout = ctx.attrs["layout"]
        hidden: Dim = ctx.attrs["hidden_size"]
        if hidden is None and r.shape is not None and len(r.shape) == 3:
            hidden = r.shape[2]
        seq: Dim = None
        batch: Dim = None
        if x.shape is not None:
            if len(x.shape) != 3:
                raise ctx.error(f"X must have rank 3, got {x}")
            seq, batch = (x.shape[0], x.shape[1]) if layout == 0 else (x.shape[1], x.shape[0])
            _check_dim(ctx, w, 2, x.shape[2], "W's input size (dim 2) differs from X's")
        for weight, name in ((w, "W"), (r, "R")):
            _check_dim(ctx, weight, 0, num_dir, f"{name}'s dim 0 must be the number of "
                                                f"directions")
            if hidden is not None:
                _check_dim(ctx, weight, 1, n_gates * hidden,
                           f"{name}'s dim 1 must be {n_gates} * hidden_size")
        if layout == 0:
            y_shape, state_shape = (seq, num_dir, batch, hidden), (num_dir, batch, hidden)
        else:
            y_shape, state_shape = (batch, seq, num_dir, hidden), (batch, num_dir, hidden)
        return [TensorType(x.dtype, y_shape)] + \
            [TensorType(x.dtype, state_shape)] * kind.states

    return infer


def _check_dim(ctx: InferContext, vtype: TensorType, axis: int, expected: Dim,
               message: str) -> None:
    if vtype.shape is None or len(vtype.shape) <= axis:
        return
    if dims_equal(vtype.shape[axis], expected) is False:
        raise ctx.error(f"{message}: got {vtype.shape[axis]}, expected {expected}")


def _common_attrs(default_activations: tuple[str, ...] | None = None) -> dict[str, Attr]:
    return {
        "activation_alpha": Attr.floats(None),
        "activation_beta": Attr.floats(None),
        "activations": Attr.strings(list(default_activations) if default_activations else None),
        "clip": Attr.float(None),
        "direction": Attr.string("forward"),
        "hidden_size": Attr.int(None),
        "layout": Attr.int(0),
    }


def _split_gates(values: np.ndarray, count: int) -> list[np.ndarray]:
    return np.split(values, count, axis=-1)


# ----------------------------------------------------------------------------- RNN


def _rnn_cell(x_t: np.ndarray, states: list[np.ndarray], p: _Weights) -> list[np.ndarray]:
    (h,) = states
    return [p.f[0](x_t @ p.w.T + h @ p.r.T + p.wb + p.rb)]


@op("RNN", family="rnn", infer=_recurrent_infer(_RNN), outputs=(0, 2),
    attrs=_common_attrs(("Tanh", "Tanh")))
def rnn(ctx, x, w, r, b=None, sequence_lens=None, initial_h=None, **attrs):
    """Simple recurrent layer: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)."""
    return _run_recurrent(ctx, _RNN, _rnn_cell, x, w, r, b, sequence_lens, [initial_h], None,
                          attrs)


# ----------------------------------------------------------------------------- GRU


def _gru_cell(linear_before_reset: bool) -> Cell:
    def cell(x_t: np.ndarray, states: list[np.ndarray], p: _Weights) -> list[np.ndarray]:
        (h,) = states
        xz, xr, xh = _split_gates(x_t @ p.w.T + p.wb, 3)
        rz, rr, rh = np.split(p.r, 3, axis=0)
        bz, br, bh = _split_gates(p.rb, 3)
        z = p.f[0](xz + h @ rz.T + bz)
        reset = p.f[0](xr + h @ rr.T + br)
        if linear_before_reset:
            candidate = p.f[1](xh + reset * (h @ rh.T + bh))
        else:
            candidate = p.f[1](xh + (reset * h) @ rh.T + bh)
        return [(1 - z) * candidate + z * h]

    return cell


@op("GRU", family="rnn", infer=_recurrent_infer(_GRU), outputs=(0, 2),
    attrs={**_common_attrs(), "linear_before_reset": Attr.int(0)})
def gru(ctx, x, w, r, b=None, sequence_lens=None, initial_h=None, *, linear_before_reset,
        **attrs):
    """Gated recurrent unit (gates z, r, h); ``linear_before_reset`` applies the reset gate
    after the recurrent matmul."""
    return _run_recurrent(ctx, _GRU, _gru_cell(bool(linear_before_reset)), x, w, r, b,
                          sequence_lens, [initial_h], None, attrs)


# ----------------------------------------------------------------------------- LSTM


def _lstm_cell(input_forget: bool) -> Cell:
    def cell(x_t: np.ndarray, states: list[np.ndarray], p: _Weights) -> list[np.ndarray]:
        h, c = states
        gi, go, gf, gc = _split_gates(x_t @ p.w.T + h @ p.r.T + p.wb + p.rb, 4)
        pi, po, pf = _split_gates(p.p, 3) if p.p is not None else (0, 0, 0)
        i = p.f[0](gi + pi * c)
        f = 1 - i if input_forget else p.f[0](gf + pf * c)
        c_new = f * c + i * p.f[1](gc)
        o = p.f[0](go + po * c_new)
        return [o * p.f[2](c_new), c_new]

    return cell


@op("LSTM", family="rnn", infer=_recurrent_infer(_LSTM), outputs=(0, 3),
    attrs={**_common_attrs(), "input_forget": Attr.int(0)})
def lstm(ctx, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *,
         input_forget, **attrs):
    """Long short-term memory (gates i, o, f, c) with optional peepholes P (i, o, f) and
    coupled input/forget gates (``input_forget``)."""
    return _run_recurrent(ctx, _LSTM, _lstm_cell(bool(input_forget)), x, w, r, b,
                          sequence_lens, [initial_h, initial_c], p, attrs)
