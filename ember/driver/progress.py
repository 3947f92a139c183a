"""A progress line for builds that take a while.

Why: a large model's first build runs its graph passes, schedules hundreds of kernels and
waits for the C compiler for tens of seconds, and a silent terminal for that long looks like
a hang.  A build shows, on stderr, which stage it is in and how many kernels or C units are
done -- only once it has run for :data:`DELAY_SECONDS` (a cached or small build stays silent),
only when stderr is a terminal (logs and CI output stay clean), and the line disappears when
the build ends.  ``EMBER_PROGRESS=0`` turns it off, ``EMBER_PROGRESS=1`` shows it on any
stream.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ember.core.config import env_flag
from ember.core.text import TerminalConsole, printable

PROGRESS_ENV = "EMBER_PROGRESS"
DELAY_SECONDS = 2.0


class BuildProgress:
    """The progress of one build: :meth:`stage` names what it does now (with a count of
    steps when it has them), :meth:`advance` and :meth:`done` move the count.  Use it as a
    context manager; every call is cheap while nothing is shown."""

    def __init__(self, model: str, console: Any = None, delay: float = DELAY_SECONDS):
        self.model = printable(model).replace("\n", " ")  # text from the model file
        self.delay = delay
        self._console = console
        forced = env_flag(PROGRESS_ENV, default=False) if PROGRESS_ENV in os.environ else None
        stream_is_terminal = bool(getattr(sys.stderr, "isatty", lambda: False)())
        self.enabled = forced if forced is not None else \
            (console is not None or stream_is_terminal)
        self._started = time.monotonic()
        self._description = ""
        self._completed = 0
        self._total: int | None = None
        self._progress: Any = None
        self._task: Any = None
        self._drawn = ""

    def __enter__(self) -> "BuildProgress":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def stage(self, description: str, total: int | None = None) -> None:
        self._description, self._completed, self._total = description, 0, total
        self._refresh()

    def advance(self, count: int = 1) -> None:
        self._completed += count
        self._refresh()

    def done(self, completed: int, total: int) -> None:
        self._completed, self._total = completed, total
        self._refresh()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    @property
    def shown(self) -> bool:
        return self._progress is not None

    def _refresh(self) -> None:
        if not self.enabled:
            return
        if self._progress is None:
            if time.monotonic() - self._started < self.delay:
                return
            self._start()
        line = self._line()
        self._progress.update(self._task, description=line, completed=self._completed,
                              total=self._total)
        if line != self._drawn:  # a new stage is drawn at once (counts at rich's own pace)
            self._drawn = line
            self._progress.refresh()

    def _line(self) -> str:
        return f"ember: building {self.model}: {self._description}"

    def _start(self) -> None:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        console = self._console if self._console is not None else TerminalConsole(stderr=True)
        self._progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                                  transient=True)
        self._progress.start()
        self._task = self._progress.add_task(self._line(), total=self._total,
                                             completed=self._completed)
