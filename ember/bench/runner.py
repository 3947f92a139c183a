"""One benchmark case: a zoo model at one batch, against every peer, with every exporter.

For a (model, batch) the runner builds the seeded torch model, takes PyTorch eager's outputs
as the reference, exports the model with each requested exporter (cached), prepares every
contender -- torch peers once, ONNX peers once per exported file -- checks each one's outputs
against the reference, and then times them all in ONE interleaved measurement, so that the
torch columns and both exporters' columns of a model share the same rounds of the same run.

Nothing a contender does stops the run: an export, compile or run failure, or a wrong result,
is recorded with its error and the case goes on with the others.
"""

from __future__ import annotations

import gc
import traceback
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from ember.bench.export import ExportRecord, export_model
from ember.bench.isolation import ContenderError, InProcessContender, IsolatedContender, Recipe
from ember.bench.peers import Peer, Prepared, Workload
from ember.bench.timing import Agreement, Series, compare_outputs, measure_interleaved
from ember.bench.zoo import ZOO, BuiltModel, ZooEntry

Log = Callable[[str], None]


@dataclass(frozen=True)
class Settings:
    threads: int = 2
    rounds: int = 10
    warmup: int = 2
    size: str = "full"
    rtol: float = 1e-4
    atol: float = 1e-5
    # Most time one contender may spend in timed samples per case (it keeps MIN_ROUNDS).
    budget_seconds: float | None = 60.0
    cache_dir: Path | None = None
    refresh_exports: bool = False
    cold_compile: bool = False  # see peers.Workload.cold_compile
    ort_spin: bool = False  # see peers.Workload.ort_spin
    tuning_db: str | None = None  # see peers.Workload.tuning_db
    traceback: bool = False  # keep full tracebacks of failures in the results
    isolate: bool = True  # each contender in its own worker process (see module docstring)


@dataclass
class ContenderResult:
    """One contender in one case: ``peer`` run on ``exporter``'s file (None: torch peers)."""

    peer: str
    exporter: str | None
    setup_seconds: float | None = None  # prepare + first call: compile time for compilers
    error: str | None = None
    error_stage: str | None = None  # "prepare" or "run"
    agreement: Agreement | None = None
    series: Series | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return contender_key(self.peer, self.exporter)

    @property
    def median_ms(self) -> float | None:
        if self.series is None or not self.series.samples_ms:
            return None
        return self.series.median


@dataclass
class CaseResult:
    """Everything measured for one (model, batch)."""

    model: str
    description: str
    batch: int
    size: str
    shape: str = ""
    exports: dict[str, ExportRecord] = field(default_factory=dict)
    contenders: dict[str, ContenderResult] = field(default_factory=dict)
    orders: list[list[str]] = field(default_factory=list)
    error: str | None = None  # the model itself could not be built or run in torch

    def row(self, exporter: str) -> dict[str, ContenderResult]:
        """The contenders of the table row for ``exporter``: its ONNX peers and the torch
        peers (which do not depend on the exporter), by peer name."""
        return {c.peer: c for c in self.contenders.values()
                if c.exporter in (None, exporter)}

    def ember_over_best(self, exporter: str) -> float | None:
        """ember's median over the fastest other contender's median in the same row:
        above 1, ember is that many times slower than the best peer."""
        row = self.row(exporter)
        ember = row.get("ember")
        others = [c.median_ms for name, c in row.items() if name != "ember"
                  and c.median_ms is not None]
        if ember is None or ember.median_ms is None or not others:
            return None
        return ember.median_ms / min(others)


def contender_key(peer: str, exporter: str | None) -> str:
    return peer if exporter is None else f"{peer}/{exporter}"


