"""ember's threads beside PyTorch's in one process: a model with graph breaks.

    .venv/bin/python benchmarks/bench_torch_threads.py              # idle, then one busy core
    .venv/bin/python benchmarks/bench_torch_threads.py --loads idle --calls 300

``torch.compile(model, backend="ember")`` runs what ember compiled and what it could not (here:
blocks that ``torch._dynamo.disable`` keeps in PyTorch) alternately in one process, so ember's
thread pool and PyTorch's OpenMP threads take turns at the same cores many times per call.
If the two fought -- one pool's idle workers spinning on the core the other needs -- the
mixed model would take longer than its parts do alone.  This benchmark times, interleaved:

* ``eager``: the whole model in PyTorch;
* ``mixed``: the model through ``torch.compile(backend="ember")``: ember's parts and
  PyTorch's parts alternate (graph breaks at each PyTorch block);
* ``ember parts`` and ``torch parts``: the same two sets of blocks, each alone (ember's
  compiled without the PyTorch blocks between them, PyTorch's in eager), whose sum is what
  ``mixed`` would take if neither pool slowed the other down.

It prints each one's median and 99th-percentile latency and ``mixed`` over the sum of the
parts (1.0: no fight).  Threads: ember and PyTorch both at ``--threads`` (default 2), no
``OMP_*`` variable set; ``--loads busy`` repeats it with one busy-loop process running.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

if __name__ == "__main__" and any(k.startswith("OMP_") for k in os.environ):
    # measure as deployed: re-run without the OpenMP settings a user would not have made
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    os.execve(sys.executable, [sys.executable, *sys.argv], env)

import torch  # noqa: E402
from torch import nn  # noqa: E402

import ember  # noqa: E402,F401  (registers the "ember" backend)

CHANNELS, SIZE, BLOCKS = 64, 28, 4


class ConvBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(CHANNELS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.conv(x)) + x)


class TorchBlock(ConvBlock):
    """A block that Dynamo leaves to PyTorch: a graph break on each side of it."""

    @torch._dynamo.disable
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


class Mixed(nn.Module):
    """ember's blocks and PyTorch's blocks alternating."""

    def __init__(self) -> None:
        super().__init__()
        self.ember_blocks = nn.ModuleList(ConvBlock() for _ in range(BLOCKS))
        self.torch_blocks = nn.ModuleList(TorchBlock() for _ in range(BLOCKS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for ours, theirs in zip(self.ember_blocks, self.torch_blocks):
            x = theirs(ours(x))
        return x


class Blocks(nn.Module):
    """One set of the mixed model's blocks alone, in order (ember's, or PyTorch's)."""

    def __init__(self, blocks: nn.ModuleList) -> None:
        super().__init__()
        self.blocks = blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _measure(contenders: dict[str, callable], calls: int, block: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    order = list(contenders)
    while any(len(s) < calls for s in samples.values()):
        for name in order:
            run = contenders[name]
            for _ in range(min(block, calls - len(samples[name]))):
                start = time.perf_counter()
                run()
                samples[name].append(time.perf_counter() - start)
        order.append(order.pop(0))
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--loads", nargs="+", default=["idle", "busy"],
                        choices=["idle", "busy"])
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    mixed = Mixed().eval()
    for module in mixed.modules():  # plausible statistics, so the outputs stay O(1)
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    x = torch.randn(1, CHANNELS, SIZE, SIZE)
    backend = {"threads": args.threads}
    compiled = torch.compile(mixed, backend="ember", options=backend)
    parts = torch.compile(Blocks(mixed.ember_blocks), backend="ember", options=backend)
    torch_parts = Blocks(mixed.torch_blocks)  # eager
    with torch.no_grad():
        expected = mixed(x)
        got = compiled(x)
        if not torch.allclose(got, expected, rtol=1e-4, atol=1e-4):
            raise SystemExit(f"mixed model differs from eager: "
                             f"{(got - expected).abs().max().item():.3g}")
        parts(x)
        contenders = {"eager": lambda: mixed(x), "mixed": lambda: compiled(x),
                      "ember parts": lambda: parts(x), "torch parts": lambda: torch_parts(x)}
        for run in contenders.values():
            for _ in range(5):
                run()
        results = {}
        for load in args.loads:
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) \
                if load == "busy" else None
            try:
                if busy is not None:
                    time.sleep(1.0)
                results[load] = _measure(contenders, args.calls, args.block)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()

    from ember.runtime.cpu import cpu_model_name

    cpu = cpu_model_name()
    console = Console(width=max(Console().width, 120))
    table = Table(title=f"ember beside PyTorch in one process, {BLOCKS} ember + {BLOCKS} PyTorch "
                        f"conv blocks ({CHANNELS}x{SIZE}x{SIZE}), {args.threads} threads "
                        f"each ({cpu})")
    for column in ("load", "run", "median ms", "p99 ms"):
        table.add_column(column, justify="left" if column in ("load", "run") else "right")
    for load, samples in results.items():
        medians = {name: statistics.median(s) * 1e3 for name, s in samples.items()}
        for name, s in samples.items():
            ordered = sorted(s)
            table.add_row(load, name, f"{medians[name]:.3f}",
                          f"{ordered[int(0.99 * (len(ordered) - 1))] * 1e3:.3f}")
        parts_sum = medians["ember parts"] + medians["torch parts"]
        table.add_row(load, "mixed / (ember parts + torch parts)",
                      f"{medians['mixed'] / parts_sum:.2f}", "")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
