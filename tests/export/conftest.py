"""Fixtures of the export tests (helpers: export_tools.py)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from export_tools import sequence_model, two_way_model


@pytest.fixture(scope="session")
def two_way_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "two_way.onnx"
    onnx.save(two_way_model(), path)
    return path


@pytest.fixture(scope="session")
def sequence_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "seqnet.onnx"
    onnx.save(sequence_model(), path)
    return path
