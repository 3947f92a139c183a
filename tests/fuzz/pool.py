"""The session's side of a worker process: start it, send it one case, collect the case's
events under a deadline, and restart it when a case kills or hangs it.

Attribution is the point of this module: each case runs alone in the worker, the worker's
log is marked at the start of the case, and when the worker dies (a signal or an exit) or
misses its deadline, the :class:`Exchange` returned for that case says so, together with the
phase the case had reached and the log lines it produced (faulthandler's Python stack).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from fuzz.protocol import MessageReader, Timeout, write_message

# The bounds the workers run under (see Pool's environment): above what any case must
# compute (fuzz.generate.bombs: MUST_INLINE nodes, loops of at most 10,000 iterations).
FUZZ_MAX_INLINED_NODES = 10_000
FUZZ_MAX_LOOP_ITERATIONS = 100_000

TESTS_DIR = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT = 120.0
LOG_TAIL_LINES = 40
# A worker is replaced after this many cases: every compiled library it loaded stays mapped
# (ctypes never unloads), so a long session would otherwise grow without bound.
CASES_PER_WORKER = 150


@dataclass
class Exchange:
    """Everything one case produced: its events in order, and how the worker ended it."""

    events: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False        # the worker said "done"
    died: str = ""                # "signal SIGSEGV" / "exit status 3", if the worker died
    timed_out: bool = False
    phase: str = ""               # the last phase the case entered
    log_tail: str = ""            # what the worker printed during the case (if it failed)
    seconds: float = 0.0

    def first(self, event: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("event") == event), None)

    def all(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]


class WorkerStartError(RuntimeError):
    """The worker could not even start (the fuzz harness is broken, not ember)."""


class Worker:
    """One worker process, restarted on demand."""

    def __init__(self, log_path: Path):
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.reader: MessageReader | None = None
        self.cases_run = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the worker in the session directory: with ``-m`` the working directory comes
        first on sys.path, and a relative path in a mutant must not resolve in the repo.  Its
        TMPDIR is in the session directory too: a killed worker cannot clean up its temporary
        files (ember's module directories, the C compiler's), the session can."""
        read_fd, write_fd = os.pipe()
        temporary = self.log_path.with_suffix(".tmp")
        temporary.mkdir(exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(TESTS_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["TMPDIR"] = str(temporary)
        env.setdefault("PYTHONFAULTHANDLER", "1")
        # ember's bounds on what a model file can make it do, lowered (as a user may) so
        # that a case reaches them within its deadline: the defaults (10**6 inlined nodes,
        # 10**7 Loop iterations) take minutes to reach, and a valid model of 10**5 nodes
        # takes minutes to compile.  The bound is what is tested: refused in time, with an
        # EmberError that names it.
        env.setdefault("EMBER_MAX_INLINED_NODES", str(FUZZ_MAX_INLINED_NODES))
        env.setdefault("EMBER_MAX_LOOP_ITERATIONS", str(FUZZ_MAX_LOOP_ITERATIONS))
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "fuzz.worker", str(write_fd)],
                stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(write_fd,),
                env=env, start_new_session=True, cwd=self.log_path.parent)
        os.close(write_fd)
        self.reader = MessageReader(read_fd)
        self.cases_run = 0
        try:
            ready = self.reader.read(time.monotonic() + STARTUP_TIMEOUT)
        except Timeout:
            ready = None
        if not ready or ready.get("event") != "ready":
            self.stop()
            raise WorkerStartError(f"the fuzz worker did not start; its log:\n{self._tail(0)}")

    def stop(self, graceful: bool = False) -> None:
        """Stop the worker: ``graceful`` lets an idle one exit on its own (it cleans up its
        temporary files); otherwise, or if it does not exit, kill it and everything it
        started (its C compiler, say): its own process group, created for it at start."""
        if self.process is None:
            return
        if graceful and self.process.poll() is None and self.process.stdin:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()
        if self.process.stdin and not self.process.stdin.closed:
            self.process.stdin.close()
        if self.reader is not None:
            os.close(self.reader.fd)
        self.process, self.reader = None, None

    # ------------------------------------------------------------------ one case
    def run(self, request: dict[str, Any], budget: Callable[[str], float]) -> Exchange:
        """Send ``request`` and collect its events.  ``budget(phase)`` is the seconds allowed
        in a phase (the clock restarts when the worker reports a new phase; the phase before
        the first report is "")."""
        if self.process is None or self.cases_run >= CASES_PER_WORKER:
            self.stop(graceful=True)
            self.start()
        assert self.process is not None and self.reader is not None
        self.cases_run += 1
        log_start = self.log_path.stat().st_size
        exchange = Exchange()
        started = time.monotonic()
        try:
            write_message(self.process.stdin, request)
        except (BrokenPipeError, OSError):
            return self._dead(exchange, log_start, started)
        deadline = started + budget("")
        while True:
            try:
                message = self.reader.read(deadline)
            except Timeout:
                exchange.timed_out = True
                self._dump_stack_and_stop()
                break
            if message is None:
                return self._dead(exchange, log_start, started)
            exchange.events.append(message)
            if message["event"] == "phase":
                exchange.phase = message["phase"]
                deadline = time.monotonic() + budget(message["phase"])
            if message["event"] == "done":
                exchange.finished = True
                break
        exchange.seconds = time.monotonic() - started
        if exchange.timed_out:
            exchange.log_tail = self._tail(log_start)
        return exchange

    def _dead(self, exchange: Exchange, log_start: int, started: float) -> Exchange:
        assert self.process is not None
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        exchange.died = _describe_exit(code)
        self.stop()
        exchange.seconds = time.monotonic() - started
        exchange.log_tail = self._tail(log_start)
        return exchange

    def _dump_stack_and_stop(self) -> None:
        """Ask faulthandler for the hung worker's Python stack, then kill it."""
        assert self.process is not None
        try:
            os.kill(self.process.pid, signal.SIGUSR1)
            time.sleep(0.5)
        except ProcessLookupError:
            pass
        self.stop()

    def _tail(self, start: int) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(start)
                text = log.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-LOG_TAIL_LINES:])


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"
