"""Hand-built kernels compiled to native code agree with numpy (see codegen_cases.py)."""

from __future__ import annotations

import pytest
from codegen_cases import all_cases, host_has, run_case


@pytest.mark.parametrize("case", all_cases(), ids=lambda c: c.name)
def test_kernel_matches_numpy(case, cases_lib):
    if not host_has(case.needs):
        pytest.skip(f"host lacks {case.needs}")
    run_case(cases_lib, case)
