"""The whole compile pipeline (ember.compile → build → artifact → runtime), on tiny models.

Oracles: the reference executor on the imported graph, numpy, and ONNX Runtime.  Covers the
manifest, the graph passes of each opt level, fallback (host) nodes and the two loaders,
outputs that no node writes, data-dependent shapes, per-shape specializations and input
checking at run time.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
import ember.runtime
from ember.driver import BuildOptions, CompileError, build_graph
from ember.core.target import Target
from ember.core.errors import ExecutionError, InputError, ModelLoadError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.package import save_artifact
from ember.runtime.cpu import host_arch, host_features

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
RNG = np.random.default_rng(11)


def _vi(name, elem=F32, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, initializers=None, opset=17, name="pipeline"):
    inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in (initializers or {}).items()]
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10)


def _reference(model, feeds):
    return ReferenceExecutor(import_onnx(model)).run(feeds)


def _assert_outputs(actual, expected, tolerance=1e-5):
    assert list(actual) == list(expected)
    for name in expected:
        got, want = np.asarray(actual[name]), np.asarray(expected[name])
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance, err_msg=name)


def _conv_model(batch=2):
    """Conv(pads) + BN + Relu + global pooling + Gemm: every level-2 pass has work."""
    consts = {"W": RNG.standard_normal((6, 3, 3, 3)).astype(np.float32),
              "B": RNG.standard_normal(6).astype(np.float32),
              "scale": RNG.standard_normal(6).astype(np.float32),
              "shift": RNG.standard_normal(6).astype(np.float32),
              "mean": RNG.standard_normal(6).astype(np.float32),
              "var": (RNG.random(6) + 0.5).astype(np.float32),
              "G": RNG.standard_normal((6, 4)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"],
                              ["bn"], name="bn"),
             helper.make_node("Relu", ["bn"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "G"], ["y"], name="gemm")]
    return _model(nodes, [_vi("x", F32, [batch, 3, 8, 8])], [_vi("y")], consts, name="convnet")


def _ort(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


# ---------------------------------------------------------------------- manifest, passes


def test_manifest_lists_signature_target_weights_and_hashes(tmp_path):
    model = _conv_model()
    module = ember.compile(model, opt_level=2)
    path = module.save(tmp_path / "convnet.ember")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format"] == "ember-artifact" and manifest["format_version"] == 2
    assert manifest["ember_version"] == ember.__version__
    assert manifest["model"] == "convnet"
    assert manifest["inputs"] == [{"name": "x", "dtype": "float32", "shape": [2, 3, 8, 8]}]
    assert manifest["outputs"] == [{"name": "y", "dtype": "float32", "shape": [2, 4]}]
    target = manifest["target"]
    assert {k: v for k, v in target.items() if k not in ("arch", "required_features")} == \
        module.build.target.to_dict()
    # What the runtime checks at load time: this host runs the code it compiled natively.
    assert target["arch"] == host_arch() == module.build.target.arch
    assert set(target["required_features"]) >= {"sse", "sse2"} or target["arch"] != "x86_64"
    assert set(target["required_features"]) <= host_features()
    assert manifest["host_nodes"] == []
    assert manifest["workspace_size"] == module.build.workspace_size
    assert manifest["weights_size"] == module.build.weights_size
    assert set(manifest["files"]) == {"model.so", "weights.safetensors"}
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((path / name).read_bytes()).hexdigest() == digest
    # Weights: aligned, non-overlapping, inside the blob, one per constant the code reads.
    spans = sorted((w["offset"], w["offset"] + w["nbytes"]) for w in manifest["weights"].values())
    assert all(lo % 64 == 0 for lo, _ in spans)
    assert all(hi <= next_lo for (_, hi), (next_lo, _) in zip(spans, spans[1:]))
    assert spans[-1][1] <= manifest["weights_size"]
    assert set(manifest["weights"]) == set(module.build.weights)
    # The loaded artifact computes what ONNX Runtime does.
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    _assert_outputs(ember.runtime.load(path).run({"x": x}), _ort(model, {"x": x}), 1e-4)


@pytest.mark.skipif(host_arch() != "x86_64" or "amx_tile" in host_features(),
                    reason="needs an x86-64 host without AMX")
def test_artifact_needing_cpu_features_this_host_lacks_is_refused(tmp_path):
    # Compiling for AMX works anywhere (only the flags change); loading it here must not.
    # (ember.compile would refuse at once: a Module loads what it builds.)
    model = _model([helper.make_node("Neg", ["x"], ["y"])], [_vi("x", F32, [4])], [_vi("y")])
    options = BuildOptions(target=Target.parse("x86_64-avx2+amx"))
    path = save_artifact(build_graph(import_onnx(model), {}, options), tmp_path / "amx.ember")
    required = json.loads((path / "manifest.json").read_text())["target"]["required_features"]
    assert {"amx_tile", "amx_int8", "amx_bf16", "avx2"} <= set(required)
    for load in (ember.load, ember.runtime.load):
        with pytest.raises(ModelLoadError, match="amx_bf16, amx_int8, amx_tile"):
            load(path)
    with pytest.raises(ModelLoadError, match="amx_tile"):
        ember.compile(model, target="x86_64-avx2+amx")


@pytest.mark.parametrize("opt_level", [0, 1, 2])
def test_opt_levels_apply_their_passes_and_agree(opt_level):
    model = _conv_model()
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    module = ember.compile(model, opt_level=opt_level)
    _assert_outputs(module.run({"x": x}), _ort(model, {"x": x}), 1e-4)
    build = module.build
    ops = [node.op for node in build.graph.nodes]
    assert build.host_nodes == [], build.report()
    passes = [entry.split(":")[0] for entry in build.pass_log]
    if opt_level == 2:
        assert "BatchNormalization" not in ops and ops[:2] == ["Pad", "Conv"]
        assert "fold_batchnorm: 1" in build.pass_log
        assert "make_padding_explicit: 1" in build.pass_log
        assert "graph passes: " in module.report()
    else:
        assert ops[:2] == ["Conv", "BatchNormalization"] and "Pad" not in ops
        assert passes == ([] if opt_level == 0 else
                          ["lower_einsum", "fold_constants", "lower_conv_transpose",
                           "unroll_recurrent", "simplify", "eliminate_common_subexpressions",
                           "eliminate_dead_code", "split_wide_variadics", "fuse"])


def test_workspace_reuses_memory_along_a_chain():
    # Eight 4 KiB intermediates, each dead after the next node: every elementwise kernel
    # writes over its dead input, so one slot is enough (two without in-place reuse).
    nodes, previous = [], "x"
    for index in range(8):
        nodes.append(helper.make_node("Relu" if index % 2 else "Neg", [previous], [f"t{index}"]))
        previous = f"t{index}"
    nodes.append(helper.make_node("Abs", [previous], ["y"]))
    model = _model(nodes, [_vi("x", F32, [32, 32])], [_vi("y")])
    module = ember.compile(model, opt_level=0)  # one kernel per node
    assert module.build.workspace_size == 32 * 32 * 4
    assert len(module.build.memory.in_place) == 7  # t1..t7 over their inputs
    x = RNG.standard_normal((32, 32)).astype(np.float32)
    expected = x
    for index in range(8):
        expected = np.maximum(expected, 0) if index % 2 else -expected
    np.testing.assert_array_equal(module(x), np.abs(expected))
    fused = ember.compile(model, opt_level=1)  # the chain is one kernel: no arena values
    assert len(fused.build.kernels) == 1
    # Relu reads its input twice (select(x < 0, 0, x)): inlining eight of them would repeat
    # the first Neg 2^7 times, so the inliner materializes one stage in kernel scratch.
    assert fused.build.workspace_size <= 32 * 32 * 4
    np.testing.assert_array_equal(fused(x), np.abs(expected))


def test_a_weight_read_by_several_products_is_packed_and_stored_once(tmp_path):
    # One layer applied four times (a recurrent step, shared transformer layers): the four
    # GEMM kernels read one weight in one layout, so the build packs and stores it once.
    weight = RNG.standard_normal((64, 64)).astype(np.float32) / 8
    nodes, previous = [], "x"
    for index in range(4):
        nodes += [helper.make_node("Gemm", [previous, "W"], [f"g{index}"], transB=1),
                  helper.make_node("Tanh", [f"g{index}"], [f"t{index}"])]
        previous = f"t{index}"
    model = _model(nodes, [_vi("x", F32, [8, 64])], [_vi("t3")], {"W": weight})
    module = ember.compile(model)
    assert len(module.build.kernels) == 4
    assert sum(array.nbytes for array in module.build.weights.values()) < 2 * weight.nbytes
    x = RNG.standard_normal((8, 64)).astype(np.float32)
    expected = x
    for _ in range(4):
        expected = np.tanh(expected @ weight.T)
    np.testing.assert_allclose(module(x), expected, rtol=1e-5, atol=1e-5)
    path = module.save(tmp_path / "shared.ember")
    assert (path / "weights.safetensors").stat().st_size < 2 * weight.nbytes
    np.testing.assert_allclose(ember.runtime.load(path)(x), expected, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- fallbacks


# The fallback model's TopK: the 9 smallest of lines of 600, past what the compiled TopK takes
# (up to 8 values by selection, any K from lines of up to 512).
FALLBACK_K, FALLBACK_LENGTH = 9, 600


def _fallback_model():
    """MeanVarianceNormalization (no compute) and a TopK the compiled kernels do not cover run
    as host nodes between compiled kernels."""
    return _model(
        [helper.make_node("MatMul", ["a", "b"], ["p"], name="matmul"),
         helper.make_node("MeanVarianceNormalization", ["p"], ["e"], axes=[1], name="mvn"),
         helper.make_node("Relu", ["e"], ["r"], name="relu"),
         helper.make_node("TopK", ["r", "k"], ["values", "indices"], axis=1, largest=0,
                          name="topk"),
         helper.make_node("Mul", ["values", "two"], ["y"], name="mul")],
        [_vi("a", F32, [3, 4]), _vi("b", F32, [4, FALLBACK_LENGTH])],
        [_vi("y"), _vi("indices", I64)],
        {"k": np.array([FALLBACK_K], np.int64), "two": np.float32(2)},
        opset=26)


def _fallback_feeds():
    return {"a": RNG.standard_normal((3, 4)).astype(np.float32),
            "b": RNG.standard_normal((4, FALLBACK_LENGTH)).astype(np.float32)}


def test_ops_without_compute_are_reported_fallbacks_and_still_correct():
    model = _fallback_model()
    module = ember.compile(model)
    build = module.build
    assert [(impl.node.name, impl.node.op) for impl in build.host_nodes] == \
        [("mvn", "MeanVarianceNormalization"), ("topk", "TopK")]
    reasons = [impl.reason for impl in build.host_nodes]
    assert "no compute" in reasons[0] and "a line of 600 elements" in reasons[1], reasons
    report = module.report()
    assert "2 numpy fallbacks" in report
    assert "fallback: node 'mvn' (MeanVarianceNormalization)" in report
    assert "fallback: node 'topk' (TopK)" in report
    feeds = _fallback_feeds()
    expected = _reference(model, feeds)
    _assert_outputs(module.run(feeds), expected)
    p = feeds["a"] @ feeds["b"]
    normalized = (p - p.mean(axis=1, keepdims=True)) / np.sqrt(p.var(axis=1, keepdims=True) +
                                                                1e-9)
    np.testing.assert_allclose(module.run(feeds)["y"],
                               2 * np.sort(np.maximum(normalized, 0), axis=1)[:, :FALLBACK_K],
                               rtol=1e-5, atol=1e-6)


def test_ember_load_runs_fallbacks_and_the_bare_runtime_refuses(tmp_path):
    model = _fallback_model()
    path = ember.compile(model).save(tmp_path / "fallback.ember")
    manifest = json.loads((path / "manifest.json").read_text())
    assert [entry["op"] for entry in manifest["host_nodes"]] == \
        ["MeanVarianceNormalization", "TopK"]
    assert "host_nodes.json" in manifest["files"]

    feeds = _fallback_feeds()
    _assert_outputs(ember.load(path).run(feeds), _reference(model, feeds))

    with pytest.raises(ModelLoadError) as error:
        ember.runtime.load(path)
    message = str(error.value)
    assert "MeanVarianceNormalization" in message and "TopK" in message and \
        "ember.load()" in message


def test_fallback_reading_outer_values_from_a_subgraph(tmp_path):
    # An If (no compute) whose branches read a kernel's output and a constant by name.
    then_branch = helper.make_graph([helper.make_node("Relu", ["h"], ["t"])], "then", [],
                                    [_vi("t", F32, [2, 3])])
    else_branch = helper.make_graph([helper.make_node("Mul", ["h", "k"], ["e"])], "else", [],
                                    [_vi("e", F32, [2, 3])])
    model = _model([helper.make_node("Neg", ["x"], ["h"]),
                    helper.make_node("If", ["cond"], ["z"], then_branch=then_branch,
                                     else_branch=else_branch, name="branch"),
                    helper.make_node("Add", ["z", "x"], ["y"])],
                   [_vi("x", F32, [2, 3]), _vi("cond", BOOL, [])], [_vi("y")],
                   {"k": np.float32(3)})
    module = ember.compile(model)
    assert [impl.node.op for impl in module.build.host_nodes] == ["If"]
    loaded = ember.load(module.save(tmp_path / "if.ember"))
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    for cond in (True, False):
        feeds = {"x": x, "cond": np.array(cond)}
        expected = _reference(model, feeds)
        _assert_outputs(module.run(feeds), expected)
        _assert_outputs(loaded.run(feeds), expected)


# ---------------------------------------------------------------------- outputs


def test_outputs_that_are_inputs_constants_or_repeated(tmp_path):
    model = _model([helper.make_node("Relu", ["x"], ["r"]),
                    helper.make_node("Add", ["w", "w"], ["folded"])],
                   [_vi("x", F32, [2, 3])],
                   [_vi("r"), _vi("x"), _vi("w"), _vi("r"), _vi("folded"), _vi("x")],
                   {"w": np.arange(3, dtype=np.float32)})
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    module = ember.compile(model)
    assert "folded" in module.build.graph.constants  # folded into a constant output
    graph = import_onnx(model)
    expected = ReferenceExecutor(graph).run({"x": x})
    values = module(x)
    assert len(values) == 6
    for value, name in zip(values, graph.outputs):
        np.testing.assert_array_equal(value, expected[name], err_msg=name)
    assert values[1] is not x  # a copy into the caller's output, not an alias
    loaded = ember.runtime.load(module.save(tmp_path / "outputs.ember"))
    outputs = loaded.run({"x": x})
    for name in set(graph.outputs):
        np.testing.assert_array_equal(outputs[name], expected[name], err_msg=name)


def test_model_of_constants_only_compiles():
    model = _model([helper.make_node("Mul", ["w", "w"], ["y"])], [], [_vi("y", I64)],
                   {"w": np.arange(5, dtype=np.int64)})
    module = ember.compile(model)
    assert module.build.graph.nodes == []
    np.testing.assert_array_equal(module.run({})["y"], np.arange(5) ** 2)


# ---------------------------------------------------------------------- shapes


def test_data_dependent_shape_is_a_compile_error_naming_the_value():
    model = _model([helper.make_node("NonZero", ["x"], ["nz"], name="nonzero"),
                    helper.make_node("Transpose", ["nz"], ["coords"], name="transpose"),
                    helper.make_node("Cast", ["coords"], ["y"], to=F32)],
                   [_vi("x", F32, [3, 4])], [_vi("y")])
    with pytest.raises(CompileError) as error:
        ember.compile(model)
    message = str(error.value)
    assert "'nz' (output of NonZero node 'nonzero')" in message
    assert "not static" in message and "mode='reference'" in message
    assert isinstance(error.value, ember.EmberError)


def test_dynamic_batch_compiles_one_variant_per_shape():
    consts = {"W": RNG.standard_normal((5, 4)).astype(np.float32),
              "b": RNG.standard_normal(4).astype(np.float32)}
    model = _model([helper.make_node("MatMul", ["x", "W"], ["h"]),
                    helper.make_node("Add", ["h", "b"], ["s"]),
                    helper.make_node("Softmax", ["s"], ["y"], axis=-1)],
                   [_vi("x", F32, ["N", 5])], [_vi("y")], consts)
    # a build per batch size (blocks are tests/runtime/test_dynamic_batch.py's subject)
    module = ember.compile(model, dynamic_batch=False)
    with pytest.raises(InputError, match="not called yet"):
        module.build  # noqa: B018 (dynamic and never called: nothing built yet)
    builds = {}
    for batch in (2, 7, 2):
        x = RNG.standard_normal((batch, 5)).astype(np.float32)
        _assert_outputs(module.run({"x": x}), _reference(model, {"x": x}))
        assert module.build.graph.types["y"].shape == (batch, 4)
        builds.setdefault(batch, module.build)
        assert module.build is builds[batch]  # the second call with batch 2 reuses it
    assert builds[2] is not builds[7]
    assert builds[2].library != builds[7].library


def test_input_shapes_fix_the_variant_at_compile_time():
    model = _model([helper.make_node("Neg", ["x"], ["y"])], [_vi("x", F32, ["N", 3])],
                   [_vi("y")])
    module = ember.compile(model, input_shapes={"x": (4, 3)})
    assert module.build.graph.types["y"].shape == (4, 3)
    with pytest.raises(InputError, match="input 'x'"):
        ember.compile(model, input_shapes={"x": (4, 3, 1)})


# ---------------------------------------------------------------------- run-time inputs


@pytest.fixture(scope="module")
def static_module():
    model = _model([helper.make_node("Mul", ["x", "x"], ["y"])], [_vi("x", F32, [2, 3])],
                   [_vi("y")])
    return ember.compile(model)


@pytest.mark.parametrize("value,fragment", [
    (np.ones((2, 3), np.float64), "dtype float64"),
    (np.ones((2, 3), np.int32), "dtype int32"),
    (np.ones((3, 2), np.float32), "dimension 0 must be 2"),
    (np.ones((2, 3, 1), np.float32), "rank 3"),
    (np.ones(6, np.float32), "rank 1"),
], ids=["f64", "i32", "transposed", "rank3", "rank1"])
def test_wrong_input_dtype_or_shape_is_an_input_error(static_module, tmp_path, value,
                                                       fragment):
    with pytest.raises(InputError, match="input 'x'") as error:
        static_module.run({"x": value})
    assert fragment in str(error.value)
    loaded = ember.runtime.load(static_module.save(tmp_path / "static.ember"))
    with pytest.raises(InputError, match="input 'x'"):
        loaded.run({"x": value})


def test_missing_or_unknown_inputs_are_input_errors(static_module, tmp_path):
    loaded = ember.runtime.load(static_module.save(tmp_path / "static.ember"))
    x = np.ones((2, 3), np.float32)
    for runner in (static_module.run, loaded.run):
        with pytest.raises(InputError, match="missing"):
            runner({})
        with pytest.raises(InputError, match="unknown"):
            runner({"x": x, "extra": x})
    with pytest.raises(InputError, match="numpy array"):
        loaded.run({"x": [[1.0] * 3] * 2})
    # a non-contiguous view of the right shape is fine
    wide = np.arange(12, dtype=np.float32).reshape(2, 6)[:, ::2]
    np.testing.assert_array_equal(loaded.run({"x": wide})["y"], wide * wide)


def test_declared_shape_of_a_run_time_reshape_is_checked_not_trusted():
    """Found by the fuzzer: a Reshape whose target shape is computed from a run-time input
    was compiled to the shape the model *declared* for its output and silently returned that
    shape for every input.  Now the node runs its reference, whose result is checked."""
    nodes = [helper.make_node("Shape", ["x"], ["dims"]),
             helper.make_node("Gather", ["dims", "pick"], ["first"], axis=0),
             helper.make_node("Unsqueeze", ["first", "zero"], ["first_1d"]),
             helper.make_node("Concat", ["first_1d", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape")]
    model = _model(nodes, [_vi("x", F32, [2, 3, 4]), _vi("pick", I64, [])],
                   [_vi("y", F32, [2, 12])],
                   {"zero": np.array([0]), "minus_one": np.array([-1])})
    module = ember.compile(model)
    [host] = module.build.host_nodes
    assert host.node.name == "reshape" and "run time" in host.reason
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(module(x, np.array(0)), x.reshape(2, 12))
    with pytest.raises(ExecutionError, match=r"'reshape' \(Reshape\) produced float32\[3, 8\]"):
        module(x, np.array(1))  # the model's declared [2, 12] does not hold for this input
