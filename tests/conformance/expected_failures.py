"""ONNX backend-suite cases that ember is expected to fail, each with its reason.

Keys are exact test names (``test_<case>``, no device suffix).  The pytest suite marks them as
expected failures, so a regression shows as a failure and a fix shows as an unexpected pass;
``tools/conformance.py`` reports both too.  Keep the reasons honest and specific.
"""

from __future__ import annotations

RANDOM = "random op: the output cannot match the expected values by value"

EXPECTED_FAILURES: dict[str, str] = {
    # Dropout in training mode with ratio > 0 drops elements at random.
    "test_training_dropout": RANDOM,
    "test_training_dropout_default": RANDOM,
    "test_training_dropout_default_mask": RANDOM,
    "test_training_dropout_mask": RANDOM,
}


# Cases that pass with the reference executor but not through the compiled path, with why.
# (Cases in EXPECTED_FAILURES are expected to fail in both modes.)
EXPECTED_COMPILED_ONLY_FAILURES: dict[str, str] = {
}


def expected_failures(mode: str) -> dict[str, str]:
    """The expected failures of a backend mode ("reference" or "compiled")."""
    if mode == "compiled":
        return {**EXPECTED_FAILURES, **EXPECTED_COMPILED_ONLY_FAILURES}
    return dict(EXPECTED_FAILURES)
