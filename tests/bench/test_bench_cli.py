"""`ember bench` end to end on the tiny MLP, and the runner with fake peers (failures,
wrong outputs, unavailable peers are reported, never fatal)."""

import json
import os
import time

import numpy as np
import pytest
from rich.console import Console

from ember.bench.cli import select_peers
from ember.bench.peers import PEERS, Peer, Prepared, Workload
from ember.bench.report import print_problems, render_compile_table, render_table
from ember.bench.runner import Settings, run_case
from ember.bench.zoo import ZOO
from ember.cli import main


def test_ember_bench_quick_writes_json(tmp_path, zoo_cache, capsys):
    out = tmp_path / "bench.json"
    status = main(["bench", "--quick", "--models", "mlp", "--exporter", "torchscript",
                   "--peers", "ember", "onnxruntime", "torch", "--rounds", "3", "--warmup", "0",
                   "--threads", "2", "--json", str(out), "--cache-dir", str(zoo_cache)])
    assert status == 0
    printed = capsys.readouterr().out
    assert "ember/best" in printed and "mlp" in printed

    payload = json.loads(out.read_text())  # strict JSON: no NaN
    assert payload["threads"] == 2
    assert payload["machine"]["cpu_model"]
    assert payload["versions"]["torch"] and payload["versions"]["onnxruntime"]
    assert set(payload["peers"]) == {"ember", "onnxruntime", "torch"}
    (case,) = payload["results"]
    assert case["model"] == "mlp" and case["batch"] == 1 and case["size"] == "tiny"
    assert case["exports"]["torchscript"]["path"]
    contenders = case["contenders"]
    assert set(contenders) == {"ember/torchscript", "onnxruntime/torchscript", "torch"}
    for key in ("onnxruntime/torchscript", "torch"):
        assert contenders[key]["agreement"]["ok"], contenders[key]
        assert len(contenders[key]["timing"]["samples_ms"]) == 3
    ember = contenders["ember/torchscript"]  # measured, or its failure recorded
    assert ember["error"] or len(ember["timing"]["samples_ms"]) == 3
    assert len(case["round_orders"]) == 3


def test_export_only_prints_the_zoo_table(zoo_cache, capsys):
    status = main(["bench", "--quick", "--models", "mlp", "--exporter", "torchscript",
                   "--export-only", "--cache-dir", str(zoo_cache)])
    assert status == 0
    printed = capsys.readouterr().out
    assert "zoo exports" in printed and "torchscript" in printed and "ok" in printed


# --------------------------------------------------------------------------- fake peers


class EchoPeer(Peer):
    """Runs the torch model: agrees with the reference by construction."""

    name, label, source = "echo", "echo", "torch"

    def version(self):
        return "1"

    def prepare(self, workload: Workload) -> Prepared:
        import torch

        module = workload.built.module

        def run(inputs):
            with torch.inference_mode():
                return [module(*(torch.from_numpy(a) for a in inputs.values())).numpy()]

        return Prepared(run, {"note": "echo"})


class WrongPeer(EchoPeer):
    name, label = "wrong", "wrong"

    def prepare(self, workload):
        echo = super().prepare(workload)
        return Prepared(lambda inputs: [o + 1.0 for o in echo(inputs)])


class BrokenPeer(EchoPeer):
    """An ONNX peer whose prepare fails: one per exporter, each recorded."""

    name, label, source = "broken", "broken", "onnx"
    seen: list[str] = []

    def prepare(self, workload):
        assert workload.onnx_path and workload.exporter
        BrokenPeer.seen.append(workload.exporter)
        raise RuntimeError("cannot compile this model\nsecond line of the error")


class GhostPeer(EchoPeer):
    name, label = "ghost", "ghost"
    requires = ("a_module_that_is_not_installed",)


def test_runner_reports_failures_and_disagreements(zoo_cache):
    # in one process: the test reads what BrokenPeer.prepare recorded
    settings = Settings(size="tiny", rounds=2, warmup=0, budget_seconds=None,
                        cache_dir=zoo_cache, isolate=False)
    peers = [EchoPeer(), WrongPeer(), BrokenPeer()]
    BrokenPeer.seen = []
    case = run_case(ZOO["mlp"], 1, ["torchscript"], peers, settings)
    assert case.error is None
    assert BrokenPeer.seen == ["torchscript"]
    echo, wrong = case.contenders["echo"], case.contenders["wrong"]
    broken = case.contenders["broken/torchscript"]
    assert echo.agreement.ok and echo.details == {"note": "echo"}
    assert not wrong.agreement.ok and wrong.agreement.max_abs_diff == pytest.approx(1.0)
    assert broken.error_stage == "prepare" and "cannot compile" in broken.error
    assert broken.series is None
    assert len(echo.series.samples_ms) == 2 and len(wrong.series.samples_ms) == 2
    assert case.orders == [["echo", "wrong"], ["wrong", "echo"]]
    assert case.ember_over_best("torchscript") is None  # no ember in this run

    console = Console(record=True, width=200)
    console.print(render_table([case], peers, settings, ["torchscript"]))
    print_problems([case], console)
    text = console.export_text()
    assert "prepare failed" in text
    assert "second line of the error" in text  # errors are shown verbatim
    assert "disagree" in text


class SlowCompilerPeer(EchoPeer):
    """Stands in for a compiler (the compile table lists ember, ember_torch and inductor)."""

    name, label = "torch_compile", "inductor"

    def prepare(self, workload):
        time.sleep(0.05)  # a first compile that takes measurable time
        return super().prepare(workload)


