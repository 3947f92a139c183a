"""Benchmark models built directly with ``onnx.helper`` (no torch, no downloads).

The benchmarks need the graphs real exporters produce (a torchvision-style ResNet-18 with its
BatchNormalization nodes, a Hugging Face-style BERT encoder with Erf-based GELU and an additive
attention mask) but must run on a machine without PyTorch or network access. So each builder
spells out the exported topology node by node and fills it with deterministic random weights:
the same seed gives the same bytes, so timings and max-|diff| figures are comparable between
runs and between engineers.

All models use opset 17 (the first with LayerNormalization; Gelu only arrives in opset 20, which
is why BERT uses the Erf form exporters emitted for years) and have fully static input shapes,
so ``ember.compile`` builds them at once without ``input_shapes``.

    from benchmarks.models import mlp, resnet18, bert, bert_base
    model = resnet18(batch=1, image=224)       # onnx.ModelProto, already checked
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# IR version 8 is the one paired with opset 17 and the newest every ONNX Runtime accepts.
IR_VERSION = 8

__all__ = ["OPSET", "mlp", "resnet18", "bert", "bert_base", "example_inputs"]


# ----------------------------------------------------------------------------- graph builder


@dataclass
class _Builder:
    """Collects nodes and initializers with unique names; keeps the builders below readable.

    Every weight comes from one ``numpy.random.Generator`` seeded by the caller, drawn in graph
    order, so a model is a pure function of its arguments.
    """

    seed: int
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[TensorProto] = field(default_factory=list)
    _counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def fresh(self, stem: str) -> str:
        """A name not used before, ``stem`` or ``stem_N``."""
        count = self._counts.get(stem, 0)
        self._counts[stem] = count + 1
        return stem if count == 0 else f"{stem}_{count}"

    def const(self, name: str, value: np.ndarray) -> str:
        """Add an initializer; returns its (unique) name."""
        unique = self.fresh(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), unique))
        return unique

    def normal(self, name: str, shape: Sequence[int], std: float, mean: float = 0.0) -> str:
        """A float32 initializer drawn from N(mean, std²)."""
        value = self.rng.normal(mean, std, size=tuple(shape)).astype(np.float32)
        return self.const(name, value)

    def uniform(self, name: str, shape: Sequence[int], low: float, high: float) -> str:
        """A float32 initializer drawn from U(low, high) (BatchNorm variances must be > 0)."""
        value = self.rng.uniform(low, high, size=tuple(shape)).astype(np.float32)
        return self.const(name, value)

    def scalar(self, name: str, value: float) -> str:
        """A float32 scalar initializer, as exporters emit for constants like sqrt(d)."""
        return self.const(name, np.array(value, dtype=np.float32))

    def ints(self, name: str, values: Sequence[int]) -> str:
        """An int64 1-D initializer (shapes, axes, indices)."""
        return self.const(name, np.asarray(values, dtype=np.int64))

    def op(self, op_type: str, inputs: Sequence[str], stem: str | None = None,
           outputs: int = 1, **attrs: object) -> str | list[str]:
        """Append a node; returns its output name (or names when ``outputs`` > 1)."""
        base = self.fresh(stem or op_type.lower())
        names = [base] if outputs == 1 else [f"{base}_out{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=f"{base}_node",
                                           **attrs))
        return names[0] if outputs == 1 else names

    def model(self, name: str, inputs: list[onnx.ValueInfoProto],
              outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        """Wrap the collected graph as an opset-17 model and validate it with the checker."""
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        model = helper.make_model(graph, producer_name="ember-benchmarks",
                                  opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model, full_check=True)
        return model


def _f32(name: str, shape: Sequence[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _i64(name: str, shape: Sequence[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.INT64, list(shape))


# ----------------------------------------------------------------------------- MLP


def mlp(batch: int = 1, *, sizes: Sequence[int] = (784, 1024, 1024, 10), use_gemm: bool = False,
        seed: int = 0) -> onnx.ModelProto:
    """A multilayer perceptron (784-1024-1024-10 by default) with Relu between layers.

    ``use_gemm=False`` emits MatMul + Add per layer (what exporters write for ``nn.Linear`` on
    inputs with more than two dims, and a fusion test for the compiler); ``use_gemm=True``
    emits one Gemm(transB=1) per layer as torch exports a 2-D ``nn.Linear``. He-initialized
    weights keep activations O(1), so max-|diff| figures read as relative errors.
    """
    b = _Builder(seed)
    x = "input"
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        std = math.sqrt(2.0 / fan_in)
        bias = b.normal(f"fc{i}.bias", [fan_out], 0.01)
        if use_gemm:
            weight = b.normal(f"fc{i}.weight", [fan_out, fan_in], std)
            x = b.op("Gemm", [x, weight, bias], f"fc{i}", transB=1)
        else:
            weight = b.normal(f"fc{i}.weight", [fan_in, fan_out], std)
            x = b.op("Add", [b.op("MatMul", [x, weight], f"fc{i}_matmul"), bias], f"fc{i}")
        if i < len(sizes) - 2:
            x = b.op("Relu", [x], f"relu{i}")
    b.nodes[-1].output[0] = "logits"
    return b.model(f"mlp_{'-'.join(map(str, sizes))}_b{batch}",
                   [_f32("input", [batch, sizes[0]])], [_f32("logits", [batch, sizes[-1]])])


# ----------------------------------------------------------------------------- ResNet-18


def _conv_bn(b: _Builder, x: str, c_in: int, c_out: int, kernel: int, stride: int, stem: str,
             relu: bool, gamma_std: float = 0.1, gamma_mean: float = 1.0) -> str:
    """Conv (no bias) + BatchNormalization (+ Relu), as torch exports an eval-mode block.

    Exporters that keep BatchNormalization (the dynamo exporter, or ``do_constant_folding``
    off) write exactly this; folding BN into the conv is the compiler's job and part of what
    the benchmark measures. Running stats are random but plausible (var in [0.5, 1.5]).
    """
    weight = b.normal(f"{stem}.weight", [c_out, c_in, kernel, kernel],
                      math.sqrt(2.0 / (c_in * kernel * kernel)))
    pad = kernel // 2
    y = b.op("Conv", [x, weight], stem, kernel_shape=[kernel, kernel], strides=[stride, stride],
             pads=[pad, pad, pad, pad], dilations=[1, 1], group=1)
    scale = b.normal(f"{stem}.bn.weight", [c_out], gamma_std, gamma_mean)
    shift = b.normal(f"{stem}.bn.bias", [c_out], 0.05)
    mean = b.normal(f"{stem}.bn.running_mean", [c_out], 0.05)
    var = b.uniform(f"{stem}.bn.running_var", [c_out], 0.5, 1.5)
    y = b.op("BatchNormalization", [y, scale, shift, mean, var], f"{stem}_bn", epsilon=1e-5,
             momentum=0.9)
    return b.op("Relu", [y], f"{stem}_relu") if relu else y


def _basic_block(b: _Builder, x: str, c_in: int, c_out: int, stride: int, stem: str) -> str:
    """torchvision's BasicBlock: two 3x3 conv-BN, a 1x1/stride conv-BN shortcut on a change
    of shape, residual Add, Relu. The second BN's scale is small (like zero-init-residual
    training leaves it) so 8 residual additions don't inflate activations by 2^8."""
    y = _conv_bn(b, x, c_in, c_out, 3, stride, f"{stem}.conv1", relu=True)
    y = _conv_bn(b, y, c_out, c_out, 3, 1, f"{stem}.conv2", relu=False,
                 gamma_std=0.05, gamma_mean=0.3)
    shortcut = x
    if stride != 1 or c_in != c_out:
        shortcut = _conv_bn(b, x, c_in, c_out, 1, stride, f"{stem}.downsample", relu=False)
    return b.op("Relu", [b.op("Add", [y, shortcut], f"{stem}_add")], f"{stem}_relu")


