"""A Loop of a model file cannot run forever: one run makes at most EMBER_MAX_LOOP_ITERATIONS
iterations, in the reference executor and in a compiled model (whose Loop is a host node
running the same reference), and one that would make more is an ExecutionError naming the
node, the bound and how to raise it.

A trip count of 2**62 without a condition input is refused before the first iteration; a
condition that stays true (with a huge trip count or none) is stopped at the bound.  Loops up to
the bound give onnx's ReferenceEvaluator's results.
"""

from __future__ import annotations


import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.core.config import (DEFAULT_MAX_LOOP_ITERATIONS, MAX_LOOP_ITERATIONS_ENV,
                               max_loop_iterations, parse_count)
from ember.core.errors import ConfigError, ExecutionError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
MODES = ("reference", "compiled")
V0 = np.array([0.0], np.float32)


@pytest.fixture(autouse=True)
def _default_bound(monkeypatch):
    """Every test starts from the default bound, whatever the environment says."""
    monkeypatch.delenv(MAX_LOOP_ITERATIONS_ENV, raising=False)


def _loop_model(trips: int | None, cond: bool, stop_at: int | None = None):
    """Loop 'counter' adding 1 to v each iteration.  ``trips`` None: no trip count input;
    ``cond``: a condition input (true), which the body keeps true, or turns false after
    iteration ``stop_at - 1`` if given."""
    body_nodes = [helper.make_node("Add", ["v_in", "one"], ["v_out"])]
    if stop_at is None:
        body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    else:
        body_nodes += [helper.make_node("Add", ["iter", "one_i"], ["next"]),
                       helper.make_node("Less", ["next", "stop"], ["cond_out"])]
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("iter", I64, []),
         helper.make_tensor_value_info("cond_in", BOOL, []),
         helper.make_tensor_value_info("v_in", F32, [1])],
        [helper.make_tensor_value_info("cond_out", BOOL, []),
         helper.make_tensor_value_info("v_out", F32, [1])],
        initializer=[helper.make_tensor("one", F32, [1], [1.0]),
                     helper.make_tensor("one_i", I64, [], [1]),
                     helper.make_tensor("stop", I64, [], [stop_at or 0])])
    initializers = [helper.make_tensor("yes", BOOL, [], [True])]
    if trips is not None:
        initializers.append(helper.make_tensor("trips", I64, [], [trips]))
    node = helper.make_node("Loop", ["trips" if trips is not None else "",
                                     "yes" if cond else "", "v0"], ["v"], body=body,
                            name="counter")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("v0", F32, [1])],
                              [helper.make_tensor_value_info("v", F32, [1])],
                              initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model, mode: str) -> np.ndarray:
    if mode == "reference":
        return ReferenceExecutor(import_onnx(model)).run({"v0": V0})["v"]
    return ember.compile(model)(V0)


@pytest.mark.parametrize("mode", MODES)
def test_a_trip_count_of_2_62_without_a_condition_is_refused_at_once(mode, deadline):
    with deadline(60), pytest.raises(ExecutionError) as error:
        _run(_loop_model(2**62, cond=False), mode)
    message = str(error.value)
    for fragment in ("node 'counter' (Loop)", f"more than {DEFAULT_MAX_LOOP_ITERATIONS:,} "
                     "iterations", "its trip count is 4,611,686,018,427,387,904",
                     f"{MAX_LOOP_ITERATIONS_ENV}="):
        assert fragment in message, message


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("trips, why", [
    (2**62, "its condition stayed true and its trip count is 4,611,686,018,427,387,904"),
    (None, "its condition stayed true"),
])
def test_a_condition_that_stays_true_is_stopped_at_the_bound(monkeypatch, mode, trips, why,
                                                           deadline):
    monkeypatch.setenv(MAX_LOOP_ITERATIONS_ENV, "1000")
    with deadline(60), pytest.raises(ExecutionError) as error:
        _run(_loop_model(trips, cond=True), mode)
    message = str(error.value)
    for fragment in ("node 'counter' (Loop) would run more than 1,000 iterations", f"({why})",
                     f"raise the limit with the environment variable "
                     f"{MAX_LOOP_ITERATIONS_ENV}=10000"):
        assert fragment in message, message


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("trips, cond, stop_at, iterations", [
    (1000, False, None, 1000),   # the trip count ends it, exactly at the bound
    (1000, True, None, 1000),    # the same with a condition that stays true
    (2**62, True, 1000, 1000),   # the condition turns false at the bound
    (None, True, 1000, 1000),
    (2**62, True, 10, 10),       # well before the bound
])
def test_loops_up_to_the_bound_run_as_onnx_says(monkeypatch, mode, trips, cond, stop_at,
                                                 iterations, deadline):
    monkeypatch.setenv(MAX_LOOP_ITERATIONS_ENV, "1000")
    model = _loop_model(trips, cond, stop_at)
    expected = V0 + iterations
    if cond:  # ReferenceEvaluator runs no iteration without a condition input, against the spec
        np.testing.assert_array_equal(ReferenceEvaluator(model).run(None, {"v0": V0})[0],
                                      expected)
    with deadline(60):
        np.testing.assert_array_equal(_run(model, mode), expected)


def test_a_malformed_bound_is_a_config_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv(MAX_LOOP_ITERATIONS_ENV, "forever")
    with pytest.raises(ConfigError, match=MAX_LOOP_ITERATIONS_ENV):
        _run(_loop_model(10, cond=False), "reference")


@pytest.mark.parametrize("value, expected", [(5, 5), ("5", 5), (" 10_000_000 ", 10**7)])
def test_counts_parse(value, expected):
    assert parse_count(value, "max_loop_iterations") == expected
    assert max_loop_iterations(value) == expected


@pytest.mark.parametrize("bad", [0, -1, "0", "", "1e6", "ten", 1.5, True, None])
def test_counts_that_are_not_positive_whole_numbers_are_refused(bad):
    with pytest.raises(ConfigError, match="max_loop_iterations"):
        parse_count(bad, "max_loop_iterations")
