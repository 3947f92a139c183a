"""Building candidates in worker processes and timing them in an isolated one.

The C compiler is the tuner's bottleneck, so candidates are built by a pool of worker
processes (``workers`` of them, each scheduling, generating and compiling one candidate at a
time; the compile cache makes a candidate built before free).  A schedule that the kernel
cannot take, a C compiler error or a worker that dies costs that candidate only.

Built candidates are then timed one after the other -- never while the workers compile, so
that the compilers do not steal the timed kernel's cores -- by the runner process
(``ember.tune.runner``), which the measurer restarts when it crashes or overruns its time.
A single time is noisy on a shared machine (episodes of seconds in which every kernel runs
up to 1.7x slower); the tuner confirms its finalists by measuring them again, interleaved
with the default (``ember.tune.tuner``).
Every candidate's outputs are checked against the oracle's (the reference executor on the
kernel's nodes, computed once per task) before its time counts: a wrong kernel is never
chosen.
"""

from __future__ import annotations

import json
import os
import pickle
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ember.core.target import Target
from ember.driver.single_kernel import KernelProblem, random_feeds, random_inputs
from ember.schedule.config import KernelConfig

if TYPE_CHECKING:
    from ember.driver.pipeline import Build

# How long one candidate's build may take, and its timing beyond what its default took.
BUILD_TIMEOUT = 300.0
RUN_TIMEOUT_MIN = 20.0
# The runner is restarted after this many candidates (each loaded library stays mapped).
RUNNER_CANDIDATES = 200
# An output matches when within this share of the reference's magnitude, or within a few
# times what the default schedule's own kernel differs by (float sums in another order).
RELATIVE_TOLERANCE = 1e-4
DEFAULT_ERROR_FACTOR = 4.0
# ... and the default schedule's own kernel (the first measured) must be this close to the
# reference, or the task is not tuned (a tolerance set by a wrong kernel would admit others).
DEFAULT_SANITY = 1e-2


@dataclass
class Measurement:
    """One candidate's fate: its time (seconds, median of the runner's rounds), whether its
    outputs matched the oracle, or why it has no time."""

    config: KernelConfig
    seconds: float | None = None
    valid: bool = False
    error: str = ""


@dataclass
class TaskData:
    """What the measurer keeps per task: the problem pickled for the workers, the inputs,
    the oracle's outputs, and the tolerance the default schedule's kernel sets."""

    problem: KernelProblem
    problem_file: Path
    inputs_file: Path
    reference: dict[str, np.ndarray]
    tolerance: dict[str, float]
    default_seconds: float | None = None  # the first valid time: bounds a candidate's run


@dataclass
class ModelTimes:
    """A whole model timed over rounds: its time per round, and each step's per round."""

    rounds: list[float] = field(default_factory=list)
    step_rounds: list[list[float]] = field(default_factory=list)
    error: str = ""

    @property
    def seconds(self) -> float | None:
        return float(np.median(self.rounds)) if self.rounds and not self.error else None

    @property
    def steps(self) -> np.ndarray | None:
        return np.median(np.array(self.step_rounds), axis=0) \
            if self.step_rounds and not self.error else None


class _LineWorker:
    """A child process that answers one JSON line per JSON line (``python -m MODULE``),
    restarted when it dies, hangs past a deadline or has served ``max_uses`` requests."""

    def __init__(self, command: Sequence[str], max_uses: int = RUNNER_CANDIDATES):
        self.command = list(command)
        self.module = self.command[-1]
        self.max_uses = max_uses
        self.process: subprocess.Popen | None = None
        self.uses = 0
        self.deadline = 0.0

    def send(self, request: dict[str, Any], timeout: float) -> bool:
        if self.process is None or self.process.poll() is not None or \
                self.uses >= self.max_uses:
            self.stop()
            self.process = subprocess.Popen(
                self.command, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                start_new_session=True)
        self.uses += 1
        self.deadline = time.monotonic() + timeout
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except OSError:
            self.stop()
            return False
        return True

    def receive(self) -> dict[str, Any]:
        """The answer to the request sent last (waits until its deadline)."""
        process = self.process
        if process is None or process.stdout is None:
            return {"ok": False, "error": f"the {self.module} process died"}
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            while True:
                left = self.deadline - time.monotonic()
                if left <= 0 or not selector.select(timeout=left):
                    self.stop()
                    return {"ok": False, "error": "no answer in time (hung)"}
                line = process.stdout.readline()
                if not line:
                    code = process.poll()
                    self.stop()
                    return {"ok": False, "error": f"the process died (exit code {code})"}
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    continue  # not an answer (something else wrote to stdout)

    def stop(self) -> None:
        if self.process is not None:
            try:
                self.process.kill()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self.process = None
            self.uses = 0