def resnet18(batch: int = 1, image: int = 224, *, num_classes: int = 1000,
             seed: int = 0) -> onnx.ModelProto:
    """ResNet-18 (torchvision topology) on ``batch`` x 3 x ``image`` x ``image`` images.

    Stem 7x7/2 conv + BN + Relu + 3x3/2 max pool; four stages of two BasicBlocks with 64, 128,
    256, 512 channels (stride 2 and a 1x1/2 downsample conv + BN on entry to stages 2-4);
    GlobalAveragePool, Flatten, Gemm(transB=1) to ``num_classes`` logits. ``image`` must be
    a multiple of 32 so every stride-2 step halves exactly (32 gives a 1x1 final map).
    """
    if image % 32:
        raise ValueError(f"image size {image} is not a multiple of 32")
    b = _Builder(seed)
    x = _conv_bn(b, "input", 3, 64, 7, 2, "conv1", relu=True)
    x = b.op("MaxPool", [x], "maxpool", kernel_shape=[3, 3], strides=[2, 2],
             pads=[1, 1, 1, 1])
    c_in = 64
    for stage, c_out in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            stride = 2 if (stage > 1 and block == 0) else 1
            x = _basic_block(b, x, c_in, c_out, stride, f"layer{stage}.{block}")
            c_in = c_out
    x = b.op("GlobalAveragePool", [x], "avgpool")
    x = b.op("Flatten", [x], "flatten", axis=1)
    weight = b.normal("fc.weight", [num_classes, 512], math.sqrt(1.0 / 512))
    bias = b.normal("fc.bias", [num_classes], 0.01)
    b.op("Gemm", [x, weight, bias], "fc", alpha=1.0, beta=1.0, transB=1)
    b.nodes[-1].output[0] = "logits"
    return b.model(f"resnet18_b{batch}_{image}", [_f32("input", [batch, 3, image, image])],
                   [_f32("logits", [batch, num_classes])])