def run_case(entry: ZooEntry, batch: int, exporters: Sequence[str], peers: Sequence[Peer],
             settings: Settings, log: Log = lambda message: None) -> CaseResult:
    """Benchmark one zoo model at one batch size; never raises for a contender's failure."""
    result = CaseResult(entry.name, entry.description, batch, settings.size)
    try:
        built = entry.build(batch, settings.size)
        reference = _reference_outputs(built)
    except Exception as error:  # the model itself is broken here: report, next case
        result.error = _describe_error(error, settings.traceback)
        log(f"  {entry.name}: building or running the torch model failed: {result.error}")
        return result
    result.shape = built.shape

    workloads: list[Workload] = []
    for exporter in exporters:
        record = export_model(entry, built, settings.size, batch, exporter,
                              settings.cache_dir, settings.refresh_exports)
        result.exports[exporter] = record
        how = "cached" if record.cached else f"{record.seconds:.1f} s"
        log(f"  export {exporter}: " + (f"ok ({how})" if record.ok else
                                        f"FAILED ({how}): {_first_line(record.error)}"))
        if record.ok:
            workloads.append(Workload(entry.name, built, settings.threads, record.path,
                                      exporter, settings.cold_compile, settings.ort_spin,
                                      settings.tuning_db))
    torch_workload = Workload(entry.name, built, settings.threads,
                              cold_compile=settings.cold_compile)

    ready: dict[str, Callable[[], Any]] = {}
    with ExitStack() as running:
        for peer in peers:
            for workload in (workloads if peer.source == "onnx" else [torch_workload]):
                contender = ContenderResult(peer.name, workload.exporter)
                result.contenders[contender.key] = contender
                run = _start(peer, workload, entry, batch, built, reference, contender,
                             settings, log)
                if run is not None:
                    running.callback(run.close)
                    ready[contender.key] = run

        if ready:
            where = "each in its own process" if settings.isolate else "in this process"
            log(f"  timing {len(ready)} contender(s), {where}: {settings.warmup} warm-up + up "
                f"to {settings.rounds} interleaved rounds ...")
            measurement = measure_interleaved(ready, settings.rounds, settings.warmup,
                                              budget_seconds=settings.budget_seconds)
            for key, series in measurement.series.items():
                result.contenders[key].series = series
            result.orders = measurement.orders
        del ready
    if not settings.isolate:
        _release_memory(peers)
    return result


def _reference_outputs(built: BuiltModel) -> list:
    """PyTorch eager's outputs: the oracle every contender is checked against."""
    import torch

    with torch.inference_mode():
        output = built.module(*(torch.from_numpy(a) for a in built.inputs.values()))
    outputs = output if isinstance(output, (tuple, list)) else (output,)
    return [o.detach().numpy().copy() for o in outputs]


def _start(peer: Peer, workload: Workload, entry: ZooEntry, batch: int, built: BuiltModel,
           reference: list, contender: ContenderResult, settings: Settings, log: Log
           ) -> IsolatedContender | InProcessContender | None:
    """Prepare a contender -- in a worker process of its own unless ``settings.isolate`` is
    off -- and check its first outputs; None when it failed.  A worker rebuilds the (seeded)
    torch model itself for a torch peer: a module does not cross the process boundary."""
    if settings.isolate:
        log(f"  preparing {contender.key} in a worker process ...")
        # the zoo's own entries go by name (their builders are closures, which do not pickle)
        model: ZooEntry | str | None = None
        if peer.source == "torch":
            model = entry.name if ZOO.get(entry.name) is entry else entry
        recipe = Recipe(prepare_zoo_contender, (peer, replace(workload, built=None), model,
                                                 batch, settings.size))
    else:
        log(f"  preparing {contender.key} ...")
        recipe = Recipe(peer.prepare, (workload,))
    try:
        run = IsolatedContender(recipe, built.inputs, settings.threads) if settings.isolate \
            else InProcessContender(recipe, built.inputs)
    except ContenderError as error:
        contender.error = error.traceback if settings.traceback else str(error)
        contender.error_stage = error.stage
        log(f"  {contender.key}: {error.stage} FAILED: {_first_line(str(error))}")
        return None
    contender.details = run.details
    contender.setup_seconds = run.setup_seconds
    contender.agreement = compare_outputs(reference, run.outputs, settings.rtol, settings.atol)
    if not contender.agreement.ok:
        log(f"  {contender.key}: outputs disagree with torch eager: "
            f"{contender.agreement.message}")
    return run


def prepare_zoo_contender(peer: Peer, workload: Workload, model: ZooEntry | str | None,
                          batch: int, size: str) -> Prepared:
    """The recipe a worker process runs: ``peer`` prepared on ``workload``, with the zoo
    model (an entry, or the name of one in ZOO) rebuilt here -- seeded, so with the same
    weights -- for a peer that runs the torch module."""
    if model is not None:
        entry = ZOO[model] if isinstance(model, str) else model
        workload = replace(workload, built=entry.build(batch, size))
    return peer.prepare(workload)


def _release_memory(peers: Sequence[Peer]) -> None:
    """Free the compiled models of a case before the next one (GPT-2's weights exist once
    per contender)."""
    if any(peer.name == "torch_compile" for peer in peers):
        import torch

        torch._dynamo.reset()
    gc.collect()


def _describe_error(error: BaseException, full: bool) -> str:
    if full:
        return "".join(traceback.format_exception(error)).rstrip()
    return f"{type(error).__name__}: {error}".strip()


def _first_line(text: str | None, limit: int = 200) -> str:
    line = (text or "").strip().splitlines()[0] if text and text.strip() else ""
    return line if len(line) <= limit else line[:limit] + " ..."
