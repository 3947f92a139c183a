"""Fixtures shared by test directories."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, ContextManager, Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


# K of the profiled model's TopK: more than the compiled TopK selects from a long line.
PROFILED_TOP_K = 9


@pytest.fixture(scope="session")
def profiled_model() -> Callable[..., onnx.ModelProto]:
    """A builder of the model the profiler tests time: x[batch, k] -> MatMul w[k, n] ->
    TopK(k=``.top_k``, smallest: a numpy fallback step where n > 512, a line longer than
    the compiled TopK sorts) -> Relu -> y, and the TopK indices.  ``batch`` may be a symbol
    name."""

    def build(batch: int | str, k_size: int, n_size: int) -> onnx.ModelProto:
        rng = np.random.default_rng(0)
        w = numpy_helper.from_array(
            rng.standard_normal((k_size, n_size)).astype(np.float32), "w")
        k = numpy_helper.from_array(np.array([PROFILED_TOP_K], np.int64), "k")
        nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="project"),
                 helper.make_node("TopK", ["h", "k"], ["values", "indices"], axis=1,
                                  largest=0, name="best"),
                 helper.make_node("Relu", ["values"], ["y"], name="clamp")]
        graph = helper.make_graph(
            nodes, "profiled",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, k_size])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, PROFILED_TOP_K]),
             helper.make_tensor_value_info("indices", TensorProto.INT64,
                                           [batch, PROFILED_TOP_K])],
            initializer=[w, k])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    build.top_k = PROFILED_TOP_K
    return build


@pytest.fixture(scope="session")
def run_sanitized() -> Callable[..., str]:
    """Run a Python script (given as source) in a child process with the ASan runtime
    preloaded, as a library built with ``sanitize=True`` needs inside a normal Python; the
    repository root is its first argument.  Fails on a non-zero exit or any sanitizer report
    (ASan aborts, UBSan halts); returns the child's standard output."""
    from ember.toolchain.compiler import sanitizer_preload

    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, LD_PRELOAD=sanitizer_preload(),
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")

    def run(script: str, *args: str, timeout: float = 600) -> str:
        result = subprocess.run([sys.executable, "-c", script, root, *args], env=env,
                                capture_output=True, text=True, timeout=timeout)
        report = result.stdout[-3000:] + result.stderr[-6000:]
        assert result.returncode == 0, report
        assert "runtime error" not in result.stderr, report  # UBSan reports
        return result.stdout

    return run


# What ember.Module logs when it compiles: a specialization for one set of shapes, or one
# build for every size of some dims (ember/api.py).
BUILD_MESSAGES = ("compiling a specialization", "compiling once for every size")


@pytest.fixture
def logged_builds(caplog) -> Callable[[], list[str]]:
    """The compilations ember's modules logged so far in the test, as messages."""
    import logging

    caplog.set_level(logging.INFO, logger="ember")

    def builds() -> list[str]:
        return [message for message in (record.getMessage() for record in caplog.records)
                if any(phrase in message for phrase in BUILD_MESSAGES)]

    return builds


@pytest.fixture(scope="session")
def deadline() -> Callable[[int], ContextManager[None]]:
    """``with deadline(seconds):`` fails the test (instead of hanging the suite) if the block
    runs longer than ``seconds``: how tests of ember's bounds on hostile models show that
    the work stops."""
    import signal

    @contextlib.contextmanager
    def within(seconds: int) -> Iterator[None]:
        def expire(signum, frame):
            pytest.fail(f"still running after {seconds} s: the work is not bounded")

        previous = signal.signal(signal.SIGALRM, expire)
        signal.alarm(seconds)
        try:
            yield
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)

    return within


@pytest.fixture
def nchw_convolutions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dense convolutions stay in NCHW (``block_convolutions`` blocks none): for tests of the
    im2col GEMM paths, which every convolution the blocked layout does not take (groups,
    channels that are not whole vectors, sizes known only at run time) still runs on."""
    from ember.passes import pipeline

    monkeypatch.setattr(pipeline, "block_convolutions", lambda graph, target: 0)
