"""Recurrent layers through the AOT route (``ember.compile(module, inputs)``).

``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` reach ember as one ``aten.lstm``/``gru``/``rnn_*`` call
each, and become one ember node per layer (``frontend/torch/convert_rnn.py``) instead of core
ATen's time steps, which copied the weights per step.  Oracle: torch eager, on layers of
every flavour (layers, directions, batch-first, without biases, given initial states), and
the saved artifact run by the bare runtime.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import ember
import ember.runtime

RTOL, ATOL = 1e-4, 1e-5


class _Wrapped(nn.Module):
    """A recurrent layer with every output returned, optionally given initial states."""

    def __init__(self, layer: nn.Module, with_states: bool) -> None:
        super().__init__()
        self.layer, self.with_states = layer, with_states

    def forward(self, x, *states):
        if not self.with_states:
            output, final = self.layer(x)
        else:
            output, final = self.layer(x, states if len(states) > 1 else states[0])
        finals = final if isinstance(final, tuple) else (final,)
        return (output, *finals)


CASES = {
    "lstm-2-layers": (nn.LSTM, dict(num_layers=2)),
    "lstm-bidirectional-batch-first": (nn.LSTM, dict(bidirectional=True, batch_first=True)),
    "lstm-no-bias": (nn.LSTM, dict(bias=False, num_layers=2)),
    "gru-bidirectional-2-layers": (nn.GRU, dict(num_layers=2, bidirectional=True)),
    "gru-batch-first": (nn.GRU, dict(batch_first=True)),
    "rnn-tanh": (nn.RNN, dict(num_layers=2)),
    "rnn-relu-bidirectional": (nn.RNN, dict(nonlinearity="relu", bidirectional=True)),
}


def _layer_and_inputs(case: str, with_states: bool, seed: int = 0):
    kind, options = CASES[case]
    torch.manual_seed(seed)
    layer = kind(12, 16, **options)
    steps, batch = 7, 3
    x = torch.randn((batch, steps, 12) if options.get("batch_first") else (steps, batch, 12))
    inputs = [x]
    if with_states:
        layers = options.get("num_layers", 1) * (2 if options.get("bidirectional") else 1)
        count = 2 if kind is nn.LSTM else 1
        inputs += [torch.randn(layers, batch, 16) for _ in range(count)]
    return _Wrapped(layer, with_states).eval(), tuple(inputs)


@pytest.mark.parametrize("with_states", [False, True], ids=["zero-states", "given-states"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_recurrent_layer_is_one_node_per_layer_and_matches_eager(case, with_states, tmp_path):
    model, inputs = _layer_and_inputs(case, with_states)
    module = ember.compile(model, inputs)
    kind = CASES[case][0].__name__
    layers = CASES[case][1].get("num_layers", 1)
    imported = [node.op for node in module.graph.nodes if node.op in ("LSTM", "GRU", "RNN")]
    assert imported == [kind] * layers
    assert not module.build.host_nodes  # written out by unroll_recurrent, every kernel compiled
    with torch.no_grad():
        expected = [t.numpy() for t in model(*inputs)]
    arrays = [t.numpy() for t in inputs]
    outputs = module(*arrays)
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    runtime = ember.runtime.load(module.save(tmp_path / "rnn.ember"))
    for got, want in zip(runtime(*arrays), expected):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_each_weight_is_stored_once():
    # Decomposed to core ATen, a 2-layer LSTM over 24 steps became ~780 nodes with the input
    # weights broadcast over time: 3.9 MB of weights for 0.93 MB of parameters.
    torch.manual_seed(1)
    model = nn.LSTM(64, 128, num_layers=2).eval()
    x = torch.randn(24, 2, 64)
    module = ember.compile(model, (x,))
    parameters = sum(p.numel() * 4 for p in model.parameters())
    assert sum(a.nbytes for a in module.build.weights.values()) <= parameters
    with torch.no_grad():
        expected = model(x)[0].numpy()
    np.testing.assert_allclose(module(x.numpy())[0], expected, rtol=RTOL, atol=ATOL)


def test_a_projected_lstm_is_decomposed_and_still_correct():
    # proj_size has no ONNX counterpart: the layer takes core ATen's decomposition instead.
    torch.manual_seed(2)
    model = nn.LSTM(8, 16, proj_size=4).eval()
    x = torch.randn(5, 2, 8)
    module = ember.compile(model, (x,))
    assert not any(node.op == "LSTM" for node in module.graph.nodes)
    with torch.no_grad():
        expected = [t.numpy() for t in (model(x)[0], *model(x)[1])]
    for got, want in zip(module(x.numpy()), expected):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


class _Sequence(nn.Module):
    """The output sequence only."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(12, 16, num_layers=2, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]


