"""Models built from configs through ember's three routes: builds, fallbacks, speed.

For every model (transformers configs with small sizes and random weights, plain-torch
recurrent and einsum nets) and route -- AOT (``ember.compile(module, inputs,
dynamic_shapes=...)``), ``torch.compile(backend="ember", dynamic=True)`` and ONNX (the dynamo
exporter, then ``ember.compile``) -- this runs the model at six (batch, length) sizes and
prints how many builds ember made, how many ops did not compile to native code (numpy
references, or calls left to PyTorch), the largest difference from torch eager, and the
median time of one call at the last size against ONNX Runtime on the same ONNX file (runs
interleaved, ratio < 1: ember faster).

    .venv/bin/python benchmarks/frontend_routes.py [--models bert,lstm] [--repeats 30]
"""

from __future__ import annotations

import argparse
import io
import logging
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn

SIZES = [(2, 16), (3, 16), (4, 24), (5, 20), (2, 31), (4, 32)]


@dataclass
class Case:
    name: str
    make: Callable[[], nn.Module]
    inputs: Callable[[int, int], tuple[torch.Tensor, ...]]
    input_names: tuple[str, ...]
    # recurrent layers are exported over a fixed number of steps: only the batch varies
    fixed_length: int | None = None

    def sizes(self) -> list[tuple[int, int]]:
        if self.fixed_length is None:
            return SIZES
        return [(batch, self.fixed_length) for batch, _ in SIZES]


def _transformer(config_name: str, model_name: str, **options) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        import transformers

        torch.manual_seed(0)
        config = getattr(transformers, config_name)(
            vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=256, max_position_embeddings=128, **options)
        return _FirstOutput(getattr(transformers, model_name)(config)).eval()
    return make


class _FirstOutput(nn.Module):
    """The model's first output (last_hidden_state), as a plain tensor."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask)[0]


class _Recurrent(nn.Module):
    def __init__(self, kind: type) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.rnn = kind(64, 128, num_layers=2, batch_first=True)
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0])


class _Bilinear(nn.Module):
    """Attention written with einsum, as many research models are."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv = nn.Linear(64, 192)
        self.out = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.unflatten(-1, (4, 16)) for t in (q, k, v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / 4.0
        mixed = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)
        return self.out(mixed.flatten(-2))


def _configured(config_name: str, model_name: str, wrap: Callable[[nn.Module], nn.Module],
                **config) -> Callable[[], nn.Module]:
    """A transformers model built from ``config`` alone (random weights), wrapped so that it
    takes plain tensors and returns one."""
    def make() -> nn.Module:
        import transformers

        torch.manual_seed(0)
        built = getattr(transformers, model_name)(getattr(transformers, config_name)(**config))
        return wrap(built).eval()
    return make


class _Pixels(nn.Module):
    """An image model's first output for ``pixel_values``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixels)[0]


class _Audio(nn.Module):
    """An audio encoder's first output for its one input (features or raw samples)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        return self.model(audio)[0]


def _pixels(batch: int, _length: int) -> tuple[torch.Tensor]:
    return (torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch)),)


def _mel_features(batch: int, _length: int) -> tuple[torch.Tensor]:
    return (torch.randn(batch, 16, 64, generator=torch.Generator().manual_seed(batch)),)


def _samples(batch: int, _length: int) -> tuple[torch.Tensor]:
    return (torch.randn(batch, 4000, generator=torch.Generator().manual_seed(batch)),)


def _tokens(batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 1000 + length)
    ids = torch.randint(3, 1000, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, -2:] = 0
    return ids, mask


def _features(batch: int, length: int) -> tuple[torch.Tensor]:
    return (torch.randn(batch, length, 64, generator=torch.Generator().manual_seed(length)),)


