"""One sample of every float32 CPU OpInfo through ``torch.compile(backend="ember")``.

See ``opinfo_harness.py`` for what passing means (backend invoked, every ATen op compiled by
ember, outputs equal to eager within tolerance).  An OpInfo in ``opinfo_expected_failures.py``
must fail (with any reason); when one starts passing, the test fails until it is taken off
the list.
``tools/opinfo.py --samples 3`` runs more samples per OpInfo and prints the counts.
"""

from __future__ import annotations

import pytest

import opinfo_harness as harness
from opinfo_expected_failures import EXPECTED_FAILURES

OPS = {harness.op_name(op): op for op in harness.float32_ops()}


def test_expected_failures_name_real_opinfos() -> None:
    unknown = sorted(set(EXPECTED_FAILURES) - set(OPS))
    assert not unknown, f"opinfo_expected_failures.py names OpInfos that do not exist: " \
                        f"{unknown}"


@pytest.mark.parametrize("name", sorted(OPS))
def test_opinfo(name: str) -> None:
    result = harness.run_op(OPS[name], limit=1)
    if result.status == "skipped":
        pytest.skip(result.detail)
    if name in EXPECTED_FAILURES:
        assert result.status == "fail", (
            f"{name} passes now: take it off tests/torch_opinfo/opinfo_expected_failures.py")
        pytest.xfail(EXPECTED_FAILURES[name])
    assert result.status == "pass", result.detail
