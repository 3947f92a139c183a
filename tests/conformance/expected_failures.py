"""ONNX backend-suite cases that ember is expected to fail, each with its reason.

Keys are exact test names (``test_<case>``, no device suffix).  The pytest suite marks them as
expected failures, so a regression shows as a failure and a fix shows as an unexpected pass;
``tools/conformance.py`` reports both too.  Keep the reasons honest and specific.
"""

from __future__ import annotations

RANDOM = "random op: the output cannot match the expected values by value"

EXPECTED_FAILURES: dict[str, str] = {
}


def reason_for(test_name: str) -> str | None:
    return EXPECTED_FAILURES.get(test_name)
