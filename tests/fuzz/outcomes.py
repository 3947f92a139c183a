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


def recursion_verdict(error: dict) -> tuple[Verdict, str, str] | None:
    """An EmberError raised from a RecursionError (ember wraps internal failures as a
    CompileError) is a failure all the same: recursion whose depth grows with the model."""
    if "recursion" not in error:
        return None
    return (Verdict.FOREIGN, f"{_error_text(error)} (from a RecursionError)",
            f"RecursionError at {error['recursion']} (wrapped in {error['type']})")


def classify_model(exchange: Exchange, kind: str, description: str,
                   must_succeed: bool = False) -> tuple[Verdict, str, str]:
    """(verdict, detail, cause) of a model case.  ``must_succeed``: the model is valid and
    within what ember should handle (a generated family says so), so an EmberError is a
    failure too."""
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
        error = ember["error"]
        recursion = recursion_verdict(error)
        if recursion:
            return recursion
        if must_succeed:
            return (Verdict.WRONG, f"ember refused a valid model: {_error_text(error)}",
                    f"valid {sub_kind} model refused: {_error_cause(error)}")
        return Verdict.EMBER_ERROR, _error_text(error), ""
    if ember["status"] == "exception":
        error = ember["error"]
        return (Verdict.FOREIGN, f"in {ember.get('phase', '?')}: {_error_text(error)}",
                _error_cause(error))
    leak = exchange.first("leak")
    if leak:
        return (Verdict.WRONG, f"the sentinel planted outside the allowed directory is in "
                               f"{leak['where']}",
                f"read external data outside the allowed directory ({sub_kind})")
    side_effect = exchange.first("side-effect")
    if side_effect:
        return Verdict.WRONG, side_effect["detail"], f"side effect: {side_effect['detail']}"
    save_error = exchange.first("save-error")
    if save_error:
        error = save_error["error"]
        return (Verdict.FOREIGN, f"in saving the compiled module: {_error_text(error)}",
                _error_cause(error))
    if exchange.timed_out or exchange.died:
        if exchange.phase == "sentinel":
            return _died(exchange, "while saving the compiled module")
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


def classify_cli(exchange: Exchange, description: str) -> tuple[Verdict, str, str]:
    """(verdict, detail, cause) of a ``cli`` case: every command must exit with 0 or 2 (an
    EmberError, reported), and print no raw control character."""
    harness = exchange.first("harness-error")
    if harness:
        return Verdict.HARNESS, _error_text(harness["error"]), "fuzz harness"
    if exchange.timed_out or exchange.died:
        return _died(exchange, "while the command ran")
    runs = exchange.all("cli")
    if not runs:
        return Verdict.HARNESS, "the worker finished without a command's outcome", "fuzz harness"
    refused = False
    for run in runs:
        command = f"ember {run['command'].split(' ', 1)[0]}"
        status = run["status"]
        if run["timeout"]:
            return (Verdict.HANG, f"{run['command']}: no exit within the deadline",
                    f"hang in {command} (subprocess)")
        if isinstance(status, int) and status < 0:
            return (Verdict.CRASH, f"{run['command']}: killed by signal {-status}",
                    f"signal {-status} in {command} (subprocess)")
        if status not in (0, 2):
            error = run.get("error")
            if error:
                recursion = recursion_verdict(error)
                cause = recursion[2] if recursion else _error_cause(error)
                return (Verdict.FOREIGN, f"{run['command']}: exit status {status}: "
                                         f"{_error_text(error)}", f"{cause} ({command})")
            return (Verdict.FOREIGN, f"{run['command']}: exit status {status}: "
                                     f"{run['stderr_tail'][-300:]}",
                    f"exit status {status} in {command}")
        if run["leaks"]:
            stream, places = sorted(run["leaks"].items())[0]
            return (Verdict.WRONG, f"{run['command']}: raw control character in {stream}: "
                                   f"{places[0]}",
                    f"raw control character reached {stream} of {command}")
        refused = refused or status == 2
    if refused:
        return Verdict.EMBER_ERROR, "; ".join(
            f"{r['command']}: {r['stderr_tail'].strip().splitlines()[-1][:200]}"
            for r in runs if r["status"] == 2 and r["stderr_tail"].strip()), ""
    return Verdict.CORRECT, "", ""


def classify_save(exchange: Exchange, description: str) -> tuple[Verdict, str, str]:
    """(verdict, detail, cause) of a ``save`` case: nothing ember did not write changed,
    nothing left outside the target; then an EmberError, or an artifact that loads and
    runs bitwise as the module."""
    harness = exchange.first("harness-error")
    if harness:
        return Verdict.HARNESS, _error_text(harness["error"]), "fuzz harness"
    save = exchange.first("save")
    if save is None:
        if exchange.timed_out or exchange.died:
            return _died(exchange, "while saving")
        return Verdict.HARNESS, "the worker finished without the save's outcome", "fuzz harness"
    target_kind = description.split(":", 1)[0].split(" (", 1)[0]
    entry = "ember compile -o" if ": cli" in description else "Module.save"
    if save["damaged"]:
        return (Verdict.WRONG, f"{entry} changed what it did not write: "
                               f"{'; '.join(save['damaged'][:4])}",
                f"{entry} deleted or changed files it did not write (target {target_kind})")
    if save["stray"]:
        return (Verdict.WRONG, f"{entry} left entries outside the target: "
                               f"{', '.join(save['stray'][:4])}",
                f"{entry} left entries outside the target (target {target_kind})")
    if save["status"] == "exception":
        error = save["error"]
        return (Verdict.FOREIGN, f"{entry}: {_error_text(error)}",
                f"{_error_cause(error)} ({entry})")
    if save["status"] == "ember-error":
        return Verdict.EMBER_ERROR, _error_text(save["error"]) if save.get("error") else \
            save.get("stderr_tail", "").strip()[-200:], ""
    if save.get("not_artifact"):
        return (Verdict.WRONG, save["not_artifact"],
                f"{entry} succeeded without an artifact at the target (target {target_kind})")
    if exchange.timed_out or exchange.died:
        return _died(exchange, "while loading or running the saved artifact")
    loaders = exchange.all("loader")
    for loader in loaders:
        if loader["status"] == "exception":
            error = loader["error"]
            return (Verdict.FOREIGN, f"the saved artifact, {loader['loader']}: "
                                     f"{_error_text(error)}", _error_cause(error))
        if loader["status"] == "ember-error":
            return (Verdict.WRONG, f"the saved artifact does not load with {loader['loader']}: "
                                   f"{_error_text(loader['error'])}",
                    f"an artifact {entry} wrote does not load (target {target_kind})")
        if loader["mismatch"]:
            return (Verdict.WRONG, f"the saved artifact, {loader['loader']}: "
                                   f"{loader['mismatch']}",
                    f"an artifact {entry} wrote runs differently (target {target_kind})")
    if len(loaders) < 2:
        return Verdict.HARNESS, "the saved artifact was not loaded twice", "fuzz harness"
    return Verdict.CORRECT, "", ""
