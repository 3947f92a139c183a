import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # artifact_tools

import pytest  # noqa: E402

from call_models import ADD, SUM_DIFF, module_and_artifact  # noqa: E402


@pytest.fixture(scope="module")
def add(tmp_path_factory):
    """ADD as a Module and as a loaded artifact."""
    return module_and_artifact(ADD, tmp_path_factory)


@pytest.fixture(scope="module")
def sum_diff(tmp_path_factory):
    """SUM_DIFF as a Module and as a loaded artifact."""
    return module_and_artifact(SUM_DIFF, tmp_path_factory)
