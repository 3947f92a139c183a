"""RNN, GRU and LSTM layers written out as their time steps (ember/passes/unroll_recurrent.py).

Oracles: ONNX Runtime's own RNN/GRU/LSTM kernels, and ember's reference of the op (what the
layer ran as before: at opt level 0 every node keeps its reference) for the attributes ONNX
Runtime does not take (layout 1).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.ir.graph import Graph
from ember.passes.unroll_recurrent import MAX_UNROLLED_STEPS, unroll_recurrent

RNG = np.random.default_rng(7)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _layer(op: str, steps: int, batch: int, size: int, hidden: int, *, direction="forward",
           layout=0, initial=False, peepholes=False, attrs=None, weights_as_inputs=False):
    """A model of one recurrent layer with constant weights; returns (model, feeds)."""
    dirs = 2 if direction == "bidirectional" else 1
    gates = GATES[op]
    w = (RNG.standard_normal((dirs, gates * hidden, size)) * 0.4).astype(np.float32)
    r = (RNG.standard_normal((dirs, gates * hidden, hidden)) * 0.4).astype(np.float32)
    b = (RNG.standard_normal((dirs, 2 * gates * hidden)) * 0.2).astype(np.float32)
    x_shape = [steps, batch, size] if layout == 0 else [batch, steps, size]
    state_shape = [dirs, batch, hidden] if layout == 0 else [batch, dirs, hidden]
    feeds = {"x": RNG.standard_normal(x_shape).astype(np.float32)}
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    initializers = [numpy_helper.from_array(a, n) for n, a in (("w", w), ("r", r), ("b", b))]
    names = ["x", "w", "r", "b", ""]
    state_names = ["h0", "c0"] if op == "LSTM" else ["h0"]
    for name in state_names:
        if initial:
            feeds[name] = RNG.standard_normal(state_shape).astype(np.float32)
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, state_shape))
            names.append(name)
        else:
            names.append("")
    if peepholes:
        p = (RNG.standard_normal((dirs, 3 * hidden)) * 0.3).astype(np.float32)
        initializers.append(numpy_helper.from_array(p, "p"))
        names.append("p")
    while names and not names[-1]:
        names.pop()
    outputs = ["y", "y_h"] + (["y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outputs, hidden_size=hidden, direction=direction,
                            **({"layout": layout} if layout else {}), **(attrs or {}))
    graph = helper.make_graph(
        [node], "rnn", inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model, feeds


def _unrolled(model: onnx.ModelProto) -> ember.Module:
    module = ember.compile(model)
    ops = {n.op for n in module.build.graph.nodes}
    assert not ops & set(GATES), f"the layer was not written out: {sorted(ops)}"
    assert all(impl.kind == "kernel" for impl in module.build.impls)
    return module


def _check(module: ember.Module, feeds: dict, expected: list[np.ndarray]) -> None:
    got = module.run(feeds)
    for name, want in zip(("y", "y_h", "y_c"), expected):
        np.testing.assert_allclose(got[name], want, rtol=2e-5, atol=2e-5, err_msg=name)


CASES = [
    ("RNN", "forward", {}),
    ("RNN", "bidirectional", {"activations": ["Relu", "Tanh"]}),
    ("GRU", "forward", {}),
    ("GRU", "reverse", {"linear_before_reset": 1}),
    ("GRU", "bidirectional", {"linear_before_reset": 0}),
    ("LSTM", "forward", {}),
    ("LSTM", "reverse", {"clip": 0.8}),
    ("LSTM", "bidirectional", {}),
]


@pytest.mark.parametrize("op,direction,attrs", CASES)
@pytest.mark.parametrize("initial", [False, True])
def test_unrolled_layer_matches_onnxruntime(op, direction, attrs, initial):
    model, feeds = _layer(op, steps=5, batch=3, size=6, hidden=4, direction=direction,
                          initial=initial, attrs=attrs)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    _check(_unrolled(model), feeds, session.run(None, feeds))


@pytest.mark.parametrize("op,attrs,peepholes", [
    ("LSTM", {"input_forget": 1}, False),
    ("LSTM", {}, True),
    ("LSTM", {"activations": ["HardSigmoid", "Softsign", "ScaledTanh", "HardSigmoid",
                              "Softsign", "ScaledTanh"],
              "activation_alpha": [0.3, 0.7], "activation_beta": [0.4, 1.2, 0.8]}, False),
    ("GRU", {"activations": ["LeakyRelu", "Affine", "Sigmoid", "Elu"],
             "activation_alpha": [0.05, 0.5, 1.1], "activation_beta": [0.25]}, False),
    ("RNN", {"activations": ["Softplus"], "clip": 1.5}, False),
])
@pytest.mark.parametrize("layout", [0, 1])
def test_unrolled_layer_matches_the_reference(op, attrs, peepholes, layout):
    """Attributes ONNX Runtime does not take (layout 1, several gate functions): against the
    op's reference, which the layer runs at opt level 0."""
    direction = "bidirectional" if "activation_alpha" in attrs and op != "RNN" else "forward"
    model, feeds = _layer(op, steps=4, batch=2, size=5, hidden=3, direction=direction,
                          layout=layout, initial=True, peepholes=peepholes, attrs=attrs)
    reference = ember.compile(model, opt_level=0).run(feeds)
    assert any(impl.kind == "host" for impl in
               ember.compile(model, opt_level=0).build.impls)
    _check(_unrolled(model), feeds, [reference[n] for n in ("y", "y_h", "y_c")
                                     if n in reference])


