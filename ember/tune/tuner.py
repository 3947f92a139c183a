"""The tuning loop: tasks, the search over each task's configs, and the budget between them.

A *task* is one distinct kernel of a model (one workload key), weighted by how many steps of
the model run it.  The loop first measures every task's default config (the heuristic's
choice: always a candidate, and the yardstick), then spends rounds where the model stands to
gain most: the next round goes to the task with the largest ``steps x best time``, halved for
every round in a row that brought it no gain, and a task that went ``STALE_ROUNDS`` rounds
without a gain, or whose space is exhausted, is done.

A round measures the task's default again beside its candidates (a control: candidates are
compared by their time scaled by the default's in the same round, see ``_measure``).  It
proposes candidates by evolution over the task's measured configs -- mutations of the best
few (one or two knobs changed), crossovers of two of them, and random walks from the
default -- skipping every config measured before, in this run or any earlier one the
database holds.  With the cost model (``ember.tune.cost_model``, when LightGBM is
installed) a round proposes ``OVERSAMPLE`` times as many as it measures and measures those
the model ranks highest, plus a share ``EXPLORE`` picked at random (epsilon-greedy); the
model starts from the pretrained one and is retrained on every round's measurements, and
its ranking of each round's candidates before it saw them is kept as its ranking quality.
Every measurement lands in the database.

Times are noisy, so before it ends, the loop *confirms*: each task's best candidates and its
default are measured again, interleaved, ``CONFIRM_ROUNDS`` times, and a finalist is chosen
only where its median beats the default's by ``MIN_GAIN``; the verdict is written to the
database as a decision (``TuningDatabase.decide``), which is what ``ember.compile(...,
tuning_db=)`` applies.  Finally (given a way to rebuild the model) the decisions are checked
in the whole model: a kernel measured alone runs on warm data, in the model on what the
kernels before it left, and a decision whose step is not faster there is taken back.  A
task an earlier run decided is taken from the database as it is: a second run on the same
database measures no candidate again, and only checks the decisions in the model again.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ember.core.target import Target
from ember.driver.pipeline import Build
from ember.driver.single_kernel import KernelProblem, kernel_problems
from ember.schedule.config import KernelConfig
from ember.tune import cost_model
from ember.tune.cost_model import CostModel, ranking_quality
from ember.tune.database import Record, TuningDatabase, target_key
from ember.tune.measure import Measurement, Measurer, ModelTimes
from ember.tune.space import ConfigSpace, Point

STALE_ROUNDS = 3
EXPLORE = 0.25
OVERSAMPLE = 8
CONFIRM_ROUNDS = 4
FINALISTS = 2
# A finalist must beat the default's median (of the confirming rounds) by this much to be
# chosen: smaller differences are within what this machine's noise makes of equal kernels.
MIN_GAIN = 0.03
# ... and its step, in the whole model built with the decided configs, must beat the default
# build's by this much (timed in turns, VERIFY_ROUNDS rounds each), else it is taken back.
IN_MODEL_GAIN = 0.01
VERIFY_ROUNDS = 7
# Each candidate is timed for about this long (its rounds: this over the default's time).
MEASURE_SECONDS = 0.1
MIN_REPEAT, MAX_REPEAT = 10, 400
# The share of the budget kept for confirming the finalists.
CONFIRM_SHARE = 0.15


@dataclass
class Task:
    """One distinct kernel of the model and what the search knows of it."""

    problem: KernelProblem
    space: ConfigSpace
    steps: int  # how many steps of the model run this kernel
    measured: dict[str, list[float]] = field(default_factory=dict)  # config -> times
    refused: set[str] = field(default_factory=set)  # configs that failed or mismatched
    points: dict[str, Point] = field(default_factory=dict)
    trials: int = 0
    stale_rounds: int = 0
    done: bool = False
    errors: list[str] = field(default_factory=list)
    # config -> median seconds over the confirming rounds (the fair comparison: interleaved
    # in time with the default's)
    confirmed: dict[str, float] = field(default_factory=dict)
    # the task's steps in the whole model, built by default and with its decided config
    in_model: tuple[float | None, float | None] = (None, None)

    @property
    def key(self) -> str:
        return self.problem.workload_key

    @property
    def default_key(self) -> str:
        return self.space.default.key

    def seconds_of(self, config_key: str) -> float | None:
        times = self.measured.get(config_key)
        return float(statistics.median(times)) if times and config_key not in self.refused \
            else None

    @property
    def default_seconds(self) -> float | None:
        return self.seconds_of(self.default_key)

    def ranked(self) -> list[tuple[float, str]]:
        """Measured valid configs, fastest first."""
        return sorted((s, k) for k in self.measured if (s := self.seconds_of(k)) is not None)

    @property
    def best_seconds(self) -> float | None:
        ranked = self.ranked()
        return ranked[0][0] if ranked else None

    def repeat(self) -> int:
        seconds = self.default_seconds or 1e-3
        return max(MIN_REPEAT, min(MAX_REPEAT, math.ceil(MEASURE_SECONDS / seconds)))


@dataclass(frozen=True)
class TuneEvent:
    """What the loop reports after every round (for a progress display)."""

    phase: str  # "defaults", "search", "confirm", "done"
    elapsed: float
    budget: float
    trials: int
    tasks: tuple[Task, ...]
    estimate: float  # the model's kernels' time with the best configs so far (seconds)
    default_estimate: float


@dataclass(frozen=True)
class KernelResult:
    key: str
    label: str
    steps: int
    trials: int
    default_seconds: float | None
    tuned_seconds: float | None
    config: KernelConfig | None  # None: the default stays
    errors: tuple[str, ...] = ()
    # its steps' time in the whole model, by default and tuned (where the model was timed)
    in_model: tuple[float | None, float | None] = (None, None)

    @property
    def speedup(self) -> float | None:
        if self.default_seconds and self.tuned_seconds:
            return self.default_seconds / self.tuned_seconds
        return None


@dataclass(frozen=True)
class TuneResult:
    kernels: tuple[KernelResult, ...]
    trials: int
    seconds: float
    curve: tuple[tuple[float, float], ...]  # (elapsed seconds, estimated model kernel time)
    target_key: str
    # The whole model timed as built by default and with the tuned configs, interleaved
    # (median seconds per call); None when not compared.
    model_default_seconds: float | None = None
    model_tuned_seconds: float | None = None
    # The cost model's ranking of candidates before it was trained on them (see
    # ember.tune.cost_model.ranking_quality); empty without a model.
    model_quality: tuple[tuple[str, float], ...] = ()

    @property
    def default_estimate(self) -> float:
        return sum(k.steps * (k.default_seconds or 0.0) for k in self.kernels)

    @property
    def tuned_estimate(self) -> float:
        return sum(k.steps * (k.tuned_seconds or k.default_seconds or 0.0)
                   for k in self.kernels)

    @property
    def tuned(self) -> int:
        return sum(1 for k in self.kernels if k.config is not None)


def tune_build(build: Build, database: TuningDatabase, *, budget_seconds: float,
               target: Target | None = None, opt_level: int = 2, workers: int = 0,
               seed: int = 0, on_event: Callable[[TuneEvent], None] | None = None,
               candidates_per_round: int = 0, measurer: Measurer | None = None,
               use_model: bool = True,
               rebuild: Callable[[dict[str, KernelConfig]], Build] | None = None
               ) -> TuneResult:
    """Tune the kernels of ``build`` for ``budget_seconds`` of wall time, recording every
    measurement in ``database``; returns per kernel the default and the tuned time.
    ``measurer`` (default: a new one with ``workers`` build processes) is closed at the
    end; ``use_model=False`` searches without the cost model.  ``rebuild`` compiles the
    model with given configs by workload key: with it, the decisions are checked in the whole
    model at the end (see ``_verify_in_model``)."""
    target = target or build.target
    started = time.monotonic()
    rng = random.Random(seed)
    tkey = target_key(target)
    tasks = _tasks(build, target, opt_level, database, tkey)
    curve: list[tuple[float, float]] = []
    trials = 0
    guide = _Guide(use_model)

    def report(phase: str) -> None:
        estimate = _estimate(tasks, best=True)
        curve.append((time.monotonic() - started, estimate))
        if on_event is not None:
            on_event(TuneEvent(phase, time.monotonic() - started, budget_seconds, trials,
                               tuple(tasks), estimate, _estimate(tasks, best=False)))

    with measurer or Measurer(target, workers) as measurer:
        per_round = candidates_per_round or max(2, 2 * measurer.workers)
        # 1. every default: the yardstick, and the oracle's tolerance for the task
        live = [task for task in tasks if not task.done]
        for task in live:
            measurer.add_task(task.problem, seed)
        trials += len(_measure(measurer, database, tkey,
                               [(task, task.space.default) for task in live]))
        for task in live:
            if task.default_seconds is None:
                task.done = True  # its default fails here: nothing to compare against
        report("defaults")
        # 2. the search, while the budget lasts
        search_end = started + budget_seconds * (1 - CONFIRM_SHARE)
        while time.monotonic() < search_end:
            task = _next_task(tasks)
            if task is None:
                break
            candidates = guide.choose(task, _propose(task, rng, per_round * guide.oversample),
                                      per_round, rng)
            if not candidates:
                task.done = True
                continue
            before = task.best_seconds
            trials += len(_measure(measurer, database, tkey,
                                   [(task, task.space.default)] +
                                   [(task, p) for p in candidates], control=True))
            guide.learn(task, candidates, tasks)
            after = task.best_seconds
            gained = before is not None and after is not None and after < before * (1 - 0.01)
            task.stale_rounds = 0 if gained else task.stale_rounds + 1
            task.done = task.stale_rounds >= STALE_ROUNDS
            report("search")
        # 3. confirm the finalists against the default, and decide
        for task in live:
            if task.default_seconds is None:
                continue
            finalists = [k for _, k in task.ranked() if k != task.default_key][:FINALISTS]
            points = [task.space.default] + [task.points[k] for k in finalists]
            confirmed = {p.key: [] for p in points}
            if finalists:
                items = [(task, p) for _ in range(CONFIRM_ROUNDS) for p in points]
                times = _measure(measurer, database, tkey, items)
                for (_, point), seconds in zip(items, times):
                    if seconds is not None:
                        confirmed[point.key].append(seconds)
                trials += len(items)
                report("confirm")
            task.confirmed = {key: float(statistics.median(times))
                              for key, times in confirmed.items() if times}
            database.decide(task.key, tkey, _verdict(task, points, confirmed).config)
        # 4. check the decisions in the model, where a kernel's data come from the kernels
        # before it rather than from its own last run
        model_times = _verify_in_model(build, rebuild, measurer, tasks, database, tkey) \
            if rebuild is not None else None
        if model_times is not None:
            report("verify")
    kernels = tuple(_result(task, database, tkey) for task in tasks)
    result = TuneResult(kernels, trials, time.monotonic() - started, tuple(curve), tkey,
                        model_default_seconds=model_times[0] if model_times else None,
                        model_tuned_seconds=model_times[1] if model_times else None,
                        model_quality=guide.quality())
    if on_event is not None:
        on_event(TuneEvent("done", result.seconds, budget_seconds, trials, tuple(tasks),
                           result.tuned_estimate, result.default_estimate))
    return result


def _tasks(build: Build, target: Target, opt_level: int, database: TuningDatabase,
           tkey: str) -> list[Task]:
    """One task per distinct kernel, with what the database already knows of it."""
    by_key: dict[str, Task] = {}
    for problem in kernel_problems(build, opt_level):
        if problem.workload_key in by_key:
            by_key[problem.workload_key].steps += 1
            continue
        task = Task(problem, ConfigSpace(problem, target), steps=1)
        for record in database.records(problem.workload_key, tkey):
            config_key = record.config.to_json()
            if record.valid and record.seconds is not None:
                task.measured.setdefault(config_key, []).append(record.seconds)
            else:
                task.refused.add(config_key)
                task.measured.setdefault(config_key, [])
            point = task.space.canonical(record.config)
            if point is not None:
                task.points.setdefault(config_key, point)
        task.points.setdefault(task.default_key, task.space.default)
        # tuned by an earlier run (it decided): nothing to measure again
        task.done = database.decision(problem.workload_key, tkey) is not None
        by_key[problem.workload_key] = task
    return list(by_key.values())


def _next_task(tasks: list[Task]) -> Task | None:
    """The live task where a round is worth most: steps x best time, halved per stale round."""
    live = [t for t in tasks if not t.done and t.best_seconds is not None]
    if not live:
        return None
    return max(live, key=lambda t: t.steps * t.best_seconds * 0.5 ** t.stale_rounds)


class _Guide:
    """The cost model's part in the search: ranks proposals, learns from measurements, and
    keeps how well it ranked each round before it learned from it."""

    def __init__(self, enabled: bool):
        self.model: CostModel | None = None
        self.start: CostModel | None = None
        if enabled and cost_model.available():
            self.start = CostModel.pretrained()
            self.model = self.start or CostModel()
        self.oversample = OVERSAMPLE if self.model is not None else 1
        self.judged: list[tuple[float, float, str]] = []  # (predicted, measured, task)

    def choose(self, task: Task, proposals: list[Point], count: int,
               rng: random.Random) -> list[Point]:
        if self.model is None or not self.model.trained or len(proposals) <= count:
            return proposals[:count]
        scores = self.model.predict(np.stack([p.features for p in proposals]))
        order = [proposals[i] for i in np.argsort(-scores, kind="stable")]
        explore = sum(rng.random() < EXPLORE for _ in range(count))
        chosen = order[:count - explore]
        rest = order[count - explore:]
        return chosen + rng.sample(rest, min(explore, len(rest)))

    def learn(self, task: Task, measured: list[Point], tasks: list[Task]) -> None:
        if self.model is None:
            return
        default = task.default_seconds
        fresh = [(p, task.seconds_of(p.key)) for p in measured]
        fresh = [(p, s) for p, s in fresh if s is not None and default]
        if self.model.trained and len(fresh) >= 2:
            predicted = self.model.predict(np.stack([p.features for p, _ in fresh]))
            self.judged.extend((float(q), math.log2(default / s), task.key)
                               for q, (_, s) in zip(predicted, fresh))
        samples = [(t.points[k].features, math.log2(t.default_seconds / s))
                   for t in tasks if t.default_seconds
                   for k in t.measured if k in t.points and (s := t.seconds_of(k))]
        if len(samples) >= 8:
            self.model = CostModel().fit(np.stack([f for f, _ in samples]),
                                         np.array([y for _, y in samples]), start=self.start)

    def quality(self) -> tuple[tuple[str, float], ...]:
        if len(self.judged) < 4:
            return ()
        predicted, measured, groups = zip(*self.judged)
        return tuple(ranking_quality(predicted, measured, groups).items())


def _propose(task: Task, rng: random.Random, count: int) -> list[Point]:
    """Up to ``count`` configs never measured before: mutations and crossovers of the best
    few, and random walks from the default."""
    elite = [task.points[k] for _, k in task.ranked()[:5] if k in task.points] or \
        [task.space.default]
    chosen: dict[str, Point] = {}
    for _ in range(count * 25):
        if len(chosen) >= count:
            break
        roll = rng.random()
        if roll < EXPLORE:
            point = task.space.random_point(rng)
        elif roll < EXPLORE + 0.2 and len(elite) > 1:
            a, b = rng.sample(elite, 2)
            point = task.space.crossover(a, b, rng)
        else:
            parent = elite[min(int(rng.expovariate(1.0)), len(elite) - 1)]
            point = task.space.mutate(parent, rng, steps=rng.choice((1, 1, 2)))
        if point is None or point.key in task.measured or point.key in chosen:
            continue
        chosen[point.key] = point
    return list(chosen.values())


def _verify_in_model(build: Build, rebuild: Callable[[dict[str, KernelConfig]], Build],
                     measurer: Measurer, tasks: list[Task], database: TuningDatabase,
                     tkey: str) -> tuple[float, float] | None:
    """Build the model with the configs decided, time it against the default build (each
    in the runner in turn, ``VERIFY_ROUNDS`` rounds), and take back every decision whose
    kernel is not faster *in the model* by ``IN_MODEL_GAIN`` (the median over rounds of its
    steps' tuned/default ratio, ``_paired_ratio``) -- measured alone, a kernel runs
    on its own last run's data, warm in the caches; in the model, on data the kernels before
    it left, and on weights that other layers evicted.  If the model with the decisions
    kept is not faster as a whole than the default build, none is kept.  Returns the model's
    time (its steps' sum) built by default and as finally decided -- the default's median
    times the paired ratio -- (None when nothing was decided against the default)."""
    chosen = {task.key: config for task in tasks
              if (config := database.decision(task.key, tkey)) is not None
              and config.to_json() != task.default_key}
    if not chosen:
        return None
    tuned = rebuild(chosen)
    default_times, tuned_times = measurer.time_models([build, tuned], rounds=VERIFY_ROUNDS)
    keys = [impl.workload_key for impl in build.impls]
    if default_times.steps is None or tuned_times.steps is None or \
            keys != [impl.workload_key for impl in tuned.impls]:
        for task in tasks:  # cannot tell: nothing is kept that the model did not confirm
            if task.key in chosen:
                database.decide(task.key, tkey, task.space.default.config)
                task.in_model = (None, None)
        return None
    by_task = {task.key: task for task in tasks}
    kept = dict(chosen)
    for key in chosen:
        steps = [i for i, k in enumerate(keys) if k == key]
        before = float(default_times.steps[steps].sum())
        after = float(tuned_times.steps[steps].sum())
        by_task[key].in_model = (before, after)
        if _paired_ratio(default_times, tuned_times, steps) >= 1 - IN_MODEL_GAIN:
            database.decide(key, tkey, by_task[key].space.default.config)
            del kept[key]
    if not kept:
        return default_times.seconds, default_times.seconds
    if kept != chosen:
        default_times, tuned_times = measurer.time_models([build, rebuild(kept)],
                                                          rounds=VERIFY_ROUNDS)
    # every step counts: steps whose code did not change are in both, so an effect of a
    # tuned kernel on its neighbours (what it leaves in the caches) is seen
    ratio = _paired_ratio(default_times, tuned_times, list(range(len(keys))))
    if default_times.seconds is None or ratio >= 1:
        # the model as a whole is not faster (its kernels' gains lost in its noise, or in
        # what they do to each other's caches): nothing is kept
        for key in kept:
            database.decide(key, tkey, by_task[key].space.default.config)
        return default_times.seconds, default_times.seconds
    return default_times.seconds, default_times.seconds * ratio


def _paired_ratio(default: ModelTimes, tuned: ModelTimes, steps: list[int]) -> float:
    """The median over rounds of (tuned / default) time of ``steps``: the two builds run
    back to back in every round, so a slow episode of the host that covers a round covers
    both (a MobileNetV2 build 0.98x by this measure had measured 1.68x by the medians of
    the two series, its default's rounds caught in an episode)."""
    rounds = min(len(default.step_rounds), len(tuned.step_rounds))
    if not rounds:
        return float("inf")
    ratios = [sum(tuned.step_rounds[r][i] for i in steps) /
              max(sum(default.step_rounds[r][i] for i in steps), 1e-12)
              for r in range(rounds)]
    return float(statistics.median(ratios))


def _verdict(task: Task, points: list[Point], confirmed: dict[str, list[float]]) -> Point:
    """The finalist with the lowest median over the confirming rounds where it beats the
    default's median of the same rounds by ``MIN_GAIN``; else the default (``points[0]``).
    A finalist that failed in any round is out."""
    default = points[0]
    medians = {key: float(statistics.median(times)) for key, times in confirmed.items()
               if len(times) == CONFIRM_ROUNDS}
    if default.key not in medians:
        return default
    contenders = [p for p in points[1:] if p.key in medians]
    if not contenders:
        return default
    best = min(contenders, key=lambda p: medians[p.key])
    return best if medians[best.key] < medians[default.key] * (1 - MIN_GAIN) else default


def _measure(measurer: Measurer, database: TuningDatabase | None, tkey: str,
             items: list[tuple[Task, Point]], control: bool = False) -> list[float | None]:
    """Measure ``items``, record them (in ``database`` unless None) and in their tasks;
    returns each one's seconds (None: it failed).

    With ``control`` the first item is the task's default, measured in the same round as
    the candidates after it: the task keeps each candidate's time scaled by how much slower
    or faster the default ran this round than its median so far -- a round takes about a
    second, this machine's slow episodes last seconds, and a candidate timed in one would
    otherwise look slow (or its rivals fast).  The database keeps the times as measured."""
    if not items:
        return []
    reference = items[0][0].default_seconds if control else None
    repeats = {task.key: task.repeat() for task, _ in items}
    # (the default is built as a model's build makes it: with no config at all)
    results: list[Measurement] = measurer.measure(
        [(task.key, None if point.key == task.default_key else point.config)
         for task, point in items], repeats)
    scale = 1.0
    if reference and results[0].valid and results[0].seconds:
        scale = reference / results[0].seconds
    records = []
    for position, ((task, point), result) in enumerate(zip(items, results)):
        task.trials += 1
        task.points.setdefault(point.key, point)
        if result.valid and result.seconds is not None:
            seconds = result.seconds * (scale if position > 0 else 1.0)
            task.measured.setdefault(point.key, []).append(seconds)
        else:
            task.refused.add(point.key)
            task.measured.setdefault(point.key, [])
            task.errors.append(result.error)
        records.append(Record(task.key, tkey, point.config, result.seconds, result.valid,
                              result.error[:2000], kernel=task.problem.label))
    if database is not None:
        database.add_many(records)
    return [r.seconds if r.valid else None for r in results]


def _estimate(tasks: list[Task], best: bool) -> float:
    total = 0.0
    for task in tasks:
        seconds = task.best_seconds if best else task.default_seconds
        total += task.steps * (seconds or task.default_seconds or 0.0)
    return total


def _result(task: Task, database: TuningDatabase, tkey: str) -> KernelResult:
    """The task's verdict, as ``ember.compile(tuning_db=...)`` will apply it (the database's
    decision, else its best config by median)."""
    chosen = database.decision(task.key, tkey)
    if chosen is None:
        best = database.best(task.key, tkey)
        chosen = best.config if best is not None else None

    def seconds(key: str) -> float | None:  # the confirming rounds' median where there is one
        return task.confirmed.get(key, task.seconds_of(key))

    default = seconds(task.default_key)
    config, tuned = None, default
    if chosen is not None and chosen.to_json() != task.default_key:
        config, tuned = chosen, seconds(chosen.to_json())
    return KernelResult(task.key, task.problem.label, task.steps, task.trials, default,
                        tuned, config, tuple(dict.fromkeys(task.errors))[:5], task.in_model)