def test_compile_table_lists_the_compilers_setup_times(zoo_cache):
    settings = Settings(size="tiny", rounds=1, warmup=0, budget_seconds=None,
                        cache_dir=zoo_cache, cold_compile=True)
    peers = [EchoPeer(), SlowCompilerPeer(), BrokenPeer()]
    case = run_case(ZOO["mlp"], 1, ["torchscript"], peers, settings)
    seconds = case.contenders["torch_compile"].setup_seconds
    assert seconds >= 0.05
    table = render_compile_table([case], peers, settings)
    console = Console(record=True, width=200)
    console.print(table)
    text = " ".join(console.export_text().split())  # the title wraps over the narrow table
    assert "first compiles, caches off" in text and "inductor" in text
    assert "echo" not in text  # not a compiler
    assert f"{seconds:.1f}" in text
    assert render_compile_table([case], [EchoPeer()], settings) is None


def test_png_chart(zoo_cache, tmp_path):
    pytest.importorskip("matplotlib")
    from ember.bench.report import write_png

    settings = Settings(size="tiny", rounds=2, warmup=0, cache_dir=zoo_cache)
    peers = [EchoPeer(), WrongPeer(), BrokenPeer()]  # a failed contender is marked, not drawn
    case = run_case(ZOO["mlp"], 1, ["torchscript"], peers, settings)
    assert case.contenders["broken/torchscript"].error
    path = tmp_path / "chart.png"
    write_png([case], peers, ["torchscript"], settings, path)
    assert path.read_bytes().startswith(b"\x89PNG")


def test_unavailable_peers_are_skipped_with_a_reason(monkeypatch):
    monkeypatch.setitem(PEERS, "ghost", GhostPeer)
    peers, skipped = select_peers(["ghost", "torch"])
    assert [p.name for p in peers] == ["torch"]
    assert "not installed" in skipped["ghost"]


def test_ember_over_best_is_the_ratio_of_medians(zoo_cache):
    settings = Settings(size="tiny", rounds=1, warmup=0, cache_dir=zoo_cache)
    case = run_case(ZOO["mlp"], 1, ["torchscript"], [EchoPeer()], settings)
    from ember.bench.runner import ContenderResult
    from ember.bench.timing import Series

    case.contenders["ember/torchscript"] = ContenderResult(
        "ember", "torchscript", series=Series([30.0, 10.0, 20.0]))
    case.contenders["echo"].series = Series([4.0, 5.0, 6.0])
    assert case.ember_over_best("torchscript") == pytest.approx(20.0 / 5.0)
    assert np.isclose(case.ember_over_best("torchscript"), 4.0)


def test_broken_models_and_failed_exports_are_rows_not_crashes(zoo_cache):
    import torch

    from ember.bench.zoo import BuiltModel, ZooEntry

    class Diff(torch.nn.Module):  # the TorchScript exporter has no symbolic for aten::diff
        def forward(self, x):
            return torch.diff(x, dim=-1)

    def build_diff(batch, size):
        return BuiltModel(Diff().eval(), {"input": np.ones((batch, 4), np.float32)},
                          ["output"], "4")

    def build_broken(batch, size):
        raise RuntimeError("no such model")

    # in one process: the models are local functions, which cannot go to a worker process
    settings = Settings(size="tiny", rounds=1, warmup=0, cache_dir=zoo_cache, isolate=False)
    peers = [EchoPeer(), BrokenPeer()]
    BrokenPeer.seen = []
    diff = run_case(ZooEntry("diff", "torch.diff", build_diff), 1, ["torchscript"], peers,
                    settings)
    broken = run_case(ZooEntry("broken", "cannot build", build_broken), 1, ["torchscript"],
                      peers, settings)
    assert not diff.exports["torchscript"].ok
    assert BrokenPeer.seen == []  # no file, so the ONNX peer was never prepared
    assert diff.contenders["echo"].series is not None  # torch peers still measured
    assert broken.error and "no such model" in broken.error

    console = Console(record=True, width=200)
    console.print(render_table([diff, broken], peers, settings, ["torchscript"]))
    print_problems([diff, broken], console)
    text = console.export_text()
    assert "export failed" in text and "model failed" in text and "aten::diff" in text


def test_cold_compile_bypasses_embers_library_cache(zoo_cache, tmp_path, monkeypatch):
    from ember.bench.export import export_model
    from ember.bench.peers import EmberPeer

    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "ember-cache"))
    entry = ZOO["mlp"]
    built = entry.build(1, "tiny")
    record = export_model(entry, built, "tiny", 1, "torchscript", zoo_cache)
    workload = Workload("mlp", built, 1, record.path, "torchscript")
    peer = EmberPeer()
    peer.prepare(workload)  # fills the cache
    assert peer.prepare(workload).details["library_from_cache"]
    workload.cold_compile = True
    assert not peer.prepare(workload).details["library_from_cache"]
    assert os.environ["EMBER_CACHE_DIR"] == str(tmp_path / "ember-cache")  # restored


@pytest.mark.parametrize("spin", [False, True])
def test_onnxruntime_workers_stop_spinning_after_a_run_unless_asked(tmp_path, spin):
    """ORT's idle workers would otherwise spin on after each call and take a core from the
    contender timed next; --ort-spin keeps ORT's default."""
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, save

    from ember.bench.peers import OnnxRuntimePeer

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "relu.onnx"
    save(model, str(path))
    prepared = OnnxRuntimePeer().prepare(Workload("relu", None, 2, str(path), "single-op",
                                                  ort_spin=spin))
    x = np.array([-1, 2, -3, 4], dtype=np.float32)
    np.testing.assert_array_equal(prepared({"x": x})[0], np.maximum(x, 0))
    assert prepared.details["idle_workers"] == ("spin" if spin else
                                                "stop spinning after each run")
