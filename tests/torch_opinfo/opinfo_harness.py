"""PyTorch's OpInfo database as a conformance suite for ``torch.compile(backend="ember")``.

Every OpInfo of ``op_db`` that supports float32 on CPU gives sample inputs; each sample is
run eagerly (the oracle) and through ``torch.compile(fn, backend=<ember, counted>,
fullgraph=True)`` after ``torch._dynamo.reset()`` (otherwise Dynamo's recompile limit would
make later samples run eagerly, unnoticed).  A sample passes when:

* the backend was invoked (so the sample did not silently run in eager mode),
* ember compiled every ATen op of every graph it received (no fallback, no training graph),
* the outputs match eager within the OpInfo's tolerances (or this suite's per-op ones).

An OpInfo passes when all its samples that eager PyTorch accepts pass.  Tensors are passed as
arguments (not captured), so Dynamo traces them as graph inputs, as it would a model's.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import torch

DEFAULT_RTOL, DEFAULT_ATOL = 1e-4, 1e-5

# Per-OpInfo tolerances where ember's kernels differ from PyTorch's within what the op's
# numerics allow: (rtol, atol), with the reason.
TOLERANCES: dict[str, tuple[float, float, str]] = {
    "pow": (1e-4, 1e-4, "x**y through exp/log in float32"),
    "float_power": (1e-4, 1e-4, "x**y through exp/log"),
    "special.i0": (1e-4, 1e-4, "series evaluation"),
    "nn.functional.gelu": (1e-4, 1e-5, "erf with 2.4 ulp"),
    "var": (1e-4, 1e-4, "float64 accumulation in ember, float32 in PyTorch"),
    "std": (1e-4, 1e-4, "float64 accumulation in ember, float32 in PyTorch"),
    "var_mean": (1e-4, 1e-4, "float64 accumulation in ember, float32 in PyTorch"),
    "std_mean": (1e-4, 1e-4, "float64 accumulation in ember, float32 in PyTorch"),
    "cumprod": (1e-4, 1e-4, "products of many factors"),
    "prod": (1e-4, 1e-4, "products of many factors"),
}


# Ops whose results are uninitialized memory: only shapes and dtypes are compared.
UNINITIALIZED = frozenset({"empty", "empty_like", "new_empty", "new_empty_strided",
                           "empty_strided", "empty_permuted"})


@dataclass
class SampleResult:
    status: str  # pass | fallback | eager | mismatch | error | skipped
    detail: str = ""


@dataclass
class OpResult:
    name: str
    status: str  # pass | fail | skipped
    samples: int
    detail: str = ""


def float32_ops() -> list[Any]:
    """The OpInfos that run float32 on CPU (variants included), by full name."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    ops = [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]
    return sorted(ops, key=op_name)


