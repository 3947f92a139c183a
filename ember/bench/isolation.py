"""Contenders in processes of their own (or in this one), driven in interleaved rounds.

In one process every runtime shares the allocator, the page cache of its libraries and, on
a 2-core machine, the cores with the other runtimes' thread pools (libgomp for torch and
ember, ORT's pool, OpenVINO's TBB): a pool left spinning, or a heap grown by another
runtime, is charged to whoever runs next.  A deployment has one runtime per process, so the
bench gives each contender its own worker process (started with ``spawn``: a fresh
interpreter, no inherited thread pools) and keeps the interleaving: the parent asks one
worker at a time for one sample, in the rotated order of :func:`timing.measure_interleaved`.

A worker prepares its contender from a *recipe* -- a module-level function and its
arguments, which the worker calls to get a :class:`~ember.bench.peers.Prepared` -- so that
nothing unpicklable (a torch module, a compiled library) crosses the process boundary; the
inputs and the first outputs do, once.  Each sample is timed inside the worker around the
calls alone, so the pipe adds nothing to the latency.  A worker that dies (a crash in a
runtime) is reported as that contender's error; the others go on.

:class:`InProcessContender` prepares the same recipe in the bench's own process
(``--in-process``), behind the same interface, so the bench has one path for both.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

# Longest wait for a worker's answer: preparing includes a compile (inductor on GPT-2 takes
# minutes here); a sample is bounded by the timing harness's own sample length.
PREPARE_TIMEOUT_SECONDS = 1800.0
SAMPLE_TIMEOUT_SECONDS = 600.0


class ContenderError(RuntimeError):
    """A contender failed: ``stage`` is "prepare" or "run"; the message is the error as
    ``Type: message`` and ``traceback`` its formatted traceback (the message alone when a
    worker process itself died)."""

    def __init__(self, stage: str, message: str, traceback_text: str = ""):
        super().__init__(message)
        self.stage = stage
        self.traceback = traceback_text or message


@dataclass(frozen=True)
class Recipe:
    """How a contender is prepared: ``function(*arguments)`` returns a Prepared."""

    function: Callable[..., Any]
    arguments: tuple[Any, ...] = ()


class IsolatedContender:
    """One contender prepared and run in its own worker process.

    ``outputs`` and ``details`` are the contender's first outputs and its report details,
    ``setup_seconds`` the time its preparation and first call took in the worker;
    ``time_calls(n)`` runs it ``n`` times back to back and returns the seconds that took
    (timed in the worker); ``close()`` stops the worker.  Usable as a context manager.
    """

    def __init__(self, recipe: Recipe, inputs: Mapping[str, np.ndarray], threads: int):
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(target=_serve,
                                        args=(child, recipe, dict(inputs), threads),
                                        daemon=True, name="ember-bench-contender")
        try:
            self._process.start()
        except Exception as error:  # the recipe or the inputs cannot be pickled
            child.close()
            self._pipe.close()
            raise ContenderError("prepare", f"cannot hand this contender to a worker process "
                                         f"({type(error).__name__}: {error}); run the bench "
                                         f"in one process (--in-process)") from None
        child.close()
        try:
            reply = self._receive(PREPARE_TIMEOUT_SECONDS, "prepare")
            if reply[0] == "error":
                raise ContenderError(*reply[1:])
            _, self.outputs, self.details, self.setup_seconds = reply
        except BaseException:
            self.close()
            raise

    def __call__(self) -> Any:
        """One call (the harness's warm-up); ``time_calls`` is what it times."""
        self.time_calls(1)

    def time_calls(self, calls: int) -> float:
        self._pipe.send(("time", int(calls)))
        reply = self._receive(SAMPLE_TIMEOUT_SECONDS, "run")
        if reply[0] == "error":
            raise ContenderError(*reply[1:])
        return float(reply[1])

    def close(self) -> None:
        if self._process.is_alive():
            try:
                self._pipe.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
        self._pipe.close()

    def __enter__(self) -> "IsolatedContender":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _receive(self, timeout: float, stage: str) -> tuple:
        if not self._pipe.poll(timeout):
            self._process.kill()
            raise ContenderError(stage, f"the contender's worker gave no answer in {timeout:.0f} s "
                                     f"and was stopped")
        try:
            return self._pipe.recv()
        except (EOFError, ConnectionError):
            self._process.join(timeout=10)
            raise ContenderError(stage, f"the contender's worker process died (exit code "
                                     f"{self._process.exitcode}); a crash in the runtime "
                                     f"under test") from None


class InProcessContender:
    """The interface of :class:`IsolatedContender` for a contender prepared in this process:
    calling it runs it once, and the timing harness times it with its own clock."""

    def __init__(self, recipe: Recipe, inputs: Mapping[str, np.ndarray]):
        self._inputs = dict(inputs)
        prepared, self.outputs, self.setup_seconds = _prepare(recipe, self._inputs)
        self.details = dict(prepared.details)
        self._run: Callable[..., Any] | None = prepared.run

    def __call__(self) -> Any:
        return self._run(self._inputs)

    def close(self) -> None:
        self._run = None  # the compiled model goes with the last reference


def _prepare(recipe: Recipe, inputs: dict[str, np.ndarray]) -> tuple[Any, list, float]:
    """(the Prepared, its first outputs, seconds to prepare and run once); a ContenderError
    naming the stage that failed."""
    stage = "prepare"
    start = time.perf_counter()
    try:
        prepared = recipe.function(*recipe.arguments)
        stage = "run"
        outputs = [np.array(o, copy=True) for o in prepared(inputs)]
    except Exception as error:  # noqa: BLE001 -- one contender's failure is a result
        raise ContenderError(stage, *_describe(error)) from error
    return prepared, outputs, time.perf_counter() - start


def _serve(pipe: Any, recipe: Recipe, inputs: dict[str, np.ndarray], threads: int) -> None:
    """The worker: prepare, answer with the first outputs, then time calls on request."""
    limit_blas_threads(threads)
    try:
        prepared, outputs, setup = _prepare(recipe, inputs)
    except ContenderError as error:  # reported to the parent, which records it
        pipe.send(("error", error.stage, str(error), error.traceback))
        return
    pipe.send(("ready", outputs, dict(prepared.details), setup))
    run = prepared.run
    while True:
        try:
            command = pipe.recv()
        except EOFError:  # the parent went away
            return
        if command[0] != "time":
            return
        try:
            start = time.perf_counter()
            for _ in range(command[1]):
                run(inputs)
            pipe.send(("seconds", time.perf_counter() - start))
        except BaseException as error:
            pipe.send(("error", "run", *_describe(error)))
            return


def limit_blas_threads(threads: int) -> None:
    """Hold numpy's BLAS (ember's fallback nodes use it) to the contenders' thread budget in
    a worker, as the bench does in its own process (when threadpoolctl is installed)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=threads)


def _describe(error: BaseException) -> tuple[str, str]:
    """(``Type: message``, the formatted traceback) of an error in the worker."""
    return (f"{type(error).__name__}: {error}".strip(),
            "".join(traceback.format_exception(error)).rstrip())
