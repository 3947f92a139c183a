"""ember.core.config: sizes parse exactly, the memory limit's precedence, the default's source."""

from __future__ import annotations

import pytest

from ember.core.config import (FALLBACK_MEMORY_LIMIT, MEMORY_LIMIT_ENV, available_memory, env_flag,
                               format_size, memory_limit, parse_size)
from ember.core.errors import ConfigError


@pytest.mark.parametrize("text, expected", [
    (4096, 4096),
    ("4096", 4096),
    ("8GiB", 8 * 1024**3),
    ("8 gib", 8 * 1024**3),
    ("8G", 8 * 1024**3),
    ("8GB", 8 * 1000**3),
    ("512 MiB", 512 * 1024**2),
    ("1.5KiB", 1536),
    ("2TB", 2 * 1000**4),
    ("100b", 100),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "lots", "8 GiBs", "-1GiB", "0", 0, -5, 1.5, True, None,
                                 "1e9"])
def test_parse_size_refuses_what_is_not_a_positive_size(bad):
    with pytest.raises(ConfigError, match="memory_limit"):
        parse_size(bad)


def test_explicit_limit_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "1GiB")
    assert memory_limit("2GiB") == 2 * 1024**3
    assert memory_limit(None) == 1024**3


def test_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "plenty")
    with pytest.raises(ConfigError, match=MEMORY_LIMIT_ENV):
        memory_limit()


def test_default_is_the_available_memory(monkeypatch, tmp_path):
    monkeypatch.delenv(MEMORY_LIMIT_ENV, raising=False)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000000 kB\nMemFree:         1000000 kB\n"
                       "MemAvailable:    7340032 kB\n")
    assert available_memory(meminfo) == 7340032 * 1024
    assert memory_limit() == available_memory()  # the real /proc/meminfo, or the fallback


def test_available_memory_without_meminfo_falls_back_to_something_positive(tmp_path):
    assert available_memory(tmp_path / "absent") > 0
    assert FALLBACK_MEMORY_LIMIT > 0


def test_format_size_is_readable_and_exact():
    assert format_size(25 * 2**30) == "25.0 GiB (26,843,545,600 bytes)"
    assert format_size(100) == "100 bytes"


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), ("ON", True),
                                             ("yes", True), ("0", False), ("false", False),
                                             ("Off", False), ("no", False), ("", False)])
def test_env_flags_read_words_as_people_write_them(monkeypatch, value, expected):
    monkeypatch.setenv("EMBER_DYNAMIC_BATCH", value)
    assert env_flag("EMBER_DYNAMIC_BATCH", default=True) is expected


def test_an_env_flag_that_is_neither_on_nor_off_is_an_error(monkeypatch):
    monkeypatch.setenv("EMBER_DYNAMIC_BATCH", "maybe")
    with pytest.raises(ConfigError, match="EMBER_DYNAMIC_BATCH='maybe'"):
        env_flag("EMBER_DYNAMIC_BATCH", default=True)
    monkeypatch.delenv("EMBER_DYNAMIC_BATCH")
    assert env_flag("EMBER_DYNAMIC_BATCH", default=True) is True


def test_dynamic_batch_false_turns_it_off(monkeypatch):
    """EMBER_DYNAMIC_BATCH=false used to count as on."""
    import onnx
    from onnx import TensorProto, helper

    import ember

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    monkeypatch.setenv("EMBER_DYNAMIC_BATCH", "false")
    module = ember.compile(model)
    assert module.batch_split is None and module.batch_split_reason == "dynamic_batch is off"
