"""Export zoo models to ONNX with both PyTorch exporters, cached on disk.

Users bring ONNX files from either exporter, and the two produce different graphs:

- ``torchscript`` -- ``torch.onnx.export(..., dynamo=False)``, the legacy tracer (opset 20 by
  default in torch 2.13): attention arrives as a web of Shape/Gather/Unsqueeze/Concat.
- ``dynamo`` -- ``torch.onnx.export(..., dynamo=True)`` (needs ``onnxscript``): torch.export,
  decompositions, then onnxscript's optimizer (opset 18): fewer, larger ops.

Each export is cached under ``<ember cache>/zoo`` ($EMBER_CACHE_DIR/zoo, else
~/.cache/ember/zoo), keyed by the model, its size, the batch, the exporter, the zoo version
and the versions of everything that shapes the graph (torch, onnx, onnxscript, transformers),
so a rerun reuses the file and a new torch gets a fresh one.  Failures are cached too, with
their error: an exporter that cannot export a model fails the same way next time, and the
zoo's report must say why without paying for the attempt again (``refresh=True`` retries).
Files are written under a temporary name and renamed, so concurrent runs never see half a
file.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import io
import json
import logging
import os
import sys
import time
import uuid
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from ember.bench.zoo import ZOO_VERSION, BuiltModel, ZooEntry

EXPORTERS = ("torchscript", "dynamo")
# Error messages of failed exports can run to pages (TorchScript prints the whole graph);
# the record keeps the head, which names the op.
MAX_ERROR_CHARS = 2000


@dataclass
class ExportRecord:
    """The outcome of exporting one (model, size, batch) with one exporter."""

    model: str
    size: str
    batch: int
    exporter: str
    path: str | None = None  # the .onnx file, when the export worked
    error: str | None = None  # why it did not
    seconds: float = 0.0  # time the export took when it ran (not when it came from the cache)
    cached: bool = False  # this run reused an earlier result
    opset: int | None = None
    nodes: int | None = None  # nodes of the main graph

    @property
    def ok(self) -> bool:
        return self.path is not None


def zoo_cache_dir() -> Path:
    from ember.toolchain.cache import default_cache_dir

    return default_cache_dir() / "zoo"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def cache_key(entry: ZooEntry, size: str, batch: int, exporter: str) -> dict[str, object]:
    """Everything the exported graph depends on, as a JSON-able dict."""
    key: dict[str, object] = {"zoo_version": ZOO_VERSION, "model": entry.name, "size": size,
                              "batch": batch, "exporter": exporter,
                              "torch": _version("torch"), "onnx": _version("onnx")}
    if exporter == "dynamo":
        key["onnxscript"] = _version("onnxscript")
        key["onnx_ir"] = _version("onnx-ir")
    for package in entry.requires:
        key[package] = _version(package.replace("_", "-"))
    return key


def _stem(key: dict[str, object]) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return f"{key['model']}-{key['size']}-b{key['batch']}-{key['exporter']}-{digest}"


def export_model(entry: ZooEntry, built: BuiltModel, size: str, batch: int, exporter: str,
                 cache_dir: Path | None = None, refresh: bool = False) -> ExportRecord:
    """Export ``built`` with ``exporter`` (or reuse the cached result); never raises for an
    exporter's failure: the record carries the error."""
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; expected one of {EXPORTERS}")
    directory = Path(cache_dir) if cache_dir is not None else zoo_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    key = cache_key(entry, size, batch, exporter)
    stem = _stem(key)
    onnx_path, record_path = directory / f"{stem}.onnx", directory / f"{stem}.json"

    if not refresh:
        cached = _load_record(record_path, onnx_path, key)
        if cached is not None:
            return cached

    record = ExportRecord(entry.name, size, batch, exporter)
    temporary = directory / f".{stem}.{uuid.uuid4().hex}.onnx"
    start = time.perf_counter()
    try:
        with _quiet():
            _run_exporter(built, exporter, temporary)
        record.opset, record.nodes = _describe(temporary)
        os.replace(temporary, onnx_path)
        record.path = str(onnx_path)
    except Exception as error:  # an exporter failure is a result, not a crash of the zoo
        record.error = _short_error(error)
    finally:
        temporary.unlink(missing_ok=True)
    record.seconds = time.perf_counter() - start
    _save_record(record_path, key, record)
    return record


def zoo_model_path(name: str, size: str = "full", batch: int = 1,
                   exporter: str = "torchscript") -> Path:
    """The ONNX file of zoo model ``name`` (exported now, or from the cache); an EmberError
    with the exporter's message when it cannot be exported."""
    from ember.bench.zoo import get_entry
    from ember.core.errors import EmberError

    entry = get_entry(name)
    record = export_model(entry, entry.build(batch, size), size, batch, exporter)
    if record.path is None:
        raise EmberError(f"zoo model {name} ({size}, batch {batch}) does not export with "
                         f"{exporter}: {record.error}")
    return Path(record.path)


def _run_exporter(built: BuiltModel, exporter: str, path: Path) -> None:
    import torch

    args = tuple(torch.from_numpy(array) for array in built.inputs.values())
    names = dict(input_names=list(built.inputs), output_names=list(built.output_names))
    with torch.no_grad():
        if exporter == "torchscript":
            torch.onnx.export(built.module, args, str(path), dynamo=False, **names)
        else:
            # One self-contained file (models under 2 GB): easy to cache and to hand around.
            torch.onnx.export(built.module, args, str(path), dynamo=True, external_data=False,
                              verbose=False, **names)


def _describe(path: Path) -> tuple[int | None, int]:
    """(default-domain opset, node count) of an exported file; it must load as ONNX."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    return opset, len(model.graph.node)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the exporters' progress prints, warnings and log lines ("torchvision is not
    installed", "[torch.onnx] Obtain model graph ... ✅", and the TorchScript exporter's dump
    of the whole Torch IR graph on a failure, which its C++ side writes to file descriptor
    1): the bench prints its own lines, and the exception names the problem."""
    # onnxscript's optimizer logs constant-folding attempts it gave up on ("Evaluation
    # failed: ..."): harmless, and not the bench's business.
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")
            stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
            stack.enter_context(_native_output_discarded())
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


@contextlib.contextmanager
def _native_output_discarded() -> Iterator[None]:
    """Point file descriptors 1 and 2 at /dev/null (what C++ code writes), then restore."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = [os.dup(fd) for fd in (1, 2)]
    try:
        with open(os.devnull, "wb") as null:
            for fd in (1, 2):
                os.dup2(null.fileno(), fd)
            yield
    finally:
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


def _short_error(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS] + f" [... {len(text) - MAX_ERROR_CHARS} more characters]"
    return text


def _save_record(path: Path, key: dict[str, object], record: ExportRecord) -> None:
    payload = {"key": key, "record": asdict(record)}
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    temporary.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(temporary, path)


def _load_record(record_path: Path, onnx_path: Path, key: dict[str, object]
                 ) -> ExportRecord | None:
    """The cached outcome, if its sidecar matches ``key`` and (for a success) the file is
    there; anything unreadable or inconsistent means "export again"."""
    try:
        payload = json.loads(record_path.read_text())
        if payload.get("key") != key:
            return None
        record = ExportRecord(**payload["record"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if record.ok:
        if not onnx_path.is_file():
            return None
        record.path = str(onnx_path)  # the cache directory may have moved
    record.cached = True
    return record
