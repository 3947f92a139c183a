"""``ember inspect --stages`` in the terminal: rich tables of the passes, kernels and memory.

The same rows as the HTML page (:mod:`ember.inspect.stages`); the printed graph after each
pass is left to the caller, which decides (``--ir``) whether a graph is small enough to print.
"""

from __future__ import annotations

from rich.table import Table

from ember.inspect.stages import MemoryStage, Stages

# Long node lists are cut in the kernel table (the HTML page and --kernel have them all).
MAX_LISTED_NODES = 6


def passes_table(stages: Stages) -> Table:
    table = Table(title=f"Graph passes: opt level {stages.opt_level}, {stages.pipeline}",
                  title_justify="left")
    for column, justify in (("#", "right"), ("pass", "left"), ("changed", "right"),
                            ("ms", "right"), ("infer+verify ms", "right")):
        table.add_column(column, justify=justify, overflow="fold")
    for stage in stages.passes:
        table.add_row(str(stage.position), stage.name, str(stage.changed),
                      f"{stage.seconds * 1e3:.2f}", f"{stage.check_seconds * 1e3:.2f}",
                      style=None if stage.changed else "dim")
    return table


def kernels_table(stages: Stages) -> Table:
    count = len(stages.kernels)
    table = Table(title=f"Kernels: {count} step{'' if count == 1 else 's'} of ember_run",
                  title_justify="left")
    for column, justify in (("#", "right"), ("kind", "left"), ("C symbol", "left"),
                            ("ops", "left"), ("nodes", "left"), ("note", "left")):
        table.add_column(column, justify=justify, overflow="fold")
    for kernel in stages.kernels:
        nodes = list(kernel.nodes[:MAX_LISTED_NODES])
        if len(kernel.nodes) > MAX_LISTED_NODES:
            nodes.append(f"... {len(kernel.nodes) - MAX_LISTED_NODES} more")
        note = f"host fallback: {kernel.reason}" if kernel.kind == "host" else \
            ("fused" if kernel.fused else "")
        table.add_row(str(kernel.index), kernel.kind, kernel.symbol or "-", kernel.ops,
                      ", ".join(nodes), note, style="red" if kernel.kind == "host" else None)
    return table


def memory_table(memory: MemoryStage) -> Table:
    table = Table(title=f"Memory plan: workspace {memory.workspace_size:,} B, naive (no reuse) "
                        f"{memory.naive_bytes:,} B, peak live {memory.peak_live_bytes:,} B",
                  title_justify="left",
                  caption=None if memory.values else "no value lives between kernels")
    for column, justify in (("value", "left"), ("offset", "right"), ("bytes", "right"),
                            ("steps", "right"), ("in place of", "left")):
        table.add_column(column, justify=justify, overflow="fold")
    for value in memory.values:
        table.add_row(value.name, f"{value.offset:,}", f"{value.size:,}",
                      f"{value.first} -> {value.last}", value.reuses)
    return table
