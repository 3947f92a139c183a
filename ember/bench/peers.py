"""The contenders: ember and the runtimes users would otherwise pick, behind one interface.

Every peer is a small class with ``name`` (the key on the command line and in JSON),
``label`` (the table column), ``source`` ("onnx": it runs an exported file, so it is timed
once per exporter; "torch": it runs the torch module itself), ``version()``,
``available()``/``unavailable_reason()`` and ``prepare(workload)``, which returns a
:class:`Prepared` callable: numpy inputs (a dict name -> array) in, the list of outputs out.

All peers run fp32 on the CPU with the same intra-op thread count, set explicitly for each
(``Workload.threads``): ORT's session options, OpenVINO's ``INFERENCE_NUM_THREADS`` (one
stream, f32 precision hint: on CPUs with bf16 support OpenVINO would otherwise pick bf16),
``torch.set_num_threads`` for eager and inductor, ``Module.set_num_threads`` for ember.  Each
takes its inputs and returns its outputs as numpy arrays, so all pay their binding costs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from ember.bench.zoo import BuiltModel

Inputs = Mapping[str, np.ndarray]


@dataclass
class Workload:
    """What a peer prepares: the zoo model (torch module, inputs) and, for ONNX peers, the
    exported file of one exporter.  ``built`` is None for a workload that only exists as an
    ONNX file (``ember bench --ops``'s single-op models): the ONNX peers never read it."""

    model: str
    built: BuiltModel | None
    threads: int
    onnx_path: str | None = None
    exporter: str | None = None
    # Compile without the compilers' caches (ember's library cache, inductor's caches), so
    # that the setup time is a first compile even on a rerun.
    cold_compile: bool = False
    # Let ONNX Runtime's idle workers keep spinning after a run (its default; see
    # OnnxRuntimePeer): only fair on a machine with a core to spare for them.
    ort_spin: bool = False
    # The tuning database the "ember-tuned" contender compiles with (ember tune's).
    tuning_db: str | None = None


@dataclass
class Prepared:
    """A ready-to-run contender: call it on the inputs; ``details`` holds what the report
    should show about it (ember: node and fallback counts)."""

    run: Callable[[Inputs], list[np.ndarray]]
    details: dict[str, Any] = field(default_factory=dict)

    def __call__(self, inputs: Inputs) -> list[np.ndarray]:
        return self.run(inputs)


class Peer:
    """The interface of a contender (see the module docstring)."""

    name = ""
    label = ""
    source = "onnx"  # or "torch"
    requires: tuple[str, ...] = ()  # importable modules it needs
    opt_in = False  # run only when named in --peers (a variant of another contender)

    def available(self) -> bool:
        return not self.unavailable_reason()

    def unavailable_reason(self) -> str:
        """Why this peer cannot run here ("" when it can)."""
        missing = [m for m in self.requires if importlib.util.find_spec(m) is None]
        if missing:
            return f"not installed ({', '.join(missing)}); pip install -e '.[bench]'"
        return ""

    def version(self) -> str:
        raise NotImplementedError

    def prepare(self, workload: Workload) -> Prepared:
        raise NotImplementedError


def _only(inputs: Inputs, names: list[str]) -> dict[str, np.ndarray]:
    """The inputs a model declares (an exporter may drop an input the graph never reads)."""
    return {name: inputs[name] for name in names}


def _built(workload: Workload) -> BuiltModel:
    if workload.built is None:
        raise ValueError(f"{workload.model}: a torch peer needs the torch model, and this "
                         f"workload is an ONNX file only")
    return workload.built


def _onnx_path(workload: Workload) -> str:
    if workload.onnx_path is None:
        raise ValueError(f"{workload.model}: an ONNX peer needs an exported file")
    return workload.onnx_path


# --------------------------------------------------------------------------- ember


class EmberPeer(Peer):
    name, label = "ember", "ember"

    def version(self) -> str:
        import ember

        return ember.__version__

    def _compile_options(self, workload: Workload) -> dict[str, Any]:
        """What this contender passes to ``ember.compile`` beyond the model."""
        return {}

    def prepare(self, workload: Workload) -> Prepared:
        import ember
        from ember.toolchain import stats

        hits_before = stats.cache_hits
        with _fresh_ember_cache(workload.cold_compile):
            module = ember.compile(_onnx_path(workload), **self._compile_options(workload))
        library_cached = stats.cache_hits > hits_before
        module.set_num_threads(workload.threads)
        build = module.build
        names, outputs = module.input_names, module.output_names
        fallbacks = [f"{impl.node.op} '{impl.node.name}': {impl.reason}"
                     for impl in build.host_nodes]

        def run(inputs: Inputs) -> list[np.ndarray]:
            results = module.run(_only(inputs, names))
            return [results[name] for name in outputs]

        return Prepared(run, {"nodes": len(build.impls), "fallbacks": len(fallbacks),
                              "fallback_nodes": fallbacks, "build_seconds": build.seconds,
                              "library_from_cache": library_cached})


@contextlib.contextmanager
def _fresh_ember_cache(enabled: bool) -> Iterator[None]:
    """While compiling, point ember's compile cache ($EMBER_CACHE_DIR) at an empty
    temporary directory, so the C compiler really runs; the loaded module keeps its own copy
    of the library."""
    if not enabled:
        yield
        return
    previous = os.environ.get("EMBER_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="ember-bench-cold-") as directory:
        os.environ["EMBER_CACHE_DIR"] = directory
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop("EMBER_CACHE_DIR", None)
            else:
                os.environ["EMBER_CACHE_DIR"] = previous


# --------------------------------------------------------------------------- ONNX Runtime


class OnnxRuntimePeer(Peer):
    """ONNX Runtime as deployed on CPU: all graph optimizations, sequential execution,
    ``threads`` intra-op threads, one inter-op thread.  Its workers spin within a run, as by
    default, but stop spinning when the run returns (``session.force_spinning_stop``):
    otherwise they keep spinning for hundreds of milliseconds after every call, and on a
    2-core machine whichever contender runs next loses a core (ember's 128x768x3072 GEMM
    measured 13.5 ms 10 ms after an ORT run, 5.2 ms with this option).  ORT itself is not
    slower for it on a model of milliseconds; on a sub-millisecond one it pays for waking its
    workers at every run (the MLP at batch 1: 0.14 ms with spinning, 0.25 ms without), which
    ``Workload.ort_spin`` (``ember bench --ort-spin``) avoids on a machine with cores to
    spare."""

    name, label = "onnxruntime", "ORT"
    requires = ("onnxruntime",)

    def version(self) -> str:
        import onnxruntime

        return onnxruntime.__version__

    def prepare(self, workload: Workload) -> Prepared:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = workload.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # errors only
        if not workload.ort_spin:
            options.add_session_config_entry("session.force_spinning_stop", "1")
        session = ort.InferenceSession(_onnx_path(workload), options,
                                       providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]

        def run(inputs: Inputs) -> list[np.ndarray]:
            return list(session.run(None, _only(inputs, names)))

        stops = _ort_config(session, "session.force_spinning_stop") == "1"
        return Prepared(run, {"idle_workers": "stop spinning after each run" if stops
                              else "spin"})


def _ort_config(session: Any, key: str) -> str:
    """A session config entry as the session holds it ("" when unset)."""
    try:
        return session.get_session_options().get_session_config_entry(key)
    except Exception:  # noqa: BLE001 -- ORT raises a plain Fail for an unset key
        return ""


# --------------------------------------------------------------------------- OpenVINO


class OpenVinoPeer(Peer):
    """OpenVINO's CPU plugin, latency mode: one stream, ``threads`` inference threads, fp32.

    CPU pinning is off: the bench shares its cores with the other contenders' thread pools in
    one process, and pinned workers measurably slowed the next contender's samples.
    """

    name, label = "openvino", "OpenVINO"
    requires = ("openvino",)

    def version(self) -> str:
        import openvino

        return openvino.get_version().split("-")[0]

    def prepare(self, workload: Workload) -> Prepared:
        import openvino

        core = openvino.Core()
        config = {"INFERENCE_NUM_THREADS": workload.threads, "NUM_STREAMS": 1,
                  "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32",
                  "ENABLE_CPU_PINNING": False}
        compiled = core.compile_model(core.read_model(_onnx_path(workload)), "CPU", config)
        request = compiled.create_infer_request()
        names = [port.get_any_name() for port in compiled.inputs]
        outputs = list(compiled.outputs)

        def run(inputs: Inputs) -> list[np.ndarray]:
            results = request.infer(_only(inputs, names), share_inputs=True, share_outputs=False)
            return [np.asarray(results[port]) for port in outputs]

        return Prepared(run)


# --------------------------------------------------------------------------- PyTorch


def _torch_runner(function: Callable[..., Any]) -> Callable[[Inputs], list[np.ndarray]]:
    """Call a torch module (or its compiled form) on numpy inputs, in inference mode."""
    import torch

    def run(inputs: Inputs) -> list[np.ndarray]:
        with torch.inference_mode():
            result = function(*(torch.from_numpy(array) for array in inputs.values()))
        tensors = result if isinstance(result, (tuple, list)) else (result,)
        return [tensor.detach().numpy() for tensor in tensors]

    return run


class TorchEagerPeer(Peer):
    name, label = "torch", "torch"
    source = "torch"
    requires = ("torch",)

    def version(self) -> str:
        import torch

        return torch.__version__

    def prepare(self, workload: Workload) -> Prepared:
        import torch

        torch.set_num_threads(workload.threads)
        return Prepared(_torch_runner(_built(workload).module))


class TorchCompilePeer(Peer):
    """``torch.compile`` with the inductor backend (static shapes).  It compiles on the first
    call, which ``prepare`` makes, so that ``cold_compile`` can turn inductor's caches off
    for exactly that compile."""

    name, label = "torch_compile", "inductor"
    source = "torch"
    requires = ("torch",)

    def unavailable_reason(self) -> str:
        reason = super().unavailable_reason()
        if not reason and not (shutil.which("c++") or shutil.which("g++")):
            reason = "inductor needs a C++ compiler (c++/g++) on PATH"
        return reason

    def version(self) -> str:
        import torch

        return torch.__version__

    def prepare(self, workload: Workload) -> Prepared:
        import torch

        torch.set_num_threads(workload.threads)
        built = _built(workload)
        compiled = torch.compile(built.module, backend="inductor", dynamic=False)
        run = _torch_runner(compiled)
        with torch.compiler.config.patch(force_disable_caches=workload.cold_compile):
            run(built.inputs)  # compiles
        return Prepared(run)


class EmberTorchCompilePeer(Peer):
    """``torch.compile`` with ember's backend (static shapes): the torch module itself,
    through Dynamo and AOT autograd, its ATen graph compiled by ember.  Like inductor, it
    compiles on the first call, which ``prepare`` makes."""

    name, label = "ember_torch", "ember (torch.compile)"
    source = "torch"
    requires = ("torch",)

    def version(self) -> str:
        import ember

        return ember.__version__

    def prepare(self, workload: Workload) -> Prepared:
        import torch

        from ember.torch_backend import REPORTS, ember_backend

        torch.set_num_threads(workload.threads)
        built = _built(workload)
        start = len(REPORTS)
        compiled = torch.compile(built.module, backend=ember_backend, dynamic=False,
                                 options={"threads": workload.threads})
        run = _torch_runner(compiled)
        with _fresh_ember_cache(workload.cold_compile):
            run(built.inputs)  # compiles
        reports = REPORTS.since(start)
        fallbacks = [f"{f.op} '{f.node}': {f.reason}" for r in reports for f in r.fallbacks]
        fallbacks += [f"graph {r.index}: {r.reason}" for r in reports if not r.compiled]
        return Prepared(run, {"fallbacks": len(fallbacks), "fallback_nodes": fallbacks})


class EmberTunedPeer(EmberPeer):
    """ember with the configs ``ember tune`` recorded (``ember bench --tuning-db DB``)."""

    name, label = "ember-tuned", "ember (tuned)"
    opt_in = True

    def _compile_options(self, workload: Workload) -> dict[str, Any]:
        if not workload.tuning_db:
            raise ValueError("the ember-tuned contender needs --tuning-db DB (made by "
                             "ember tune)")
        return {"tuning_db": workload.tuning_db}


class EmberPredictedPeer(EmberPeer):
    """ember with the configs the tuner's cost model picks, nothing measured."""

    name, label = "ember-predicted", "ember (predicted)"
    requires = ("lightgbm",)
    opt_in = True

    def _compile_options(self, workload: Workload) -> dict[str, Any]:
        return {"schedule": "predicted"}


# --------------------------------------------------------------------------- registry


PEERS: dict[str, type[Peer]] = {peer.name: peer for peer in (
    EmberPeer, EmberTunedPeer, EmberPredictedPeer, TorchEagerPeer, TorchCompilePeer,
    EmberTorchCompilePeer, OnnxRuntimePeer, OpenVinoPeer)}
