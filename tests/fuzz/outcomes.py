"""Turning what a worker reported for a case into a verdict.

The property under test: ember raises an EmberError, or returns a correct result.  Anything
else is a failure, and the kind of failure decides who looks at it: a crash or hang (memory
safety, unbounded loops), a foreign exception (a missing check), a wrong result (a
miscompilation the damage provoked).  "Accepted, oracle rejects" is kept apart for review.
Each failure also gets a *cause*: a short signature (exception type and the ember frame that
raised it, or the signal and the frame it hit) under which the report groups cases, since a
hundred failing cases are usually a handful of bugs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from fuzz.pool import Exchange


class Verdict(str, Enum):
    EMBER_ERROR = "ember-error"
    CORRECT = "correct"
    CRASH = "crash"
    HANG = "hang"
    FOREIGN = "foreign-exception"
    WRONG = "wrong-result"
    ORACLE_REJECTS = "accepted-oracle-rejects"
    HARNESS = "harness-error"
    NOT_APPLICABLE = "not-applicable"


FAILURES = (Verdict.CRASH, Verdict.HANG, Verdict.FOREIGN, Verdict.WRONG)
PASSES = (Verdict.EMBER_ERROR, Verdict.CORRECT)


@dataclass
class CaseResult:
    case: str
    category: str
    kind: str
    seed: str                    # the seed model or base artifact the case started from
    description: str
    verdict: Verdict
    detail: str = ""
    cause: str = ""
    seconds: float = 0.0
    log_tail: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def is_failure(self) -> bool:
        return self.verdict in FAILURES or self.verdict is Verdict.HARNESS


def _error_text(error: dict) -> str:
    where = f" [at {error['origin']}]" if error.get("origin") else ""
    return f"{error['type']}: {error['message']}{where}"


def _error_cause(error: dict) -> str:
    return f"{error['type']} at {error.get('origin') or 'outside ember'}"


_EMBER_FRAME = re.compile(r'File "[^"]*/ember/([^"]+)", line (\d+) in (\S+)')


def stack_cause(log_tail: str) -> str:
    """The innermost ember frame of a faulthandler stack dump (printed most recent first)."""
    for line in log_tail.splitlines():
        if "/tests/" in line:
            continue
        match = _EMBER_FRAME.search(line)
        if match:
            return f"ember/{match.group(1)}:{match.group(2)} {match.group(3)}"
    return "no ember frame on the stack"


def _died(exchange: Exchange, what: str) -> tuple[Verdict, str, str]:
    where = stack_cause(exchange.log_tail)
    if exchange.timed_out:
        return (Verdict.HANG, f"no answer {what} (phase '{exchange.phase}') within the deadline",
                f"hang in {exchange.phase} at {where}")
    return (Verdict.CRASH, f"worker died ({exchange.died}) {what} (phase '{exchange.phase}')",
            f"{exchange.died} in {exchange.phase} at {where}")


def classify_model(exchange: Exchange, kind: str, description: str
                   ) -> tuple[Verdict, str, str]:
    """(verdict, detail, cause) of a model-mutation case."""
    harness = exchange.first("harness-error")
    if harness:
        return Verdict.HARNESS, _error_text(harness["error"]), "fuzz harness"
    ember = exchange.first("ember")
    if ember is None:
        if exchange.timed_out or exchange.died:
            return _died(exchange, "while ember ran")
        return Verdict.HARNESS, "the worker finished without ember's outcome", "fuzz harness"
    sub_kind = f"{kind}/{description.split(':', 1)[0]}"
    if ember["status"] == "ember-error":
        return Verdict.EMBER_ERROR, _error_text(ember["error"]), ""
    if ember["status"] == "exception":
        error = ember["error"]
        return (Verdict.FOREIGN, f"in {ember.get('phase', '?')}: {_error_text(error)}",
                _error_cause(error))
    oracle = exchange.first("oracle")
    if oracle is None:
        state = "timed out" if exchange.timed_out else f"died ({exchange.died})"
        return (Verdict.ORACLE_REJECTS, f"ember returned a result; the oracle {state}",
                f"oracle {state}: {sub_kind}")
    checker = f"; onnx.checker: {oracle['checker']}"
    if oracle["agrees"]:
        return Verdict.CORRECT, "", ""
    if oracle["ran"] and oracle["checker"] == "valid":
        return (Verdict.WRONG, "; ".join(oracle["mismatches"]) + checker,
                f"wrong result: {sub_kind}")
    if oracle["ran"]:
        # ONNX gives an invalid model no meaning: differing from an oracle that ran it
        # anyway is not a wrong result, but ember should probably have refused the model.
        return (Verdict.ORACLE_REJECTS, "; ".join(oracle["mismatches"]) + checker,
                f"accepted a model onnx.checker rejects, results differ: {sub_kind}")
    return (Verdict.ORACLE_REJECTS, "; ".join(oracle["rejections"]) + checker,
            f"oracle rejects: {sub_kind}")


def classify_artifact(exchange: Exchange, kind: str) -> tuple[Verdict, str, str]:
    """(verdict, detail, cause) of an artifact-tamper case: the worst outcome of the two
    loaders (ember.runtime.load, ember.load)."""
    harness = exchange.first("harness-error")
    if harness:
        return Verdict.HARNESS, _error_text(harness["error"]), "fuzz harness"
    if exchange.timed_out or exchange.died:
        return _died(exchange, "while loading or running the artifact")
    loaders = exchange.all("loader")
    if not loaders:
        return Verdict.HARNESS, "the worker finished without a loader outcome", "fuzz harness"
    for loader in loaders:
        if loader["status"] == "exception":
            error = loader["error"]
            return (Verdict.FOREIGN, f"{loader['loader']}: {_error_text(error)}",
                    _error_cause(error))
    for loader in loaders:
        if loader["status"] == "ok" and loader["mismatch"]:
            return (Verdict.WRONG, f"{loader['loader']} ran it: {loader['mismatch']}",
                    f"wrong result ({kind}) from {loader['loader']}")
    if any(loader["status"] == "ok" for loader in loaders):
        return Verdict.CORRECT, "", ""
    return Verdict.EMBER_ERROR, " | ".join(
        f"{loader['loader']}: {_error_text(loader['error'])}" for loader in loaders), ""


def control_verdict(verdict: Verdict, detail: str, cause: str) -> tuple[Verdict, str, str]:
    """A control case (an unmutated seed, an intact artifact) must be *correct*: an error on
    a valid model is a failure too, reported as a wrong result."""
    if verdict is Verdict.EMBER_ERROR:
        return Verdict.WRONG, f"ember refused a valid control: {detail}", \
            "a valid control case was refused"
    if verdict is Verdict.ORACLE_REJECTS:
        return Verdict.HARNESS, f"the oracle refused a valid seed: {detail}", "fuzz harness"
    return verdict, detail, cause