CASES = {
    "bert": Case("bert", _transformer("BertConfig", "BertModel"), _tokens, ("ids", "mask")),
    "roberta-eager": Case("roberta-eager", _transformer("RobertaConfig", "RobertaModel",
                                                        attn_implementation="eager"),
                          _tokens, ("ids", "mask")),
    "albert": Case("albert", _transformer("AlbertConfig", "AlbertModel", embedding_size=64),
                   _tokens, ("ids", "mask")),
    "deberta-v2": Case("deberta-v2", _transformer("DebertaV2Config", "DebertaV2Model"),
                       _tokens, ("ids", "mask")),
    "llama": Case("llama", _transformer("LlamaConfig", "LlamaModel", num_key_value_heads=2),
                  _tokens, ("ids", "mask")),
    "mistral": Case("mistral", _transformer("MistralConfig", "MistralModel",
                                            num_key_value_heads=2), _tokens, ("ids", "mask")),
    "qwen2": Case("qwen2", _transformer("Qwen2Config", "Qwen2Model", num_key_value_heads=2),
                  _tokens, ("ids", "mask")),
    "t5-encoder": Case("t5-encoder", _transformer("T5Config", "T5EncoderModel", d_kv=32,
                                                  d_ff=256), _tokens, ("ids", "mask")),
    "bart": Case("bart", _transformer("BartConfig", "BartModel", encoder_ffn_dim=256,
                                      decoder_ffn_dim=256, decoder_layers=2,
                                      decoder_attention_heads=4), _tokens, ("ids", "mask")),
    "clip-text": Case("clip-text", _transformer("CLIPTextConfig", "CLIPTextModel"), _tokens,
                      ("ids", "mask")),
    "vit": Case("vit", _configured("ViTConfig", "ViTModel", _Pixels, hidden_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=256, image_size=32, patch_size=8),
                _pixels, ("pixels",), 32),
    "clip-vision": Case("clip-vision", _configured(
        "CLIPVisionConfig", "CLIPVisionModel", _Pixels, hidden_size=128, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=256, image_size=32, patch_size=8),
        _pixels, ("pixels",), 32),
    "swin": Case("swin", _configured("SwinConfig", "SwinModel", _Pixels, image_size=32,
                                     patch_size=4, embed_dim=32, depths=[2, 2],
                                     num_heads=[2, 4], window_size=4),
                 _pixels, ("pixels",), 32),
    "convnext": Case("convnext", _configured("ConvNextConfig", "ConvNextModel", _Pixels,
                                             num_stages=2, hidden_sizes=[16, 32],
                                             depths=[1, 1]),
                     _pixels, ("pixels",), 32),
    "regnet": Case("regnet", _configured("RegNetConfig", "RegNetModel", _Pixels,
                                         embedding_size=16, hidden_sizes=[16, 32],
                                         depths=[1, 1], groups_width=8),
                   _pixels, ("pixels",), 32),
    "whisper-encoder": Case("whisper-encoder", _configured(
        "WhisperConfig", "WhisperModel", lambda m: _Audio(m.get_encoder()), d_model=128,
        encoder_layers=2, encoder_attention_heads=4, decoder_layers=2,
        decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, num_mel_bins=16,
        max_source_positions=32), _mel_features, ("audio",), 64),
    "wav2vec2": Case("wav2vec2", _configured(
        "Wav2Vec2Config", "Wav2Vec2Model", _Audio, hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32), conv_stride=(5, 2),
        conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
        _samples, ("audio",), 4000),
    "lstm": Case("lstm", lambda: _Recurrent(nn.LSTM).eval(), _features, ("x",), 24),
    "gru": Case("gru", lambda: _Recurrent(nn.GRU).eval(), _features, ("x",), 24),
    "einsum-attention": Case("einsum-attention", lambda: _Bilinear().eval(), _features, ("x",)),
}


def _dims(case: Case) -> tuple[dict, ...]:
    batch = torch.export.Dim("batch", min=1, max=64)
    length = torch.export.Dim("length", min=3, max=64)
    return tuple({0: batch} if case.fixed_length else {0: batch, 1: length}
                 for _ in case.input_names)


class _BuildCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.builds = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "compiling once for every size" in message or "compiling a specialization" in message:
            self.builds += 1


