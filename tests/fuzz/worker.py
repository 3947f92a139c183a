"""The worker process: runs fuzz cases one at a time and reports events to the session.

    python -m fuzz.worker <reply-fd>      (requests on stdin; started by fuzz.pool)

It is a separate process because the cases are meant to crash it: a segfault, an abort or a
hang here costs the session one restart, not the test run.  It stays alive between cases
because importing ember, onnx and onnxruntime takes about a second, longer than most cases.

Before anything else it caps its address space (a mutant declaring a 2**40-element tensor
must fail with an error, not make the machine swap) and enables ``faulthandler``, so that a
crash prints the Python stack to the log and SIGUSR1 (sent by the session before it kills a
hung worker) prints where it hangs.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import os
import resource
import signal
import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fuzz.layout import SCRATCH, materialize, substitute
from fuzz.protocol import read_message, write_message

ADDRESS_SPACE_LIMIT = 8 << 30
Send = Callable[[dict[str, Any]], None]


def describe_exception(error: BaseException) -> dict[str, Any]:
    """Type, message, traceback and the innermost frame inside ember (which names the code
    that failed, and groups failures by cause in the report)."""
    frames = traceback.extract_tb(error.__traceback__)
    ember_frames = [f for f in frames if f"{os.sep}ember{os.sep}" in f.filename
                    and f"{os.sep}tests{os.sep}" not in f.filename]
    origin = ""
    if isinstance(error, RecursionError) and ember_frames:
        # The innermost frame is wherever the limit happened to hit; the frame repeating
        # most often is the unbounded recursion.
        counts = Counter((f.filename, f.name) for f in ember_frames)
        (filename, function), _ = counts.most_common(1)[0]
        origin = f"{_relative(filename)} {function} (recursing)"
    elif ember_frames:
        last = ember_frames[-1]
        origin = f"{_relative(last.filename)}:{last.lineno} {last.name}"
    lines = str(error).strip().splitlines()
    described = {
        "type": _type_name(error),
        "message": (lines[0] if lines else "")[:500],
        "origin": origin,
        "traceback": "".join(traceback.format_exception(error, limit=-15))[-6000:],
    }
    inner = _wrapped_recursion(error)
    if inner is not None:
        # An EmberError made of a RecursionError ("internal compiler error") is still the
        # recursion the fuzzer looks for: keep where it recursed.
        described["recursion"] = describe_exception(inner)["origin"] or "outside ember"
    return described


def _type_name(error: BaseException) -> str:
    kind = type(error)
    return kind.__name__ if kind.__module__ == "builtins" else \
        f"{kind.__module__}.{kind.__qualname__}"


def _wrapped_recursion(error: BaseException) -> BaseException | None:
    """The RecursionError that ``error`` was raised from (its cause or context), if any."""
    seen: set[int] = set()
    current = error.__cause__ or error.__context__
    while current is not None and id(current) not in seen:
        if isinstance(current, RecursionError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _relative(filename: str) -> str:
    marker = f"{os.sep}ember{os.sep}"
    return "ember/" + filename.rsplit(marker, 1)[-1] if marker in filename else filename


# ---------------------------------------------------------------------------- model cases


def run_model_case(request: dict[str, Any], send: Send) -> None:
    import onnx

    import ember
    from fuzz.feeds import build_feeds, transform_feeds

    with tempfile.TemporaryDirectory(prefix="ember-fuzz-model-") as scratch:
        root = Path(scratch)
        try:
            data, source, options = _model_source(request, root)
        except Exception as error:
            send({"event": "harness-error", "error": describe_exception(error)})
            return
        given = source.SerializeToString() if isinstance(source, onnx.ModelProto) else None
        send({"event": "phase", "phase": "compile"})
        try:
            with _working_directory(root, request.get("cwd")):
                module = ember.compile(source, **options)
        except ember.EmberError as error:
            send({"event": "ember", "status": "ember-error", "error": describe_exception(error)})
            return
        except Exception as error:
            send({"event": "ember", "status": "exception", "error": describe_exception(error),
                  "phase": "compile"})
            return
        if given is not None and source.SerializeToString() != given:
            send({"event": "side-effect", "detail": "ember.compile changed the ModelProto it "
                                                    "was given"})
        try:
            model = onnx.load_model_from_string(request.get("oracle_data") or data)
            feeds = transform_feeds(build_feeds(model, request["seed_feeds"],
                                                request["overrides"]),
                                    request["feed_transform"])
        except Exception as error:
            send({"event": "harness-error", "error": describe_exception(error)})
            return
        send({"event": "phase", "phase": "run"})
        try:
            results = module.run(feeds)
            outputs = [np.asarray(results[name]) for name in module.output_names]
        except ember.EmberError as error:
            send({"event": "ember", "status": "ember-error", "error": describe_exception(error)})
            return
        except Exception as error:
            send({"event": "ember", "status": "exception", "error": describe_exception(error),
                  "phase": "run"})
            return
        send({"event": "ember", "status": "ok", "outputs": outputs})
        if request.get("sentinel"):
            send({"event": "phase", "phase": "sentinel"})
            _check_sentinel(module, outputs, request["sentinel"], root, send)
        send({"event": "phase", "phase": "oracle"})
        oracle_source: bytes | str = request.get("oracle_data") or source
        if isinstance(oracle_source, onnx.ModelProto):
            oracle_source = data
        send({"event": "oracle", **_run_oracles(request, oracle_source, model, feeds,
                                                outputs)})


def _model_source(request: dict[str, Any], root: Path
                  ) -> tuple[bytes, Any, dict[str, Any]]:
    """(the serialized model, what ember.compile gets, its keyword arguments): bytes, a
    ModelProto or a path, after laying out the case's files (``request["layout"]``) and
    putting the scratch directory's path where the case wrote ``fuzz.layout.SCRATCH``."""
    import onnx

    data: bytes = request["data"]
    if request["as_file"]:
        return data, _write_model_dir(root, data, request["files"]), {}
    layout = request.get("layout") or []
    if not layout and not request.get("source"):
        return data, data, {}
    materialize(layout, root)
    if SCRATCH.encode() in data:
        proto = onnx.load_model_from_string(data)
        for tensor_proto in _all_tensor_protos(proto):
            for entry in tensor_proto.external_data:
                entry.value = substitute(entry.value, root)
        data = proto.SerializeToString()
    for old, new in request.get("byte_patches") or []:
        data = data.replace(old, new)
    path = root / request["model_path"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    options: dict[str, Any] = {}
    if request.get("base_dir") is not None:
        options["base_dir"] = substitute(request["base_dir"], root)
    source = request.get("source") or "bytes"
    if source == "path":
        return data, str(path), options
    if source == "proto":
        return data, onnx.load_model_from_string(data), options
    return data, data, options


def _all_tensor_protos(proto) -> list:
    """Every TensorProto of a model: initializers, sparse initializers' parts, tensor
    attributes, in subgraphs and functions."""
    found = []

    def from_nodes(nodes) -> None:
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    found.append(attr.t)
                found.extend(attr.tensors)
                if attr.HasField("g"):
                    from_graph(attr.g)
                for graph in attr.graphs:
                    from_graph(graph)

    def from_graph(graph) -> None:
        found.extend(graph.initializer)
        for sparse in graph.sparse_initializer:
            found.extend([sparse.values, sparse.indices])
        from_nodes(graph.node)

    from_graph(proto.graph)
    for function in proto.functions:
        from_nodes(function.node)
    return found


@contextlib.contextmanager
def _working_directory(root: Path, relative: str | None):
    """Run inside ``root / relative`` (``None``: where the worker is)."""
    if relative is None:
        yield
        return
    previous = os.getcwd()
    os.chdir(root / relative)
    try:
        yield
    finally:
        os.chdir(previous)


def sentinel_windows(pattern: bytes) -> list[bytes]:
    """Every 16-byte window of the repeated ``pattern``: data read at any offset of a
    sentinel file shows one of them."""
    doubled = pattern * 2
    return [doubled[i:i + len(pattern)] for i in range(len(pattern))]


def find_sentinel(blob: bytes, windows: list[bytes]) -> bool:
    return any(window in blob for window in windows)


def _check_sentinel(module, outputs: list[np.ndarray], pattern: bytes, root: Path,
                    send: Send) -> None:
    """The sentinel planted outside the allowed directory must be in no output and in no
    file of an artifact saved from the module."""
    import ember

    windows = sentinel_windows(pattern)
    for index, output in enumerate(outputs):
        if output.dtype != object and find_sentinel(np.ascontiguousarray(output).tobytes(),
                                                    windows):
            send({"event": "leak", "where": f"output {index}"})
            return
    saved = root / "saved-artifact"
    try:
        module.save(saved)
    except ember.EmberError:
        return  # not every module can be saved; the outputs were checked
    except Exception as error:
        send({"event": "save-error", "error": describe_exception(error)})
        return
    for folder, _, names in os.walk(saved):
        for name in names:
            path = Path(folder) / name
            if path.is_file() and find_sentinel(path.read_bytes(), windows):
                send({"event": "leak", "where": f"saved artifact file {path.relative_to(saved)}"})
                return


def _write_model_dir(directory: Path, data: bytes, files: dict[str, bytes]) -> str:
    for name, content in files.items():
        (directory / name).write_bytes(content)
    path = directory / "model.onnx"
    path.write_bytes(data)
    return str(path)


def _run_oracles(request: dict[str, Any], source: bytes | str, model, feeds,
                 outputs: list[np.ndarray]) -> dict[str, Any]:
    import onnx

    from fuzz import oracle

    mode = request.get("oracle") or "onnx"
    if mode == "expected":
        verdict = oracle.judge(outputs, [oracle.OracleRun("expected", request["expected"])])
        return {"agrees": verdict.agrees, "ran": verdict.ran,
                "mismatches": verdict.mismatches, "rejections": [], "checker": "valid"}
    if mode == "impossible":
        return {"agrees": False, "ran": ["expected"], "rejections": [], "checker": "valid",
                "mismatches": ["expected: no result is possible in time (the model never "
                               "ends, or its output cannot fit in memory)"]}
    evaluated = model
    if request["as_file"]:
        try:
            evaluated = onnx.load(str(source))  # resolves external data like ember did
        except Exception as error:
            return {"agrees": False, "ran": [], "mismatches": [],
                    "rejections": [f"onnx.load: {type(error).__name__}: {error}"],
                    "checker": oracle.checker_verdict(model)}
    runs = [oracle.reference_evaluator(evaluated, feeds), oracle.onnxruntime(source, feeds)]
    verdict = oracle.judge(outputs, runs)
    return {"agrees": verdict.agrees, "ran": verdict.ran, "mismatches": verdict.mismatches,
            "rejections": verdict.rejections, "checker": oracle.checker_verdict(evaluated)}


# ---------------------------------------------------------------------------- artifact cases


def run_artifact_case(request: dict[str, Any], send: Send) -> None:
    import ember
    import ember.runtime
    from fuzz.feeds import transform_feeds

    loaders = {"ember.runtime.load": ember.runtime.load, "ember.load": ember.load}
    for name, load in loaders.items():
        send({"event": "phase", "phase": f"{name} (load)"})
        try:
            model = load(request["path"])
            send({"event": "phase", "phase": f"{name} (run)"})
            outputs = model.run(transform_feeds(request["feeds"], request["feed_transform"]))
            mismatch = bitwise_mismatch(outputs, request["expected"])
            send({"event": "loader", "loader": name, "status": "ok", "mismatch": mismatch})
        except ember.EmberError as error:
            send({"event": "loader", "loader": name, "status": "ember-error",
                  "error": describe_exception(error)})
        except Exception as error:
            send({"event": "loader", "loader": name, "status": "exception",
                  "error": describe_exception(error)})


def bitwise_mismatch(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> str:
    """Why ``actual`` is not bit-for-bit ``expected`` (empty if it is).  Outputs are compared
    in order: the names are the manifest's to choose (an edited name changes no value)."""
    if len(actual) != len(expected):
        return f"{len(actual)} outputs {list(actual)}, expected {list(expected)}"
    for index, (got, want) in enumerate(zip(actual.values(), expected.values(), strict=True)):
        got = np.asarray(got)
        if got.dtype != want.dtype or got.shape != want.shape:
            return (f"output {index}: {got.dtype}{list(got.shape)}, expected "
                    f"{want.dtype}{list(want.shape)}")
        if got.tobytes() != want.tobytes():
            return f"output {index}: values differ"
    return ""


# ---------------------------------------------------------------------------- preparation


def prepare_artifacts(request: dict[str, Any], send: Send) -> None:
    """Compile the base artifacts of a session and record their outputs on fixed inputs."""
    import ember
    from fuzz.seeds import seed

    prepared = {}
    for name in request["seeds"]:
        base = seed(name)
        path = Path(request["root"]) / name
        module = ember.compile(base.serialized())
        module.run(base.feeds)
        module.save(path)
        expected = ember.load(path).run(base.feeds)
        prepared[name] = {"path": str(path), "feeds": base.feeds, "expected": expected}
    send({"event": "prepared", "artifacts": prepared})


def misbehave(request: dict[str, Any], send: Send) -> None:
    """Crash, hang, exit or raise on demand: how the harness tests that it attributes each
    to the case (tests/fuzz/test_harness.py)."""
    import ctypes
    import time

    send({"event": "phase", "phase": "misbehave"})
    action = request["action"]
    if action == "segfault":
        ctypes.string_at(0)
    elif action == "hang":
        time.sleep(3600)
    elif action == "exit":
        os._exit(3)
    elif action == "raise":
        raise ValueError("misbehaving on purpose")


def run_cli_case(request: dict[str, Any], send: Send) -> None:
    from fuzz.worker_cli import run_cli_case as run

    run(request, send)


def run_save_case(request: dict[str, Any], send: Send) -> None:
    from fuzz.worker_save import run_save_case as run

    run(request, send)


HANDLERS: dict[str, Callable[[dict[str, Any], Send], None]] = {
    "model": run_model_case, "artifact": run_artifact_case, "prepare": prepare_artifacts,
    "misbehave": misbehave, "cli": run_cli_case, "save": run_save_case,
}


def main(argv: list[str]) -> int:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the session decides when workers stop
    replies = os.fdopen(int(argv[1]), "wb")
    requests = sys.stdin.buffer

    def send(message: dict[str, Any]) -> None:
        write_message(replies, message)

    import onnx.reference  # noqa: F401  (warm the imports every case needs)
    import onnxruntime  # noqa: F401

    import ember.api  # noqa: F401
    send({"event": "ready", "pid": os.getpid()})
    while (request := read_message(requests)) is not None:
        print(f"=== case {request.get('case', request['type'])}", file=sys.stderr, flush=True)
        try:
            HANDLERS[request["type"]](request, send)
        except Exception as error:  # a bug of the harness itself, reported as such
            send({"event": "harness-error", "error": describe_exception(error)})
        gc.collect()  # compiled modules sit in reference cycles; free their temporary files
        send({"event": "done"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
