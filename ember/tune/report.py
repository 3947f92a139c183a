"""What a tuning run shows: a live progress display, the final table, the tuning curve."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

from ember.core.errors import EmberError
from ember.tune.tuner import TuneEvent, TuneResult

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*\Z", re.IGNORECASE)


def parse_budget(text: str | float | int) -> float:
    """Seconds from ``90``, ``90s``, ``10m``, ``1.5h``."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _DURATION.match(str(text))
        if match is None:
            raise EmberError(f"budget {text!r}: give a duration such as 90s, 10m or 1h")
        unit = (match.group(2) or "s").lower()
        seconds = float(match.group(1)) * {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}[unit]
    if seconds <= 0:
        raise EmberError(f"budget {text!r}: must be positive")
    return seconds


def parse_model_spec(text: str) -> tuple[Path, dict[str, tuple[int, ...]]]:
    """A model and input shapes as the tuning scripts take them:
    ``path[:name=d,d,...[;name=d,...]]`` (inputs not named keep their declared shape)."""
    path, _, shapes = text.partition(":")
    given = {}
    for part in filter(None, shapes.split(";")):
        name, _, dims = part.partition("=")
        try:
            given[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise EmberError(f"{text!r}: give shapes as NAME=D,D,... (integers)") from None
    return Path(path), given


def _us(seconds: float | None) -> str:
    return f"{seconds * 1e6:,.1f}" if seconds else "-"


class LiveProgress:
    """A rich live display of the tuning loop (a ``TuneEvent`` callback); quiet where the
    output is not a terminal, apart from one line per phase."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self._live: Live | None = None
        self._phase = ""

    def __enter__(self) -> "LiveProgress":
        if self.console.is_terminal:
            self._live = Live(console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc_info)

    def __call__(self, event: TuneEvent) -> None:
        if self._live is not None:
            self._live.update(self._render(event))
        elif event.phase != self._phase:
            self.console.print(f"tuning: {event.phase} ({event.elapsed:.0f} s, "
                               f"{event.trials} trials)")
        self._phase = event.phase

    def _render(self, event: TuneEvent) -> Group:
        left = max(0.0, event.budget - event.elapsed)
        gain = event.default_estimate / event.estimate if event.estimate else 1.0
        header = (f"[bold]{event.phase}[/bold]  {event.trials} trials  "
                  f"{event.elapsed:.0f} s elapsed, {left:.0f} s left  "
                  f"kernels {_us(event.default_estimate)} -> {_us(event.estimate)} us "
                  f"({gain:.2f}x)")
        table = Table(box=None, pad_edge=False)
        for column in ("kernel", "steps", "trials", "default us", "best us", ""):
            table.add_column(column, justify="left" if column == "kernel" else "right")
        for task in sorted(event.tasks, key=lambda t: -(t.steps * (t.default_seconds or 0))):
            table.add_row(task.problem.label[:60], str(task.steps), str(task.trials),
                          _us(task.default_seconds), _us(task.best_seconds),
                          "done" if task.done else "")
        bar = ProgressBar(total=event.budget, completed=min(event.elapsed, event.budget))
        return Group(header, bar, table)


def result_table(result: TuneResult) -> Table:
    """Per kernel: default and tuned time (alone, the confirming rounds' medians), speedup,
    share of the model's kernel time, and where the model was timed, its steps' time there
    (decisions not faster in the model are taken back)."""
    table = Table(title=f"tuned {result.tuned} of {len(result.kernels)} kernels in "
                        f"{result.trials} trials, {result.seconds:.0f} s")
    in_model = any(k.in_model[0] is not None for k in result.kernels)
    columns = ["kernel", "steps", "trials", "default us", "tuned us", "speedup", "share"]
    if in_model:
        columns += ["in model: default us", "tuned us"]
    for column in columns:
        table.add_column(column, justify="left" if column == "kernel" else "right")
    total = result.default_estimate or 1.0
    for kernel in sorted(result.kernels, key=lambda k: -k.steps * (k.default_seconds or 0)):
        share = kernel.steps * (kernel.default_seconds or 0) / total
        speedup = kernel.speedup
        cells = [kernel.label[:60], str(kernel.steps), str(kernel.trials),
                 _us(kernel.default_seconds),
                 _us(kernel.tuned_seconds) if kernel.config is not None else "(default)",
                 f"{speedup:.2f}x" if speedup and kernel.config is not None else "",
                 f"{share:.1%}"]
        if in_model:
            before, after = kernel.in_model
            kept = kernel.config is not None
            cells += [_us(before), (_us(after) if kept else f"{_us(after)} (taken back)")
                      if after is not None else ""]
        table.add_row(*cells)
    table.caption = (f"kernels of the model: {_us(result.default_estimate)} us by default, "
                     f"{_us(result.tuned_estimate)} us tuned "
                     f"({result.default_estimate / (result.tuned_estimate or 1):.2f}x)")
    return table


def plot_curve(result: TuneResult, path: str | Path) -> Path:
    """A PNG of the estimated model kernel time against tuning time (needs matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise EmberError("plotting the tuning curve needs matplotlib: "
                         "pip install 'ember[bench]' or pip install matplotlib") from None
    figure, axes = plt.subplots(figsize=(6, 3.5))
    xs = [t for t, _ in result.curve]
    ys = [s * 1e6 for _, s in result.curve]
    axes.plot(xs, ys, drawstyle="steps-post", label="best configs so far")
    axes.axhline(result.default_estimate * 1e6, color="grey", linestyle="--",
                 label="default schedules")
    axes.set_xlabel("tuning time (s)")
    axes.set_ylabel("kernel time of the model (us)")
    axes.legend()
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
