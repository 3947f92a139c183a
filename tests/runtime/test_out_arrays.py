"""Caller-given outputs: ``model(..., out=...)`` and ``model.run(feeds, out=...)``.

The outputs are written into the caller's arrays and those very arrays come back, for
``ember.Module``, a loaded artifact (``CompiledModel``), a batch-blocked artifact
(``BatchBlockedModel``) and a build that takes its dims at run time (``RuntimeDimsModel``).
numpy is the oracle of the values.  Arrays the code may write where they lie (64-byte
aligned, sharing no memory with an input) are handed to ``ember_run`` itself, which a spy on
the entry point sees; others get the results copied in.  Arrays that cannot take an output
(wrong dtype or shape, read-only, strided, not an array) are InputErrors naming the output,
raised before anything runs.  Also here: the cheap path of an ordinary call keeps every
check, and models sharing a library still run on their own thread counts.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
import ember.runtime
from call_models import (ADD, F32, SUM_DIFF, module_and_artifact, onnx_model,
                         value_info)
from ember.core.errors import InputError
from ember.runtime.dims_model import RuntimeDimsModel
from ember.runtime.model import CompiledModel

RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 3)).astype(np.float32)
Y = RNG.standard_normal((2, 3)).astype(np.float32)


# an input named like the keyword
OUT_INPUT = onnx_model([helper.make_node("Neg", ["out"], ["n"])],
                       [value_info("out", [2, 3])], [value_info("n", [2, 3])])


def _blocked_model():
    """x[N, 4] -> y[N, 8] (a row per sample), z[2N, 4] (two rows per sample) and c2[3],
    which does not depend on the batch."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([-1, 4], np.int64), "shape"),
             numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "c")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Relu", ["h"], ["y"]),
             helper.make_node("Reshape", ["h", "shape"], ["z"]),
             helper.make_node("Mul", ["c", "c"], ["c2"])]
    model = onnx_model(nodes, [value_info("x", ["N", 4])],
                       [value_info("y", ["N", 8]), value_info("z", [None, 4]),
                        value_info("c2", [3])], inits)
    w, c = (numpy_helper.to_array(i) for i in (inits[0], inits[2]))

    def expected(x):
        h = x @ w
        return [np.maximum(h, 0), h.reshape(-1, 4), c * c]

    return model, expected


BLOCKED, BLOCKED_EXPECTED = _blocked_model()
DYNAMIC = onnx_model([helper.make_node("Relu", ["x"], ["r"])], [value_info("x", ["N", 3])],
                     [value_info("r", ["N", 3])])


