"""``ember bench --peak`` on whole models: each contender's GFLOP/s as a share of the machine.

The FMA peak and the triad bandwidth (``ember.profile.peak``) are measured in the same run,
before the first case and after the last, because the host's load drifts; the shares are of
the higher of the two measurements, so that a busy moment cannot flatter anyone.  A model's
work is counted once, by ember's cost rules (``ember.ops.cost``: a multiply-add is two FLOPs)
on the exported ONNX file, and divided by each contender's median time: every contender is
credited with the same FLOPs, whatever it really executes, as ``ember profile`` does per
kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from rich.table import Table
from rich.text import Text

from ember.bench.peers import Peer
from ember.bench.runner import CaseResult
from ember.profile.peak import Peak


@dataclass
class Machine:
    """The peaks measured around the run."""

    before: Peak
    after: Peak | None = None

    @property
    def fma_gflops(self) -> float:
        return max(p.fma_gflops for p in self.measurements)

    @property
    def bandwidth_gbs(self) -> float:
        return max(p.bandwidth_gbs for p in self.measurements)

    @property
    def measurements(self) -> list[Peak]:
        return [self.before] + ([self.after] if self.after is not None else [])

    def describe(self) -> str:
        shown = " / ".join(f"{p.fma_gflops:.1f}" for p in self.measurements)
        bandwidth = " / ".join(f"{p.bandwidth_gbs:.1f}" for p in self.measurements)
        return (f"fp32 FMA peak {shown} GFLOP/s, triad bandwidth {bandwidth} GB/s "
                f"({self.before.threads} thread(s), {self.before.lanes} lanes; before / after "
                f"the run)")

    def to_dict(self) -> dict[str, Any]:
        return {"before": self.before.to_dict(),
                "after": self.after.to_dict() if self.after is not None else None,
                "fma_gflops": self.fma_gflops, "bandwidth_gbs": self.bandwidth_gbs}


@dataclass
class ModelWork:
    """FLOPs per call of each (model, batch, exporter) file; None where they are unknown."""

    flops: dict[tuple[str, int, str], int | None] = field(default_factory=dict)

    def get(self, case: CaseResult, exporter: str) -> int | None:
        return self.flops.get((case.model, case.batch, exporter))


def model_flops(path: Path) -> int | None:
    """The FLOPs of one call of the ONNX model at ``path`` (its shapes must be static, as the
    zoo's exports are); None when some op's cost is unknown."""
    from ember.frontend.onnx import import_onnx
    from ember.ops.cost import estimate_flops

    total = estimate_flops(import_onnx(str(path))).total
    return total if isinstance(total, int) else None


def count_work(results: Sequence[CaseResult]) -> ModelWork:
    work = ModelWork()
    for case in results:
        for exporter, record in case.exports.items():
            if record.ok and record.path is not None:
                try:
                    flops = model_flops(Path(record.path))
                except Exception:  # noqa: BLE001 -- a file ember cannot read has no count
                    flops = None
                work.flops[(case.model, case.batch, exporter)] = flops
    return work


def gflops_per_second(flops: int | None, median_ms: float | None) -> float | None:
    if not flops or not median_ms or median_ms <= 0 or math.isnan(median_ms):
        return None
    return flops / (median_ms * 1e-3) / 1e9


def render_efficiency_table(results: Sequence[CaseResult], peers: Sequence[Peer],
                            exporters: Sequence[str], work: ModelWork,
                            machine: Machine) -> Table:
    table = Table(title=f"achieved GFLOP/s and % of the FMA peak — {machine.describe()}",
                  title_justify="left")
    table.add_column("model", no_wrap=True)
    table.add_column("batch", justify="right")
    table.add_column("exporter", no_wrap=True)
    table.add_column("GFLOP/call", justify="right")
    for peer in peers:
        table.add_column(peer.label, justify="right")
    peak = machine.fma_gflops
    for case in results:
        for exporter in exporters:
            if exporter not in case.exports:
                continue
            flops = work.get(case, exporter)
            row = case.row(exporter)
            cells = []
            for peer in peers:
                contender = row.get(peer.name)
                speed = gflops_per_second(flops, contender.median_ms if contender else None)
                cells.append(Text("—") if speed is None else
                             Text(f"{speed:.1f} ({100 * speed / peak:.0f}%)"))
            table.add_row(case.model, str(case.batch), exporter, _gflop(flops), *cells)
    table.caption = ("GFLOP/call: the model's work by ember's cost rules (a multiply-add is "
                     "two FLOPs), the same for every contender. Cells: GFLOP/s at the median "
                     "time (% of the higher FMA peak measurement).")
    table.caption_justify = "left"
    return table


def _gflop(flops: int | None) -> str:
    if flops is None:
        return "—"
    return f"{flops / 1e9:.2f}" if flops >= 10**8 else f"{flops / 1e9:.2g}"


def efficiency_json(work: ModelWork, machine: Machine) -> dict[str, Any]:
    return {"peak": machine.to_dict(),
            "flops_per_call": [{"model": model, "batch": batch, "exporter": exporter,
                                "flops": flops}
                               for (model, batch, exporter), flops in work.flops.items()]}
