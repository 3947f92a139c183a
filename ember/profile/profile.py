"""A per-kernel profile: where a compiled model spends its time, and how well.

The runtime measures one time per step of ``ember_run`` (:mod:`ember.runtime.profiling`);
the build knows what each step is -- the kernel, the fused nodes, their types.  Joining the
two gives a row per step with its median time and share, its FLOPs (``ember.ops.cost`` over
the step's nodes) and bytes moved (what the step reads from and writes to memory outside
it: the group's inputs and outputs), and so its GFLOP/s and GB/s.  Given the machine's peak
(:mod:`ember.profile.peak`), each row also says how close it comes to the FMA peak and to the
memory bandwidth, and which of the two bounds it -- the larger share: a step at 60% of the
bandwidth and 5% of the FMA peak has little to gain from better arithmetic.

FLOPs count a multiply-add as two operations; nodes whose op has no FLOPs rule are listed in
``uncounted`` (the row's FLOPs are then a lower bound).  Bytes moved are those of the fused
kernel, not the sum over its nodes: values the fusion keeps in registers move nothing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ember.codegen.c import kernel_symbol
from ember.driver.kernels import KernelImpl
from ember.ir.graph import Graph
from ember.ir.types import TensorType
from ember.ops.cost import has_rule, node_flops
from ember.profile.peak import Peak


@dataclass(frozen=True)
class StepProfile:
    """One step of ``ember_run``: a compiled kernel or a numpy fallback (``kind`` host)."""

    index: int
    kind: str  # "kernel" | "host"
    kernel: str | None  # the C symbol of a kernel; None for a host step
    ops: tuple[str, ...]  # op types of the fused nodes, in graph order
    nodes: tuple[str, ...]  # their names
    seconds: float  # median wall time
    share: float  # of the sum of the step medians
    flops: int
    bytes: int
    uncounted: tuple[str, ...] = ()  # ops of the nodes without a FLOPs rule
    peak: Peak | None = field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        """What the table shows for the step: its kernel, or the fallback op."""
        return self.kernel if self.kernel is not None else f"numpy {'+'.join(self.ops)}"

    @property
    def gflops_per_second(self) -> float | None:
        return self.flops / self.seconds / 1e9 if self.seconds > 0 else None

    @property
    def gbytes_per_second(self) -> float | None:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else None

    @property
    def peak_fraction(self) -> float | None:
        """Achieved GFLOP/s over the FMA peak (None without a peak or a time)."""
        rate = self.gflops_per_second
        if self.peak is None or rate is None or self.peak.fma_gflops <= 0:
            return None
        return rate / self.peak.fma_gflops

    @property
    def bandwidth_fraction(self) -> float | None:
        """Achieved GB/s over the memory bandwidth (None without a peak or a time)."""
        rate = self.gbytes_per_second
        if self.peak is None or rate is None or self.peak.bandwidth_gbs <= 0:
            return None
        return rate / self.peak.bandwidth_gbs

    @property
    def bound(self) -> str | None:
        """"compute" or "memory": whichever peak the step comes closer to."""
        compute, memory = self.peak_fraction, self.bandwidth_fraction
        if compute is None or memory is None:
            return None
        return "compute" if compute > memory else "memory"

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "kernel": self.kernel,
                "ops": list(self.ops), "nodes": list(self.nodes), "seconds": self.seconds,
                "share": self.share, "flops": self.flops, "uncounted_ops": list(self.uncounted),
                "gflops_per_second": self.gflops_per_second, "bytes": self.bytes,
                "gbytes_per_second": self.gbytes_per_second,
                "peak_fraction": self.peak_fraction,
                "bandwidth_fraction": self.bandwidth_fraction, "bound": self.bound}


@dataclass(frozen=True)
class Profile:
    """Every step of one compiled model's run, timed; ``table()`` and ``to_json()`` show it.

    ``call_seconds`` is the median of whole ``run()`` calls as a caller makes them; the
    difference to ``total_seconds`` (the sum of the step medians) is what a call costs
    outside the kernels: binding inputs, allocating outputs, the ctypes call.
    """

    steps: tuple[StepProfile, ...]
    call_seconds: float
    repeat: int
    warmup: int
    threads: int | None = None  # None: the library's default (every core)
    peak: Peak | None = None
    model: str = ""
    inputs: dict[str, tuple[int, ...]] = field(default_factory=dict)  # the shapes run

    @property
    def total_seconds(self) -> float:
        return sum(step.seconds for step in self.steps)

    @property
    def overhead_seconds(self) -> float:
        """Whole call minus the steps (negative in noise: the two are separate samples)."""
        return self.call_seconds - self.total_seconds

    @property
    def total_flops(self) -> int:
        return sum(step.flops for step in self.steps)

    @property
    def total_bytes(self) -> int:
        return sum(step.bytes for step in self.steps)

    def by_time(self, top: int | None = None) -> list[StepProfile]:
        """The steps, slowest first (ties in step order); the ``top`` slowest if given."""
        ranked = sorted(self.steps, key=lambda step: (-step.seconds, step.index))
        return ranked if top is None else ranked[:max(top, 0)]

    def table(self, top: int | None = None) -> Any:
        """A rich Table of the steps, slowest first, with a total line."""
        from ember.profile.table import render_table

        return render_table(self, top)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model,
                "inputs": {name: list(shape) for name, shape in self.inputs.items()},
                "repeat": self.repeat, "warmup": self.warmup,
                "threads": self.threads,
                "peak": self.peak.to_dict() if self.peak is not None else None,
                "total_seconds": self.total_seconds, "call_seconds": self.call_seconds,
                "overhead_seconds": self.overhead_seconds, "total_flops": self.total_flops,
                "total_bytes": self.total_bytes,
                "steps": [step.to_dict() for step in self.steps]}

    def to_json(self, indent: int | None = 2) -> str:
        """The profile as JSON (times in seconds; NaN-free: missing rates are null)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)


