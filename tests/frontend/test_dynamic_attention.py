"""A masked transformer serves many (batch, length) sizes from at most two builds, on every
route: AOT (``ember.compile(module, dynamic_shapes=...)``), ``torch.compile(dynamic=True)``
and ONNX (the dynamo exporter).

Two builds: the first call's, which takes the length at run time and whose batch runs in
blocks, and a block of 1 sample for the remainders.  What used to break it: core ATen's SDPA
decomposition moves the batch axis off axis 0 around a layout copy (the AOT route refused
batch blocks), and the dynamo exporter broadcasts two index ranges through ``Max`` only to
read its shape (the ONNX route took it for a read across samples).  Models are built from
transformers configs with small sizes and random weights, with both attention
implementations; the oracle is torch eager with a padded mask.
"""

from __future__ import annotations

import io
import logging
import warnings

import numpy as np
import pytest
import torch

import ember

SIZES = [(2, 16), (3, 16), (4, 24), (5, 20), (2, 31), (6, 17)]
RTOL, ATOL = 1e-4, 1e-5


def _model(kind: str, attention: str) -> torch.nn.Module:
    """RoBERTa with hidden size 128 (its GEMMs cross the parallel-work threshold inside the
    length class 16..31, which once cut the class at 22), BERT with 32."""
    from transformers import BertConfig, BertModel, RobertaConfig, RobertaModel

    config_class, model_class = {"bert": (BertConfig, BertModel),
                                 "roberta": (RobertaConfig, RobertaModel)}[kind]
    hidden = 128 if kind == "roberta" else 32
    torch.manual_seed(0)
    config = config_class(vocab_size=100, hidden_size=hidden, num_hidden_layers=2,
                          num_attention_heads=hidden // 16, intermediate_size=2 * hidden,
                          max_position_embeddings=64, attn_implementation=attention)
    return model_class(config).eval()


def _inputs(batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 100 + length)
    ids = torch.randint(3, 100, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, -3:] = 0  # a padded sample
    return ids, mask


def _expected(model, ids, mask) -> np.ndarray:
    with torch.no_grad():
        return model(ids, mask).last_hidden_state.numpy()


def _dims():
    return ({0: torch.export.Dim("batch", min=1, max=64),
             1: torch.export.Dim("length", min=2, max=48)},) * 2


def _serves_every_size_from_two_builds(module: ember.Module, model: torch.nn.Module) -> None:
    assert module.batch_split is not None, module.batch_split_reason
    for batch, length in SIZES:
        ids, mask = _inputs(batch, length)
        output = module(ids.numpy(), mask.numpy())
        output = output[0] if isinstance(output, tuple) else output
        np.testing.assert_allclose(output, _expected(model, ids, mask), rtol=RTOL, atol=ATOL)
    assert len(module.build_reasons) <= 2, module.build_reasons


@pytest.mark.parametrize("kind,attention", [("roberta", "sdpa"), ("bert", "eager")])
def test_aot_route(kind: str, attention: str) -> None:
    model = _model(kind, attention)
    module = ember.compile(model, _inputs(2, 16), dynamic_shapes=_dims())
    _serves_every_size_from_two_builds(module, model)


@pytest.mark.parametrize("kind,attention", [("roberta", "sdpa"), ("bert", "eager")])
def test_onnx_route(kind: str, attention: str) -> None:
    model = _model(kind, attention)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, _inputs(2, 16), dynamo=True, verbose=False,
                                    input_names=["input_ids", "attention_mask"],
                                    dynamic_shapes=_dims())
    program.save(buffer)
    module = ember.compile(buffer.getvalue())
    _serves_every_size_from_two_builds(module, model)


@pytest.mark.parametrize("kind,attention", [("roberta", "sdpa"), ("bert", "eager")])
def test_torch_compile_route(kind: str, attention: str, caplog) -> None:
    torch._dynamo.reset()
    model = _model(kind, attention)
    fast = torch.compile(model, backend="ember", dynamic=True)
    with caplog.at_level(logging.INFO, logger="ember"):
        for batch, length in SIZES:
            ids, mask = _inputs(batch, length)
            with torch.no_grad():
                output = fast(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
            np.testing.assert_allclose(output, _expected(model, ids, mask), rtol=RTOL,
                                       atol=ATOL)
    # each build logs one of these (a batch-1 block is announced before its build, too)
    builds = [r.getMessage() for r in caplog.records if r.name == "ember" and
              ("compiling once for every size" in r.getMessage() or
               "compiling a specialization" in r.getMessage())]
    assert 1 <= len(builds) <= 2, builds
    torch._dynamo.reset()


def test_a_build_traced_at_the_bottom_of_a_length_class_serves_the_whole_class() -> None:
    """Traced at length 32 (the first size of the class 32..63), the build serves 40 and 47
    too: the GEMM blocking is planned for the class (its task width once followed the traced
    sample's columns, and its task count decided on which side of 1 the sample fell, so the
    two traces differed and every length of the class compiled its own build)."""
    model = _model("roberta", "sdpa")
    module = ember.compile(model, _inputs(4, 32), dynamic_shapes=_dims())
    for batch, length in [(4, 32), (2, 40), (6, 47), (3, 33)]:
        ids, mask = _inputs(batch, length)
        output = module(ids.numpy(), mask.numpy())
        output = output[0] if isinstance(output, tuple) else output
        np.testing.assert_allclose(output, _expected(model, ids, mask), rtol=RTOL, atol=ATOL)
    assert len(module.build_reasons) <= 2, module.build_reasons
