"""The cost model's pieces: features of scheduled kernels, the ranking measures, LightGBM.

Oracles: hand-made rankings (the measures), the knobs a config sets (the features must show
them), and a learnable relation between features and speed built from real kernels'
features (the model must find it on candidates it was not trained on).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember.core.target import Target
from ember.driver import BuildOptions, build_graph
from ember.driver.single_kernel import kernel_problems
from ember.frontend.onnx import import_onnx
from ember.schedule.config import KernelConfig
from ember.tune.cost_model import CostModel, PRETRAINED_FILE, ranking_quality
from ember.tune.features import FEATURE_NAMES
from ember.tune.space import ConfigSpace

lightgbm = pytest.importorskip("lightgbm")


@pytest.fixture(scope="module")
def gemm_space(tmp_path_factory) -> ConfigSpace:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((200, 120)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="project")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 200])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 120])], [w])
    path = tmp_path_factory.mktemp("cost") / "g.onnx"
    import onnx
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    build = build_graph(import_onnx(path), {"x": (64, 200)}, BuildOptions())
    return ConfigSpace(kernel_problems(build)[0], Target.native())


def test_ranking_quality_of_perfect_reversed_and_tied_predictions() -> None:
    measured = [0.0, 1.0, 2.0, 3.0, 0.5, 0.1]
    groups = ["a", "a", "a", "a", "b", "b"]
    perfect = ranking_quality(measured, measured, groups, top=1)
    assert perfect["pairwise_accuracy"] == 1.0 and perfect["top1_recall"] == 1.0
    reversed_ = ranking_quality([-m for m in measured], measured, groups, top=1)
    assert reversed_["pairwise_accuracy"] == 0.0 and reversed_["top1_recall"] == 0.0
    assert perfect["pairs"] == 6 + 1 and perfect["groups"] == 2
    # pairs measured within 1 % of each other are not judged
    assert ranking_quality([0, 1], [1.0, 1.001], ["a", "a"])["pairs"] == 0


def test_features_show_the_knobs_of_the_config(gemm_space) -> None:
    default = gemm_space.default
    assert default.features.shape == (len(FEATURE_NAMES),)
    index = {name: i for i, name in enumerate(FEATURE_NAMES)}
    assert default.features[index["gemms"]] == 1
    tile = default.config.get("gemm0.tile")
    other = next(c for k in default.knobs if k.name == "gemm0.tile" for c in k.choices
                 if c != tile)
    # (the tile alone: the blocks that fit the default's tile need not fit another's)
    moved = gemm_space.canonical(KernelConfig.of({"gemm0.tile": other}))
    assert (moved.features[index["gemm_mr"]], moved.features[index["gemm_nr"]]) == other
    plain = gemm_space.canonical(KernelConfig.of({"gemm0.template": False}))
    assert plain.features[index["gemms"]] == 0 and plain.features[index["loops"]] > 0
    again = gemm_space.canonical(KernelConfig.from_json(default.config.to_json()))
    np.testing.assert_array_equal(again.features, default.features)


def test_the_model_learns_a_relation_it_is_shown_and_round_trips(gemm_space, tmp_path) -> None:
    rng = random.Random(0)
    points = {p.key: p for p in (gemm_space.random_point(rng) for _ in range(300)) if p}
    points = list(points.values())
    assert len(points) >= 30
    index = {name: i for i, name in enumerate(FEATURE_NAMES)}

    # a speed that real kernels show: wasted tile rows and columns cost, more tasks help
    def speed(p):
        f = p.features
        return -f[index["gemm_row_waste"]] - f[index["gemm_column_waste"]] + \
            0.1 * f[index["gemm_log_tasks"]]
    train, test = points[: len(points) * 2 // 3], points[len(points) * 2 // 3:]
    model = CostModel().fit(np.stack([p.features for p in train]),
                            np.array([speed(p) for p in train]))
    predicted = model.predict(np.stack([p.features for p in test]))
    quality = ranking_quality(predicted, [speed(p) for p in test], ["g"] * len(test))
    assert quality["pairwise_accuracy"] > 0.8, quality
    saved = CostModel.load(model.save(tmp_path / "model.txt"))
    np.testing.assert_allclose(saved.predict(np.stack([p.features for p in test])), predicted)


def test_the_shipped_model_reads_this_embers_features() -> None:
    if not PRETRAINED_FILE.is_file():
        pytest.fail(f"{PRETRAINED_FILE} is missing from the package")
    model = CostModel.pretrained()
    assert model is not None and model.trained
    assert model.predict(np.zeros((2, len(FEATURE_NAMES)))).shape == (2,)


def test_predicted_schedules_compile_correct_kernels_without_measuring(tmp_path) -> None:
    """The cost model's picks (here: a model that predicts any other config than the
    default's 4x faster, so that it does pick) build kernels that compute what the reference
    computes; the shipped model's picks too."""
    import ember
    from ember.interp import ReferenceExecutor
    from ember.tune.predict import PredictedSchedules

    rng_x = np.random.default_rng(0)
    w = numpy_helper.from_array(rng_x.standard_normal((200, 120)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 200])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 120])], [w])
    import onnx
    path = tmp_path / "p.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    default = build_graph(import_onnx(path), {"x": (64, 200)}, BuildOptions())
    problem = next(p for p in kernel_problems(default) if "MatMul" in p.ops)
    space = ConfigSpace(problem, Target.native())
    # a model that predicts 4x for any config but the default
    rng = random.Random(1)
    points = [p for p in (space.random_point(rng) for _ in range(80))
              if p and p.key != space.default.key]
    features = np.stack([p.features for p in points] + [space.default.features] * 20)
    model = CostModel().fit(features, np.array([2.0] * len(points) + [0.0] * 20))
    x = rng_x.standard_normal((64, 200)).astype(np.float32)
    expected = ReferenceExecutor(import_onnx(path)).run({"x": x})["y"]
    chooser = PredictedSchedules(Target.native(), model=model)
    build = build_graph(import_onnx(path), {"x": (64, 200)},
                        BuildOptions(config_chooser=chooser))
    picked = [impl for impl in build.kernels if impl.config_source == "predicted"]
    assert picked and all(impl.config != space.default.config for impl in picked)
    assert "predicted: 1 of" in build.report()
    module = ember.compile(path, schedule="predicted")
    # (sums of 200 products of magnitude ~14, in another order: ~1e-5 apart before the tanh)
    np.testing.assert_allclose(module(x), expected, rtol=1e-5, atol=5e-5)
    with pytest.raises(ember.EmberError, match="'default' or 'predicted'"):
        ember.compile(path, schedule="fastest")