# ----------------------------------------------------------------------------- BERT


def _linear(b: _Builder, x: str, fan_in: int, fan_out: int, stem: str) -> str:
    """MatMul + Add with a [in, out] weight: what exporters emit for ``nn.Linear`` on 3-D
    activations. Xavier-like std so attention scores are O(1) and softmax isn't uniform."""
    weight = b.normal(f"{stem}.weight", [fan_in, fan_out], 1.0 / math.sqrt(fan_in))
    bias = b.normal(f"{stem}.bias", [fan_out], 0.02)
    return b.op("Add", [b.op("MatMul", [x, weight], f"{stem}_matmul"), bias], stem)


def _layer_norm(b: _Builder, x: str, hidden: int, stem: str) -> str:
    """LayerNormalization over the last axis (opset 17), eps 1e-12 as in BERT."""
    scale = b.normal(f"{stem}.weight", [hidden], 0.1, 1.0)
    shift = b.normal(f"{stem}.bias", [hidden], 0.05)
    return b.op("LayerNormalization", [x, scale, shift], stem, axis=-1, epsilon=1e-12)


def _erf_gelu(b: _Builder, x: str, stem: str) -> str:
    """x * 0.5 * (1 + Erf(x / sqrt 2)) — node for node what torch exported for exact GELU
    before ONNX had a Gelu op; a compiler must fuse this pattern to be competitive."""
    erf = b.op("Erf", [b.op("Div", [x, b.scalar(f"{stem}.sqrt2", math.sqrt(2.0))],
                            f"{stem}_div")], f"{stem}_erf")
    one_plus = b.op("Add", [erf, b.scalar(f"{stem}.one", 1.0)], f"{stem}_add")
    return b.op("Mul", [b.op("Mul", [x, one_plus], f"{stem}_mul"),
                        b.scalar(f"{stem}.half", 0.5)], stem)


def _attention(b: _Builder, x: str, mask: str, batch: int, seq: int, hidden: int,
               heads: int, stem: str) -> str:
    """Multi-head self-attention as Hugging Face BERT exports with eager attention."""
    head_dim = hidden // heads
    split_shape = b.ints(f"{stem}.split_shape", [batch, seq, heads, head_dim])

    def project(name: str, perm: list[int]) -> str:
        y = _linear(b, x, hidden, hidden, f"{stem}.{name}")
        y = b.op("Reshape", [y, split_shape], f"{stem}_{name}_reshape")
        return b.op("Transpose", [y], f"{stem}_{name}_transpose", perm=perm)

    q = project("query", [0, 2, 1, 3])                                # [B, h, S, d]
    k = project("key", [0, 2, 3, 1])                                  # [B, h, d, S]
    v = project("value", [0, 2, 1, 3])                                # [B, h, S, d]
    scores = b.op("MatMul", [q, k], f"{stem}_scores")
    scores = b.op("Div", [scores, b.scalar(f"{stem}.sqrt_d", math.sqrt(head_dim))],
                  f"{stem}_scaled")
    scores = b.op("Add", [scores, mask], f"{stem}_masked")
    probs = b.op("Softmax", [scores], f"{stem}_softmax", axis=-1)
    context = b.op("MatMul", [probs, v], f"{stem}_context")
    context = b.op("Transpose", [context], f"{stem}_context_transpose", perm=[0, 2, 1, 3])
    merge_shape = b.ints(f"{stem}.merge_shape", [batch, seq, hidden])
    return b.op("Reshape", [context, merge_shape], f"{stem}_context_reshape")