def _median_ratio(ember_call, ort_call, repeats: int) -> tuple[float, str]:
    """ember's median time (ms) and its ratio to ONNX Runtime's ("-" without an ONNX file)."""
    ember_call()
    if ort_call is not None:
        ort_call()
    ember_times, ort_times = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        ember_call()
        ember_times.append(time.perf_counter() - start)
        if ort_call is not None:
            start = time.perf_counter()
            ort_call()
            ort_times.append(time.perf_counter() - start)
    ember_ms = statistics.median(ember_times) * 1e3
    if not ort_times:
        return ember_ms, "-"
    return ember_ms, f"{ember_ms / (statistics.median(ort_times) * 1e3):.2f}"


def run_case(case: Case, repeats: int) -> list[str]:
    import onnxruntime as ort

    import ember
    from ember.torch_backend import REPORTS

    model = case.make()
    sizes = case.sizes()
    first = case.inputs(*sizes[0])
    rows = []
    onnx_bytes = run_onnx = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(model, first, dynamo=True, verbose=False,
                                        input_names=list(case.input_names),
                                        dynamic_shapes=_dims(case))
        buffer = io.BytesIO()
        program.save(buffer)
        onnx_bytes = buffer.getvalue()
    except Exception as failure:  # PyTorch's exporter: no ONNX route, no ONNX Runtime
        rows.append(_failed(case, "ONNX export", failure))
    last = case.inputs(*sizes[-1])
    feeds = {name: t.numpy() for name, t in zip(case.input_names, last)}
    if onnx_bytes is not None:
        session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
        run_onnx = lambda: session.run(None, feeds)  # noqa: E731
    with torch.no_grad():
        expected = {size: model(*case.inputs(*size)).numpy() for size in sizes}

    counter = _BuildCounter()
    logging.getLogger("ember").addHandler(counter)
    logging.getLogger("ember").setLevel(logging.INFO)
    try:
        routes = {
            "AOT": lambda: ember.compile(model, first, dynamic_shapes=_dims(case),
                                         allow_fallbacks=True),
        }
        if onnx_bytes is not None:
            routes["ONNX"] = lambda: ember.compile(onnx_bytes)
        for route, make in routes.items():
            counter.builds = 0
            try:
                module = make()
                error = max(float(np.abs(np.asarray(_first(module(*[t.numpy() for t in
                                                                     case.inputs(*size)])))
                                         - expected[size]).max()) for size in sizes)
                fallbacks = len(module.build.host_nodes)
                ms, ratio = _median_ratio(lambda: module(*feeds.values()), run_onnx, repeats)
            except Exception as failure:  # a row that says so, and the other routes still run
                rows.append(_failed(case, route, failure))
                continue
            rows.append(f"| {case.name} | {route} | {len(module.build_reasons)} | {fallbacks} | "
                        f"{error:.1e} | {ms:.2f} | {ratio} |")
        torch._dynamo.reset()
        counter.builds = 0
        start = len(REPORTS)
        fast = torch.compile(model, backend="ember", dynamic=True)
        try:
            with torch.no_grad():
                error = max(float(np.abs(fast(*case.inputs(*size)).numpy() -
                                         expected[size]).max()) for size in sizes)
                reports = REPORTS.since(start)
                fallbacks = sum(len(r.fallbacks) + len(r.references) for r in reports) + \
                    sum(1 for r in reports if not r.compiled)
                ms, ratio = _median_ratio(lambda: fast(*last), run_onnx, repeats)
        except Exception as failure:
            rows.append(_failed(case, "torch.compile", failure))
            return rows
        rows.append(f"| {case.name} | torch.compile | {counter.builds} | {fallbacks}"
                    f"{'' if reports else ' (no graph)'} | {error:.1e} | {ms:.2f} | "
                    f"{ratio} |")
    finally:
        logging.getLogger("ember").removeHandler(counter)
    return rows


def _failed(case: Case, route: str, failure: Exception) -> str:
    message = " ".join(str(failure).split())[:160]
    return f"| {case.name} | {route} | failed: {type(failure).__name__}: {message} | | | | |"


def _first(outputs):
    return outputs[0] if isinstance(outputs, tuple) else outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(CASES))
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    print(f"sizes (batch, length): {SIZES} (recurrent models: length 24); time at the last")
    print("| model | route | builds | not native | max abs diff | ember ms | ember/ORT |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in args.models.split(","):
        for row in run_case(CASES[name], args.repeats):
            print(row, flush=True)


if __name__ == "__main__":
    main()
