"""The tuner end to end, on tiny models and budgets.

Oracles: the reference executor (every measured candidate's output is checked against it by
the tuner; here, the tuned model's output against it and against the default build's), the
database's records (what was measured, what failed and why), and a measuring process that
crashes, hangs or lies on purpose (``faulty_runner.py``): none of its bad candidates may be
chosen, and none may stop the search.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.core.target import Target
from ember.driver import BuildOptions, build_graph
from ember.driver.pipeline import TuningRecordWarning
from ember.driver.single_kernel import kernel_problems
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.schedule.config import KernelConfig
from ember.tune.database import Record, TuningDatabase, target_key
from ember.tune.measure import Measurer
from ember.tune.space import ConfigSpace
from ember.tune.tuner import tune_build

sys.path.insert(0, str(Path(__file__).parent))
from faulty_runner import fault_of  # noqa: E402

FAULTY_RUNNER = [sys.executable, str(Path(__file__).parent / "faulty_runner.py")]
SHAPES = {"x": (16, 96)}


def _model(path: Path) -> Path:
    """x[16, 96] -> MatMul w[96, 80] -> Relu -> Softmax: a GEMM-template kernel with many
    knobs, and a row reduction kernel."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((96, 80)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="project"),
             helper.make_node("Relu", ["h"], ["r"], name="clamp"),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1, name="normalize")]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 80])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    import onnx
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    return _model(tmp_path_factory.mktemp("tune") / "tiny.onnx")


@pytest.fixture(scope="module")
def default_build(model_path):
    return build_graph(import_onnx(model_path), SHAPES, BuildOptions())


def _x() -> np.ndarray:
    return np.random.default_rng(1).standard_normal(SHAPES["x"]).astype(np.float32)


def test_bad_candidates_are_never_chosen_and_do_not_stop_the_search(default_build,
                                                                    tmp_path) -> None:
    target = Target.native()
    measurer = Measurer(target, workers=2, runner_command=FAULTY_RUNNER, min_run_timeout=2.0)
    with TuningDatabase(tmp_path / "t.db") as db:
        result = tune_build(default_build, db, budget_seconds=25, target=target,
                            measurer=measurer, seed=3)
        records = db.records()
        errors = [r.error for r in records if not r.valid]
        assert any("died" in e for e in errors), errors          # crashes
        assert any("in time" in e for e in errors), errors       # hangs
        assert any("wrong output" in e for e in errors), errors  # lies
        # the search went on after them: valid candidates other than the defaults
        valid_others = [r for r in records if r.valid and r.config.values]
        assert len(valid_others) >= 3
        for kernel in result.kernels:
            if kernel.config is not None:
                assert fault_of({k: list(v) if isinstance(v, tuple) else v
                                 for k, v in kernel.config.values}) is None
            best = db.best(kernel.key, result.target_key)
            assert best is not None and best.valid


def test_tuned_records_reapply_exactly_and_a_second_run_measures_nothing(
        model_path, default_build, tmp_path) -> None:
    db_path = tmp_path / "t.db"
    with TuningDatabase(db_path) as db:
        first = tune_build(default_build, db, budget_seconds=12, workers=2, seed=0)
        assert first.trials > len(first.kernels)
        second = tune_build(default_build, db, budget_seconds=30, workers=2, seed=0)
        assert second.trials == 0  # every task was confirmed by the first run
        best = db.best_configs(first.target_key)
    module = ember.compile(model_path, input_shapes=SHAPES, tuning_db=db_path)
    build = module.build
    assert {impl.workload_key for impl in build.tuned_kernels} == set(best)
    for impl in build.tuned_kernels:
        assert impl.config == best[impl.workload_key]
        assert impl.config_source == "tuned"
    x = _x()
    expected = ReferenceExecutor(import_onnx(model_path)).run({"x": x})["y"]
    np.testing.assert_allclose(module(x), expected, rtol=1e-5, atol=1e-6)
    assert "scheduled from the tuning database" in module.report()
    artifact = module.save(tmp_path / "tiny.ember")
    manifest = json.loads((artifact / "manifest.json").read_text())
    recorded = {e["workload_key"]: e for e in manifest["schedules"]}
    assert set(recorded) == set(best)
    for key, entry in recorded.items():
        assert entry["source"] == "tuned"
        assert KernelConfig.of(entry["config"]) == best[key]
    loaded = ember.runtime.load(artifact)
    np.testing.assert_allclose(loaded.run({"x": x})["y"], expected, rtol=1e-5, atol=1e-6)


