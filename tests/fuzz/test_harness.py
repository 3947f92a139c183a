"""The fuzz harness itself: case ids rebuild the same case, and a worker's crash, hang or
exit is attributed to the case that caused it (a fuzzer that misses those is worse than
none: it reports a clean run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fuzz.cases import (CaseId, all_kinds, build_cli_case, build_model_case, build_save_case,
                        plan)
from fuzz.generate.base import TIER_SPAN, size_tier
from fuzz.generate.external import SENTINEL, sentinel_block
from fuzz.pool import Worker
from fuzz.worker import find_sentinel, sentinel_windows
from fuzz.worker_cli import captured_output, raw_controls
from fuzz.worker_save import _changes


def test_case_ids_round_trip() -> None:
    for kind in all_kinds():
        case = CaseId.parse(f"{kind}/42")
        assert str(case) == f"{kind}/42"
    with pytest.raises(ValueError):
        CaseId.parse("model/no-such-kind/1")


def test_plans_are_deterministic_and_cover_every_kind() -> None:
    first, second = plan(400, 3), plan(400, 3)
    assert first == second
    assert len(first) == 400
    assert {f"{c.category}/{c.kind}" for c in first} == set(all_kinds())
    assert all(c.number >= 3_000_000 for c in first)


@pytest.mark.parametrize("kind", ["dims", "attr", "edge", "name", "init", "mixed", "bytes",
                                  "external", "deep", "wide", "nest", "bomb"])
def test_a_case_id_rebuilds_the_same_mutant(kind: str) -> None:
    case = CaseId("model", kind, 7)
    first, second = build_model_case(case), build_model_case(case)
    assert first.mutant.data == second.mutant.data
    assert first.mutant.description == second.mutant.description
    assert first.mutant.layout == second.mutant.layout


def test_cli_and_save_case_ids_rebuild_the_same_case() -> None:
    for number in (0, 5, 1_000_003):
        assert build_cli_case(CaseId("cli", "escapes", number)) == \
            build_cli_case(CaseId("cli", "escapes", number))
        first = build_save_case(CaseId("save", "target", number))
        second = build_save_case(CaseId("save", "target", number))
        assert (first.description, first.layout, first.target) == \
            (second.description, second.layout, second.target)


def test_generated_sizes_grow_only_with_the_cases_of_a_session() -> None:
    """The CI run's few cases per kind stay in the cheap tier, in every session."""
    assert size_tier(0) == size_tier(TIER_SPAN - 1) == size_tier(3_000_000) == 0
    assert size_tier(3 * TIER_SPAN) == 3 and size_tier(10**6 - 1) == 3
    ci = [c for c in plan(800) if c.category == "model" and c.kind in ("deep", "wide", "bomb")]
    assert ci and all(size_tier(c.number) == 0 for c in ci)


def test_the_sentinel_is_found_at_any_offset() -> None:
    windows = sentinel_windows(SENTINEL)
    block = sentinel_block(4096)
    for offset in (0, 1, 7, 16, 333):
        assert find_sentinel(b"\0" * 5 + block[offset:offset + 16] + b"\0" * 5, windows)
    assert not find_sentinel(bytes(range(256)) * 4, windows)


def test_raw_control_characters_are_found_and_styles_allowed_as_a_terminal() -> None:
    assert raw_controls("name \\x1b[2J escaped\n\tok".encode(), terminal=False) == []
    assert raw_controls("a\x1b]0;t\x07".encode(), terminal=False)
    assert raw_controls(b"8-bit CSI \x9b2J", terminal=False)  # not UTF-8: a raw C1 byte
    assert raw_controls("\u202eevil".encode(), terminal=False)
    assert raw_controls("\x1b[1mbold\x1b[0m".encode(), terminal=True) == []
    assert raw_controls("\x1b[1mbold\x1b[0m\x1b[2J".encode(), terminal=True)


