"""The oracle for models ember accepts: ONNX's reference evaluator and ONNX Runtime on the
same mutated model and inputs, and what ``onnx.checker`` thinks of the model.

Two independent implementations make a "wrong result" verdict trustworthy: ember is only
called wrong when every oracle that runs the model disagrees with it, so a bug in one oracle
(the reference evaluator has a few) does not become a report against ember.  When no oracle
accepts the model, the case is "accepted, oracle rejects": ember ran something the reference
implementations refuse, which deserves a look but is not always a bug.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx

RTOL = 1e-4
ATOL = 1e-5


@dataclass
class OracleRun:
    """One oracle's outputs (in graph-output order), or why it refused the model."""

    name: str
    outputs: list[np.ndarray] | None = None
    error: str = ""


@dataclass
class OracleVerdict:
    """What the oracles say about ember's outputs."""

    agrees: bool                 # some oracle ran and matched ember
    ran: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)  # per oracle that ran, why not equal
    rejections: list[str] = field(default_factory=list)  # per oracle that refused, why
    checker: str = ""            # onnx.checker's verdict on the model


def reference_evaluator(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> OracleRun:
    from onnx.reference import ReferenceEvaluator

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outputs = ReferenceEvaluator(model).run(None, feeds)
        return OracleRun("reference", [np.asarray(o) for o in outputs])
    except Exception as error:  # the oracle refusing the model is a result, not a crash
        return OracleRun("reference", error=_describe(error))


def onnxruntime(model: bytes | str, feeds: dict[str, np.ndarray]) -> OracleRun:
    """ONNX Runtime on the serialized model, or on its path (to resolve external data)."""
    import onnxruntime as ort

    try:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 4
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        outputs = session.run(None, {k: v for k, v in feeds.items() if k in names})
        return OracleRun("onnxruntime", [np.asarray(o) for o in outputs])
    except Exception as error:
        return OracleRun("onnxruntime", error=_describe(error))


def checker_verdict(model: onnx.ModelProto) -> str:
    try:
        onnx.checker.check_model(model, full_check=True)
        return "valid"
    except Exception as error:
        return _describe(error)


def judge(ember_outputs: list[np.ndarray], runs: list[OracleRun]) -> OracleVerdict:
    verdict = OracleVerdict(agrees=False)
    for run in runs:
        if run.outputs is None:
            verdict.rejections.append(f"{run.name}: {run.error}")
            continue
        verdict.ran.append(run.name)
        mismatch = compare_outputs(ember_outputs, run.outputs)
        if mismatch:
            verdict.mismatches.append(f"{run.name}: {mismatch}")
        else:
            verdict.agrees = True
    return verdict


def compare_outputs(actual: list[np.ndarray], expected: list[np.ndarray]) -> str:
    """Why ``actual`` differs from ``expected`` (empty if they agree within tolerance)."""
    if len(actual) != len(expected):
        return f"ember gives {len(actual)} outputs, the oracle {len(expected)}"
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        got, want = np.asarray(got), np.asarray(want)
        if got.shape != want.shape:
            return f"output {index}: ember gives shape {got.shape}, the oracle {want.shape}"
        if got.dtype != want.dtype and not (got.dtype.kind in "OUS" and want.dtype.kind in "OUS"):
            return f"output {index}: ember gives {got.dtype}, the oracle {want.dtype}"
        problem = _compare_values(got, want)
        if problem:
            return f"output {index}: {problem}"
    return ""


def _compare_values(got: np.ndarray, want: np.ndarray) -> str:
    if got.dtype.kind in "OUS" or want.dtype.kind in "OUS":
        equal = got.astype(str).tolist() == want.astype(str).tolist()
        return "" if equal else "strings differ"
    if got.dtype.kind in "biu" and want.dtype.kind in "biu":
        bad = np.count_nonzero(got != want)
        return f"{bad} of {got.size} elements differ" if bad else ""
    if got.dtype.kind == "c":  # compare real and imaginary parts as floats
        got = np.concatenate([got.real.ravel(), got.imag.ravel()])
        want = np.concatenate([want.real.ravel(), want.imag.ravel()])
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    close = np.isclose(got64, want64, rtol=RTOL, atol=ATOL, equal_nan=True)
    bad = np.count_nonzero(~close)
    if not bad:
        return ""
    with np.errstate(invalid="ignore"):
        worst = np.nanmax(np.abs(got64 - want64)) if got64.size else 0.0
    return f"{bad} of {got.size} elements differ (max abs diff {worst:.3g})"


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(error).__name__}: {first[:300]}"
