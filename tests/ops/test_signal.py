"""Signal ops (DFT, STFT, windows, MelWeightMatrix) and, at the end, the attention ops
(Attention, RotaryEmbedding, LinearAttention), which have no test module of their own yet:
symbolic shape inference, numbers against numpy, errors, and the DFT-17 upgrade."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from op_helpers import node_graph, node_types, run_named

from ember.core.dtypes import DType
from ember.core.errors import EmberError, ShapeError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ir.types import tensor

F32, I64 = DType.FLOAT32, DType.INT64
RNG = np.random.default_rng(0)


def _complex(x: np.ndarray) -> np.ndarray:
    """An ONNX (..., 2) complex tensor as numpy complex values."""
    return x[..., 0] + 1j * x[..., 1]


def _scalar(value: int) -> np.ndarray:
    return np.array(value, dtype=np.int64)


# ----------------------------------------------------------------------------- shape inference


def test_dft_shapes_follow_length_axis_and_mode():
    assert node_types("DFT", {"x": tensor(F32, "N", 16, 1)}, onesided=1) == ["f32[N, 9, 2]"]
    assert node_types("DFT", {"x": tensor(F32, "N", 16, 1), "n": _scalar(10)}) == ["f32[N, 10, 2]"]
    # IRFFT's default length 2 * (bins - 1) stays symbolic.
    assert node_types("DFT", {"x": tensor(F32, "N", "S", 2), "n": None, "axis": _scalar(1)},
                      inverse=1, onesided=1) == ["f32[N, 2*S - 2, 1]"]
    # floor(S / 2) + 1 of an arbitrary S is not a polynomial: unknown rather than a guess.
    assert node_types("DFT", {"x": tensor(F32, "N", "S", 1)}, onesided=1) == ["f32[N, ?, 2]"]
    # A run-time axis could transform any signal axis.
    assert node_types("DFT", {"x": tensor(F32, "N", 16, 2), "n": None, "axis": tensor(I64)}) == \
        ["f32[?, ?, 2]"]


def test_stft_window_and_mel_shapes():
    signal = tensor(F32, "N", 128, 1)
    assert node_types("STFT", {"s": signal, "step": _scalar(8), "w": None,
                               "length": _scalar(16)}) == ["f32[N, 15, 9, 2]"]
    assert node_types("STFT", {"s": tensor(F32, "N", "L", 1), "step": _scalar(1),
                               "w": tensor(F32, 16)}, onesided=0) == ["f32[N, L - 15, 16, 2]"]
    assert node_types("HannWindow", {"size": _scalar(10)}, output_datatype=11) == ["f64[10]"]
    assert node_types("BlackmanWindow", {"size": tensor(I64)}) == ["f32[?]"]
    mel = {"bins": _scalar(8), "n": _scalar(64), "rate": _scalar(16000),
           "low": np.array(0, np.float32), "high": np.array(8000, np.float32)}
    assert node_types("MelWeightMatrix", mel) == ["f32[33, 8]"]


@pytest.mark.parametrize("op, inputs, attrs, message", [
    ("DFT", {"x": tensor(F32, 2, 8, 2), "n": None, "axis": _scalar(-1)}, {}, "axis -1"),
    ("DFT", {"x": tensor(F32, 2, 8, 2)}, {"onesided": 1}, "needs a real input"),
    ("DFT", {"x": tensor(F32, 2, 8, 3)}, {}, "last dimension of 1 or 2"),
    ("STFT", {"s": tensor(F32, 2, 64, 1), "step": _scalar(4), "w": tensor(F32, 4, 4)}, {},
     "window must be 1-D"),
    ("HannWindow", {"size": _scalar(4)}, {"output_datatype": TensorProto.STRING},
     "output_datatype 8"),
])
def test_inconsistent_inputs_are_shape_errors(op, inputs, attrs, message):
    with pytest.raises(ShapeError, match=message):
        node_graph(op, inputs, **attrs)


# ----------------------------------------------------------------------------- numbers


def test_dft_forward_inverse_and_one_sided_match_numpy_fft():
    x = RNG.standard_normal((3, 10, 2))
    np.testing.assert_allclose(_complex(run_named("DFT", {"x": x})),
                               np.fft.fft(_complex(x), axis=1))
    np.testing.assert_allclose(_complex(run_named("DFT", {"x": x}, inverse=1)),
                               np.fft.ifft(_complex(x), axis=1))
    real = x[..., :1]
    spectrum = run_named("DFT", {"x": real, "n": _scalar(12), "axis": _scalar(0)}, onesided=1)
    np.testing.assert_allclose(_complex(spectrum), np.fft.rfft(real[..., 0], n=12, axis=0))
    signal = run_named("DFT", {"x": spectrum, "n": _scalar(12), "axis": _scalar(0)}, inverse=1,
                       onesided=1)
    np.testing.assert_allclose(signal, np.pad(real, [(0, 9), (0, 0), (0, 0)]), atol=1e-12)


def test_stft_is_the_dft_of_windowed_frames():
    signal = RNG.standard_normal((2, 40, 1))
    window = run_named("HannWindow", {"size": _scalar(8)}, output_datatype=TensorProto.DOUBLE)
    out = run_named("STFT", {"s": signal, "step": _scalar(5), "w": window})
    frames = np.stack([signal[:, i:i + 8, 0] for i in range(0, 33, 5)], axis=1)
    np.testing.assert_allclose(_complex(out), np.fft.rfft(frames * window, axis=-1))


def test_windows_match_their_cosine_sums():
    n = np.arange(7)
    for op, expected in [
        ("HannWindow", 0.5 - 0.5 * np.cos(2 * np.pi * n / 7)),
        ("HammingWindow", 25 / 46 - 21 / 46 * np.cos(2 * np.pi * n / 7)),
        ("BlackmanWindow", np.blackman(8)[:7]),
    ]:
        got = run_named(op, {"size": _scalar(7)}, output_datatype=TensorProto.DOUBLE)
        np.testing.assert_allclose(got, expected, atol=1e-12, err_msg=op)
    symmetric = run_named("BlackmanWindow", {"size": _scalar(7)}, periodic=0)
    np.testing.assert_allclose(symmetric, np.blackman(7), atol=1e-6)


def test_mel_filters_are_triangles_peaking_at_one():
    weights = run_named("MelWeightMatrix", {"bins": _scalar(6), "n": _scalar(64),
                                            "rate": _scalar(8000), "low": np.array(100, np.float32),
                                            "high": np.array(4000, np.float32)})
    assert weights.shape == (33, 6) and weights.dtype == np.float32
    assert np.allclose(weights.max(axis=0), 1.0)
    peaks = weights.argmax(axis=0)
    assert np.all(np.diff(peaks) > 0)  # band centres rise with the band index


def test_dft_17_axis_attribute_defaults_to_1():
    x = RNG.standard_normal((2, 6, 3, 1)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("DFT", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_empty_tensor_value_info("y")])
    model = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert str(model.types["y"]) == "f32[2, 6, 3, 2]"
    y = ReferenceExecutor(model).run({"x": x})["y"]
    np.testing.assert_allclose(_complex(y), np.fft.fft(x[..., 0], axis=1), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- attention


def _sdpa(q, k, v, bias=0.0):
    """Plain scaled dot-product attention over (batch, heads, sequence, size) arrays."""
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]) + bias
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def test_attention_shapes_with_heads_cache_and_symbols():
    inputs = {"q": tensor(F32, "B", "S", 64), "k": tensor(F32, "B", "T", 32),
              "v": tensor(F32, "B", "T", 48), "mask": None,
              "past_k": tensor(F32, "B", 4, "P", 8), "past_v": tensor(F32, "B", 4, "P", 12)}
    assert node_types("Attention", inputs, 4, q_num_heads=8, kv_num_heads=4) == \
        ["f32[B, S, 96]", "f32[B, 4, P + T, 8]", "f32[B, 4, P + T, 12]", "f32[B, 8, S, P + T]"]
    four_d = {"q": tensor(F32, "B", 8, "S", 16), "k": tensor(F32, "B", 2, "T", 16),
              "v": tensor(F32, "B", 2, "T", 32)}
    assert node_types("Attention", four_d) == ["f32[B, 8, S, 32]"]
    assert node_types("RotaryEmbedding", {"x": tensor(F32, "B", "S", 64), "cos": tensor(F32, 99, 4),
                                          "sin": tensor(F32, 99, 4)}, num_heads=8) == \
        ["f32[B, S, 64]"]
    linear = {"q": tensor(F32, "B", "T", 64), "k": tensor(F32, "B", "T", 32),
              "v": tensor(F32, "B", "T", 48)}
    assert node_types("LinearAttention", linear, 2, q_num_heads=8, kv_num_heads=4,
                      update_rule="linear") == ["f32[B, T, 96]", "f32[B, 4, 8, 12]"]


@pytest.mark.parametrize("inputs, attrs, message", [
    ({"q": tensor(F32, 1, 4, 24), "k": tensor(F32, 1, 4, 24), "v": tensor(F32, 1, 4, 24)}, {},
     "need the attributes q_num_heads"),
    ({"q": tensor(F32, 1, 6, 4, 8), "k": tensor(F32, 1, 4, 4, 8), "v": tensor(F32, 1, 4, 4, 8)},
     {}, "multiple of"),
    ({"q": tensor(F32, 1, 2, 4, 8), "k": tensor(F32, 1, 2, 4, 6), "v": tensor(F32, 1, 2, 4, 8)},
     {}, "head sizes of Q and K disagree"),
    ({"q": tensor(F32, 1, 4, 24), "k": tensor(F32, 1, 4, 24), "v": tensor(F32, 1, 4, 24)},
     {"q_num_heads": 5, "kv_num_heads": 3}, "not a multiple of its 5 heads"),
])
def test_inconsistent_attention_inputs_are_shape_errors(inputs, attrs, message):
    with pytest.raises(ShapeError, match=message):
        node_graph("Attention", inputs, **attrs)


def test_attention_matches_plain_numpy_with_causal_mask_and_grouped_heads():
    q = RNG.standard_normal((2, 4, 3, 8))
    k, v = RNG.standard_normal((2, 2, 5, 8)), RNG.standard_normal((2, 2, 5, 6))
    k_full, v_full = k.repeat(2, axis=1), v.repeat(2, axis=1)
    np.testing.assert_allclose(run_named("Attention", {"q": q, "k": k, "v": v}),
                               _sdpa(q, k_full, v_full))
    # Causal with 5 keys and 3 queries is bottom-right aligned only with a cache; without
    # one query i sees keys 0..i.
    causal = np.where(np.tril(np.ones((3, 5), bool)), 0.0, -np.inf)
    np.testing.assert_allclose(run_named("Attention", {"q": q, "k": k, "v": v}, is_causal=1),
                               _sdpa(q, k_full, v_full, causal))
    # A past cache shifts the frontier: query i sees the 2 cached keys and new keys 0..i.
    past_k, past_v = k[:, :, :2], v[:, :, :2]
    y, present_k, _ = run_named("Attention", {"q": q, "k": k[:, :, 2:], "v": v[:, :, 2:],
                                              "mask": None, "pk": past_k, "pv": past_v},
                                outputs=3, is_causal=1)
    np.testing.assert_array_equal(present_k, k)
    shifted = np.where(np.tril(np.ones((3, 5), bool), k=2), 0.0, -np.inf)
    np.testing.assert_allclose(y, _sdpa(q, k_full, v_full, shifted))


def test_attention_fully_masked_rows_are_zero():
    q, k, v = (RNG.standard_normal((1, 1, 2, 4)).astype(np.float32) for _ in range(3))
    mask = np.array([[True, True], [False, False]])
    y = run_named("Attention", {"q": q, "k": k, "v": v, "mask": mask})
    assert np.all(y[0, 0, 1] == 0) and np.all(np.isfinite(y))


def test_rotary_embedding_rotates_complex_pairs():
    x = RNG.standard_normal((1, 2, 3, 8)).astype(np.float32)  # (batch, heads, sequence, size)
    angles = RNG.uniform(0, np.pi, (3, 4))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    y = run_named("RotaryEmbedding", {"x": x, "cos": cos[None], "sin": sin[None]}, interleaved=1)
    pairs = x[..., 0::2] + 1j * x[..., 1::2]
    rotated = pairs * np.exp(1j * angles)[None, None]
    np.testing.assert_allclose(y[..., 0::2] + 1j * y[..., 1::2], rotated, atol=1e-5)


def test_linear_attention_linear_rule_is_causal_unnormalized_attention():
    q, k, v = (RNG.standard_normal((1, 5, 8)).astype(np.float32) for _ in range(3))
    out, state = run_named("LinearAttention", {"q": q, "k": k, "v": v}, outputs=2, q_num_heads=2,
                           kv_num_heads=2, update_rule="linear")
    q4, k4, v4 = (a.reshape(1, 5, 2, 4).transpose(0, 2, 1, 3) for a in (q, k, v))
    scores = np.tril(q4 @ np.swapaxes(k4, -1, -2)) / 2.0  # scale 1/sqrt(4)
    expected = (scores @ v4).transpose(0, 2, 1, 3).reshape(1, 5, 8)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state, np.swapaxes(k4, -1, -2) @ v4, rtol=1e-5, atol=1e-5)


def test_linear_attention_rule_inputs_are_checked():
    q = np.zeros((1, 2, 4), np.float32)
    with pytest.raises(EmberError, match="needs decay input"):
        run_named("LinearAttention", {"q": q, "k": q, "v": q}, outputs=2, q_num_heads=1,
                  kv_num_heads=1, update_rule="gated")
