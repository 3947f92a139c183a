"""ember survives malformed models and tampered artifacts: a fixed, deterministic fuzz run.

Every case must end in an EmberError or a correct result.  The test runs the same cases on
every run (session seed 0), so a failure here is reproducible with the case id it prints:

    .venv/bin/python tools/fuzz.py --case model/dims/17

More cases: ``EMBER_FUZZ_CASES=5000`` (and ``EMBER_FUZZ_SEED=3`` for other ones), or
``tools/fuzz.py --cases 5000``.  Failing cases are never skipped or marked xfail here: the
test fails until ember handles them.
"""

from __future__ import annotations

import os

import pytest

from fuzz.cases import plan
from fuzz.report import full_report
from fuzz.session import Session

# Sized for CI on two cores: see the cost table of README.md (a warm compile cache makes most
# cases milliseconds; the generated families' few cases and any hang, which costs its
# deadline, make up most of the time).
CI_CASES = 800


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def test_ember_raises_ember_errors_or_computes_correctly() -> None:
    cases = plan(_env_int("EMBER_FUZZ_CASES", CI_CASES), _env_int("EMBER_FUZZ_SEED", 0))
    workers = _env_int("EMBER_FUZZ_WORKERS", min(2, os.cpu_count() or 1))
    with Session(workers=workers) as session:
        results = session.run(cases)
    assert len(results) == len(cases), "some cases produced no result"
    failing = [r for r in results if r.is_failure]
    if failing:
        pytest.fail(f"{len(failing)} of {len(results)} fuzz cases failed\n\n"
                    f"{full_report(results)}", pytrace=False)
