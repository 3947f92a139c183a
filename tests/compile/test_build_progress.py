"""The progress line of a build (``ember/driver/progress.py``): shown on a terminal once a
build has run for a while, naming its stage and counts; silent otherwise."""

from __future__ import annotations

import functools
import io

import numpy as np
import pytest
from onnx import TensorProto, helper
from rich.console import Console

import ember
import ember.driver.pipeline as pipeline
from ember.core.errors import ConfigError
from ember.driver.progress import BuildProgress


def _model(name: str = "chain"):
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Softmax", ["a"], ["b"], axis=1),
             helper.make_node("MatMul", ["b", "b"], ["y"])]
    graph = helper.make_graph(nodes, name,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=10)


def _terminal() -> tuple[io.StringIO, Console]:
    buffer = io.StringIO()
    return buffer, Console(file=buffer, force_terminal=True, width=160)


def test_a_build_past_the_delay_shows_its_stages_on_a_terminal(monkeypatch) -> None:
    monkeypatch.delenv("EMBER_PROGRESS", raising=False)
    buffer, console = _terminal()
    monkeypatch.setattr(pipeline, "BuildProgress",
                        functools.partial(BuildProgress, console=console, delay=0.0))
    module = ember.compile(_model("evil\x1b[2Jname"))
    shown = buffer.getvalue()
    assert "ember: building evil\\x1b[2Jname: " in shown  # the model's name, escaped
    assert "\x1b[2J" not in shown
    assert "scheduling kernels" in shown and "compiling C" in shown
    x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    e = np.exp(np.maximum(x, 0) - np.maximum(x, 0).max(1, keepdims=True))
    b = e / e.sum(1, keepdims=True)
    np.testing.assert_allclose(module(x), b @ b, rtol=1e-5, atol=1e-6)


def test_a_short_build_or_a_pipe_shows_nothing(monkeypatch, capsys) -> None:
    monkeypatch.delenv("EMBER_PROGRESS", raising=False)
    buffer, console = _terminal()
    progress = BuildProgress("m", console=console)  # the default delay: nothing yet
    progress.stage("scheduling kernels", total=3)
    progress.advance()
    progress.close()
    assert not progress.shown and buffer.getvalue() == ""
    # pytest's captured stderr is not a terminal: a real build stays silent there
    ember.compile(_model())
    assert capsys.readouterr().err == ""


def test_the_environment_switch_turns_it_off_or_on(monkeypatch) -> None:
    buffer, console = _terminal()
    monkeypatch.setenv("EMBER_PROGRESS", "0")
    progress = BuildProgress("m", console=console, delay=0.0)
    progress.stage("compiling C", total=2)
    assert not progress.shown and buffer.getvalue() == ""
    monkeypatch.setenv("EMBER_PROGRESS", "1")
    forced = BuildProgress("m", delay=0.0)
    assert forced.enabled
    monkeypatch.setenv("EMBER_PROGRESS", "maybe")
    with pytest.raises(ConfigError, match="EMBER_PROGRESS"):
        BuildProgress("m")
