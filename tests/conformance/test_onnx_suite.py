"""The ONNX backend test suite (shipped in ``onnx``) against ember's reference executor.

One pytest case per suite case.  Cases listed in expected_failures.py are xfail(strict=True):
a regression fails, and so does a fix until the list is updated.
"""

from __future__ import annotations

import os
import warnings

import pytest

from backend_harness import run_suite_case
from expected_failures import EXPECTED_FAILURES

KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator", "real")


def _cases():
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind in KINDS:
            for case in load_model_tests(kind=kind):
                marks = []
                if case.name in EXPECTED_FAILURES:
                    marks.append(pytest.mark.xfail(reason=EXPECTED_FAILURES[case.name],
                                                   strict=True))
                if kind == "real":
                    marks.append(pytest.mark.slow)
                yield pytest.param(case, id=f"{kind}/{case.name}", marks=marks)


@pytest.mark.parametrize("case", list(_cases()))
def test_reference_executor(case):
    status, detail = run_suite_case(case, mode="reference")
    assert status == "pass", detail