def op_name(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def samples_of(op: Any, limit: int) -> Iterator[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        for i, sample in enumerate(op.sample_inputs("cpu", torch.float32,
                                                    requires_grad=False)):
            if i >= limit:
                return
            yield sample


class _CountingBackend:
    """The ember backend, counting invocations and collecting each graph's report."""

    def __init__(self) -> None:
        from ember.torch_backend import REPORTS

        self.calls = 0
        self.start = len(REPORTS)

    def __call__(self, gm, example_inputs):
        from ember.torch_backend import ember_backend

        self.calls += 1
        return ember_backend(gm, example_inputs)

    def reports(self):
        from ember.torch_backend import REPORTS

        return REPORTS.since(self.start)


def _flatten(sample: Any) -> tuple[list[torch.Tensor], Any]:
    leaves, spec = torch.utils._pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    return tensors, (leaves, spec)


def _rebuild(tensors: list[torch.Tensor], structure: Any) -> tuple[Any, tuple, dict]:
    leaves, spec = structure
    it = iter(tensors)
    filled = [next(it) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    return torch.utils._pytree.tree_unflatten(filled, spec)


def run_sample(op: Any, sample: Any) -> SampleResult:
    import torch._dynamo

    tensors, structure = _flatten(sample)
    if not tensors:
        return SampleResult("skipped", "no tensor inputs")

    def call(*arrays: torch.Tensor) -> Any:
        first, args, kwargs = _rebuild(list(arrays), structure)
        return op.op(first, *args, **kwargs)

    with torch.no_grad():
        try:
            expected = call(*[t.clone() for t in tensors])
        except Exception as error:  # noqa: BLE001 -- eager rejects the sample itself
            return SampleResult("skipped", f"eager raises {type(error).__name__}")
        torch._dynamo.reset()
        backend = _CountingBackend()
        compiled = torch.compile(call, backend=backend, fullgraph=True)
        try:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(), \
                    _without_seed_wrapper():
                warnings.simplefilter("ignore")
                actual = compiled(*[t.clone() for t in tensors])
        except Exception as error:  # noqa: BLE001 -- recorded as this sample's failure
            return SampleResult("error", _first_cause(error))
    if backend.calls == 0:
        return SampleResult("eager", "the backend was not invoked")
    for report in backend.reports():
        if not report.compiled:
            return SampleResult("fallback", report.reason)
        if report.fallbacks or report.references:  # a numpy reference is not compiled
            first = (report.fallbacks or report.references)[0]
            return SampleResult("fallback", f"{first.op}: {first.reason}"[:300])
    if op_name(op) in UNINITIALIZED:
        expected = torch.utils._pytree.tree_map(
            lambda t: torch.zeros_like(t) if isinstance(t, torch.Tensor) else t, expected)
        actual = torch.utils._pytree.tree_map(
            lambda t: torch.zeros_like(t) if isinstance(t, torch.Tensor) else t, actual)
    rtol, atol, _ = TOLERANCES.get(op_name(op), (DEFAULT_RTOL, DEFAULT_ATOL, ""))
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True,
                                   check_device=False)
    except (AssertionError, TypeError, ValueError, RuntimeError) as error:
        return SampleResult("mismatch", " ".join(str(error).split())[:300])
    return SampleResult("pass")


@contextlib.contextmanager
def _without_seed_wrapper() -> Iterator[None]:
    """Let Dynamo trace the ops that OpInfo wraps in ``wrapper_set_seed`` (dropout, item,
    scaled_dot_product_attention ...): that wrapper saves and restores the generator state,
    which Dynamo cannot trace, so the compiled call runs the op unwrapped (eager, the oracle,
    keeps the wrapper).  Samples that really draw random numbers then differ from eager and
    fail as mismatches, which they are."""
    from torch.testing._internal import common_methods_invocations as database

    def call_directly(op: Any, *args: Any, **kwargs: Any) -> Any:
        return op(*args, **kwargs)

    saved = database.wrapper_set_seed
    database.wrapper_set_seed = call_directly
    try:
        yield
    finally:
        database.wrapper_set_seed = saved


def _first_cause(error: BaseException) -> str:
    """The innermost exception's type and first line (Dynamo wraps the backend's errors)."""
    while error.__cause__ is not None:
        error = error.__cause__
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    inner = getattr(error, "inner_exception", None)
    if inner is not None:
        return _first_cause(inner)
    text = " ".join(lines[:2])
    return f"{type(error).__name__}: {text}"[:300]


def run_op(op: Any, limit: int) -> OpResult:
    name = op_name(op)
    count = 0
    try:
        samples = list(samples_of(op, limit))
    except Exception as error:  # noqa: BLE001 -- an OpInfo whose samples fail to build
        return OpResult(name, "skipped", 0, f"samples: {type(error).__name__}")
    for sample in samples:
        result = run_sample(op, sample)
        if result.status == "skipped":
            continue
        count += 1
        if result.status != "pass":
            return OpResult(name, "fail", count, f"{result.status}: {result.detail}")
    if count == 0:
        return OpResult(name, "skipped", 0, "no sample eager PyTorch accepts")
    return OpResult(name, "pass", count)
