"""Models exported by both PyTorch ONNX exporters compile to native code with no fallback.

Users bring ONNX files from either exporter, and the two write different graphs for the same
module: the TorchScript exporter (``dynamo=False``) computes Reshape/Expand targets at run time
from Shape -> Gather -> Unsqueeze -> Concat chains (with Mod, Cast, Where, ConstantOfShape,
Range ...) and writes Gemm for every nn.Linear; the dynamo exporter (``dynamo=True``, through
onnxscript) writes MatMul + Add and its own attention and mask idioms.  For every model here,
built in plain torch or from a transformers config with small sizes and random weights,
exported with a dynamic batch (and sequence) axis, ``ember.compile`` must give a library whose
every node is a compiled kernel (``module.build.host_nodes`` empty) and whose outputs match
torch eager at two batch sizes.

What the exporters themselves do (torch 2.13, transformers 5):

* The TorchScript exporter keeps the batch axis dynamic everywhere, but bakes the sequence
  length that ``nn.MultiheadAttention`` (and so ``nn.TransformerEncoderLayer``) computes in
  Python into constant Reshape targets, and a causal mask built from ``x.shape`` into a
  constant: those models run at any batch size but only at the exported sequence length.
  ember then refuses another length with a ShapeError naming the Reshape.
* The TorchScript exporter cannot export transformers' GPT-2 without an ``attention_mask``
  (``aten::diff`` in the packed-sequence detection); with one it can, so the GPT-2 case passes
  a mask to both exporters.
* The dynamo exporter keeps both axes dynamic for every model here.

Nothing is cached inside the repository: models are exported to memory, and compiled
libraries go to ember's compile cache.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember.runtime.dims_model import RuntimeDimsModel

EXPORT_SIZES = (2, 8)  # (batch, sequence) the models are traced with
RTOL, ATOL = 1e-4, 1e-5
HIDDEN, HEADS, VOCAB, MAX_POSITIONS = 32, 2, 100, 32

Inputs = tuple[torch.Tensor, ...]


# ----------------------------------------------------------------------------- plain torch


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(HIDDEN, 64)
        self.out = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.out(F.gelu(self.hidden(x))), dim=-1)


class SmallCNN(nn.Module):
    """Conv/BN/ReLU, pooling, a residual block, a depthwise conv, a transposed conv,
    nearest and bilinear upsampling, adaptive pooling, Flatten and Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.residual = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.head = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(self.stem(x), 2)
        y = F.relu(y + self.residual(y))
        y = F.avg_pool2d(self.up(F.relu(self.depthwise(y))), 2)
        y = self.upsample(y) + F.interpolate(y, scale_factor=2, mode="bilinear",
                                             align_corners=False)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(y, 4), 1))


class AttentionBlock(nn.Module):
    """nn.MultiheadAttention without masks, and with a key padding mask and a causal mask
    together, each followed by a residual LayerNorm and a feed-forward layer."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(HIDDEN, HEADS, batch_first=True)
        self.norm = nn.LayerNorm(HIDDEN)
        self.feed_forward = nn.Linear(HIDDEN, HIDDEN)

    def _block(self, x: torch.Tensor, **masks: torch.Tensor) -> torch.Tensor:
        attended, _ = self.attention(x, x, x, need_weights=False, **masks)
        y = self.norm(x + attended)
        return y + F.relu(self.feed_forward(y))

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> Inputs:
        length = x.shape[1]
        causal = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
        return self._block(x), self._block(x, key_padding_mask=padding, attn_mask=causal)


class EncoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(HIDDEN, HEADS, 64, dropout=0.0,
                                                batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


# ----------------------------------------------------------------------------- transformers


class LastHiddenState(nn.Module):
    """A transformers model called with input ids and an attention mask."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


def bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=1,
                        num_attention_heads=HEADS, intermediate_size=64,
                        max_position_embeddings=MAX_POSITIONS, attn_implementation="eager")
    return LastHiddenState(BertModel(config))


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=1, n_head=HEADS,
                        n_positions=MAX_POSITIONS, attn_implementation="eager",
                        use_cache=False, bos_token_id=0, eos_token_id=0)
    return LastHiddenState(GPT2Model(config))


# ----------------------------------------------------------------------------- inputs


def features(rng: torch.Generator, batch: int, _: int) -> Inputs:
    return (torch.randn(batch, HIDDEN, generator=rng),)


def images(rng: torch.Generator, batch: int, _: int) -> Inputs:
    return (torch.randn(batch, 3, 16, 16, generator=rng),)


def sequence(rng: torch.Generator, batch: int, length: int) -> Inputs:
    return (torch.randn(batch, length, HIDDEN, generator=rng),)


def padded_lengths(batch: int, length: int) -> torch.Tensor:
    """True where a position is padding: rows end 0, 1 or 2 positions early."""
    valid = length - torch.arange(batch) % 3
    return torch.arange(length)[None, :] >= valid[:, None]


def sequence_and_padding(rng: torch.Generator, batch: int, length: int) -> Inputs:
    return sequence(rng, batch, length) + (padded_lengths(batch, length),)


def tokens_and_mask(rng: torch.Generator, batch: int, length: int) -> Inputs:
    ids = torch.randint(0, VOCAB, (batch, length), generator=rng)
    return ids, (~padded_lengths(batch, length)).long()


# ----------------------------------------------------------------------------- cases

BATCH, BATCH_AND_SEQUENCE = {0: "batch"}, {0: "batch", 1: "sequence"}


@dataclass(frozen=True)
class ExportCase:
    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[torch.Generator, int, int], Inputs]
    dynamic_axes: dict[str, dict[int, str]]  # per input: axis -> name
    outputs: int = 1
    needs: str | None = None  # a module the case imports (skipped without it)
    # Exporters whose graph keeps the sequence axis dynamic (see the module docstring).
    sequence_dynamic: frozenset[str] = field(default=frozenset({"dynamo"}))

    @property
    def input_names(self) -> list[str]:
        return list(self.dynamic_axes)


BOTH = frozenset({"torchscript", "dynamo"})
CASES = [
    ExportCase("mlp", MLP, features, {"x": BATCH}),
    ExportCase("cnn", SmallCNN, images, {"x": BATCH}),
    ExportCase("attention", AttentionBlock, sequence_and_padding,
               {"x": BATCH_AND_SEQUENCE, "padding": BATCH_AND_SEQUENCE}, outputs=2),
    ExportCase("encoder_layer", EncoderLayer, sequence, {"x": BATCH_AND_SEQUENCE}),
    ExportCase("bert", bert, tokens_and_mask,
               {"ids": BATCH_AND_SEQUENCE, "mask": BATCH_AND_SEQUENCE},
               needs="transformers", sequence_dynamic=BOTH),
    ExportCase("gpt2", gpt2, tokens_and_mask,
               {"ids": BATCH_AND_SEQUENCE, "mask": BATCH_AND_SEQUENCE},
               needs="transformers", sequence_dynamic=BOTH),
]