def test_a_dynamic_batch_keeps_the_layer_whole_and_runs_in_blocks():
    # The steps are static, the batch is not: the layer stays one node, and every batch size
    # runs on the first build and a batch-1 block.
    torch.manual_seed(3)
    model = _Sequence().eval()
    batch = torch.export.Dim("batch", max=32)
    module = ember.compile(model, (torch.randn(2, 7, 12),), dynamic_shapes=({0: batch},))
    assert [node.op for node in module.graph.nodes if node.op == "GRU"] == ["GRU", "GRU"]
    assert module.batch_split is not None, module.batch_split_reason
    for size in (2, 5, 3, 1):
        x = torch.randn(size, 7, 12)
        with torch.no_grad():
            expected = model(x).numpy()
        np.testing.assert_allclose(module(x.numpy()), expected, rtol=RTOL, atol=ATOL)
    assert len(module.build_reasons) <= 2, module.build_reasons


@pytest.mark.parametrize("batch_first", [False, True])
def test_torch_compile_with_allow_rnn_compiles_the_lstm(batch_first):
    # With Dynamo's allow_rnn, AOT autograd hands over one aten.mkldnn_rnn_layer per layer
    # and direction: each becomes an ember LSTM, nothing runs in PyTorch.
    import torch._dynamo

    from ember.torch_backend import explain

    torch.manual_seed(4)
    model = _Wrapped(nn.LSTM(8, 16, num_layers=2, bidirectional=True,
                             batch_first=batch_first), False).eval()
    x = torch.randn(3, 5, 8)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):
        report = explain(model, x)
        assert report.graph_count == 1 and not report.fallbacks, str(report)
        assert report.compiled_flop_share == 1.0
        with torch.no_grad():
            outputs, expected = report.compiled(x), model(x)
    torch._dynamo.reset()
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=ATOL)


def test_final_states_with_the_batch_second_run_in_blocks_and_save(tmp_path):
    # h_n and c_n are [layers * directions, batch, hidden]: their blocks are joined along
    # axis 1, in the module and in the saved artifact alike.
    import ember.runtime

    torch.manual_seed(5)
    model = _Wrapped(nn.LSTM(6, 8, num_layers=2, bidirectional=True, batch_first=True),
                     False).eval()
    batch = torch.export.Dim("batch", max=32)
    module = ember.compile(model, (torch.randn(4, 5, 6),), dynamic_shapes=({0: batch},))
    module(torch.randn(4, 5, 6).numpy())
    assert module.batch_split is not None, module.batch_split_reason
    assert dict(module.batch_split.output_axes) == {name: 1 for name in
                                                    module.graph.outputs[1:]}
    saved = ember.runtime.load(module.save(tmp_path / "lstm.ember"))
    for size in (4, 7, 1):
        x = torch.randn(size, 5, 6)
        with torch.no_grad():
            expected = [t.numpy() for t in model(x)]
        for got in (module(x.numpy()), saved(x.numpy())):
            assert [g.shape for g in got] == [e.shape for e in expected]
            for g, e in zip(got, expected):
                np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL)
    # caller-given output arrays take the joined states too
    x = torch.randn(6, 5, 6)
    with torch.no_grad():
        expected = [t.numpy() for t in model(x)]
    given = [np.empty(e.shape, e.dtype) for e in expected]
    saved(x.numpy(), out=given)
    for g, e in zip(given, expected):
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL)