def at_offset(shape, dtype, offset: int) -> np.ndarray:
    """An array filled with a sentinel whose data starts ``offset`` bytes past a 64-byte
    boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.zeros(nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    array = raw[start:start + nbytes].view(dtype).reshape(shape)
    array[...] = 7
    assert array.ctypes.data % 64 == offset
    return array


def output_pointers(monkeypatch, runtime):
    """The output addresses every later ember_run call of ``runtime`` gets, in a list."""
    seen: list[list[int]] = []
    ember_run = runtime._run_entry

    def spy(inputs, outputs, *rest):
        seen.append([outputs[i] for i in range(len(runtime.outputs))])
        return ember_run(inputs, outputs, *rest)

    monkeypatch.setattr(runtime, "_run_entry", spy)
    return seen


# ---------------------------------------------------------------------- writing in place


@pytest.mark.parametrize("who", ["Module", "CompiledModel"])
def test_out_takes_the_output_and_is_returned(add, who):
    model = add[0] if who == "Module" else add[1]
    for form in ("array", "list", "tuple", "dict"):
        z = at_offset((2, 3), np.float32, 0)
        out = {"array": z, "list": [z], "tuple": (z,), "dict": {"z": z}}[form]
        result = model(X, Y, out=out)
        assert result is z, form
        np.testing.assert_array_equal(z, X + Y)
        assert model(X, y=Y, out=out) is z  # a named input too
        z[...] = 0
        outputs = model.run({"x": X, "y": Y}, out=out)
        assert list(outputs) == ["z"] and outputs["z"] is z
        np.testing.assert_array_equal(z, X + Y)
        z[...] = 0
        assert model.run([X, Y], out=out)["z"] is z
        np.testing.assert_array_equal(z, X + Y)


@pytest.mark.parametrize("who", ["Module", "CompiledModel"])
def test_several_outputs_some_given(sum_diff, who):
    model = sum_diff[0] if who == "Module" else sum_diff[1]
    s, d = np.empty((2, 3), np.float32), np.empty((2, 3), np.float32)
    got = model(X, Y, out=[s, d])
    assert got[0] is s and got[1] is d
    np.testing.assert_array_equal(s, X + Y)
    np.testing.assert_array_equal(d, X - Y)
    # only some: a dict naming them, or None in the list; the others are new arrays
    d2 = np.zeros((2, 3), np.float32)
    got = model(X, Y, out={"d": d2})
    assert got[1] is d2 and got[0] is not s
    np.testing.assert_array_equal(got[0], X + Y)
    np.testing.assert_array_equal(d2, X - Y)
    s2 = np.zeros((2, 3), np.float32)
    outputs = model.run({"x": X, "y": Y}, out=[s2, None])
    assert outputs["s"] is s2 and outputs["d"] is not d2
    np.testing.assert_array_equal(s2, X + Y)
    np.testing.assert_array_equal(outputs["d"], X - Y)


def test_returned_arrays_are_written_directly_and_others_through_a_copy(add, monkeypatch):
    """An array a call returned is 64-byte aligned: ember_run writes it itself.  One off
    that boundary (np.empty's usual place), or not even aligned to its element type, gets
    the results copied in; the values are the same."""
    _, loaded = add
    seen = output_pointers(monkeypatch, loaded)
    z = loaded(X, Y)
    assert z.ctypes.data % 64 == 0 and seen[-1] == [z.ctypes.data]
    z[...] = 0
    assert loaded(X, Y, out=z) is z and seen[-1] == [z.ctypes.data]
    np.testing.assert_array_equal(z, X + Y)
    for offset in (16, 32, 1):
        target = at_offset((2, 3), np.float32, offset)
        assert loaded(X, Y, out=target) is target
        assert seen[-1] != [target.ctypes.data]
        assert seen[-1][0] % 64 == 0
        np.testing.assert_array_equal(target, X + Y)


@pytest.mark.parametrize("who", ["Module", "CompiledModel"])
def test_an_output_may_be_an_input(add, who, monkeypatch):
    """In place, x = x + y: the kernels' pointers are restrict, so the output goes through
    a scratch array even when aligned."""
    module, loaded = add
    model = module if who == "Module" else loaded
    runtime = module._last[1] if who == "Module" else loaded
    x = loaded(X, np.zeros_like(Y))  # an aligned copy of X, as a call returns it
    assert x.ctypes.data % 64 == 0
    seen = output_pointers(monkeypatch, runtime)
    assert model(x, Y, out=x) is x
    assert seen[-1] != [x.ctypes.data]
    np.testing.assert_array_equal(x, X + Y)


def test_element_types_without_buffer_exports(tmp_path_factory):
    """bfloat16 (ml_dtypes) arrays export no buffer, which the cheap path reads addresses
    through: they take the checked path, in and out."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    model = onnx_model([helper.make_node("Add", ["x", "x"], ["s"]),
                        helper.make_node("Cast", ["x"], ["f"], to=F32)],
                       [value_info("x", [2, 3], TensorProto.BFLOAT16)],
                       [value_info("s", [2, 3], TensorProto.BFLOAT16), value_info("f", [2, 3])])
    x = np.arange(6, dtype=np.float32).reshape(2, 3).astype(bf16)
    for runtime in module_and_artifact(model, tmp_path_factory):
        s, f = runtime(x)
        np.testing.assert_array_equal(s.astype(np.float32), 2 * x.astype(np.float32))
        np.testing.assert_array_equal(f, x.astype(np.float32))
        for offset in (0, 16):
            target = at_offset((2, 3), bf16, offset)
            assert runtime(x, out={"s": target})[0] is target
            np.testing.assert_array_equal(target.astype(np.float32),
                                          2 * x.astype(np.float32))


def test_an_input_named_out_stays_an_input(tmp_path_factory):
    for model in module_and_artifact(OUT_INPUT, tmp_path_factory):
        np.testing.assert_array_equal(model(out=X), -X)
        n = np.empty((2, 3), np.float32)
        assert model.run({"out": X}, out=[n])["n"] is n
        np.testing.assert_array_equal(n, -X)


# ---------------------------------------------------------------------- refusals


