"""Benchmark each configuration alone: prepare and check every contender against ONNX
Runtime, then time them in one interleaved measurement (:mod:`ember.bench.timing`), each
in a worker process of its own unless ``Settings.isolate`` is off (:mod:`ember.bench.isolation`).

ORT is the reference: ember's and mkl's outputs must match its output with ``rtol`` and an
``atol`` scaled by the output's magnitude (random K=3072 dot products are O(50)).  Nothing
here stops at a contender's failure: it is recorded in the row.
"""

from __future__ import annotations

import gc
import math
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from ember.bench.ops.configs import ConfigUse
from ember.bench.ops.single import build_single_op, prepare_torch_matmul, single_op_flops
from ember.bench.isolation import ContenderError, InProcessContender, IsolatedContender, Recipe
from ember.bench.peers import EmberPeer, OnnxRuntimePeer, Workload
from ember.bench.runner import Log, Settings
from ember.bench.timing import Agreement, Series, compare_outputs, measure_interleaved

CONTENDERS = ("ember", "onnxruntime", "mkl")
LABELS = {"ember": "ember", "onnxruntime": "ORT", "mkl": "mkl"}


@dataclass
class OpResult:
    """One configuration measured: each contender's series, its agreement with ORT, its
    failure (``"prepare: ..."`` / ``"run: ..."``) and ember's build details.  ``error`` is
    set when the single-op model itself could not be built (then nothing ran)."""

    use: ConfigUse
    summary: str
    flops: int | None = None
    error: str | None = None
    series: dict[str, Series] = field(default_factory=dict)
    agreement: dict[str, Agreement] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    setup_seconds: dict[str, float] = field(default_factory=dict)
    ember_details: dict[str, Any] = field(default_factory=dict)

    def median_ms(self, contender: str) -> float | None:
        series = self.series.get(contender)
        return series.median if series is not None and series.samples_ms else None

    @property
    def ratio(self) -> float | None:
        """ORT's median over ember's: above 1, ember is that many times faster."""
        ember, ort = self.median_ms("ember"), self.median_ms("onnxruntime")
        return ort / ember if ember and ort else None

    @property
    def zoo_ms(self) -> float | None:
        """count x ORT's time: what this configuration costs the selected zoo under ORT."""
        ort = self.median_ms("onnxruntime")
        return None if ort is None else ort * self.use.count

    def gflops(self, contender: str = "ember") -> float | None:
        median = self.median_ms(contender)
        return self.flops / median / 1e6 if self.flops and median else None

    @property
    def failed(self) -> bool:
        return self.error is not None or bool(self.errors)

    @property
    def mismatch(self) -> bool:
        return any(not agreement.ok for agreement in self.agreement.values())


def run_ops(uses: Sequence[ConfigUse], settings: Settings, *, with_mkl: bool = True,
            log: Log = lambda message: None) -> list[OpResult]:
    """Benchmark every configuration in turn (in the given order)."""
    results = []
    with tempfile.TemporaryDirectory(prefix="ember-bench-ops-") as directory:
        for index, use in enumerate(uses, 1):
            log(f"[{index}/{len(uses)}] {use.config.summary()} (x{use.count}) ...")
            result = run_op(use, settings, Path(directory) / f"op{index}.onnx",
                            with_mkl=with_mkl)
            log("  " + _outcome(result))
            results.append(result)
    return results


def run_op(use: ConfigUse, settings: Settings, path: Path, *, with_mkl: bool = True
           ) -> OpResult:
    """One configuration: build, prepare and check every contender, then time them in one
    interleaved measurement.  ORT is the reference: without it the row has no timing."""
    config = use.config
    result = OpResult(use, config.summary())
    try:
        single = build_single_op(config)
        result.flops = single_op_flops(single)
    except Exception as error:  # noqa: BLE001 -- reported in the row
        result.error = f"building the single-op model failed: {_text(error)}"
        return result
    onnx.save(single.model, str(path))
    workload = Workload(result.summary, None, settings.threads, str(path), "single-op",
                        ort_spin=settings.ort_spin)

    recipes: dict[str, Recipe] = {
        "onnxruntime": Recipe(OnnxRuntimePeer().prepare, (workload,)),
        "ember": Recipe(EmberPeer().prepare, (workload,))}
    if with_mkl and config.op in ("MatMul", "Gemm"):
        recipes["mkl"] = Recipe(prepare_torch_matmul, (single, settings.threads))

    ready: dict[str, Callable[[], Any]] = {}
    reference: list[np.ndarray] | None = None
    with ExitStack() as running:
        for name, recipe in recipes.items():  # ORT first: it is the reference
            run = _start(name, recipe, single.feeds, settings, result)
            if run is None:
                continue
            running.callback(run.close)
            if name == "onnxruntime":
                reference = run.outputs
            elif reference is not None:
                result.agreement[name] = _agree(reference, run.outputs, settings)
            ready[name] = run
        if "onnxruntime" not in ready:
            return result  # no reference, no ratio: the row shows ORT's error
        measurement = measure_interleaved(ready, settings.rounds, settings.warmup,
                                          budget_seconds=settings.budget_seconds)
        result.series = measurement.series
        del ready
    gc.collect()  # free the compiled module before the next configuration
    return result


def _start(name: str, recipe: Recipe, feeds: Mapping[str, np.ndarray], settings: Settings,
           result: OpResult) -> IsolatedContender | InProcessContender | None:
    """Prepare a contender (in a worker process unless ``settings.isolate`` is off) and run it
    once; None, with the error in the row, when it failed."""
    try:
        run = IsolatedContender(recipe, feeds, settings.threads) if settings.isolate \
            else InProcessContender(recipe, feeds)
    except ContenderError as error:
        result.errors[name] = f"{error.stage}: {error}"
        return None
    if name == "ember":
        result.ember_details = run.details
    result.setup_seconds[name] = run.setup_seconds
    return run


def _agree(reference: list[np.ndarray], outputs: list[np.ndarray],
           settings: Settings) -> Agreement:
    """``np.allclose`` with ``rtol`` and ``atol`` relative to the output's scale (its largest
    magnitude): a sum of K random products is O(sqrt(K)), and a fixed atol would flag
    float32 rounding on big K as a wrong result."""
    scale = max((float(np.max(np.abs(r))) for r in reference if r.size), default=1.0)
    scale = scale if math.isfinite(scale) and scale > 0 else 1.0
    return compare_outputs(reference, outputs, settings.rtol, settings.atol * scale)


def _outcome(result: OpResult) -> str:
    if result.error:
        return result.error
    parts = []
    for name in CONTENDERS:
        median = result.median_ms(name)
        if name in result.errors:
            parts.append(f"{LABELS[name]} {result.errors[name].splitlines()[0][:120]}")
        elif median is not None:
            parts.append(f"{LABELS[name]} {median:.3f} ms")
    ratio = result.ratio
    if ratio is not None:
        parts.append(f"ORT/ember {ratio:.2f}x")
    if result.mismatch:
        parts.append("MISMATCH")
    return ", ".join(parts) or "nothing ran"


def _text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".strip()