def build_profile(graph: Graph, impls: Sequence[KernelImpl], step_seconds: Sequence[float],
                  call_seconds: float, *, repeat: int, warmup: int,
                  threads: int | None = None, peak: Peak | None = None,
                  model: str = "", inputs: Mapping[str, Sequence[int]] | None = None
                  ) -> Profile:
    """Join the build's steps (``impls``, in step order) with their measured medians."""
    if len(step_seconds) != len(impls):
        raise ValueError(f"{len(step_seconds)} step time(s) for a build of {len(impls)} "
                         f"step(s): the library is not this build's")
    total = float(sum(step_seconds))
    steps = []
    for impl, seconds in zip(impls, step_seconds):
        seconds = float(seconds)
        flops, uncounted = step_flops(impl, graph)
        steps.append(StepProfile(
            index=impl.index, kind=impl.kind,
            kernel=kernel_symbol(impl.func) if impl.func is not None else None,
            ops=tuple(node.op for node in impl.nodes),
            nodes=tuple(node.name for node in impl.nodes), seconds=seconds,
            share=seconds / total if total > 0 else 0.0, flops=flops,
            bytes=step_bytes(impl, graph), uncounted=uncounted, peak=peak))
    shapes = {name: tuple(int(d) for d in shape) for name, shape in (inputs or {}).items()}
    return Profile(tuple(steps), float(call_seconds), repeat, warmup, threads, peak, model,
                   shapes)


def step_flops(impl: KernelImpl, graph: Graph) -> tuple[int, tuple[str, ...]]:
    """The FLOPs of the step's nodes, and the ops of those that cannot be counted."""
    total, uncounted = 0, []
    for node in impl.nodes:
        cost = node_flops(node, graph.types) if has_rule(node.op) else None
        if isinstance(cost, int) and not isinstance(cost, bool):
            total += cost
        else:  # no rule, or a cost that needs a shape that is not static
            uncounted.append(node.op)
    return total, tuple(uncounted)


def step_bytes(impl: KernelImpl, graph: Graph) -> int:
    """Bytes the step reads and writes: each input and output of its group once."""
    total = 0
    for name in dict.fromkeys([*impl.group.inputs, *impl.group.outputs]):
        vtype = graph.types.get(name)
        if isinstance(vtype, TensorType) and vtype.is_static:
            total += vtype.nbytes
    return total


def format_seconds(seconds: float) -> str:
    """``"412.3 µs"``, ``"1.234 ms"`` or ``"2.50 s"``."""
    if not math.isfinite(seconds):
        return "—"
    if abs(seconds) < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if abs(seconds) < 1.0:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.2f} s"