def test_the_steps_share_their_kernels():
    """Every step is the same code on other buffers: the library defines far fewer kernel
    functions than the layer has steps."""
    model, feeds = _layer("LSTM", steps=24, batch=2, size=8, hidden=16)
    module = _unrolled(model)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    _check(module, feeds, session.run(None, feeds))
    steps = len(module.build.impls)
    definitions = module.build.source.count("EMBER_INTERNAL void ember_k_")
    assert steps > 48 and definitions < steps // 4


def test_an_lstm_step_is_a_product_and_one_pass_over_its_states():
    """The new cell state is read by the next step and by the new hidden state: the two are
    one kernel (``fuse.py``'s siblings), so a step is its product and one pointwise pass."""
    steps = 12
    model, feeds = _layer("LSTM", steps=steps, batch=3, size=8, hidden=16)
    module = _unrolled(model)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    _check(module, feeds, session.run(None, feeds))
    cells = [impl for impl in module.build.kernels
             if {"Sigmoid", "Tanh"} <= {n.op for n in impl.group.nodes}]
    assert len(cells) == steps
    assert all([n.op for n in impl.group.nodes].count("Tanh") == 2 for impl in cells)
    # + the input projection, its reshape and split, the outputs' concat and unsqueezes
    assert len(module.build.kernels) <= 2 * steps + 6


def _graph_with(model: onnx.ModelProto) -> Graph:
    from ember.frontend.onnx.importer import import_onnx

    return import_onnx(model)


def test_layers_it_cannot_write_out_keep_their_reference():
    """Weights that are inputs, a sequence_lens input and too many steps leave the node as it
    is (it runs its reference)."""
    model, _ = _layer("GRU", steps=3, batch=2, size=4, hidden=3)
    runtime_weights = onnx.ModelProto()
    runtime_weights.CopyFrom(model)
    del runtime_weights.graph.initializer[:]
    for name, value in (("w", None), ("r", None), ("b", None)):
        source = {i.name: i for i in model.graph.initializer}[name]
        runtime_weights.graph.input.append(helper.make_tensor_value_info(
            name, TensorProto.FLOAT, list(source.dims)))
    graph = _graph_with(runtime_weights)
    assert unroll_recurrent(graph) == 0

    with_lengths = onnx.ModelProto()
    with_lengths.CopyFrom(model)
    node = with_lengths.graph.node[0]
    node.input[4:] = ["lengths"]
    with_lengths.graph.input.append(helper.make_tensor_value_info("lengths", TensorProto.INT32,
                                                                  [2]))
    assert unroll_recurrent(_graph_with(with_lengths)) == 0

    long_model, _ = _layer("RNN", steps=MAX_UNROLLED_STEPS + 1, batch=1, size=2, hidden=2)
    assert unroll_recurrent(_graph_with(long_model)) == 0
    assert unroll_recurrent(_graph_with(model)) == 1


def test_a_pytorch_lstm_stack_compiles_without_host_steps():
    """Two stacked LSTM layers as the TorchScript exporter writes them (initial states from
    Expand, Squeeze between the layers) against PyTorch eager."""
    torch = pytest.importorskip("torch")
    import io

    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.LSTM(12, 16, num_layers=2)
            self.head = torch.nn.Linear(16, 3)

        def forward(self, x):
            y, _ = self.rnn(x)
            return self.head(y[-1])

    net = Net().eval()
    x = torch.randn(9, 2, 12)
    buffer = io.BytesIO()
    torch.onnx.export(net, (x,), buffer, dynamo=False, input_names=["x"])
    module = ember.compile(onnx.load_from_string(buffer.getvalue()))
    assert all(impl.kind == "kernel" for impl in module.build.impls)
    with torch.no_grad():
        want = net(x).numpy()
    np.testing.assert_allclose(module(x.numpy()), want, rtol=1e-4, atol=1e-5)