def test_output_is_captured_at_the_file_descriptors() -> None:
    import os
    import sys

    with captured_output() as streams:
        print("via sys.stdout")
        os.write(1, b"via fd 1\n")
        os.write(2, b"via fd 2\n")
        sys.stderr.write("via sys.stderr\n")
    assert streams["stdout"] == b"via sys.stdout\nvia fd 1\n"
    assert streams["stderr"] == b"via fd 2\nvia sys.stderr\n"


def test_a_save_that_touches_user_files_is_seen() -> None:
    before = {b"work": ("dir", b"", 0o755), b"work/keep.txt": ("file", b"mine", 0o644),
              b"work/out": ("dir", b"", 0o755), b"work/out/notes": ("file", b"n", 0o644)}
    intact = dict(before)
    intact.update({b"work/out/model.so": ("file", b"so", 0o644)})
    assert _changes(before, intact, set(), b"work/out", succeeded=True) == ([], [])
    deleted = {k: v for k, v in before.items() if k != b"work/out/notes"}
    assert _changes(before, deleted, set(), b"work/out", succeeded=True)[0]
    changed = dict(before, **{"work/keep.txt": None})
    changed[b"work/keep.txt"] = ("file", b"changed", 0o644)
    changed.pop("work/keep.txt")
    assert _changes(before, changed, set(), b"work/out", succeeded=True)[0]
    stray = dict(before, **{})
    stray[b"work/.out.tmp123"] = ("dir", b"", 0o700)
    assert _changes(before, stray, set(), b"work/out", succeeded=True)[1]
    assert _changes(before, deleted, {b"work/out/notes"}, b"work/out", True) == ([], [])


@pytest.fixture
def worker(tmp_path: Path):
    worker = Worker(tmp_path / "worker.log")
    yield worker
    worker.stop()


@pytest.mark.parametrize("action, died", [("segfault", "signal SIGSEGV"),
                                          ("exit", "exit status 3")])
def test_a_dying_worker_is_attributed_and_replaced(worker: Worker, action: str,
                                                   died: str) -> None:
    exchange = worker.run({"type": "misbehave", "case": "x", "action": action}, lambda _: 30)
    assert exchange.died == died
    assert exchange.phase == "misbehave"
    if action == "segfault":
        assert "misbehave" in exchange.log_tail  # faulthandler's stack names the function
    follow_up = worker.run({"type": "misbehave", "case": "y", "action": "raise"}, lambda _: 30)
    assert follow_up.finished and follow_up.first("harness-error")


def test_a_hanging_worker_is_stopped_with_its_stack(worker: Worker) -> None:
    exchange = worker.run({"type": "misbehave", "case": "x", "action": "hang"},
                          lambda phase: 30 if phase == "" else 1)
    assert exchange.timed_out and exchange.phase == "misbehave"
    assert "misbehave" in exchange.log_tail


def test_an_external_data_case_that_must_load_does(tmp_path: Path) -> None:
    """The layout, the scratch-directory placeholders and the oracle of the legitimate load
    work together: a case whose locations are all valid comes out correct."""
    from fuzz.outcomes import Verdict
    from fuzz.session import Session

    number = next(n for n in range(500)
                  if build_model_case(CaseId("model", "external", n)).mutant.must_succeed)
    with Session(workers=1) as session:
        result = session.run([CaseId("model", "external", number)])[0]
    assert result.verdict is Verdict.CORRECT, (result.description, result.detail)


def test_an_ember_error_made_of_a_recursion_error_is_a_failure() -> None:
    """ember wraps internal failures in a CompileError; a RecursionError inside one is
    still recursion whose depth grows with the model."""
    import ember
    from fuzz.outcomes import Verdict, recursion_verdict
    from fuzz.worker import describe_exception

    def recurse(depth: int) -> int:
        return recurse(depth + 1)

    try:
        try:
            recurse(0)
        except RecursionError as error:
            raise ember.CompileError("internal compiler error in graph pass 'fuse'") from error
    except ember.CompileError as wrapped:
        described = describe_exception(wrapped)
    verdict = recursion_verdict(described)
    assert verdict is not None and verdict[0] is Verdict.FOREIGN
    assert "RecursionError" in verdict[2] and "CompileError" in verdict[2]
