"""The terminal table of a :class:`~ember.profile.profile.Profile`.

One row per step, slowest first, then a total line over *every* step (also when ``top``
shows fewer), and a caption that sets the sum of the steps against the whole call: the gap is
what a call costs outside the kernels.  With a peak, three more columns say how close each
step comes to the FMA peak and to the memory bandwidth, and which of the two bounds it.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ember.profile.profile import Profile, StepProfile, format_seconds

# Node names shown per row; the JSON has all of them.
NODES_SHOWN = 3


def render_table(profile: Profile, top: int | None = None) -> Table:
    steps = profile.by_time(top)
    threads = "default threads" if profile.threads is None else \
        f"{profile.threads} thread{'' if profile.threads == 1 else 's'}"
    title = (f"ember profile{' — ' + profile.model if profile.model else ''} — {threads}, "
             f"median of {profile.repeat} run{'' if profile.repeat == 1 else 's'}")
    table = Table(title=title, title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("kind")
    table.add_column("kernel", overflow="fold")
    table.add_column("nodes", overflow="fold")
    for column in ("time", "%", "FLOPs", "GFLOP/s", "bytes", "GB/s"):
        table.add_column(column, justify="right")
    peak = profile.peak
    if peak is not None:
        for column in ("% FMA peak", "% bandwidth", "bound"):
            table.add_column(column, justify="right")
    for step in steps:
        table.add_row(*_row(step, peak is not None))
    table.add_section()
    table.add_row(*_total_row(profile, peak is not None))
    table.caption = _caption(profile, len(steps))
    table.caption_justify = "left"
    return table


def _row(step: StepProfile, with_peak: bool) -> list[str | Text]:
    names = ", ".join(step.nodes[:NODES_SHOWN]) + (
        f" +{len(step.nodes) - NODES_SHOWN}" if len(step.nodes) > NODES_SHOWN else "")
    flops = format_count(step.flops) + ("*" if step.uncounted else "")
    cells: list[str | Text] = [
        str(step.index), step.kind if step.kind == "kernel" else Text("host", style="yellow"),
        step.label, f"{'+'.join(step.ops)}: {names}", format_seconds(step.seconds),
        f"{step.share * 100:.1f}", flops, _rate(step.gflops_per_second, step.flops),
        format_bytes(step.bytes), _rate(step.gbytes_per_second, step.bytes)]
    if with_peak:
        cells += [_percent(step.peak_fraction), _percent(step.bandwidth_fraction),
                  step.bound or "—"]
    return cells


def _total_row(profile: Profile, with_peak: bool) -> list[str | Text]:
    seconds, flops, moved = profile.total_seconds, profile.total_flops, profile.total_bytes
    gflops = flops / seconds / 1e9 if seconds > 0 else None
    gbs = moved / seconds / 1e9 if seconds > 0 else None
    count = len(profile.steps)
    cells: list[str | Text] = [
        "", "", Text(f"total ({count} step{'' if count == 1 else 's'})", style="bold"), "",
        Text(format_seconds(seconds), style="bold"), "100.0", format_count(flops),
        _rate(gflops, flops), format_bytes(moved), _rate(gbs, moved)]
    if with_peak:
        peak = profile.peak
        assert peak is not None
        compute = gflops / peak.fma_gflops if gflops is not None and peak.fma_gflops else None
        memory = gbs / peak.bandwidth_gbs if gbs is not None and peak.bandwidth_gbs else None
        cells += [_percent(compute), _percent(memory), ""]
    return cells


def _caption(profile: Profile, shown: int) -> str:
    call, total = profile.call_seconds, profile.total_seconds
    overhead = profile.overhead_seconds
    share = f" ({overhead / call * 100:.1f}% of the call)" if call > 0 else ""
    lines = [f"steps sum to {format_seconds(total)}; a whole run() call takes "
             f"{format_seconds(call)} (median); outside the steps: "
             f"{format_seconds(overhead)}{share}."]
    if shown < len(profile.steps):
        lines.append(f"Showing the {shown} slowest of {len(profile.steps)} steps; the total "
                     f"covers all of them.")
    if any(step.uncounted for step in profile.steps):
        lines.append("*: some fused ops have no FLOPs rule and are not counted.")
    peak = profile.peak
    if peak is not None:
        lines.append(f"Peak measured in this run on {peak.threads} thread(s): fp32 FMA "
                     f"{peak.fma_gflops:.1f} GFLOP/s ({peak.lanes} lanes), memory "
                     f"{peak.bandwidth_gbs:.1f} GB/s (triad over arrays beyond the caches: "
                     f"steps whose data stay in cache can pass 100%). bound: the larger "
                     f"share.")
    return "\n".join(lines)


def _rate(value: float | None, amount: int) -> str:
    if value is None or amount == 0:
        return "—"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _percent(fraction: float | None) -> str:
    return "—" if fraction is None else f"{fraction * 100:.1f}"


def format_count(value: int) -> str:
    """``"1.23 G"``-style counts (FLOPs), exact below a thousand."""
    for scale, unit in ((10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "K")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return str(value)


def format_bytes(size: int) -> str:
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"
