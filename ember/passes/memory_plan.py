"""Static memory planning: one workspace arena, offsets fixed at compile time.

Every intermediate tensor gets an offset in a single arena.  A tensor is live from the node
that produces it to the last node that reads it; tensors whose lifetimes do not overlap share
memory.  The placement is greedy best-fit in order of execution, which is what TFLite and TVM's
planners do at their simplest, and is close to optimal on the chain-like graphs of inference.
Offsets are aligned to 64 bytes (a cache line, and an AVX-512 vector).  In a build that
takes sizes at run time, a tensor whose size varies gets the slot of the largest size of its
class (``ember.core.traced.class_bound``), so the plan holds for every size of the class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

from ember.core.traced import class_bound

ALIGNMENT = 64


def align(size: int, alignment: int = ALIGNMENT) -> int:
    return (size + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class Interval:
    """A tensor to place: ``nbytes`` live from step ``start`` to step ``end`` inclusive;
    ``name`` is any hashable key (a value's name, or the driver's key of a scratch buffer)."""

    name: Hashable
    nbytes: int
    start: int
    end: int


@dataclass
class MemoryPlan:
    offsets: dict[Hashable, int]
    workspace_size: int

    def summary(self, intervals: list[Interval]) -> str:
        naive = sum(align(i.nbytes) for i in intervals)
        return (f"workspace {self.workspace_size:,} bytes for {len(intervals)} tensors "
                f"({naive:,} without reuse)")


def plan_memory(intervals: list[Interval]) -> MemoryPlan:
    """Assign arena offsets so that tensors alive at the same step never overlap."""
    placed: list[tuple[int, int, Interval]] = []  # (offset, size, interval)
    offsets: dict[Hashable, int] = {}
    arena_end = 0
    # a size that varies at run time gets the slot of the largest size of its class; slots
    # are plain numbers, so the order of placement is the same for every size of the class
    slots = [align(max(class_bound(interval.nbytes), 1)) for interval in intervals]
    for size, interval in sorted(zip(slots, intervals), key=lambda pair: (pair[1].start,
                                                                          -pair[0])):
        busy = sorted((off, off + sz) for off, sz, other in placed
                      if not (other.end < interval.start or other.start > interval.end))
        best_offset, best_waste = None, None
        cursor = 0
        for lo, hi in busy:
            gap = lo - cursor
            if gap >= size and (best_waste is None or gap - size < best_waste):
                best_offset, best_waste = cursor, gap - size
            cursor = max(cursor, hi)
        if best_offset is None:
            best_offset = cursor
        offsets[interval.name] = best_offset
        placed.append((best_offset, size, interval))
        arena_end = max(arena_end, best_offset + size)
    return MemoryPlan(offsets, arena_end)
