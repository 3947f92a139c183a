"""Recurrent layers (RNN, GRU, LSTM): symbolic shape inference for both layouts, numbers
against step-by-step numpy oracles (sequence_lens, reverse and bidirectional passes,
activations with parameters, clip, linear_before_reset, peepholes, input_forget), and the
errors a user gets for inconsistent weights."""

from __future__ import annotations

import numpy as np
import pytest

from ember.core.dtypes import DType
from ember.core.errors import EmberError, ShapeError
from ember.interp import ReferenceExecutor
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType, tensor
from ember.passes.infer_shapes import infer_shapes

F32 = DType.FLOAT32
RNG = np.random.default_rng(0)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
INPUTS = ("x", "w", "r", "b", "sequence_lens", "initial_h", "initial_c", "p")


def _graph(op: str, types: dict[str, TensorType], outputs: int, **attrs) -> Graph:
    names = [name if name in types else "" for name in INPUTS]
    while names and not names[-1]:
        names.pop()
    outs = [f"out{i}" for i in range(outputs)]
    node = Node(op, names, outs, attrs, name="cell")
    return infer_shapes(Graph(inputs=list(types), outputs=outs, nodes=[node], types=dict(types)))


def _types(op: str, types: dict[str, TensorType], outputs: int = 2, **attrs) -> list[str]:
    graph = _graph(op, types, outputs, **attrs)
    return [str(graph.types[name]) for name in graph.outputs]


def _run(op: str, values: dict[str, np.ndarray], outputs: int = 2, **attrs) -> list[np.ndarray]:
    types = {name: TensorType(DType.from_numpy(v.dtype), v.shape) for name, v in values.items()}
    graph = _graph(op, types, outputs, **attrs)
    result = ReferenceExecutor(graph).run(values)
    return [result[name] for name in graph.outputs]


