"""One call contract for ember.Module, the runtime's CompiledModel and onnx_backend's EmberRep.

``model(*arrays, **named)`` binds exactly the model's inputs (a single ndarray is one input,
never a stack of inputs) and returns the array of a one-output model, else a tuple;
``model.run(feeds)`` takes a dict or a list/tuple and returns a dict.  Misuse is an InputError
naming the inputs concerned.  numpy is the oracle of the values.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember
import ember.api
import ember.onnx_backend as backend
import ember.runtime
from call_models import (ADD, F32, SUM_DIFF, module_and_artifact, onnx_model,
                         value_info)
from ember.core.errors import InputError

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3)).astype(np.float32)
Y = RNG.standard_normal((2, 3)).astype(np.float32)


SCALAR = onnx_model([helper.make_node("Neg", ["t"], ["u"])], [value_info("t", [])],
                    [value_info("u", [])])
ONE_INPUT = onnx_model([helper.make_node("Relu", ["x"], ["r"])], [value_info("x", [2, 3])],
                       [value_info("r", [2, 3])])
# an input named like the method's own parameter
SELF = onnx_model([helper.make_node("Neg", ["self"], ["out"])], [value_info("self", [2, 3])],
                  [value_info("out", [2, 3])])


@pytest.fixture(scope="module")
def add_rep():
    return backend.prepare(ADD)


# ---------------------------------------------------------------------- the good forms


def test_every_call_form_gives_the_same_result(add):
    for model in add:
        for result in (model(X, Y), model(x=X, y=Y), model(X, y=Y), model(y=Y, x=X)):
            assert type(result) is np.ndarray
            np.testing.assert_array_equal(result, X + Y)
        for feeds in ({"x": X, "y": Y}, [X, Y], (X, Y)):
            outputs = model.run(feeds)
            assert type(outputs) is dict and list(outputs) == ["z"]
            np.testing.assert_array_equal(outputs["z"], X + Y)


def test_both_classes_return_the_same_types(sum_diff):
    module, loaded = sum_diff
    results = [module(X, Y), loaded(X, Y)]
    for result in results:
        assert type(result) is tuple and len(result) == 2
        np.testing.assert_array_equal(result[0], X + Y)
        np.testing.assert_array_equal(result[1], X - Y)
    assert module.run([X, Y]).keys() == loaded.run([X, Y]).keys() == {"s", "d"}


def test_single_array_is_one_input(tmp_path_factory):
    for model in module_and_artifact(ONE_INPUT, tmp_path_factory):
        np.testing.assert_array_equal(model(X), np.maximum(X, 0))
        np.testing.assert_array_equal(model.run(X)["r"], np.maximum(X, 0))
    (r,) = backend.prepare(ONE_INPUT).run(X)
    np.testing.assert_array_equal(r, np.maximum(X, 0))


def test_numpy_scalar_is_a_0d_array(tmp_path_factory):
    for model in module_and_artifact(SCALAR, tmp_path_factory):
        result = model(np.float32(1.5))
        assert isinstance(result, np.ndarray) and result.shape == () and result == -1.5
        assert model.run({"t": np.float32(2)})["u"] == -2
    (u,) = backend.prepare(SCALAR).run([np.float32(3)])
    assert u == -3


def test_an_input_may_be_named_self(tmp_path_factory):
    for model in module_and_artifact(SELF, tmp_path_factory):
        np.testing.assert_array_equal(model(**{"self": X}), -X)


# ---------------------------------------------------------------------- misuse


STACKED = np.stack([X, Y])


@pytest.mark.parametrize("who", ["Module", "CompiledModel", "EmberRep"])
def test_a_stacked_array_is_not_split_into_inputs(add, add_rep, who):
    """Iterating it would bind its rows to x and y and run on them silently."""
    model = {"Module": add[0], "CompiledModel": add[1], "EmberRep": add_rep}[who]
    calls = [lambda: model.run(STACKED)]
    if who != "EmberRep":
        calls.append(lambda: model(STACKED))
    for call in calls:
        with pytest.raises(InputError, match=r"missing input\(s\) \['y'\]; the model takes 2"):
            call()


@pytest.mark.parametrize("who", ["Module", "CompiledModel"])
def test_wrong_arguments_are_input_errors_naming_them(add, who):
    model = add[0] if who == "Module" else add[1]
    with pytest.raises(InputError, match=r"takes 2 input\(s\) \['x', 'y'\], got 3 positional"):
        model(X, Y, X)
    with pytest.raises(InputError, match=r"input\(s\) \['x'\] given both positionally and by"):
        model(X, Y, x=X)
    with pytest.raises(InputError, match=r"missing input\(s\) \['y'\]"):
        model(X)
    with pytest.raises(InputError, match=r"unknown input\(s\) \['w'\]"):
        model(X, Y, w=X)
    with pytest.raises(InputError, match=r"unknown input\(s\) \['w'\]"):
        model.run({"x": X, "y": Y, "w": X})
    with pytest.raises(InputError, match=r"missing input\(s\) \['x', 'y'\]"):
        model.run([])
    with pytest.raises(InputError, match="run\\(\\) takes a dict .* got set"):
        model.run({1, 2})
    with pytest.raises(InputError, match="input names must be strings"):
        model.run({0: X, 1: Y})


@pytest.mark.parametrize("who", ["Module", "CompiledModel", "EmberRep"])
@pytest.mark.parametrize("value", [1.5, [[1.0] * 3] * 2, "text", None],
                         ids=["float", "list", "str", "none"])
def test_non_arrays_are_input_errors_naming_the_input_and_type(add, add_rep, who, value):
    model = {"Module": add[0], "CompiledModel": add[1], "EmberRep": add_rep}[who]
    with pytest.raises(InputError, match=r"input 'y' must be a numpy array of float32\[2, 3\]"):
        model.run([X, value])


def test_emberrep_binds_like_the_others(add_rep):
    (z,) = add_rep.run([X, Y])
    np.testing.assert_array_equal(z, X + Y)
    (z,) = add_rep.run({"y": Y, "x": X})
    np.testing.assert_array_equal(z, X + Y)
    with pytest.raises(InputError, match=r"got 3 positional"):
        add_rep.run([X, Y, X])
    reference = backend.prepare(ADD, mode="reference")
    with pytest.raises(InputError, match=r"missing input\(s\) \['y'\]"):
        reference.run(STACKED)


# ---------------------------------------------------------------------- concurrency


DYNAMIC = onnx_model([helper.make_node("Relu", ["x"], ["y"])], [value_info("x", ["N", 3])],
                     [value_info("y", ["N", 3])])


@pytest.fixture
def counted_builds(monkeypatch):
    """Count build_graph calls of ember.api; each takes long enough for threads to meet."""
    calls: list[dict] = []
    lock = threading.Lock()
    real = ember.api.build_graph

    def counting(graph, shapes, options):
        with lock:
            calls.append(dict(shapes))
        time.sleep(0.3)
        return real(graph, shapes, options)

    def counting_traced(graph, options, shapes, symbols):
        with lock:
            calls.append({"traced": tuple(symbols), **shapes})
        time.sleep(0.3)
        return real_traced(graph, options, shapes, symbols)

    real_traced = ember.api.build_traced
    monkeypatch.setattr(ember.api, "build_graph", counting)
    monkeypatch.setattr(ember.api, "build_traced", counting_traced)
    return calls


def _in_threads(count: int, work) -> list:
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except BaseException as error:  # noqa: BLE001 -- reported to the test
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


@pytest.mark.parametrize("dynamic_batch", [False, True])
def test_concurrent_first_calls_compile_a_shape_once(counted_builds, dynamic_batch, monkeypatch):
    # (specializations: the batch in blocks or compiled into the code)
    monkeypatch.setenv("EMBER_RUNTIME_DIMS", "0")
    module = ember.compile(DYNAMIC, dynamic_batch=dynamic_batch)
    inputs = [RNG.standard_normal((4, 3)).astype(np.float32) for _ in range(4)]
    results = _in_threads(4, lambda i: module(inputs[i]))
    for x, result in zip(inputs, results):
        assert isinstance(result, np.ndarray), result
        np.testing.assert_array_equal(result, np.maximum(x, 0))
    assert counted_builds == [{"x": (4, 3)}]
    # two new shapes at once: one build each, or, in blocks, one batch-1 build for both
    results = _in_threads(4, lambda i: module(inputs[i][: 1 + i % 2]))
    assert all(isinstance(r, np.ndarray) for r in results), results
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result, np.maximum(inputs[i][: 1 + i % 2], 0))
    expected = [(1, 3)] if dynamic_batch else [(1, 3), (2, 3)]
    assert sorted(c["x"] for c in counted_builds[1:]) == expected


def test_concurrent_first_calls_trace_once(counted_builds, monkeypatch):
    """Threads that meet on a new size wait for one build for every size of the batch;
    then the sizes its guards admit run on it, from any thread, without another build."""
    monkeypatch.delenv("EMBER_RUNTIME_DIMS", raising=False)   # the default: on
    module = ember.compile(DYNAMIC, dynamic_batch=False)
    inputs = [RNG.standard_normal((7, 3)).astype(np.float32) for _ in range(4)]
    for sizes in ([4, 4, 4, 4], [5, 6, 7, 4]):
        results = _in_threads(4, lambda i: module(inputs[i][: sizes[i]]))
        for i, result in enumerate(results):
            assert isinstance(result, np.ndarray), result
            np.testing.assert_array_equal(result, np.maximum(inputs[i][: sizes[i]], 0))
    assert counted_builds == [{"traced": ("N",), "x": (4, 3)}]
    assert module.build_reasons == ["the first call"]


def test_a_failed_compile_fails_every_waiting_call_and_is_retried(counted_builds, monkeypatch):
    module = ember.compile(DYNAMIC)
    failing = ember.api.build_graph

    def broken(graph, shapes, options):
        failing(graph, shapes, options)
        raise RuntimeError("compiler broke")

    monkeypatch.setattr(ember.api, "build_graph", broken)
    x = np.ones((5, 3), np.float32)
    results = _in_threads(3, lambda i: module(x))
    assert all(isinstance(r, RuntimeError) for r in results), results
    assert len(counted_builds) == 1
    monkeypatch.setattr(ember.api, "build_graph", failing)
    np.testing.assert_array_equal(module(x), x)
    assert len(counted_builds) == 2


def test_repeated_calls_take_the_fast_path_without_losing_checks(add):
    """Arrays of a (dtype, shape) seen before skip re-binding, not the checks: views that are
    strided or misaligned are copied, and another dtype or shape is still refused."""
    expected = X + Y
    for model in add:
        np.testing.assert_array_equal(model(X, Y), expected)
        np.testing.assert_array_equal(model(X, Y), expected)  # the fast path
        wide = np.zeros((2, 6), np.float32)
        wide[:, ::2] = X  # a strided view with the same dtype and shape
        np.testing.assert_array_equal(model(wide[:, ::2], Y), expected)
        raw = np.zeros(X.size * 4 + 4, np.uint8)[4:].view(np.float32).reshape(2, 3)
        raw[...] = X  # misaligned for the kernels' 64-byte assumption
        np.testing.assert_array_equal(model(raw, Y), expected)
        with pytest.raises(InputError, match="dtype float64"):
            model(X.astype(np.float64), Y)
        with pytest.raises(InputError):
            model(np.zeros((3, 2), np.float32), Y)