class Measurer:
    """Builds and times candidates; one per tuning session (a context manager)."""

    def __init__(self, target: Target, workers: int = 0,
                 runner_command: Sequence[str] | None = None,
                 min_run_timeout: float = RUN_TIMEOUT_MIN):
        """``workers`` build processes (default: one per CPU); ``runner_command`` starts the
        measuring process (default: ``python -m ember.tune.runner``; another harness speaks
        its protocol); a run gets ``min_run_timeout`` seconds plus a hundred times what the
        task's default took before it counts as hung."""
        self.target = target
        self.workers = workers or max(1, len(os.sched_getaffinity(0)))
        self.min_run_timeout = min_run_timeout
        self.scratch = Path(tempfile.mkdtemp(prefix="ember-tune-"))
        self.tasks: dict[str, TaskData] = {}
        self._builders = [_LineWorker([sys.executable, "-m", "ember.tune.builder"],
                                      max_uses=10_000) for _ in range(self.workers)]
        self._runner = _LineWorker(runner_command or
                                   [sys.executable, "-m", "ember.tune.runner"])
        self._counter = 0

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Measurer":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        for worker in (*self._builders, self._runner):
            worker.stop()
        shutil.rmtree(self.scratch, ignore_errors=True)

    # ------------------------------------------------------------------ tasks
    def add_task(self, problem: KernelProblem, seed: int = 0) -> TaskData:
        """Register a task: pickle its problem for the workers, make its inputs and run the
        oracle (the reference executor on the kernel's nodes) on them."""
        from ember.interp import ReferenceExecutor

        folder = self.scratch / problem.workload_key
        folder.mkdir(exist_ok=True)
        problem_file = folder / "problem.pickle"
        with open(problem_file, "wb") as f:
            pickle.dump((problem, self.target), f, protocol=pickle.HIGHEST_PROTOCOL)
        feeds = random_inputs(problem, seed)
        inputs_file = folder / "inputs.npz"
        np.savez(inputs_file, **feeds)
        reference = ReferenceExecutor(problem.graph).run(feeds)
        data = TaskData(problem, problem_file, inputs_file,
                        {name: np.asarray(reference[name]) for name in problem.graph.outputs},
                        {})
        self.tasks[problem.workload_key] = data
        return data

    # ------------------------------------------------------------------ measuring
    def measure(self, items: Sequence[tuple[str, KernelConfig | None]],
                repeats: dict[str, int], warmup: int = 3) -> list[Measurement]:
        """Build the candidates ``items`` -- (task key, config; None: the default heuristic)
        -- in the workers, then time each in the runner (``repeats[key]`` rounds) and check
        its outputs.  The first measurement of a task that matches the oracle sets the
        task's tolerance, so measure its default first."""
        folders = []
        for key, _ in items:
            self._counter += 1
            folders.append(self.scratch / key / f"c{self._counter}")
        built = self._build_all(items, folders)
        results = []
        for (key, config), folder, (ok, error) in zip(items, folders, built):
            task = self.tasks[key]
            result = Measurement(config if config is not None else KernelConfig())
            if not ok:
                result.error = f"build: {error}"
            else:
                self._time(task, folder, result, repeats.get(key, 30), warmup)
            shutil.rmtree(folder, ignore_errors=True)
            results.append(result)
        return results

    def _time(self, task: TaskData, folder: Path, result: Measurement, repeat: int,
              warmup: int) -> None:
        outputs_file = folder.with_suffix(".out.npz")
        request = {"artifact": str(folder), "inputs": str(task.inputs_file),
                   "outputs": str(outputs_file), "repeat": repeat, "warmup": warmup}
        # a candidate may be far slower than the default, but not a hundred times
        per_run = task.default_seconds if task.default_seconds is not None else 0.5
        answer = self._ask_runner(request, timeout=self.min_run_timeout +
                                  100 * (2 * repeat + warmup + 1) * per_run)
        if not answer.get("ok"):
            result.error = f"run: {answer.get('error', 'failed')}"
            return
        try:
            with np.load(outputs_file, allow_pickle=False) as data:
                outputs = {name: data[name] for name in data.files}
        finally:
            outputs_file.unlink(missing_ok=True)
        mismatch = self._check(task, outputs)
        if mismatch:
            result.error = f"wrong output: {mismatch}"
            return
        result.valid = True
        result.seconds = float(answer["seconds"])
        if task.default_seconds is None:
            task.default_seconds = result.seconds

    def time_models(self, builds: Sequence["Build"], rounds: int = 5,
                    seconds_per_round: float = 0.3) -> list[ModelTimes]:
        """Time whole models in the runner, one library loaded at a time, taking turns for
        ``rounds`` rounds (the drift of a shared machine falls on all alike), on the same
        random inputs; each model's outputs are checked against the first's."""
        from ember.package.artifact import save_artifact

        folder = self.scratch / f"models{self._counter}"
        self._counter += 1
        folder.mkdir()
        dirs = [save_artifact(build, folder / f"m{i}") for i, build in enumerate(builds)]
        inputs_file = folder / "inputs.npz"
        np.savez(inputs_file, **random_feeds(builds[0].graph))
        times = [ModelTimes() for _ in builds]
        first_outputs: dict[str, np.ndarray] | None = None
        repeat = 10
        for round_ in range(rounds):
            # the order rotates every round: the first of a round (after the others ran)
            # must not always be the same model
            order = [(round_ + i) % len(dirs) for i in range(len(dirs))]
            for directory, entry in ((dirs[i], times[i]) for i in order):
                outputs_file = folder / "out.npz"
                answer = self._ask_runner(
                    {"artifact": str(directory), "inputs": str(inputs_file),
                     "outputs": str(outputs_file), "repeat": repeat, "warmup": 2},
                    timeout=self.min_run_timeout + 100 * seconds_per_round)
                if not answer.get("ok"):
                    entry.error = str(answer.get("error", "failed"))
                    continue
                with np.load(outputs_file, allow_pickle=False) as data:
                    outputs = {name: data[name] for name in data.files}
                if first_outputs is None:
                    first_outputs = outputs
                elif not all(np.allclose(outputs[k], v, rtol=1e-3, atol=1e-4, equal_nan=True)
                             for k, v in first_outputs.items()):
                    entry.error = "its outputs differ from the default build's"
                entry.rounds.append(float(answer["seconds"]))
                entry.step_rounds.append(list(answer["steps"]))
                if round_ == 0 and entry is times[order[0]]:  # ~seconds_per_round of calls
                    repeat = max(3, min(200, int(seconds_per_round / max(
                        float(answer["seconds"]), 1e-6))))
        shutil.rmtree(folder, ignore_errors=True)
        return times

    def _check(self, task: TaskData, outputs: dict[str, np.ndarray]) -> str:
        """Why ``outputs`` do not match the oracle's ("" when they do)."""
        first = not task.tolerance
        for name, expected in task.reference.items():
            got = outputs.get(name)
            if got is None or got.shape != expected.shape:
                return f"output '{name}' missing or of another shape"
            if expected.dtype.kind not in "fc":
                if not np.array_equal(got, expected):
                    return f"output '{name}' differs"
                continue
            expected64 = expected.astype(np.float64)
            got64 = got.astype(np.float64)
            nan = np.isnan(expected64)
            if not np.array_equal(nan, np.isnan(got64)):
                return f"output '{name}' has NaN elsewhere"
            finite = ~nan & np.isfinite(expected64)
            if not np.array_equal(got64[~finite & ~nan], expected64[~finite & ~nan]):
                return f"output '{name}' has other infinities"
            error = float(np.max(np.abs(got64[finite] - expected64[finite]), initial=0.0))
            scale = float(np.max(np.abs(expected64[finite]), initial=0.0))
            allowed = max(RELATIVE_TOLERANCE * max(scale, 1.0),
                          task.tolerance.get(name, 0.0))
            if first:
                if error > DEFAULT_SANITY * max(scale, 1.0):
                    return (f"output '{name}' of the default schedule is off by {error:.3g}: "
                            f"the kernel disagrees with the reference, nothing to tune")
                task.tolerance[name] = DEFAULT_ERROR_FACTOR * error
            elif error > allowed:
                return f"output '{name}' off by {error:.3g} (allowed {allowed:.3g})"
        return ""

    def _build_all(self, items: Sequence[tuple[str, KernelConfig | None]],
                   folders: list[Path]) -> list[tuple[bool, str]]:
        """Build every candidate, each on the next free worker."""
        built: list[tuple[bool, str]] = [(False, "not built")] * len(items)
        pending = list(range(len(items)))
        busy: dict[int, int] = {}  # worker index -> candidate index
        while pending or busy:
            for w, worker in enumerate(self._builders):
                if w in busy or not pending:
                    continue
                c = pending.pop(0)
                key, config = items[c]
                request = {"problem": str(self.tasks[key].problem_file),
                           "config": config.to_json() if config is not None else None,
                           "out": str(folders[c])}
                if worker.send(request, BUILD_TIMEOUT):
                    busy[w] = c
                else:
                    built[c] = (False, "its build worker could not start")
            if not busy:
                continue
            ready = _first_ready([self._builders[w] for w in busy])
            w = list(busy)[ready]
            answer = self._builders[w].receive()
            built[busy.pop(w)] = (bool(answer.get("ok")), str(answer.get("error", "")))
        return built

    # ------------------------------------------------------------------ the runner
    def _ask_runner(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        if not self._runner.send(request, timeout):
            return {"ok": False, "error": "the runner process could not start"}
        answer = self._runner.receive()
        if not answer.get("ok") and "exit code" in str(answer.get("error", "")):
            answer["error"] = f"{answer['error']}: a crash in the kernel?"
        return answer


def _first_ready(workers: list[_LineWorker]) -> int:
    """The position of a worker with an answer to read, or whose deadline passed first."""
    with selectors.DefaultSelector() as selector:
        for i, worker in enumerate(workers):
            if worker.process is None or worker.process.stdout is None:
                return i
            selector.register(worker.process.stdout, selectors.EVENT_READ, i)
        soonest = min(range(len(workers)), key=lambda i: workers[i].deadline)
        left = max(0.0, workers[soonest].deadline - time.monotonic())
        events = selector.select(timeout=left)
        return events[0][0].data if events else soonest