def _weights(op: str, dirs: int, hidden: int, size: int) -> dict[str, np.ndarray]:
    g = GATES[op]
    return {"w": RNG.normal(size=(dirs, g * hidden, size)).astype(np.float32),
            "r": RNG.normal(size=(dirs, g * hidden, hidden)).astype(np.float32),
            "b": RNG.normal(size=(dirs, 2 * g * hidden)).astype(np.float32)}


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _oracle(op: str, x, w, r, b, h, c=None, p=None, lengths=None, reverse=False,
            f=_sigmoid, g=np.tanh, linear_before_reset=False):
    """One direction, one batch entry at a time, written straight from the ONNX equations."""
    seq, batch, _ = x.shape
    hidden = r.shape[-1]
    y = np.zeros((seq, batch, hidden), np.float32)
    h, c = h.copy(), None if c is None else c.copy()
    for n in range(batch):
        length = seq if lengths is None else lengths[n]
        for t in (range(length - 1, -1, -1) if reverse else range(length)):
            xw = x[t, n] @ w.T + b[:len(b) // 2]
            rb = b[len(b) // 2:]
            if op == "RNN":
                h[n] = g(xw + h[n] @ r.T + rb)
            elif op == "GRU":
                xz, xr, xh = np.split(xw, 3)
                (rz, rr, rh), (bz, br, bh) = np.split(r, 3), np.split(rb, 3)
                z = f(xz + h[n] @ rz.T + bz)
                reset = f(xr + h[n] @ rr.T + br)
                hh = g(xh + reset * (h[n] @ rh.T + bh)) if linear_before_reset else \
                    g(xh + (reset * h[n]) @ rh.T + bh)
                h[n] = (1 - z) * hh + z * h[n]
            else:
                gi, go, gf, gc = np.split(xw + h[n] @ r.T + rb, 4)
                pi, po, pf = np.split(p, 3) if p is not None else (0, 0, 0)
                i = f(gi + pi * c[n])
                forget = f(gf + pf * c[n])
                c[n] = forget * c[n] + i * g(gc)
                h[n] = f(go + po * c[n]) * g(c[n])
            y[t, n] = h[n]
    return y, h, c


# ----------------------------------------------------------------------------- inference


def test_lstm_symbolic_shapes_in_both_layouts():
    weights = {"w": tensor(F32, 2, 64, 8), "r": tensor(F32, 2, 64, 16)}
    seq_major = {"x": tensor(F32, "S", "N", 8), **weights}
    assert _types("LSTM", seq_major, 3, direction="bidirectional") == [
        "f32[S, 2, N, 16]", "f32[2, N, 16]", "f32[2, N, 16]"]
    batch_major = {"x": tensor(F32, "N", "S", 8), **weights}
    assert _types("LSTM", batch_major, 3, direction="bidirectional", layout=1) == [
        "f32[N, S, 2, 16]", "f32[N, 2, 16]", "f32[N, 2, 16]"]


def test_hidden_size_comes_from_r_when_the_attribute_is_absent():
    types = {"x": tensor(F32, "S", "N", 4), "w": tensor(F32, 1, 9, 4), "r": tensor(F32, 1, 9, 3)}
    assert _types("GRU", types) == ["f32[S, 1, N, 3]", "f32[1, N, 3]"]


def test_weights_that_do_not_fit_the_input_are_an_error():
    types = {"x": tensor(F32, "S", "N", 5), "w": tensor(F32, 1, 4, 4), "r": tensor(F32, 1, 4, 4)}
    with pytest.raises(ShapeError, match="'cell'.*input size"):
        _types("RNN", types, hidden_size=4)
    types["x"] = tensor(F32, "S", "N", 4)
    with pytest.raises(ShapeError, match="'cell'.*number of directions"):
        _types("RNN", types, hidden_size=4, direction="bidirectional")
    with pytest.raises(ShapeError, match="'cell'.*direction must be one of"):
        _types("RNN", types, hidden_size=4, direction="backward")


# ----------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_bidirectional_with_sequence_lens_matches_the_oracle(op):
    seq, batch, size, hidden = 4, 3, 2, 3
    values = {"x": RNG.normal(size=(seq, batch, size)).astype(np.float32),
              **_weights(op, 2, hidden, size),
              "sequence_lens": np.array([4, 1, 3], np.int32),
              "initial_h": RNG.normal(size=(2, batch, hidden)).astype(np.float32)}
    if op == "LSTM":
        values["initial_c"] = RNG.normal(size=(2, batch, hidden)).astype(np.float32)
    outputs = _run(op, values, 3 if op == "LSTM" else 2, direction="bidirectional",
                   hidden_size=hidden)
    for d in range(2):
        y, h, c = _oracle(op, values["x"], values["w"][d], values["r"][d], values["b"][d],
                          values["initial_h"][d], values.get("initial_c", [None, None])[d],
                          lengths=values["sequence_lens"], reverse=d == 1)
        np.testing.assert_allclose(outputs[0][:, d], y, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(outputs[1][d], h, rtol=1e-5, atol=1e-6)
        if op == "LSTM":
            np.testing.assert_allclose(outputs[2][d], c, rtol=1e-5, atol=1e-6)
    assert not outputs[0][1:, :, 1].any()  # past an entry's length, Y is zero


def test_gru_linear_before_reset_in_batch_major_layout():
    values = {"x": RNG.normal(size=(2, 5, 3)).astype(np.float32), **_weights("GRU", 1, 4, 3)}
    y, h = _run("GRU", values, linear_before_reset=1, layout=1)
    y_ref, h_ref, _ = _oracle("GRU", values["x"].transpose(1, 0, 2), values["w"][0],
                              values["r"][0], values["b"][0], np.zeros((2, 4), np.float32),
                              linear_before_reset=True)
    np.testing.assert_allclose(y[:, :, 0], y_ref.transpose(1, 0, 2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h[:, 0], h_ref, rtol=1e-5, atol=1e-6)


def test_lstm_peepholes_match_the_oracle():
    values = {"x": RNG.normal(size=(3, 2, 2)).astype(np.float32), **_weights("LSTM", 1, 3, 2),
              "p": RNG.normal(size=(1, 9)).astype(np.float32)}
    _, h, c = _run("LSTM", values, 3)
    _, h_ref, c_ref = _oracle("LSTM", values["x"], values["w"][0], values["r"][0],
                              values["b"][0], np.zeros((2, 3), np.float32),
                              np.zeros((2, 3), np.float32), p=values["p"][0])
    np.testing.assert_allclose(h[0], h_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c[0], c_ref, rtol=1e-5, atol=1e-6)


def test_lstm_input_forget_couples_the_gates():
    values = {"x": RNG.normal(size=(1, 1, 2)).astype(np.float32), **_weights("LSTM", 1, 2, 2),
              "initial_c": np.full((1, 1, 2), 3.0, np.float32)}
    values["b"][:] = 0
    _, _, c = _run("LSTM", values, 3, input_forget=1)
    gi, _, _, gc = np.split(values["x"][0, 0] @ values["w"][0].T, 4)
    i = _sigmoid(gi)
    np.testing.assert_allclose(c[0, 0], (1 - i) * 3.0 + i * np.tanh(gc), rtol=1e-5)


def test_activation_parameters_are_consumed_in_order_and_clip_bounds_gate_inputs():
    values = {"x": RNG.normal(size=(3, 2, 2)).astype(np.float32) * 4,
              **_weights("RNN", 1, 3, 2)}
    _, h = _run("RNN", values, activations=["ScaledTanh"], activation_alpha=[0.5],
                activation_beta=[2.0], clip=0.25)
    _, h_ref, _ = _oracle("RNN", values["x"], values["w"][0], values["r"][0], values["b"][0],
                          np.zeros((2, 3), np.float32),
                          g=lambda v: 0.5 * np.tanh(2.0 * np.clip(v, -0.25, 0.25)))
    np.testing.assert_allclose(h[0], h_ref, rtol=1e-5, atol=1e-6)


def test_float16_input_gives_float16_outputs():
    values = {k: v.astype(np.float16) for k, v in
              {"x": RNG.normal(size=(2, 1, 2)), **_weights("GRU", 1, 2, 2)}.items()}
    y, h = _run("GRU", values)
    assert y.dtype == np.float16 and h.dtype == np.float16


def test_unknown_activation_and_bad_sequence_lens_are_errors():
    values = {"x": RNG.normal(size=(2, 1, 2)).astype(np.float32), **_weights("RNN", 1, 2, 2)}
    with pytest.raises(EmberError, match="'cell'.*unknown activation 'Swish'"):
        _run("RNN", values, activations=["Swish"])
    values["sequence_lens"] = np.array([3], np.int32)
    with pytest.raises(EmberError, match="'cell'.*sequence_lens"):
        _run("RNN", values)
