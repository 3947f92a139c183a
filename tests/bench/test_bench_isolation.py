"""Each bench contender runs in a worker process of its own, timed in interleaved rounds.

The peers here are module-level classes, so a worker process (started with ``spawn``) can
unpickle them; what they report (their process id, their thread pools) is checked in the
parent.  The oracle for outputs is PyTorch eager, as in every bench run.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from ember.bench.isolation import IsolatedContender, Recipe, ContenderError
from ember.bench.peers import Prepared, Workload
from ember.bench.runner import Settings, run_case
from ember.bench.zoo import ZOO

from .test_bench_cli import EchoPeer


class PidPeer(EchoPeer):
    """Runs the torch model (as EchoPeer) and reports the process it was prepared in."""

    name, label = "pid", "pid"

    def prepare(self, workload: Workload) -> Prepared:
        echo = super().prepare(workload)
        return Prepared(echo.run, {"pid": os.getpid(), "threads": workload.threads})


class OtherPidPeer(PidPeer):
    name, label = "other", "other"


class DyingPeer(PidPeer):
    """A runtime that crashes the process while preparing (as a segfault would)."""

    name, label = "dying", "dying"

    def prepare(self, workload):
        os._exit(3)


class FailingPeer(PidPeer):
    name, label = "failing", "failing"

    def prepare(self, workload):
        raise RuntimeError("cannot compile this model\nsecond line of the error")


def test_each_contender_runs_in_a_process_of_its_own(zoo_cache):
    settings = Settings(size="tiny", rounds=3, warmup=1, budget_seconds=None,
                        cache_dir=zoo_cache, threads=1)
    peers = [PidPeer(), OtherPidPeer(), DyingPeer(), FailingPeer()]
    case = run_case(ZOO["mlp"], 1, ["torchscript"], peers, settings)
    mine, other = case.contenders["pid"], case.contenders["other"]
    pids = {mine.details["pid"], other.details["pid"]}
    assert len(pids) == 2 and os.getpid() not in pids
    assert mine.details["threads"] == 1  # the workload reached the worker whole
    for contender in (mine, other):
        assert contender.agreement.ok  # the worker's rebuilt model agrees with eager here
        assert len(contender.series.samples_ms) == 3
        assert all(sample > 0 for sample in contender.series.samples_ms)
        assert contender.setup_seconds is not None and contender.setup_seconds > 0
    assert case.orders == [["pid", "other"], ["other", "pid"], ["pid", "other"]]

    dying, failing = case.contenders["dying"], case.contenders["failing"]
    assert dying.error_stage == "prepare" and "died (exit code 3)" in dying.error
    assert failing.error_stage == "prepare"
    assert failing.error == "RuntimeError: cannot compile this model\nsecond line of the error"
    assert dying.series is None and failing.series is None


def _square(x: np.ndarray) -> Prepared:
    return Prepared(lambda inputs: [inputs["x"] * inputs["x"]])


def _broken_on_run() -> Prepared:
    def run(inputs):
        raise ValueError("bad input")
    return Prepared(run)


def test_a_worker_times_its_own_calls_and_reports_errors():
    x = np.arange(6, dtype=np.float32)
    with IsolatedContender(Recipe(_square, (x,)), {"x": x}, threads=1) as worker:
        np.testing.assert_array_equal(worker.outputs[0], x * x)
        assert worker.time_calls(5) > 0
        worker()  # one untimed call, as the harness's warm-up makes
    with pytest.raises(ContenderError, match="ValueError: bad input") as caught:
        IsolatedContender(Recipe(_broken_on_run), {"x": x}, threads=1)
    assert caught.value.stage == "run" and "Traceback" in caught.value.traceback


def test_a_recipe_that_cannot_be_pickled_is_a_clear_error():
    local = lambda: Prepared(lambda inputs: [])  # noqa: E731 -- a local object on purpose
    with pytest.raises(ContenderError, match="--in-process"):
        IsolatedContender(Recipe(local), {}, threads=1)