def bert(batch: int = 1, seq: int = 128, layers: int = 2, hidden: int = 256, heads: int = 4,
         *, intermediate: int | None = None, vocab: int = 30522, max_positions: int = 512,
         seed: int = 0) -> onnx.ModelProto:
    """A BERT-style encoder (small by default: 2 layers, hidden 256, 4 heads, seq 128).

    Inputs ``input_ids`` and ``attention_mask`` (int64, [batch, seq]; mask 1 = attend,
    0 = padding). The mask becomes the additive [batch, 1, 1, seq] bias exporters compute,
    (1 - mask) * -10000, through Unsqueeze/Cast/Sub/Mul. Embeddings: Gather of word and
    position tables, Add, LayerNormalization. Each layer: Q/K/V MatMul+Add, Reshape to
    heads, Transpose, MatMul scores, Div by sqrt(d), Add mask, Softmax, MatMul, Transpose back,
    Reshape, output MatMul+Add, residual Add, LayerNormalization, FFN (MatMul+Add, Erf GELU,
    MatMul+Add), residual Add, LayerNormalization. Output ``last_hidden_state``.
    """
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not divisible by heads {heads}")
    if seq > max_positions:
        raise ValueError(f"seq {seq} exceeds max_positions {max_positions}")
    intermediate = intermediate or 4 * hidden
    b = _Builder(seed)

    word = b.normal("embeddings.word_embeddings.weight", [vocab, hidden], 0.5)
    position = b.normal("embeddings.position_embeddings.weight", [max_positions, hidden], 0.5)
    position_ids = b.const("embeddings.position_ids",
                           np.arange(seq, dtype=np.int64).reshape(1, seq))
    x = b.op("Add", [b.op("Gather", [word, "input_ids"], "word_embeddings", axis=0),
                     b.op("Gather", [position, position_ids], "position_embeddings", axis=0)],
             "embeddings_sum")
    x = _layer_norm(b, x, hidden, "embeddings.LayerNorm")

    mask = b.op("Unsqueeze", ["attention_mask", b.ints("mask_axes", [1, 2])], "mask_unsqueeze")
    mask = b.op("Cast", [mask], "mask_cast", to=TensorProto.FLOAT)
    mask = b.op("Sub", [b.scalar("mask_one", 1.0), mask], "mask_invert")
    mask = b.op("Mul", [mask, b.scalar("mask_min", -10000.0)], "mask_bias")

    for layer in range(layers):
        stem = f"encoder.layer.{layer}"
        attended = _attention(b, x, mask, batch, seq, hidden, heads, f"{stem}.attention.self")
        attended = _linear(b, attended, hidden, hidden, f"{stem}.attention.output.dense")
        x = _layer_norm(b, b.op("Add", [attended, x], f"{stem}_attention_residual"), hidden,
                        f"{stem}.attention.output.LayerNorm")
        inner = _linear(b, x, hidden, intermediate, f"{stem}.intermediate.dense")
        inner = _erf_gelu(b, inner, f"{stem}.intermediate.gelu")
        out = _linear(b, inner, intermediate, hidden, f"{stem}.output.dense")
        x = _layer_norm(b, b.op("Add", [out, x], f"{stem}_output_residual"), hidden,
                        f"{stem}.output.LayerNorm")
    b.nodes[-1].output[0] = "last_hidden_state"
    return b.model(f"bert_l{layers}_h{hidden}_a{heads}_b{batch}_s{seq}",
                   [_i64("input_ids", [batch, seq]), _i64("attention_mask", [batch, seq])],
                   [_f32("last_hidden_state", [batch, seq, hidden])])


def bert_base(batch: int = 1, seq: int = 128, *, seed: int = 0) -> onnx.ModelProto:
    """BERT-base geometry: 12 layers, hidden 768, 12 heads, FFN 3072, vocab 30522."""
    return bert(batch, seq, layers=12, hidden=768, heads=12, seed=seed)


# ----------------------------------------------------------------------------- inputs


def example_inputs(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    """Deterministic inputs for any model above, keyed by graph input name.

    Float inputs are standard normal. ``input_ids`` are drawn below the word-table size read
    from the model (so a small test vocabulary works). ``attention_mask`` pads the last
    quarter of each sequence with 0, so the mask actually changes the result and a compiler
    that mishandles it shows up in max |diff|.
    """
    rng = np.random.default_rng(seed)
    initializers = {t.name: t for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if value.name == "input_ids":
            vocab = initializers["embeddings.word_embeddings.weight"].dims[0]
            feeds[value.name] = rng.integers(0, vocab, size=shape, dtype=np.int64)
        elif value.name == "attention_mask":
            mask = np.ones(shape, dtype=np.int64)
            mask[:, shape[1] - shape[1] // 4:] = 0
            feeds[value.name] = mask
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds
