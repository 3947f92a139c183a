"""A model built three ways -- default schedules, the cost model's picks, a tuning database's
configs -- timed against each other the way the tuner checks its decisions.

    .venv/bin/python benchmarks/tuned_vs_default.py --db tune.db \\
        ember/models/tinynet.onnx:input=8,3,32,32 resnet18.onnx mobilenet_v2.onnx

Each build is saved as an artifact and timed by the tuner's runner process (one library
loaded at a time: two of ember's thread pools in one process compete for the cores), in
turns for ``--rounds`` rounds whose order rotates (the first of a round was favoured by a
few percent), each round ~0.3 s of calls; the figure is the sum of every step's median
(kernel time, without the Python call).  The outputs of the three builds are checked
against each other.  Prints per model each build's time, its speedup over the default and
how many kernels differ from the default's config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ember.core.target import Target  # noqa: E402
from ember.driver import BuildOptions, build_graph  # noqa: E402
from ember.frontend.onnx import import_onnx  # noqa: E402
from ember.tune.database import TuningDatabase, target_key  # noqa: E402
from ember.tune.measure import Measurer  # noqa: E402
from ember.tune.predict import PredictedSchedules  # noqa: E402
from ember.tune.report import parse_model_spec  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", type=parse_model_spec, metavar="PATH[:NAME=D,D,...]")
    parser.add_argument("--db", type=Path, help="a tuning database (ember tune's)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    target = Target.native()
    tuned_configs = {}
    if args.db is not None:
        with TuningDatabase(args.db) as db:
            tuned_configs = db.best_configs(target_key(target))
    print(f"{'model':28s} {'default ms':>10s} {'predicted ms':>13s} {'':>16s} "
          f"{'tuned ms':>9s}")
    for path, given in args.models:
        graph = import_onnx(path)
        shapes = {n: given.get(n) or tuple(int(d) for d in graph.types[n].shape)
                  for n in graph.inputs}
        default = build_graph(graph, shapes, BuildOptions(target=target))
        predicted = build_graph(graph, shapes, BuildOptions(
            target=target, config_chooser=PredictedSchedules(target)))
        tuned = build_graph(graph, shapes, BuildOptions(target=target,
                                                        tuned_configs=tuned_configs))
        with Measurer(target, workers=1) as measurer:
            times = measurer.time_models([default, predicted, tuned], rounds=args.rounds)
        errors = "; ".join(t.error for t in times if t.error)
        if errors:
            print(f"{path.name[:28]:28s} failed: {errors}")
            continue
        base = times[0].steps.sum()

        def cell(i: int, build) -> str:
            changed = sum(1 for a, b in zip(default.kernels, build.kernels)
                          if a.config != b.config)
            seconds = times[i].steps.sum()
            return f"{seconds * 1e3:9.3f} ({base / seconds:.2f}x, {changed:2d} kernels)"

        print(f"{path.name[:28]:28s} {base * 1e3:10.3f} {cell(1, predicted)} {cell(2, tuned)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