@pytest.mark.parametrize("who", ["Module", "CompiledModel"])
def test_unfit_arrays_are_input_errors_naming_the_output(sum_diff, who):
    model = sum_diff[0] if who == "Module" else sum_diff[1]
    good = np.zeros((2, 3), np.float32)
    read_only = np.zeros((2, 3), np.float32)
    read_only.flags.writeable = False
    cases = [
        (np.zeros((3, 2), np.float32), r"output 'd' given in out= has shape \(3, 2\); the "
                                       r"compiled model writes float32\[2, 3\]"),
        (np.zeros((2, 3), np.float64), r"output 'd' given in out= has dtype float64; the "
                                       r"compiled model writes float32\[2, 3\]"),
        (read_only, r"output 'd' given in out= is read-only"),
        (np.zeros((2, 6), np.float32)[:, ::2], r"output 'd' given in out= is not "
                                               r"C-contiguous"),
        (np.zeros((3, 2), np.float32).T, r"output 'd' given in out= is not C-contiguous"),
        ([[0.0] * 3] * 2, r"output 'd' given in out= must be a numpy array of "
                          r"float32\[2, 3\], got list"),
    ]
    for bad, message in cases:
        good[...] = 5
        with pytest.raises(InputError, match=message):
            model(X, Y, out=[good, bad])
        with pytest.raises(InputError, match=message):
            model.run({"x": X, "y": Y}, out={"s": good, "d": bad})
        assert (good == 5).all(), "nothing runs before every output is checked"


@pytest.mark.parametrize("who", ["Module", "CompiledModel"])
def test_malformed_out_is_an_input_error(sum_diff, who):
    model = sum_diff[0] if who == "Module" else sum_diff[1]
    s = np.zeros((2, 3), np.float32)
    with pytest.raises(InputError, match=r"one entry per output in output order \['s', 'd'\]"
                                         r".* got 1"):
        model(X, Y, out=[s])
    with pytest.raises(InputError, match=r"one array per output.*2 outputs"):
        model(X, Y, out=s)
    with pytest.raises(InputError, match=r"out= names unknown output\(s\) \['w'\]"):
        model(X, Y, out={"w": s})
    with pytest.raises(InputError, match=r"out= takes a list/tuple .* got set"):
        model(X, Y, out={1, 2})
    with pytest.raises(InputError, match=r"outputs 's' and 'd' arrays that share memory"):
        model(X, Y, out=[s, s])
    with pytest.raises(InputError, match=r"output 's' given in out= must be a numpy array"):
        model(X, Y, out=[np.float32(1), None])


# ---------------------------------------------------------------------- dynamic shapes