def test_records_of_another_machine_are_not_applied(model_path, default_build,
                                                    tmp_path) -> None:
    problem = kernel_problems(default_build)[0]
    space = ConfigSpace(problem, Target.native())
    other = space.mutate(space.default, __import__("random").Random(0))
    assert other is not None
    elsewhere = target_key(Target.native(), cpu_model="Another CPU")
    with TuningDatabase(tmp_path / "t.db") as db:
        db.add(Record(problem.workload_key, elsewhere, other.config, 1e-9, True))
    module = ember.compile(model_path, input_shapes=SHAPES, tuning_db=tmp_path / "t.db")
    assert not module.build.tuned_kernels


def test_a_record_this_kernel_no_longer_accepts_falls_back_with_a_warning(
        model_path, default_build, tmp_path) -> None:
    problem = kernel_problems(default_build)[0]
    stale = KernelConfig.of({"gemm0.tile": (99, 99)})
    with TuningDatabase(tmp_path / "t.db") as db:
        for _ in range(3):
            db.add(Record(problem.workload_key, target_key(Target.native()), stale, 1e-6,
                          True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = ember.compile(model_path, input_shapes=SHAPES, tuning_db=tmp_path / "t.db")
        module(_x())
    assert any(issubclass(w.category, TuningRecordWarning) and "gemm0.tile" in str(w.message)
               for w in caught)
    assert not module.build.tuned_kernels


def test_a_missing_database_is_an_error(model_path, tmp_path) -> None:
    with pytest.raises(ember.EmberError, match="does not exist"):
        ember.compile(model_path, input_shapes=SHAPES, tuning_db=tmp_path / "missing.db")


def test_the_space_proposes_configs_the_kernel_accepts(default_build) -> None:
    import random

    problem = kernel_problems(default_build)[0]
    space = ConfigSpace(problem, Target.native())
    rng = random.Random(0)
    seen = set()
    for _ in range(30):
        point = space.random_point(rng)
        if point is None:
            continue
        seen.add(point.key)
        # canonical: scheduling the config again gives the same complete config
        assert space.canonical(point.config).config == point.config
    assert len(seen) >= 5
    a, b = [space.canonical(KernelConfig.from_json(k)) for k in sorted(seen)[:2]]
    child = space.crossover(a, b, rng)
    assert child is None or set(child.config.as_dict()) == {k.name for k in child.knobs}


def test_the_command_tunes_records_and_reports(model_path, tmp_path, capsys) -> None:
    from ember.cli import main

    db = tmp_path / "cli.db"
    status = main(["tune", str(model_path), "--budget", "8s", "--db", str(db),
                   "--workers", "2", "--no-verify"])
    out, err = capsys.readouterr()
    assert status == 0, out + err
    assert "Traceback" not in out + err
    assert "kernels of the model" in out and "tuning_db=" in out
    with TuningDatabase(db) as database:
        assert len(database) >= 2  # at least every kernel's default
        assert database.workloads()


def test_a_budget_must_be_a_duration(model_path, tmp_path, capsys) -> None:
    from ember.cli import main

    status = main(["tune", str(model_path), "--budget", "soon", "--db", str(tmp_path / "x.db")])
    out, err = capsys.readouterr()
    assert status != 0 and "90s, 10m or 1h" in out + err
    assert not (tmp_path / "x.db").exists()


def test_tuning_on_a_local_ray_instance_lands_in_the_one_database(
        default_build, tmp_path) -> None:
    pytest.importorskip("ray")
    from ember.tune.distributed import tune_on_ray

    graph = import_onnx(_model(tmp_path / "m.onnx"))
    with TuningDatabase(tmp_path / "t.db") as db:
        nodes = tune_on_ray(graph, SHAPES, db, budget_seconds=8, address="local", workers=1)
        assert len(nodes) == 1
        node = nodes[0]
        assert node.target_key == target_key(Target.native())  # this machine is the node
        assert {r.target_key for r in db.records()} == {node.target_key}
        assert len(db) == len(node.records) >= len(node.result.kernels)
        keys = {p.workload_key for p in kernel_problems(default_build)}
        assert set(db.workloads()) == keys
        for key in keys:  # every kernel decided, as a local run decides it
            assert db.decision(key, node.target_key) is not None


def test_ember_tune_is_callable_from_python(model_path, tmp_path) -> None:
    import ember.tune.database  # noqa: F401 -- binds the package to ember.tune first

    with pytest.raises(ember.EmberError, match="90s, 10m or 1h"):
        ember.tune(model_path, budget="a while", db=tmp_path / "x.db")
    with pytest.raises(ember.EmberError, match="input_shapes"):
        ember.tune(_dynamic_model(tmp_path), budget="5s", db=tmp_path / "x.db")
    assert not (tmp_path / "x.db").exists()


def _dynamic_model(tmp_path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    import onnx
    path = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_the_verdict_needs_a_clear_gain_over_the_default(default_build) -> None:
    from ember.tune.tuner import CONFIRM_ROUNDS, MIN_GAIN, Task, _verdict

    problem = kernel_problems(default_build)[0]
    space = ConfigSpace(problem, Target.native())
    task = Task(problem, space, steps=1)
    rng = __import__("random").Random(0)
    a, b = [p for p in (space.random_point(rng) for _ in range(20))
            if p and p.key != space.default.key][:2]
    points = [space.default, a, b]

    def verdict(default: float, first: float, second: list[float] | float):
        second = second if isinstance(second, list) else [second] * CONFIRM_ROUNDS
        return _verdict(task, points, {space.default.key: [default] * CONFIRM_ROUNDS,
                                       a.key: [first] * CONFIRM_ROUNDS, b.key: second})

    assert verdict(1.0, 1.0 - MIN_GAIN / 2, 1.0) is space.default   # within the noise
    assert verdict(1.0, 0.9, 0.8) is b                               # the fastest, clearly
    assert verdict(1.0, 0.9, [0.5] * (CONFIRM_ROUNDS - 1)) is a      # b failed a round
    assert verdict(1.0, 1.2, 1.1) is space.default                   # nothing beats it


def test_a_decision_not_faster_in_the_model_is_taken_back(model_path, default_build,
                                                          tmp_path) -> None:
    """A config decided for the matrix product that is far slower (plain loops instead of
    the GEMM template) must be taken back by the check in the whole model."""
    from ember.tune.tuner import _tasks, _verify_in_model

    graph = import_onnx(model_path)
    target = Target.native()
    tkey = target_key(target)

    def rebuild(configs):
        return build_graph(graph, SHAPES, BuildOptions(tuned_configs=configs))

    with TuningDatabase(tmp_path / "t.db") as db, Measurer(target, workers=1) as measurer:
        tasks = _tasks(default_build, target, 2, db, tkey)
        gemm = next(t for t in tasks if t.default_key != "{}" and
                    t.space.default.config.get("gemm0.template"))
        slow = gemm.space.canonical(KernelConfig.of({"gemm0.template": False}))
        db.decide(gemm.key, tkey, slow.config)
        times = _verify_in_model(default_build, rebuild, measurer, tasks, db, tkey)
        assert db.decision(gemm.key, tkey) == gemm.space.default.config
        before, after = gemm.in_model
        assert before is not None and after > before  # the plain loops are slower
        assert times is not None and times[0] == times[1]  # nothing kept: default build


def test_a_round_scales_its_candidates_by_the_control(default_build) -> None:
    """A round whose control (the default, measured first) ran 2x slower than its median so
    far -- a slow episode of the machine -- keeps its candidates' times halved; the database
    gets the times as measured."""
    from ember.tune.measure import Measurement
    from ember.tune.tuner import Task, _measure

    problem = kernel_problems(default_build)[0]
    space = ConfigSpace(problem, Target.native())
    task = Task(problem, space, steps=1)
    task.measured[space.default.key] = [1.0e-3]
    rng = __import__("random").Random(0)
    other = next(p for p in (space.random_point(rng) for _ in range(20))
                 if p and p.key != space.default.key)

    class Slow:  # a measurer in a slow episode: everything takes twice its usual time
        def measure(self, items, repeats):
            times = {None: 2.0e-3}
            return [Measurement(config or KernelConfig(), times.get(config, 1.6e-3), True)
                    for _, config in items]

    with TuningDatabase(":memory:") as db:
        _measure(Slow(), db, "t", [(task, space.default), (task, other)], control=True)
        assert task.measured[other.key] == [pytest.approx(0.8e-3)]
        assert task.measured[space.default.key] == [1.0e-3, 2.0e-3]
        assert sorted(r.seconds for r in db.records()) == [1.6e-3, 2.0e-3]


def test_builds_are_compared_round_by_round() -> None:
    """Four of seven rounds fell in a slow episode (2x) for both builds, run back to back in
    each round: round by round the tuned build is 5 % slower, whatever the episode."""
    from ember.tune.measure import ModelTimes
    from ember.tune.tuner import _paired_ratio

    slow = [2.0, 1.0, 2.0, 2.0, 1.0, 2.0, 1.0]
    default = ModelTimes(step_rounds=[[s * 1e-3, s * 2e-3] for s in slow])
    tuned = ModelTimes(step_rounds=[[s * 1.05e-3, s * 2.1e-3] for s in slow])
    assert _paired_ratio(default, tuned, [0, 1]) == pytest.approx(1.05)
    assert _paired_ratio(default, tuned, [1]) == pytest.approx(1.05)
    assert _paired_ratio(default, ModelTimes(), [0]) == float("inf")  # nothing measured
