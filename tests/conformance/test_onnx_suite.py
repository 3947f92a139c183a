"""The ONNX backend test suite (shipped in ``onnx``) against ember, in both backend modes.

One pytest case per suite case and mode: ``reference`` runs ember's numpy references, and
``compiled`` compiles the model to one native library (ops without a compute definition run
their reference through a callback).  Cases listed in expected_failures.py are
xfail(strict=True): a regression fails, and so does a fix until the list is updated.
"""

from __future__ import annotations

import warnings

import pytest

from backend_harness import run_suite_case
from expected_failures import expected_failures

KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator", "real")
MODES = ("reference", "compiled")


def _cases():
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [(kind, case) for kind in KINDS for case in load_model_tests(kind=kind)]
    for mode in MODES:
        known = expected_failures(mode)
        for kind, case in cases:
            marks = []
            if case.name in known:
                marks.append(pytest.mark.xfail(reason=known[case.name], strict=True))
            yield pytest.param(case, mode, id=f"{mode}/{kind}/{case.name}", marks=marks)


@pytest.mark.parametrize("case,mode", list(_cases()))
def test_onnx_backend_suite(case, mode):
    status, detail = run_suite_case(case, mode=mode)
    assert status == "pass", detail