@pytest.fixture(scope="module")
def blocked(tmp_path_factory):
    """BLOCKED as a Module whose batch runs in blocks of 4 and 1, and saved (a
    BatchBlockedModel)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EMBER_RUNTIME_DIMS", "0")
        module = ember.compile(BLOCKED)
        module(RNG.standard_normal((4, 4)).astype(np.float32))
        assert module.batch_split is not None, module.batch_split_reason
        loaded = ember.runtime.load(module.save(tmp_path_factory.mktemp("b") / "m.ember"))
    assert isinstance(loaded, ember.runtime.BatchBlockedModel)
    assert loaded.block_sizes == [4, 1]
    return module, loaded


@pytest.mark.parametrize("who", ["Module", "BatchBlockedModel"])
@pytest.mark.parametrize("batch", [4, 6, 9])
def test_a_batch_run_in_blocks_writes_every_block_in_place(blocked, who, batch):
    model = blocked[0] if who == "Module" else blocked[1]
    x = RNG.standard_normal((batch, 4)).astype(np.float32)
    want = BLOCKED_EXPECTED(x)
    y = at_offset((batch, 8), np.float32, 0)
    z = at_offset((2 * batch, 4), np.float32, 16)
    c2 = np.zeros(3, np.float32)
    got = model(x, out=[y, z, c2])
    assert got[0] is y and got[1] is z and got[2] is c2
    for have, expected in zip((y, z, c2), want):
        np.testing.assert_allclose(have, expected, rtol=1e-5, atol=1e-5)
    # some of them, by name
    z2 = np.zeros((2 * batch, 4), np.float32)
    outputs = model.run({"x": x}, out={"z": z2})
    assert outputs["z"] is z2
    np.testing.assert_allclose(z2, want[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outputs["y"], want[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("who", ["Module", "BatchBlockedModel"])
def test_a_batch_run_in_blocks_checks_out_against_the_whole_call(blocked, who):
    model = blocked[0] if who == "Module" else blocked[1]
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    z = np.full((12, 4), 3, np.float32)
    with pytest.raises(InputError, match=r"output 'y' given in out= has shape \(4, 8\); the "
                                         r"compiled model writes float32\[6, 8\]"):
        model(x, out={"y": np.zeros((4, 8), np.float32), "z": z})
    with pytest.raises(InputError, match=r"output 'z' given in out= has shape \(6, 4\); the "
                                         r"compiled model writes float32\[12, 4\]"):
        model(x, out=[None, np.zeros((6, 4), np.float32), None])
    assert (z == 3).all()


def test_a_build_for_every_size_writes_out(monkeypatch):
    """A build that takes the batch at run time (RuntimeDimsModel) checks out= against the
    shapes of each call."""
    monkeypatch.delenv("EMBER_RUNTIME_DIMS", raising=False)
    module = ember.compile(DYNAMIC, dynamic_batch=False)
    for batch in (3, 5, 8):
        x = RNG.standard_normal((batch, 3)).astype(np.float32)
        r = np.empty((batch, 3), np.float32)
        assert module(x, out=r) is r
        np.testing.assert_array_equal(r, np.maximum(x, 0))
    assert isinstance(module._last[1], RuntimeDimsModel)
    with pytest.raises(InputError, match=r"output 'r' given in out= has shape \(5, 3\); the "
                                         r"compiled model writes float32\[8, 3\]"):
        module(x, out=np.empty((5, 3), np.float32))
    assert module(x, out=[None]).shape == (8, 3)


# ---------------------------------------------------------------------- the cheap path


class _Subclass(np.ndarray):
    pass


@pytest.mark.parametrize("who", ["Module", "CompiledModel"])
def test_the_cheap_path_keeps_every_check(add, who):
    """Inputs that are not exactly what the code reads -- read-only, strided, Fortran
    order, a subclass -- still run (through a copy when needed); wrong ones
    are still refused."""
    model = add[0] if who == "Module" else add[1]
    expected = X + Y
    read_only = X.copy()
    read_only.flags.writeable = False
    wide = np.zeros((2, 6), np.float32)
    wide[:, ::2] = X
    for x in (X, read_only, wide[:, ::2], np.asfortranarray(X), X.view(_Subclass)):
        np.testing.assert_array_equal(model(x, Y), expected)
        np.testing.assert_array_equal(model.run({"x": x, "y": Y})["z"], expected)
    with pytest.raises(InputError, match="dtype float64"):
        model(X.astype(np.float64), Y)
    with pytest.raises(InputError, match=r"input 'x' has shape \(3, 2\)|shape"):
        model(np.zeros((3, 2), np.float32), Y)
    with pytest.raises(InputError, match="input 'y' must be a numpy array"):
        model(X, [[1.0] * 3] * 2)


def test_the_module_fast_path_keeps_the_current_specialization(monkeypatch):
    """Calls that go straight to a known specialization still make it the current one (the
    one ``save`` and ``build`` describe)."""
    monkeypatch.setenv("EMBER_RUNTIME_DIMS", "0")
    module = ember.compile(DYNAMIC, dynamic_batch=False)
    small, large = (np.ones((n, 3), np.float32) for n in (2, 5))
    for x in (small, large, small, large, small):
        np.testing.assert_array_equal(module(x), x)
        assert module._last_shapes == {"x": x.shape}
        assert module.build.graph.types["x"].shape == x.shape


def test_concurrent_calls_get_their_own_results(add):
    """Threads calling one model at once: every call binds its own buffers."""
    _, loaded = add
    inputs = [(RNG.standard_normal((2, 3)).astype(np.float32),
               RNG.standard_normal((2, 3)).astype(np.float32)) for _ in range(4)]
    failures: list[str] = []

    def work(i: int) -> None:
        x, y = inputs[i]
        out = loaded(x, y)
        for _ in range(300):
            if not np.array_equal(loaded(x, y), x + y) or loaded(x, y, out=out) is not out \
                    or not np.array_equal(out, x + y):
                failures.append(f"thread {i}")
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures


def test_models_sharing_a_library_keep_their_thread_counts(add, tmp_path):
    """Two loads of one artifact share its library; each call runs on its own model's
    count, though a call sets it only when the other model set another."""
    module, _ = add
    path = module.save(tmp_path / "m.ember")
    one = ember.runtime.load(path, threads=1)
    two = ember.runtime.load(path, threads=2)
    assert isinstance(one, CompiledModel) and one._lib is two._lib
    if not hasattr(one._lib, "ember_get_num_threads"):
        pytest.skip("a library without the thread pool")
    for model, count in ((one, 1), (two, 2), (two, 2), (one, 1), (one, 1), (two, 2)):
        np.testing.assert_array_equal(model(X, Y), X + Y)
        assert model._lib.ember_get_num_threads() == count
    one.set_num_threads(2)
    two.set_num_threads(1)
    for model, count in ((one, 2), (two, 1), (one, 2)):
        model(X, Y)
        assert model._lib.ember_get_num_threads() == count
