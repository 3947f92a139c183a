"""A fuzz session: build the base artifacts, run the cases on a pool of workers, classify.

Used by the pytest test and by ``tools/fuzz.py``; both only choose the cases and print the
results.  Deadlines are per phase (compiling a mutant may legitimately take seconds, loading
an artifact must not), scaled by ``EMBER_FUZZ_TIMEOUT_SCALE`` on slow machines.
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Callable

from fuzz.cases import (ARTIFACT, ARTIFACT_SEEDS, CLI, CONTROLS, MODEL, SAVE, CaseId,
                        build_artifact_case, build_cli_case, build_model_case,
                        build_save_case, remove_tree)
from fuzz.mutate import Mutant, NotApplicable
from fuzz.outcomes import (CaseResult, Verdict, classify_artifact, classify_cli,
                           classify_model, classify_save, control_verdict)
from fuzz.pool import Exchange, Worker, WorkerStartError
from fuzz.tamper import ArtifactContext

MODEL_BUDGETS = {"": 10.0, "compile": 40.0, "run": 40.0, "oracle": 30.0}
ARTIFACT_BUDGET = 6.0
# A command line may compile the model (profile, compile, run --mode compiled); a save
# compiles it too (from the cache, mostly) and loads the artifact twice.
CLI_BUDGET = 60.0
SAVE_BUDGET = 60.0
PREPARE_BUDGET = 300.0
Progress = Callable[[CaseResult], None]


def _scale() -> float:
    return float(os.environ.get("EMBER_FUZZ_TIMEOUT_SCALE", "1"))


def model_budget(phase: str, overrides: dict[str, float] | None = None) -> float:
    """Seconds allowed in ``phase``: the case's own deadline for it (a generated graph's
    grows with its size), else the default."""
    seconds = (overrides or {}).get(phase) or MODEL_BUDGETS.get(phase, 30.0)
    return seconds * _scale()


def artifact_budget(phase: str) -> float:
    return ARTIFACT_BUDGET * _scale()


class Session:
    """Workers and a scratch directory for one run; use as a context manager.  ``keep``
    leaves the directory (worker logs, base artifacts) in place for a post-mortem."""

    def __init__(self, workers: int = 1, keep: bool = False, dump: Path | None = None):
        self.worker_count = max(1, workers)
        self.keep = keep
        self.dump = dump  # if set, every case's model / tampered artifact is kept there
        self.workdir = Path(tempfile.mkdtemp(prefix="ember-fuzz-"))
        self.workers = [Worker(self.workdir / f"worker-{i}.log")
                        for i in range(self.worker_count)]
        self.context: ArtifactContext | None = None
        self.expected: dict[str, dict] = {}
        self.prepare_error = ""

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for worker in self.workers:
            worker.stop(graceful=True)
        if not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ------------------------------------------------------------------ running
    def run(self, cases: list[CaseId], progress: Progress | None = None) -> list[CaseResult]:
        if any(case.category == ARTIFACT for case in cases):
            self._prepare_artifacts()
        todo: queue.Queue[tuple[int, CaseId]] = queue.Queue()
        for item in enumerate(cases):
            todo.put(item)
        results: list[CaseResult | None] = [None] * len(cases)
        lock = threading.Lock()

        def drain(worker: Worker) -> None:
            while True:
                try:
                    index, case = todo.get_nowait()
                except queue.Empty:
                    return
                result = self.run_case(worker, case)
                with lock:
                    results[index] = result
                    if progress:
                        progress(result)

        threads = [threading.Thread(target=drain, args=(w,), daemon=True) for w in self.workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return [r for r in results if r is not None]

    def run_case(self, worker: Worker, case: CaseId) -> CaseResult:
        try:
            if case.category == MODEL:
                return self._model_case(worker, case)
            if case.category == CLI:
                return self._cli_case(worker, case)
            if case.category == SAVE:
                return self._save_case(worker, case)
            return self._artifact_case(worker, case)
        except NotApplicable as why:
            return CaseResult(str(case), case.category, case.kind, "", str(why),
                              Verdict.NOT_APPLICABLE)
        except WorkerStartError as error:
            return CaseResult(str(case), case.category, case.kind, "", "", Verdict.HARNESS,
                              str(error), "fuzz harness: worker does not start")
        except Exception:
            return CaseResult(str(case), case.category, case.kind, "", "", Verdict.HARNESS,
                              traceback.format_exc(limit=-8), "fuzz harness")

    def _model_case(self, worker: Worker, case: CaseId) -> CaseResult:
        built = build_model_case(case)
        if self.dump is not None:
            self._dump_model(case, built.mutant)
        budgets = built.mutant.budgets
        exchange = worker.run(built.request(), lambda phase: model_budget(phase, budgets))
        verdict, detail, cause = classify_model(exchange, case.kind, built.mutant.description,
                                                built.mutant.must_succeed)
        if (case.category, case.kind) in CONTROLS:
            verdict, detail, cause = control_verdict(verdict, detail, cause)
        return CaseResult(str(case), case.category, case.kind, built.seed_name,
                          built.mutant.description, verdict, detail, cause, exchange.seconds,
                          _diagnostics(exchange, verdict))

    def _artifact_case(self, worker: Worker, case: CaseId) -> CaseResult:
        if self.context is None:
            return CaseResult(str(case), case.category, case.kind, "", "", Verdict.HARNESS,
                              self.prepare_error, "base artifacts could not be built")
        built = build_artifact_case(case, self.context, self.workdir / "cases")
        try:
            expected = self.expected[built.base_name]
            request = {"type": ARTIFACT, "case": str(case), "path": str(built.directory),
                       "feeds": expected["feeds"], "expected": expected["expected"],
                       "feed_transform": built.feed_transform}
            exchange = worker.run(request, artifact_budget)
        finally:
            if self.dump is not None:
                self.dump.mkdir(parents=True, exist_ok=True)
                target = self.dump / str(case).replace("/", "_")
                remove_tree(target)
                shutil.move(built.directory, target)  # a rename: never reads a FIFO
            remove_tree(built.directory)
        verdict, detail, cause = classify_artifact(exchange, case.kind)
        if (case.category, case.kind) in CONTROLS:
            verdict, detail, cause = control_verdict(verdict, detail, cause)
        return CaseResult(str(case), case.category, case.kind, built.base_name,
                          built.description, verdict, detail, cause, exchange.seconds,
                          _diagnostics(exchange, verdict))

    def _cli_case(self, worker: Worker, case: CaseId) -> CaseResult:
        built = build_cli_case(case)
        if self.dump is not None:
            target = self.dump / str(case).replace("/", "_")
            target.mkdir(parents=True, exist_ok=True)
            (target / "model.onnx").write_bytes(built.data)
            (target / "commands.txt").write_text(
                "\n".join(repr(c) for c in built.commands) + f"\nfile name: {built.file_name!r}\n")
        request = {"type": CLI, "case": str(case), "data": built.data,
                   "file_name": built.file_name, "commands": built.commands,
                   "mode": built.mode, "terminal": built.terminal}
        exchange = worker.run(request, lambda phase: CLI_BUDGET * _scale())
        verdict, detail, cause = classify_cli(exchange, built.description)
        return CaseResult(str(case), case.category, case.kind, built.mode, built.description,
                          verdict, detail, cause, exchange.seconds,
                          _diagnostics(exchange, verdict))

    def _save_case(self, worker: Worker, case: CaseId) -> CaseResult:
        built = build_save_case(case)
        request = {"type": SAVE, "case": str(case), "data": built.data,
                   "previous_data": built.previous_data, "feeds": built.feeds,
                   "input_shapes": built.input_shapes, "layout": built.layout,
                   "previous": built.previous, "extras": built.extras,
                   "target": built.target, "entry": built.entry,
                   "overwrite": built.overwrite, "cli_args": built.cli_args}
        exchange = worker.run(request, lambda phase: SAVE_BUDGET * _scale())
        verdict, detail, cause = classify_save(exchange, built.description)
        return CaseResult(str(case), case.category, case.kind, built.entry, built.description,
                          verdict, detail, cause, exchange.seconds,
                          _diagnostics(exchange, verdict))

    def _dump_model(self, case: CaseId, mutant: Mutant) -> None:
        assert self.dump is not None
        target = self.dump / str(case).replace("/", "_")
        target.mkdir(parents=True, exist_ok=True)
        (target / "model.onnx").write_bytes(mutant.data)
        for name, content in mutant.files.items():
            (target / name).write_bytes(content)
        if mutant.layout:  # the worker lays it out in a scratch directory; list it here
            (target / "layout.txt").write_text("".join(
                f"{entry.kind} {entry.path!r} {len(entry.data)} bytes {entry.target!r}\n"
                for entry in mutant.layout) + f"source={mutant.source} "
                f"base_dir={mutant.base_dir!r} cwd={mutant.cwd!r}\n")

    # ------------------------------------------------------------------ base artifacts
    def _prepare_artifacts(self) -> None:
        """Compile the base artifacts once per session (in a worker: if ember crashes on a
        valid seed, the session survives to say so)."""
        if self.context is not None or self.prepare_error:
            return
        root = self.workdir / "bases"
        root.mkdir()
        (self.workdir / "cases").mkdir()
        worker = self.workers[0]
        try:
            exchange = worker.run({"type": "prepare", "root": str(root),
                                   "seeds": list(ARTIFACT_SEEDS)}, lambda _: PREPARE_BUDGET)
        except WorkerStartError as error:
            self.prepare_error = str(error)
            return
        prepared = exchange.first("prepared")
        if prepared is None:
            failure = exchange.first("harness-error")
            self.prepare_error = (
                f"building the base artifacts failed: "
                f"{failure['error']['traceback'] if failure else exchange.died or 'timeout'}"
                f"\n{exchange.log_tail}")
            return
        self.expected = prepared["artifacts"]
        self.context = ArtifactContext(
            bases={name: Path(entry["path"]) for name, entry in self.expected.items()})


def _diagnostics(exchange: Exchange, verdict: Verdict) -> str:
    """What a developer needs beyond the one-line detail: the traceback of a foreign
    exception, the worker's log (faulthandler's stack) of a crash or hang."""
    if verdict in (Verdict.CORRECT, Verdict.EMBER_ERROR):
        return ""
    tracebacks = [e["error"]["traceback"] for e in exchange.events
                  if isinstance(e.get("error"), dict) and "traceback" in e["error"]
                  and (e.get("status") not in ("ember-error", 0, 2) or "recursion" in e["error"])]
    return "\n".join(tracebacks + ([exchange.log_tail] if exchange.log_tail else []))