def export(model: nn.Module, case: ExportCase, args: Inputs, exporter: str) -> onnx.ModelProto:
    """The model as the exporter writes it, with the case's dynamic axes declared."""
    outputs = [f"y{i}" for i in range(case.outputs)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            dims = {"batch": torch.export.Dim("batch", min=1, max=64),
                    "sequence": torch.export.Dim("sequence", min=2, max=MAX_POSITIONS)}
            shapes = {name: {axis: dims[dim] for axis, dim in axes.items()}
                      for name, axes in case.dynamic_axes.items()}
            program = torch.onnx.export(model, args, None, input_names=case.input_names,
                                        output_names=outputs, dynamic_shapes=shapes,
                                        dynamo=True, verbose=False)
            return program.model_proto
        buffer = io.BytesIO()
        torch.onnx.export(model, args, buffer, input_names=case.input_names,
                          output_names=outputs, dynamic_axes=dict(case.dynamic_axes),
                          dynamo=False)
        return onnx.load_from_string(buffer.getvalue())


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_exported_model_compiles_without_fallback(case: ExportCase, exporter: str) -> None:
    if case.needs:
        pytest.importorskip(case.needs)
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model = case.build().eval()
    rng = torch.Generator().manual_seed(0)
    proto = export(model, case, case.inputs(rng, *EXPORT_SIZES), exporter)
    module = ember.compile(proto)
    # Another batch size, and another sequence length where the exported graph allows it.
    other_length = 13 if exporter in case.sequence_dynamic else EXPORT_SIZES[1]  # odd
    sizes = [EXPORT_SIZES, (3, other_length)]
    for batch, length in sizes:
        inputs = case.inputs(rng, batch, length)
        with torch.no_grad():
            expected = model(*inputs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = module(*[tensor.numpy() for tensor in inputs])
        got = got if isinstance(got, tuple) else (got,)
        where = f"{case.name} via {exporter} at batch {batch}, sequence {length}"
        assert module.build.host_nodes == [], f"{where}: {module.report()}"
        assert len(got) == len(expected), where
        for index, (actual, want) in enumerate(zip(got, expected)):
            np.testing.assert_allclose(actual, want.numpy(), rtol=RTOL, atol=ATOL,
                                       err_msg=f"{where}, output {index}")


class SplitProjection(nn.Module):
    """torch.split and torch.chunk of a projection, as attention layers split q, k and v."""

    def __init__(self) -> None:
        super().__init__()
        self.project = nn.Linear(HIDDEN, 3 * HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(x).split(HIDDEN, dim=-1)
        first, second = v.chunk(2, dim=-1)
        return torch.cat([q * k, second, first], dim=-1)


def test_unoptimized_dynamo_export_compiles_without_fallback() -> None:
    """Without its optimizer the dynamo exporter writes torch.split as SplitToSequence read
    back by SequenceAt; the importer turns that into Split, so the model still compiles."""
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model = SplitProjection().eval()
    rng = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, sequence(rng, *EXPORT_SIZES), None,
                                    input_names=["x"], dynamo=True, optimize=False,
                                    dynamic_shapes={"x": {0: torch.export.Dim("batch")}},
                                    verbose=False)
    assert "SplitToSequence" in {node.op_type for node in program.model_proto.graph.node}
    module = ember.compile(program.model_proto)
    for batch in (2, 3):
        (x,) = sequence(rng, batch, EXPORT_SIZES[1])
        with torch.no_grad():
            expected = model(x).numpy()
        np.testing.assert_allclose(module(x.numpy()), expected, rtol=RTOL, atol=ATOL)
        assert module.build.host_nodes == [], module.report()


def test_sequence_length_baked_by_the_torchscript_exporter_is_named() -> None:
    """The TorchScript exporter writes nn.MultiheadAttention's sequence length into constant
    Reshape targets although the axis was declared dynamic: another length is refused with an
    error naming the Reshape, not a crash or a wrong result."""
    from ember.core.errors import ShapeError

    case = next(case for case in CASES if case.name == "encoder_layer")
    torch.manual_seed(0)
    model = case.build().eval()
    rng = torch.Generator().manual_seed(0)
    module = ember.compile(export(model, case, case.inputs(rng, *EXPORT_SIZES), "torchscript"))
    (x,) = case.inputs(rng, EXPORT_SIZES[0], EXPORT_SIZES[1] + 4)
    with pytest.raises(ShapeError, match="Reshape"):
        module(x.numpy())


def test_bert_compiled_with_dynamic_shapes_serves_every_batch_from_two_builds(
        logged_builds) -> None:
    """transformers reads its padding mask as mask[arange(batch)[:, None, None, None], kv]:
    the batch-split analysis follows that index (``ember/passes/batch_index.py``), so a new
    batch size runs on the compiled blocks instead of compiling again."""
    pytest.importorskip("transformers")
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = bert().eval()
    compiled = torch.compile(model, backend="ember", dynamic=True)
    rng = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for batch in (2, 3, 5, 2):
            inputs = tokens_and_mask(rng, batch, EXPORT_SIZES[1])
            np.testing.assert_allclose(compiled(*inputs).numpy(), model(*inputs).numpy(),
                                       rtol=RTOL, atol=ATOL, err_msg=f"batch {batch}")
    torch._dynamo.reset()
    builds = logged_builds()
    assert len(builds) == 2, builds


def _serve_lengths_from_traced_builds(module: ember.Module, model: nn.Module,
                                      case: ExportCase, rng: torch.Generator,
                                      lengths: tuple[int, ...]) -> None:
    """Run ``module`` at batch 2 and each length: outputs as eager PyTorch's, every call on a
    build for every length (a ``RuntimeDimsModel``)."""
    with torch.no_grad():
        for length in lengths:
            inputs = case.inputs(rng, 2, length)
            np.testing.assert_allclose(module(*[t.numpy() for t in inputs]),
                                       model(*inputs).numpy(), rtol=RTOL, atol=ATOL,
                                       err_msg=f"length {length}")
            assert isinstance(module._last[1], RuntimeDimsModel), module.last_refusal


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_a_transformer_exported_by_torchscript_serves_sequence_lengths_from_few_builds(
        name: str, logged_builds, monkeypatch) -> None:
    """The exporter computes shapes at run time (Shape, Gather, Concat into Reshape; a Slice of
    the position ids up to the length; Range for the causal mask): those values keep the
    length as a run-time size, so lengths of one size class run on one build, checked
    against eager PyTorch."""
    pytest.importorskip("transformers")
    monkeypatch.delenv("EMBER_RUNTIME_DIMS", raising=False)   # the default: on
    torch.manual_seed(0)
    case = next(case for case in CASES if case.name == name)
    model = case.build().eval()
    rng = torch.Generator().manual_seed(0)
    module = ember.compile(export(model, case, case.inputs(rng, *EXPORT_SIZES), "torchscript"))
    # two classes of lengths: [8, 15] and [4, 7]
    _serve_lengths_from_traced_builds(module, model, case, rng, (8, 9, 13, 15, 11, 5, 7))
    builds = logged_builds()
    assert len(builds) == 2, builds
    assert all("compiling once for every size of sequence" in b for b in builds), builds


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_a_transformer_compiled_by_dynamo_serves_sequence_lengths_from_few_builds(
        name: str, logged_builds, monkeypatch) -> None:
    """``torch.compile(dynamic=True)`` hands ember one graph with a symbolic batch and length.
    transformers reads the padding mask as mask[arange(N)[:, None, None, None], kv], a
    GatherND whose run-time index tuples address a dim of N and one of S: each component is
    range-checked against its own dim, and the views of attention divide by multiples of S
    that are decided as expressions, so lengths of one size class run on one build."""
    pytest.importorskip("transformers")
    import torch._dynamo

    monkeypatch.delenv("EMBER_RUNTIME_DIMS", raising=False)   # the default: on
    torch._dynamo.reset()
    torch.manual_seed(0)
    case = next(case for case in CASES if case.name == name)
    model = case.build().eval()
    compiled = torch.compile(model, backend="ember", dynamic=True)
    rng = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for length in (8, 9, 13, 15, 11, 5, 7):   # two classes: [8, 15] and [4, 7]
            inputs = case.inputs(rng, 2, length)
            np.testing.assert_allclose(compiled(*inputs).numpy(), model(*inputs).numpy(),
                                       rtol=RTOL, atol=ATOL, err_msg=f"length {length}")
    torch._dynamo.reset()
    builds = logged_builds()
    assert len(builds) == 2, builds
    assert all("compiling once for every size of" in b for b in builds), builds


def test_a_transformer_compiled_ahead_of_time_with_a_dynamic_length_traces_it(
        logged_builds, monkeypatch) -> None:
    """``ember.compile(model, inputs, dynamic_shapes=...)`` through ``torch.export``: a
    length declared as a ``Dim`` is taken at run time, one build for each class of lengths,
    including 16, where the Reshape targets [N*heads, S, 16] and [N*heads, 16, S] of
    attention hold the same numbers and must stay two constants."""
    pytest.importorskip("transformers")
    monkeypatch.delenv("EMBER_RUNTIME_DIMS", raising=False)   # the default: on
    torch.manual_seed(0)
    case = next(case for case in CASES if case.name == "bert")
    model = case.build().eval()
    rng = torch.Generator().manual_seed(0)
    length = torch.export.Dim("length", min=2, max=32)
    module = ember.compile(model, case.inputs(rng, 2, 16),
                           dynamic_shapes=({1: length}, {1: length}))
    _serve_lengths_from_traced_builds(module, model, case, rng, (16, 23, 31, 17))
    builds = logged_builds()
    assert len(builds) == 1 and "compiling once for every size of length" in builds[0], builds


def test_bert_exported_by_torchscript_serves_every_batch_from_two_builds(logged_builds) -> None:
    """The TorchScript exporter writes the same mask read as Gather(Flatten(mask), i*S + kv)
    (``batch_index.py``, flat rows): through ONNX, too, a new batch size runs on blocks.
    Padding differs per sample (``tokens_and_mask``), so a block reading another sample's
    mask rows would show in the outputs."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = bert().eval()
    case = next(case for case in CASES if case.name == "bert")
    rng = torch.Generator().manual_seed(0)
    module = ember.compile(export(model, case, case.inputs(rng, *EXPORT_SIZES), "torchscript"))
    assert module.batch_split is not None, module.batch_split_reason
    with torch.no_grad():
        for batch in (2, 3, 5, 2):
            inputs = tokens_and_mask(rng, batch, EXPORT_SIZES[1])
            np.testing.assert_allclose(module(*[t.numpy() for t in inputs]),
                                       model(*inputs).numpy(), rtol=RTOL, atol=ATOL,
                                       err_msg=f"batch {batch}")
    builds = logged_builds()
    assert len(builds) == 2, builds


class _EinsumAttention(torch.nn.Module):
    """Attention written with einsum, ending in a Linear whose output the TorchScript
    exporter declares at the traced sizes ([2, 16, 64]) when only the input is named
    dynamic."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)
        self.out = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.unflatten(-1, (4, 16)) for t in (q, k, v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / 4.0
        mixed = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)
        return self.out(mixed.flatten(-2))


def test_outputs_declared_at_the_traced_sizes_keep_their_dynamic_dims() -> None:
    """The declared [2, 16, 64] of the output is the exporter's sample, not a constraint:
    the output follows the input's batch and length, so every (batch, length) of a length
    class runs on the first build and a batch-1 block (once a build per batch size)."""
    torch.manual_seed(0)
    model = _EinsumAttention().eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(2, 16, 64),), buffer, dynamo=False,
                          input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch", 1: "length"}})
    declared = onnx.load_from_string(buffer.getvalue()).graph.output[0]
    assert [d.dim_value for d in declared.type.tensor_type.shape.dim] == [2, 16, 64]
    module = ember.compile(buffer.getvalue())
    with torch.no_grad():
        for batch, length in ((2, 16), (3, 16), (4, 24), (5, 20), (2, 31), (6, 17)):
            x = torch.randn(batch, length, 64)
            np.testing.assert_allclose(module(x.numpy()), model(x).numpy(), rtol=1e-5,
                                       atol=1e-6, err_msg=f"{(batch, length)}")
    assert len(module.build_reasons) <= 2, module.build_reasons
