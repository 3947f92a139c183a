"""The fuzz harness itself: case ids rebuild the same case, and a worker's crash, hang or
exit is attributed to the case that caused it (a fuzzer that misses those is worse than
none: it reports a clean run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fuzz.cases import CaseId, all_kinds, build_model_case, plan
from fuzz.pool import Worker


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


@pytest.mark.parametrize("kind", ["dims", "attr", "edge", "name", "init", "mixed", "bytes"])
def test_a_case_id_rebuilds_the_same_mutant(kind: str) -> None:
    case = CaseId("model", kind, 7)
    first, second = build_model_case(case), build_model_case(case)
    assert first.mutant.data == second.mutant.data
    assert first.mutant.description == second.mutant.description


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
