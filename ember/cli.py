"""The ``ember`` command line.

    ember inspect MODEL.onnx [--ir | --no-ir] [--json OUT] [--dim N=8]
    ember inspect MODEL.onnx --stages [--kernel K] [--html OUT] [--opt-level 2] [--dim N=8]
    ember run MODEL.onnx [--input NAME=FILE.npy ...] [--dim N=1] [--seed S] [--output-dir DIR]
    ember bench [--models ...] [--batch 1 16] [--exporter both] [--peers ...] [--quick]
    ember profile MODEL.onnx [--batch N] [--shape NAME=D1,D2] [--repeat N] [--threads N]
                             [--peak] [--json OUT] [--top K]
    ember serve [NAME=]ARTIFACT ... [--port P] [--max-batch N] [--max-queue-delay-ms D]
                                    [--workers W] [--max-queue Q] [--timeout S] [--replicas R]

MODEL may also be an ember graph JSON file (``--json`` output of ``inspect``).  Each subcommand
is one ``_add_<name>`` function that declares its arguments and one ``_<name>`` function that
runs it; :func:`main` dispatches and turns every :class:`EmberError` into a single
``error: ...`` message on stderr with exit status 2 (an internal bug exits with status 1; pass
``--traceback`` to see where it happened).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import ml_dtypes
import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ember.core.dims import Dim, SymDim, single_symbol
from ember.core.dtypes import DType
from ember.core.errors import EmberError, InputError
from ember.core.text import TerminalConsole, printable
from ember.frontend.onnx import import_onnx
from ember.frontend.onnx.importer import check_regular_file
from ember.interp import ReferenceExecutor
from ember.ops.cost import FlopsEstimate, estimate_flops, format_flops
from ember.ir.graph import Graph
from ember.ir.serialize import load_graph, save_graph
from ember.ir.types import OptionalType, SequenceType, TensorType, ValueType
from ember.ir.verifier import verify
from ember.ops.registry import get_op
from ember.passes.batch_split import BatchSplit, NotSeparable, batch_split_for

EXIT_OK, EXIT_INTERNAL, EXIT_USER = 0, 1, 2
# ``inspect`` prints the IR by default when the graph has at most this many nodes.
SMALL_GRAPH_NODES = 40
PREVIEW_VALUES = 6
# Random integer inputs lie in [0, RANDOM_INT_LIMIT): small, so that indices and axes are
# more often valid.
RANDOM_INT_LIMIT = 4

# ---------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ember`` command line; returns the exit status."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, or a usage error argparse already printed
        return exit_.code if isinstance(exit_.code, int) else EXIT_USER
    # No markup: model, value and type names are printed as they are ("f32[batch, 3]").
    console = TerminalConsole(markup=False, highlight=False, soft_wrap=True)
    try:
        return args.handler(args, console)
    except EmberError as error:
        return _fail(str(error))
    except OSError as error:  # writing outputs: a missing directory, no permission, disk full
        where = f" '{error.filename}'" if error.filename else ""
        return _fail(f"cannot access{where}: {error.strerror or error}")
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        if args.traceback:
            raise
        _fail(f"internal error: {type(error).__name__}: {error} (this is a bug in ember; "
              f"rerun with --traceback for details)")
        return EXIT_INTERNAL


def _fail(message: str) -> int:
    print(f"error: {printable(message)}", file=sys.stderr)
    return EXIT_USER


class _TerminalSafeParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage, help and error messages escape control characters:
    an error quotes the argument it refuses (a ``--dim`` value, a file name), and that text
    may come from anywhere, a model's own names included.  Subcommand parsers are of the
    same class (argparse makes them with the parent's class)."""

    def _print_message(self, message: str, file=None) -> None:
        super()._print_message(printable(message) if message else message, file)


def _build_parser() -> argparse.ArgumentParser:
    parser = _TerminalSafeParser(
        prog="ember", description="ember: a deep-learning compiler for ONNX models.")
    parser.add_argument("--traceback", action="store_true",
                        help="show the Python traceback of internal errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_command in (_add_inspect, _add_run, _add_compile, _add_export, _add_bench,
                        _add_profile,
                        _add_tune,
                        _add_serve):
        add_command(commands)
    return parser


# ---------------------------------------------------------------------- shared arguments


def _add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, metavar="MODEL",
                        help="an .onnx model, or an ember graph .json file")


def _add_dim_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--dim", action="append", default=[], type=_name_equals(_dim_size),
                        metavar="NAME=SIZE", help=help_text)


def _name_equals(convert: Callable[[str], Any]) -> Callable[[str], tuple[str, Any]]:
    """An argparse type for ``NAME=VALUE`` options."""

    def parse(text: str) -> tuple[str, Any]:
        name, sep, value = text.partition("=")
        if not sep or not name or not value:
            raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got '{text}'")
        return name, convert(value)

    return parse


def _dim_size(text: str) -> int:
    try:
        size = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"dimension size '{text}' is not an integer") from None
    if size < 0:
        raise argparse.ArgumentTypeError(f"dimension size {size} is negative")
    return size


def _load(path: Path, memory_limit: int | None = None) -> Graph:
    """Import an ONNX model, or load an ember graph JSON file."""
    if path.exists() and not path.is_dir():
        check_regular_file(path, "the model")
    if path.suffix.lower() == ".json":
        return load_graph(path)
    return import_onnx(path, memory_limit=memory_limit)


def _add_size_options(parser: argparse.ArgumentParser) -> None:
    """--batch, --shape and --dim: the sizes to compile a model for (``_profile_shapes``)."""
    parser.add_argument("--batch", type=_positive_int, metavar="N",
                        help="size of the symbolic leading (batch) dimension of the inputs")
    parser.add_argument("--shape", action="append", default=[], type=_name_equals(_shape),
                        metavar="NAME=D1,D2,...", help="the full shape of input NAME")
    _add_dim_option(parser, "size of a symbolic dimension (unbound ones default to 1)")


def _add_memory_limit_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--memory-limit", type=_memory_size, default=None, metavar="SIZE",
                        help="the most memory compiling may use, e.g. 8GiB (default: "
                             "$EMBER_MEMORY_LIMIT, else the memory available)")


def _memory_size(text: str) -> int:
    from ember.core.config import parse_size
    from ember.core.errors import ConfigError

    try:
        return parse_size(text, "--memory-limit")
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _bindings(graph: Graph, dims: list[tuple[str, int]]) -> dict[str, int]:
    """The ``--dim`` bindings, checked against the symbols the model uses."""
    known = _symbols(graph)
    unknown = sorted({name for name, _ in dims} - known)
    if unknown:
        names = ", ".join(sorted(s for s in known if not s.startswith("_"))) or "none"
        raise InputError(f"--dim names unknown dimension(s) {unknown}; the model's symbolic "
                         f"dimensions are: {names}")
    return dict(dims)


def _symbols(graph: Graph) -> set[str]:
    found: set[str] = set()
    for vtype in _all_types(graph):
        found.update(_type_symbols(vtype))
    return found


def _all_types(graph: Graph) -> list[ValueType | None]:
    types = list(graph.types.values())
    for node in graph.nodes:
        for sub in node.subgraphs():
            types.extend(_all_types(sub))
    return types


def _type_symbols(vtype: ValueType | None) -> set[str]:
    if isinstance(vtype, (SequenceType, OptionalType)):
        return _type_symbols(vtype.elem)
    if isinstance(vtype, TensorType) and vtype.shape is not None:
        return {s for d in vtype.shape if isinstance(d, SymDim) for s in d.symbols}
    return set()


# ---------------------------------------------------------------------- inspect


def _add_inspect(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "inspect", help="summarize a model: signature, ops, parameters, FLOPs, IR",
        description="Import a model and print its inputs, outputs, op histogram, parameter "
                    "count, a FLOPs estimate and (for small graphs, or with --ir) its IR.")
    _add_model_argument(parser)
    parser.add_argument("--ir", action=argparse.BooleanOptionalAction, default=None,
                        help=f"print the graph IR (default: only for graphs of at most "
                             f"{SMALL_GRAPH_NODES} nodes)")
    parser.add_argument("--json", type=Path, metavar="OUT",
                        help="also write the imported graph as ember graph JSON to OUT")
    _add_dim_option(parser, "bind a symbolic dimension (for the FLOPs estimate; --stages "
                            "compiles for these sizes, so it needs every input dimension)")
    stages = parser.add_argument_group(
        "compilation stages", "compile the model and show what each stage made of it")
    stages.add_argument("--stages", action="store_true",
                        help="compile and show the graph after each pass (its IR with --ir; "
                             "by default for small graphs), the kernels and the memory plan")
    stages.add_argument("--kernel", metavar="K",
                        help="print the generated C of kernel K: its step index, C symbol, or "
                             "the name of a node in it (implies --stages)")
    stages.add_argument("--html", type=Path, metavar="OUT",
                        help="write every stage to one self-contained HTML page OUT, with a "
                             "drawing of the compiled graph (implies --stages)")
    stages.add_argument("--opt-level", type=int, choices=(0, 1, 2), default=None,
                        help="the optimization level compiled at (default 2)")
    _add_memory_limit_option(stages)
    parser.set_defaults(handler=_inspect)


def _inspect(args: argparse.Namespace, console: Console) -> int:
    staged = args.stages or args.kernel is not None or args.html is not None
    if not staged and args.opt_level is not None:
        raise InputError("--opt-level applies to the compilation that --stages shows; add "
                         "--stages")
    graph = _load(args.model, args.memory_limit)
    bindings = _bindings(graph, args.dim)
    # Check the sizes before printing anything: compiling needs every dimension bound.
    shapes = _compile_shapes(graph, bindings) if staged else {}
    console.print(Text(str(args.model), style="bold"), _provenance(graph))
    console.print(_signature_table("Inputs", graph.inputs, graph))
    console.print(_signature_table("Outputs", graph.outputs, graph))

    flops = estimate_flops(graph)
    console.print(_ops_table(graph, flops, bindings))
    count, size, tensors = _parameters(graph)
    console.print(f"Parameters: {count:,} in {tensors} constant(s), {_format_bytes(size)}")
    console.print(f"FLOPs: {flops.format(bindings)}")
    if flops.uncounted:
        listed = ", ".join(f"{op} ({n})" for op, n in sorted(flops.uncounted.items()))
        console.print(f"  not counted (no FLOPs rule): {listed}")
    console.print(f"IR check: {_check(graph)}")

    show_ir = args.ir if args.ir is not None else sum(1 for _ in graph.walk()) <= SMALL_GRAPH_NODES
    if show_ir:
        console.print()
        console.out(str(graph), highlight=False)
    if args.json is not None:
        save_graph(graph, args.json)
        console.print(f"wrote the graph IR as JSON to {args.json}")
    if staged:
        _inspect_stages(args, graph, shapes, console)
    return EXIT_OK


def _print_loop_stages(console: Console, impl: Any) -> None:
    """A kernel's loop IR after each loop stage, then its workload key and schedule config."""
    for record in impl.stages:
        note = "" if record.name == "lower" else \
            f" ({'changed' if record.changed else 'unchanged'}, {record.seconds * 1e3:.2f} ms)"
        console.print(Text(f"loop IR after {record.name}{note}:", style="bold"))
        if record.ir is not None and (record.changed or record.name == "lower"):
            console.out(record.ir, highlight=False)
    if impl.workload_key:
        console.print(Text(f"workload key {impl.workload_key}; config: {impl.config}",
                           style="bold"))


def _inspect_stages(args: argparse.Namespace, graph: Graph, shapes: dict[str, tuple[int, ...]],
                    console: Console) -> None:
    """``inspect --stages``: compile once with every pass dumped, then show each stage."""
    from ember.driver import BuildOptions
    from ember.inspect import collect_stages, write_html
    from ember.inspect.terminal import kernels_table, memory_table, passes_table

    opt_level = 2 if args.opt_level is None else args.opt_level
    stages = collect_stages(graph, shapes, BuildOptions(
        opt_level=opt_level, memory_limit=args.memory_limit,
        keep_loop_stages=args.kernel is not None))
    console.print()
    console.print(passes_table(stages))
    show_ir = args.ir if args.ir is not None else len(stages.graph.nodes) <= SMALL_GRAPH_NODES
    for stage in stages.passes:
        if show_ir and stage.ir is not None:
            console.print(Text(f"after pass {stage.position} {stage.name} ({stage.changed} "
                               f"changed, {stage.seconds * 1e3:.2f} ms):", style="bold"))
            console.out(stage.ir, highlight=False)
    console.print(kernels_table(stages))
    console.print(memory_table(stages.memory))
    if stages.memory.in_place:
        console.print("written in place: " + ", ".join(
            f"{output} over {source}" for output, source in stages.memory.in_place))
    if args.kernel is not None:
        kernel = stages.select_kernel(args.kernel)
        console.print(Text(f"kernel {kernel.index}: {kernel.symbol} ({kernel.ops}; nodes "
                           f"{', '.join(kernel.nodes)})", style="bold"))
        _print_loop_stages(console, kernel.impl)
        console.out(stages.kernel_source(kernel), highlight=False)
    if args.html is not None:
        write_html(stages, args.html, args.model.name)
        console.print(f"wrote the stages as HTML to {args.html}")


def _provenance(graph: Graph) -> str:
    meta = graph.metadata
    parts = []
    if meta.get("producer"):
        parts.append(f"producer: {meta['producer']}")
    if "ir_version" in meta:
        parts.append(f"IR version {meta['ir_version']}")
    opsets = meta.get("opsets") or {}
    if opsets:
        parts.append("opsets: " + ", ".join(f"{domain or 'ai.onnx'} {version}"
                                            for domain, version in sorted(opsets.items())))
    return f"({'; '.join(parts)})" if parts else ""


def _ops_table(graph: Graph, flops: FlopsEstimate, bindings: Mapping[str, int]) -> Table:
    """The op histogram (subgraphs included) with each op's share of the FLOPs."""
    table = Table(title="Ops", title_justify="left")
    table.add_column("op", overflow="fold")
    table.add_column("nodes", justify="right")
    table.add_column("FLOPs", justify="right")
    for op_name, count in graph.op_histogram().items():
        cost = format_flops(flops.by_op[op_name], bindings) if op_name in flops.by_op else "-"
        table.add_row(op_name, str(count), cost)
    return table


def _signature_table(title: str, names: list[str], graph: Graph) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("name", overflow="fold")
    table.add_column("type", overflow="fold")
    for name in names:
        vtype = graph.types.get(name)
        table.add_row(name, str(vtype) if vtype is not None else "unknown")
    return table


def _parameters(graph: Graph) -> tuple[int, int, int]:
    """(elements, bytes, tensors) over the constants of the graph and its subgraphs."""
    count = size = tensors = 0
    graphs = [graph]
    while graphs:
        current = graphs.pop()
        for array in current.constants.values():
            count += array.size
            size += (sum(len(str(s).encode()) for s in array.flat) if array.dtype == object
                     else array.nbytes)
            tensors += 1
        graphs.extend(sub for node in current.nodes for sub in node.subgraphs())
    return count, size, tensors


def _format_bytes(size: int) -> str:
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if size >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size} bytes"


def _check(graph: Graph) -> str:
    try:
        verify(graph, get_op)
    except EmberError as error:
        return f"FAILED ({error})"
    return "ok"


# ---------------------------------------------------------------------- run


def _add_run(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "run", help="run a model with the reference executor",
        description="Run a model with ember's numpy reference executor.  Inputs not given "
                    "with --input are random, of the declared dtype and shape.")
    _add_model_argument(parser)
    parser.add_argument("--input", action="append", default=[], type=_name_equals(Path),
                        metavar="NAME=FILE.npy", help="an input value from a .npy file")
    _add_dim_option(parser, "size of a symbolic dimension for random inputs (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument("--output-dir", type=Path, metavar="DIR",
                        help="save every output as DIR/NAME.npy")
    parser.add_argument("--mode", choices=("reference", "compiled"), default="reference",
                        help="for a model file: run ember's numpy references (default) or "
                             "compile it first")
    parser.add_argument("--threads", type=_positive_int, metavar="N",
                        help="threads of the compiled kernels, for --mode compiled or an "
                             "artifact (default: the CPUs this process may use)")
    _add_memory_limit_option(parser)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace, console: Console) -> int:
    if args.model.is_dir():
        return _run_artifact(args, console)
    graph = _load(args.model, args.memory_limit)
    bindings = _bindings(graph, args.dim)
    feeds = {name: _load_npy(name, path) for name, path in args.input}
    _bind_from_inputs(graph, feeds, bindings)
    rng = np.random.default_rng(args.seed)
    sources = {name: "file" for name in feeds}
    for name in graph.inputs:
        if name not in feeds:
            feeds[name] = _random_value(name, graph.types.get(name), bindings, rng)
            sources[name] = f"random (seed {args.seed})"

    if args.mode == "compiled":
        from ember.api import compile as compile_model

        module = compile_model(graph, input_shapes={n: np.shape(v) for n, v in feeds.items()},
                               memory_limit=args.memory_limit, threads=args.threads)
        outputs = module.run(feeds)
        console.print(module.report())
    else:
        outputs = ReferenceExecutor(graph).run(feeds)

    console.print(_values_table("Inputs", feeds, sources))
    console.print(_values_table("Outputs", outputs))
    if args.output_dir is not None:
        saved = _save_outputs(outputs, args.output_dir)
        console.print(f"saved {len(saved)} file(s) to {args.output_dir}: {', '.join(saved)}")
    return EXIT_OK


def _load_npy(name: str, path: Path) -> np.ndarray:
    check_regular_file(path, f"input '{name}'")
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"input '{name}': file '{path}' does not exist") from None
    except ValueError as error:
        if "allow_pickle" in str(error):
            raise InputError(f"input '{name}': '{path}' holds Python objects (a pickled "
                             f"array); ember reads plain .npy arrays only") from None
        raise InputError(f"input '{name}': '{path}' is not a valid .npy file: {error}") from None
    except (OSError, EOFError) as error:
        raise InputError(f"input '{name}': cannot read '{path}' as .npy: {error}") from None


def _bind_from_inputs(graph: Graph, feeds: Mapping[str, Any], bindings: dict[str, int]) -> None:
    """Symbols that a given input fixes (``x: f32[N, 3]`` fed 4x3 gives N=4), unless --dim set
    them; the executor reports any inconsistency."""
    for name, value in feeds.items():
        vtype = graph.types.get(name)
        if not isinstance(vtype, TensorType) or vtype.shape is None:
            continue
        if np.ndim(value) != len(vtype.shape):
            continue  # the executor reports the mismatch
        for dim, actual in zip(vtype.shape, np.shape(value)):
            symbol = single_symbol(dim)
            if symbol is not None:
                bindings.setdefault(symbol, int(actual))


def _random_value(name: str, vtype: ValueType | None, bindings: Mapping[str, int],
                  rng: np.random.Generator) -> Any:
    """A random value of ``vtype``: symbolic dims from ``bindings`` (default 1)."""
    if isinstance(vtype, SequenceType):
        return [_random_value(name, vtype.elem, bindings, rng)]
    if isinstance(vtype, OptionalType):
        return None if vtype.elem is None else _random_value(name, vtype.elem, bindings, rng)
    if not isinstance(vtype, TensorType) or vtype.shape is None:
        what = "no declared type" if vtype is None else f"type {vtype} of unknown rank"
        raise InputError(f"input '{name}' has {what}; give its value with "
                         f"--input {name}=FILE.npy")
    shape = tuple(_concrete(dim, bindings) for dim in vtype.shape)
    return _random_array(vtype.dtype, shape, rng, name)


def _concrete(dim: Dim, bindings: Mapping[str, int]) -> int:
    if isinstance(dim, SymDim):
        return max(dim.evaluate({s: bindings.get(s, 1) for s in dim.symbols}), 0)
    return 1 if dim is None else int(dim)


def _random_array(dtype: DType, shape: tuple[int, ...], rng: np.random.Generator,
                  name: str = "") -> np.ndarray:
    """Random values of ``dtype`` and ``shape``, refused before any allocation when they
    would not fit the memory budget (a typo in --dim must not end in a MemoryError)."""
    from ember.core.config import format_size, memory_limit

    count = 1
    for dim in shape:
        count *= int(dim)
    needs = count * 16  # the float64 draws and the array made from them
    budget = memory_limit()
    if needs > budget:
        which = f"input '{name}'" if name else "an input"
        raise InputError(f"a random value for {which} of shape {list(shape)} needs about "
                         f"{format_size(needs)}, more than the memory budget "
                         f"({format_size(budget)}); give smaller sizes (--dim, --batch, "
                         f"--shape) or the value itself with --input")
    if dtype is DType.STRING:
        words = np.array(["alpha", "beta", "gamma", "delta"], dtype=object)
        return rng.choice(words, size=shape)
    if dtype is DType.BOOL:
        return rng.random(shape) < 0.5
    if dtype in (DType.COMPLEX64, DType.COMPLEX128):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype.numpy)
    if dtype.is_float:
        return rng.standard_normal(shape).astype(np.float32).astype(dtype.numpy)
    high = min(RANDOM_INT_LIMIT, int(ml_dtypes.iinfo(dtype.numpy).max) + 1)
    return rng.integers(0, high, size=shape).astype(dtype.numpy)


def _values_table(title: str, values: Mapping[str, Any],
                  sources: Mapping[str, str] | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("name", "dtype", "shape", "values") + (("source",) if sources else ()):
        table.add_column(column, overflow="fold")
    for name, value in values.items():
        row = [name, *_describe_value(value)]
        if sources:
            row.append(sources.get(name, ""))
        table.add_row(*row)
    return table


def _describe_value(value: Any) -> tuple[str, str, str]:
    """(dtype, shape, preview) of a tensor, sequence or optional value."""
    if value is None:
        return "-", "-", "empty optional"
    if isinstance(value, list):
        dtypes = sorted({str(np.asarray(v).dtype) for v in value})
        shapes = ", ".join(str(np.shape(v)) for v in value[:3]) + (", ..." if len(value) > 3
                                                                    else "")
        return (" | ".join(dtypes) or "-", f"sequence of {len(value)}: [{shapes}]", "")
    array = np.asarray(value)
    return str(array.dtype), str(array.shape), _preview(array)


def _preview(array: np.ndarray) -> str:
    flat = array.reshape(-1)[:PREVIEW_VALUES]
    suffix = ", ..." if array.size > PREVIEW_VALUES else ""
    if array.dtype == object:
        return "[" + ", ".join(repr(v) for v in flat) + suffix + "]"
    if array.dtype.type.__module__ == "ml_dtypes":  # bfloat16, float8, int4: print via numpy
        flat = flat.astype(np.float32 if DType.from_numpy(array.dtype).is_float else np.int64)
    text = np.array2string(flat, precision=4, separator=", ", max_line_width=10**6)
    return text[:-1] + suffix + "]"


def _save_outputs(outputs: Mapping[str, Any], directory: Path) -> list[str]:
    """Save each output as NAME.npy (a sequence as NAME_0.npy, NAME_1.npy, ...); two outputs
    never share a file, whatever their names sanitize to ("a/b" and "a:b", or an output "s_0"
    beside item 0 of a sequence "s")."""
    directory.mkdir(parents=True, exist_ok=True)
    saved: list[str] = []
    used: set[str] = set()

    def file_for(stem: str) -> str:
        while f"{stem}.npy".lower() in used:  # lower: case-insensitive file systems too
            stem += "_"
        used.add(f"{stem}.npy".lower())
        return f"{stem}.npy"

    for name, value in outputs.items():
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "output"
        if isinstance(value, list):
            files = [(file_for(f"{stem}_{index}"), item) for index, item in enumerate(value)]
        elif value is None:
            files = []  # an empty optional has nothing to save
        else:
            files = [(file_for(stem), value)]
        for file_name, item in files:
            np.save(directory / file_name, np.asarray(item))
            saved.append(file_name)
    return saved


def _run_artifact(args: argparse.Namespace, console: Console) -> int:
    """``ember run ARTIFACT``: run a compiled artifact directory."""
    from ember.api import load as load_artifact
    from ember.runtime.dtypes import numpy_dtype

    model = load_artifact(args.model, threads=args.threads)
    feeds = {name: _load_npy(name, path) for name, path in args.input}
    rng = np.random.default_rng(args.seed)
    sources = {name: "file" for name in feeds}
    for spec in model.inputs:
        if spec.name not in feeds:
            dtype = DType.from_numpy(numpy_dtype(spec.dtype))
            feeds[spec.name] = _random_array(dtype, spec.shape, rng, spec.name)
            sources[spec.name] = f"random (seed {args.seed})"
    outputs = model.run(feeds)
    console.print(_values_table("Inputs", feeds, sources))
    console.print(_values_table("Outputs", outputs))
    if args.output_dir is not None:
        saved = _save_outputs(outputs, args.output_dir)
        console.print(f"saved {len(saved)} file(s) to {args.output_dir}: {', '.join(saved)}")
    return EXIT_OK


# ---------------------------------------------------------------------- compile


def _add_compile(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "compile", help="compile a model into an artifact (library + weights + manifest)",
        description="Compile a model to native code and save it as an artifact directory that "
                    "ember.runtime.load() (or `ember run ARTIFACT`) runs.")
    _add_model_argument(parser)
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="OUT",
                        help="the artifact directory to write")
    parser.add_argument("--target", default="native",
                        help="native (default), x86_64-avx2, x86_64-avx512, ...")
    parser.add_argument("--opt-level", type=int, default=2, choices=(0, 1, 2, 3))
    _add_dim_option(parser, "size of a symbolic dimension (required for dynamic inputs)")
    parser.add_argument("--no-batch-blocks", dest="batch_blocks", action="store_false",
                        help="for a model with a dynamic batch that it keeps apart, save only "
                             "the given batch size (default: also a block of 1 sample, so "
                             "that the artifact runs any batch size)")
    parser.add_argument("--batch-blocks", dest="extra_blocks", type=_size_list,
                        metavar="N,N,...",
                        help="compile these batch block sizes too, e.g. 16,8,4,2,1 for a "
                             "server that batches any number of requests (default: the "
                             "given batch size and 1)")
    parser.add_argument("--tuning-db", type=Path, metavar="DB",
                        help="apply the configs `ember tune` recorded in DB for this machine")
    parser.add_argument("--schedule", choices=("default", "predicted"), default="default",
                        help="predicted: the tuner's cost model picks each other kernel's "
                             "config, nothing measured (needs ember[tune])")
    _add_memory_limit_option(parser)
    parser.set_defaults(handler=_compile)


def _size_list(text: str) -> list[int]:
    sizes = [_positive_int(part.strip()) for part in text.split(",") if part.strip()]
    if not sizes:
        raise argparse.ArgumentTypeError(f"expected sizes like 16,8,4,2,1, got '{text}'")
    return sizes


def _compile(args: argparse.Namespace, console: Console) -> int:
    from ember.driver import BuildOptions, build_graph
    from ember.core.target import Target
    from ember.package import save_artifact, save_batch_blocks

    if args.batch_blocks is False and args.extra_blocks:
        return _fail("--batch-blocks and --no-batch-blocks contradict each other")
    graph = _load(args.model, args.memory_limit)
    shapes = _compile_shapes(graph, _bindings(graph, args.dim))
    # Build and save without loading the library: the artifact may be for another CPU
    # (--target x86_64-avx512 on an AVX2 machine), which this machine's runtime would refuse.
    from ember.api import config_chooser_for, tuned_configs_from

    target = Target.parse(args.target)
    options = BuildOptions(target=target, opt_level=args.opt_level,
                           memory_limit=args.memory_limit,
                           tuned_configs=tuned_configs_from(args.tuning_db, target),
                           config_chooser=config_chooser_for(args.schedule, target,
                                                             args.opt_level))
    build = build_graph(graph, shapes, options)
    console.print(build.report())
    split = _batch_blocks(graph, shapes, console) if args.batch_blocks else None
    if split is None:
        if args.extra_blocks:
            return _fail("--batch-blocks: this model's batch is not run in blocks (see the "
                         "note above), so the artifact holds the given batch size alone")
        path = save_artifact(build, args.output)
    else:
        builds = {shapes[split.inputs[0]][0]: build}
        for size in sorted({1, *(args.extra_blocks or ())} - set(builds), reverse=True):
            sized = {name: (size, *shape[1:]) if name in split.inputs else shape
                     for name, shape in shapes.items()}
            builds[size] = build_graph(graph, sized, options)
        path = save_batch_blocks(builds, split.inputs, split.batch_outputs, args.output,
                                 split.output_axes)
        console.print(f"batch blocks of {', '.join(map(str, sorted(builds, reverse=True)))}"
                      f" sample(s): the artifact runs any batch size of "
                      f"{', '.join(split.inputs)}")
    console.print(f"wrote {path}")
    return EXIT_OK


# ---------------------------------------------------------------------- export


def _add_export(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "export", help="compile a model for a target into a C library or WebAssembly module",
        description="Compile a model for a target and write a directory that runs it with no "
                    "Python: a C header, a shared and a static library and the weights file "
                    "(Linux targets), or a WebAssembly module (wasm32-wasi).  "
                    "examples/c/run_model.c builds against it with cc alone.")
    _add_model_argument(parser)
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="DIR",
                        help="the directory to write")
    parser.add_argument("--target", default="host",
                        help="host (default), x86_64-linux, x86_64-avx2-linux, "
                             "x86_64-avx512-linux, aarch64-linux, wasm32-wasi, wasm32-browser "
                             "(cross targets compile with the ziglang package)")
    parser.add_argument("--name", help="the files' name and the C functions' prefix "
                                       "(default: the model's name)")
    parser.add_argument("--opt-level", type=int, default=2, choices=(0, 1, 2, 3))
    _add_dim_option(parser, "size of a symbolic dimension (fixed in the export, or the traced "
                            "sample of a --dynamic one)")
    parser.add_argument("--dynamic", action="append", default=[], metavar="NAME",
                        help="a symbolic dimension the export takes at run time "
                             "(NAME_set_dims in C), traced at its --dim size; repeatable")
    parser.add_argument("--embed-weights", action="store_true",
                        help="link the weights into the libraries (NAME_create_embedded) "
                             "instead of writing NAME.weights beside them")
    _add_memory_limit_option(parser)
    parser.set_defaults(handler=_export)


def _export(args: argparse.Namespace, console: Console) -> int:
    from ember.api import export

    graph = _load(args.model, args.memory_limit)
    shapes = _compile_shapes(graph, _bindings(graph, args.dim))
    result = export(graph, args.output, target=args.target, input_shapes=shapes,
                    name=args.name if args.name else graph.name, dynamic_dims=args.dynamic,
                    embed_weights=args.embed_weights, opt_level=args.opt_level,
                    memory_limit=args.memory_limit)
    console.print(result.report)
    target = result.target
    console.print(f"wrote {result.directory} for {target.triple}: "
                  f"{', '.join(sorted(p.name for p in result.files.values()))}")
    return EXIT_OK


def _batch_blocks(graph: Graph, shapes: Mapping[str, tuple[int, ...]],
                  console: Console) -> BatchSplit | None:
    """The graph's :class:`BatchSplit` at these shapes when its inputs have a dynamic batch
    that it keeps apart; None (saying why when there is a dynamic batch) otherwise."""
    if all(isinstance(graph.types.get(n), TensorType) and graph.types[n].is_static
           for n in graph.inputs):
        return None
    try:
        split = batch_split_for(graph, shapes)
    except NotSeparable as why:
        console.print(f"note: one specialization only (the batch is not split in blocks: "
                      f"{why})")
        return None
    return split if shapes[split.inputs[0]][0] > 0 else None


def _compile_shapes(graph: Graph, bindings: Mapping[str, int],
                    given: Mapping[str, tuple[int, ...]] | None = None
                    ) -> dict[str, tuple[int, ...]]:
    """The concrete input shapes to compile for (``given`` ones as they are); names every
    symbolic dimension that --dim leaves unbound (all of them at once, not one per attempt)."""
    shapes: dict[str, tuple[int, ...]] = dict(given or {})
    unbound: dict[str, list[str]] = {}  # symbol -> inputs that have it
    for name in graph.inputs:
        if name in shapes:
            continue
        vtype = graph.types.get(name)
        if not isinstance(vtype, TensorType) or vtype.shape is None:
            continue
        dims = []
        for dim in vtype.shape:
            if isinstance(dim, int):
                dims.append(dim)
                continue
            symbol = single_symbol(dim) if dim is not None else None
            if symbol is None:
                raise InputError(f"input '{name}' has a dimension '{dim}' that cannot be bound")
            if symbol in bindings:
                dims.append(bindings[symbol])
            elif name not in unbound.setdefault(symbol, []):
                unbound[symbol].append(name)
        shapes[name] = tuple(dims)
    if unbound:
        where = "; ".join(
            (f"input {inputs[0]!r} has" if len(inputs) == 1 else
             f"inputs {', '.join(repr(i) for i in inputs)} have") +
            f" the symbolic dimension '{symbol}'" for symbol, inputs in unbound.items())
        options = " ".join(f"--dim {symbol}=SIZE" for symbol in unbound)
        raise InputError(f"compiling needs concrete sizes: {where}; give them with {options}")
    return shapes


# ---------------------------------------------------------------------- bench


def _add_bench(commands: argparse._SubParsersAction) -> None:
    """``ember bench``: declared and run by ember.bench.cli (the benchmark layer)."""
    from ember.bench.cli import add_bench_parser

    add_bench_parser(commands)


# ---------------------------------------------------------------------- profile


def _add_profile(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "profile", help="compile a model and time each of its kernels",
        description="Compile a model, run it on random inputs and time every step of the "
                    "compiled run (each fused kernel and numpy fallback): median time, share, "
                    "FLOPs, bytes moved and the rates they give, slowest first.  With --peak, "
                    "also each kernel's share of this machine's FMA peak and memory bandwidth, "
                    "measured in the same run.")
    _add_model_argument(parser)
    _add_size_options(parser)
    parser.add_argument("--repeat", type=_positive_int, default=20, metavar="N",
                        help="timed runs; the table shows medians (default: %(default)s)")
    parser.add_argument("--warmup", type=_non_negative_int, default=3, metavar="N",
                        help="untimed runs first (default: %(default)s)")
    parser.add_argument("--threads", type=_positive_int, metavar="N",
                        help="threads of the kernels and of the peak (default: the CPUs "
                             "this process may use)")
    parser.add_argument("--peak", action="store_true",
                        help="measure the fp32 FMA peak and the memory bandwidth now and "
                             "show each kernel's share of them (a few seconds)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the profile to OUT")
    parser.add_argument("--top", type=_positive_int, metavar="K",
                        help="show only the K slowest steps (the total covers all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument("--opt-level", type=int, default=2, choices=(0, 1, 2, 3))
    _add_memory_limit_option(parser)
    parser.set_defaults(handler=_profile)


# ---------------------------------------------------------------------- tune


def _add_tune(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "tune", help="search faster schedules for a model's kernels on this machine",
        description="Tune a model's kernels on this machine: search each kernel's schedule "
                    "configs (candidates built in worker processes, timed in an isolated "
                    "one, every output checked against the reference executor), recording "
                    "every measurement in a SQLite database.  A second run on the same "
                    "database resumes it.  Apply the result with "
                    "ember.compile(model, tuning_db=DB).")
    _add_model_argument(parser)
    parser.add_argument("--budget", default="10m",
                        help="wall time to spend, e.g. 90s, 10m, 1h (default: %(default)s)")
    parser.add_argument("--db", type=Path, default=Path("tune.db"),
                        help="the tuning database, created if new (default: %(default)s)")
    parser.add_argument("--workers", type=_non_negative_int, default=0, metavar="N",
                        help="processes building candidates (default: one per CPU)")
    _add_size_options(parser)
    parser.add_argument("--target", default="native",
                        help="native (default), x86_64-avx2, ... (measured on this machine)")
    parser.add_argument("--opt-level", type=int, default=2, choices=(0, 1, 2, 3))
    parser.add_argument("--seed", type=int, default=0, help="seed of the search")
    parser.add_argument("--plot", type=Path, metavar="PNG",
                        help="write the tuning curve to PNG (needs matplotlib)")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="skip checking the decisions in the whole model at the end (built "
                             "both ways, timed in turns; a kernel not faster there keeps its "
                             "default)")
    parser.add_argument("--ray", metavar="ADDRESS",
                        help="tune on every node of this Ray cluster (or 'local' for an "
                             "instance started for the run), each for its own machine, all "
                             "records in --db (needs the distributed extra)")
    parser.set_defaults(handler=_tune)


def _tune(args: argparse.Namespace, console: Console) -> int:
    from ember.tune.report import plot_curve, result_table
    from ember.tune.session import tune

    if args.model.is_dir():
        raise InputError(f"'{args.model}' is a directory; ember tune takes a model file")
    graph = _load(args.model)
    shapes, defaulted = _profile_shapes(graph, args)
    if defaulted:
        console.print(f"note: tuning with {', '.join(f'{s}=1' for s in defaulted)} (set "
                      f"sizes with --batch, --dim or --shape)")
    result = tune(graph, input_shapes=shapes, budget=args.budget, db=args.db,
                  target=args.target, opt_level=args.opt_level, workers=args.workers,
                  seed=args.seed, verify=args.verify and args.ray is None, ray=args.ray)
    _wide(console).print(result_table(result))
    if result.model_default_seconds and result.model_tuned_seconds:
        console.print(f"whole model, each build timed in turns: "
                      f"{result.model_default_seconds * 1e3:.3f} ms by default, "
                      f"{result.model_tuned_seconds * 1e3:.3f} ms tuned "
                      f"({result.model_default_seconds / result.model_tuned_seconds:.2f}x)")
    quality = dict(result.model_quality)
    if quality:
        console.print(f"cost model, on each round's candidates before it learned from them: "
                      f"pairwise accuracy {quality['pairwise_accuracy']:.2f}, top-5 recall "
                      f"{quality['top5_recall']:.2f} ({int(quality['pairs'])} pairs)")
    console.print(f"records in {args.db}; apply them with "
                  f"ember.compile(model, tuning_db='{args.db}')")
    if args.plot is not None:
        console.print(f"wrote {plot_curve(result, args.plot)}")
    return EXIT_OK


# ---------------------------------------------------------------------- serve


def _add_serve(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "serve", help="serve saved artifacts over HTTP (Open Inference Protocol)",
        description="Serve ember artifacts over HTTP with the Open Inference Protocol (KServe "
                    "V2: /v2/models/NAME/infer), batching concurrent requests per model; "
                    "metrics at /metrics, the API at /docs.  Needs the serve extra: "
                    "pip install 'ember[serve]'.")
    parser.add_argument("models", nargs="+", type=_served_model, metavar="[NAME=]ARTIFACT",
                        help="a saved artifact directory, served as NAME (default: the "
                             "directory's name without .ember)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (default: %(default)s; 0.0.0.0 for "
                             "every interface)")
    parser.add_argument("--port", type=_non_negative_int, default=8000,
                        help="the port to listen on (default: %(default)s)")
    parser.add_argument("--max-batch", type=_positive_int, default=32, metavar="N",
                        help="most samples a batch of several requests holds; 1 turns "
                             "batching off (default: %(default)s)")
    parser.add_argument("--preferred-batch", type=_positive_int, metavar="N",
                        help="a batch of this many samples runs without waiting (default: "
                             "--max-batch)")
    parser.add_argument("--max-queue-delay-ms", type=float, default=2.0, metavar="D",
                        help="longest a request waits for others to batch with while "
                             "another worker is busy (default: %(default)s)")
    parser.add_argument("--max-queue", type=_positive_int, default=256, metavar="Q",
                        help="requests each model queues; more are refused with 429 "
                             "(default: %(default)s)")
    parser.add_argument("--workers", type=_positive_int, default=1, metavar="W",
                        help="model calls run at once per model, each on its own loaded "
                             "copy (default: %(default)s)")
    parser.add_argument("--threads", type=_positive_int, metavar="N",
                        help="threads of each worker's kernels (default: the CPUs this "
                             "process may use, divided among the workers)")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="S",
                        help="seconds a request may take before a 504 (default: %(default)s)")
    parser.add_argument("--max-payload-mb", type=float, default=64.0, metavar="MB",
                        help="largest request body, larger ones get 413 (default: "
                             "%(default)s)")
    parser.add_argument("--digest", action="append", default=[], type=_name_equals(str),
                        metavar="NAME=SHA256",
                        help="serve model NAME only if its artifact has this digest")
    parser.add_argument("--replicas", type=_positive_int, metavar="R",
                        help="serve on Ray Serve with R replicas of this server (a local Ray "
                             "cluster, or the one of --ray-address / $RAY_ADDRESS; needs "
                             "pip install 'ember[distributed]')")
    parser.add_argument("--ray-address", metavar="ADDRESS",
                        help="the Ray cluster to join with --replicas (default: "
                             "$RAY_ADDRESS, else a local one)")
    parser.add_argument("--log-level", default="info",
                        choices=("critical", "error", "warning", "info", "debug"))
    parser.set_defaults(handler=_serve)


def _serve_on_ray(args: argparse.Namespace, models: list, policies: dict, limits: Any,
                  console: Console) -> int:
    try:
        from ember.serve.ray_serve import ModelSpec, run_on_ray
        import ray  # noqa: F401
    except ImportError as error:
        return _fail(f"--replicas needs Ray Serve ({error.name} is not installed): "
                     f"pip install 'ember[distributed]'")
    specs = [ModelSpec(model.name, str(model.path.resolve()), model.digest) for model in models]
    console.print(f"starting {args.replicas} replica(s) on Ray Serve at "
                  f"http://{args.host}:{args.port}")
    run_on_ray(specs, policies, limits, host=args.host, port=args.port,
               replicas=args.replicas, workers=args.workers, threads=args.threads,
               address=args.ray_address)
    return EXIT_OK


def _served_model(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep:
        path, name = text, Path(text.rstrip("/")).name.removesuffix(".ember")
    if not name or not path:
        raise argparse.ArgumentTypeError(f"expected [NAME=]ARTIFACT, got '{text}'")
    return name, Path(path)


def _serve(args: argparse.Namespace, console: Console) -> int:
    import logging

    try:
        from ember.serve import BatchPolicy, ServedModel, ServerLimits, create_app, run
        from ember.serve.app import describe
    except ImportError as error:
        return _fail(str(error))
    digests = dict(args.digest)
    unknown = sorted(set(digests) - {name for name, _ in args.models})
    if unknown:
        return _fail(f"--digest names model(s) {unknown}, which are not served")
    for value, option in ((args.max_queue_delay_ms, "--max-queue-delay-ms"),
                          (args.timeout, "--timeout"), (args.max_payload_mb, "--max-payload-mb")):
        if not value >= 0 or value == float("inf"):
            return _fail(f"{option} must be a finite number >= 0, not {value}")
    policy = BatchPolicy(max_batch=args.max_batch, preferred_batch=args.preferred_batch,
                         max_queue_delay=args.max_queue_delay_ms / 1e3,
                         max_queue=args.max_queue)
    if args.ray_address and not args.replicas:
        return _fail("--ray-address is for serving on Ray Serve: give --replicas too")
    # Loaded here first, with --replicas too: a bad artifact is an error before any cluster
    # starts, and the replicas are pinned to the digests found.
    models = [ServedModel(name, path, digest=digests.get(name),
                          workers=1 if args.replicas else args.workers, threads=args.threads,
                          time_blocks=not args.replicas)  # each replica times its own
              for name, path in args.models]
    policies = {model.name: policy for model in models}
    limits = ServerLimits(max_payload_bytes=int(args.max_payload_mb * (1 << 20)),
                          request_timeout=args.timeout)
    app = create_app(models, policies, limits)
    logging.basicConfig(level=args.log_level.upper(), format="%(message)s")
    for line in describe(models, policies):
        console.print(line)
    if args.replicas:
        return _serve_on_ray(args, models, policies, limits, console)
    console.print(f"serving on http://{args.host}:{args.port} (Ctrl-C stops after answering "
                  f"the requests already accepted)")
    run(app, host=args.host, port=args.port, log_level=args.log_level)
    return EXIT_OK


def _positive_int(text: str) -> int:
    return _bounded_int(text, 1, "a positive integer")


def _non_negative_int(text: str) -> int:
    return _bounded_int(text, 0, "a non-negative integer")


def _bounded_int(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def _shape(text: str) -> tuple[int, ...]:
    """``8,3,224,224`` (or ``8x3x224x224``; empty parts are an error, ``""`` is a scalar)."""
    parts = [part.strip() for part in re.split(r"[,x]", text)] if text.strip() else []
    return tuple(_dim_size(part) for part in parts)


def _profile(args: argparse.Namespace, console: Console) -> int:
    from ember.api import compile as compile_model

    if args.model.is_dir():
        raise InputError(f"'{args.model}' is a directory (an artifact?); ember profile takes "
                         f"a model file, as it needs the compiler's view of each kernel (an "
                         f"artifact's step times: ember.load(path).profile(inputs))")
    graph = _load(args.model, args.memory_limit)
    for name in graph.inputs:
        vtype = graph.types.get(name)
        if not isinstance(vtype, TensorType) or vtype.shape is None:
            raise InputError(f"input '{name}' is {vtype or 'of unknown type'}; compiled models "
                             f"take tensors of known rank")
    shapes, defaulted = _profile_shapes(graph, args)
    if defaulted:
        console.print(f"note: profiling with {', '.join(f'{s}=1' for s in defaulted)} (set "
                      f"sizes with --batch, --dim or --shape)")
    rng = np.random.default_rng(args.seed)
    feeds = {name: _random_array(graph.types[name].dtype, shapes[name], rng, name)
             for name in graph.inputs}
    module = compile_model(graph, opt_level=args.opt_level, input_shapes=shapes,
                           memory_limit=args.memory_limit)
    if args.threads is not None:
        module.set_num_threads(args.threads)
    console.print(module.report().splitlines()[0])
    peak = None
    if args.peak:
        from ember.profile import measure_peak

        peak = measure_peak(args.threads)
    profile = module.profile(feeds, repeat=args.repeat, warmup=args.warmup, peak=peak)
    _wide(console).print(profile.table(top=args.top))
    if args.json is not None:
        args.json.write_text(profile.to_json() + "\n", encoding="utf-8")
        console.print(f"wrote {args.json}")
    return EXIT_OK


def _profile_shapes(graph: Graph, args: argparse.Namespace
                    ) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """The input shapes to profile, and the symbols nothing binds (they default to 1, as in
    ``ember run``).  --shape fixes its input's whole shape; a symbol takes its size from
    --dim, else from a --shape that has it, else (a leading dimension) from --batch."""
    given: dict[str, tuple[int, ...]] = {}
    bindings = _bindings(graph, args.dim)
    for name, shape in args.shape:
        given[name] = _checked_shape(graph, name, shape)
        vtype = graph.types[name]
        assert isinstance(vtype, TensorType) and vtype.shape is not None  # _profile checked
        for dim, size in zip(vtype.shape, shape):
            symbol = single_symbol(dim)
            if symbol is not None:
                bindings.setdefault(symbol, size)
    if args.batch is not None:
        leading = [vtype.shape[0] for name in graph.inputs
                   if isinstance(vtype := graph.types.get(name), TensorType) and vtype.shape]
        symbols = {single_symbol(dim) for dim in leading} - {None}
        fixed = {dim for dim in leading if isinstance(dim, int)}
        if not symbols and fixed != {args.batch}:
            raise InputError(f"--batch {args.batch}: no input has a symbolic leading "
                             f"dimension (leading dimensions: {sorted(fixed) or 'none'}); "
                             f"give shapes with --shape NAME=D1,D2,...")
        for symbol in symbols:  # --dim and --shape win
            bindings.setdefault(symbol, args.batch)
    defaulted = sorted({symbol for name in graph.inputs if name not in given
                        for symbol in _type_symbols(graph.types.get(name))} - set(bindings))
    for symbol in defaulted:
        bindings[symbol] = 1
    return _compile_shapes(graph, bindings, given), defaulted


def _checked_shape(graph: Graph, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A --shape for input ``name``: its rank and static dims must be the model's."""
    if name not in graph.inputs:
        raise InputError(f"--shape names '{name}', which is not an input; the model's inputs "
                         f"are {', '.join(graph.inputs)}")
    vtype = graph.types[name]
    assert isinstance(vtype, TensorType) and vtype.shape is not None  # _profile checked
    if len(vtype.shape) != len(shape):
        raise InputError(f"--shape {name}: {len(shape)} dimension(s) given, input '{name}' "
                         f"has {len(vtype.shape)} ({vtype})")
    for axis, (dim, size) in enumerate(zip(vtype.shape, shape)):
        if isinstance(dim, int) and dim != size:
            raise InputError(f"--shape {name}: dimension {axis} is {dim} in the model, "
                             f"{size} given ({vtype})")
    return shape


def _wide(console: Console) -> Console:
    """A console wide enough for a wide table when the output is a file or a pipe (rich
    would wrap it at 80 columns and fold every cell)."""
    if console.is_terminal:
        return console
    return TerminalConsole(width=240, markup=False, highlight=False, soft_wrap=True)


if __name__ == "__main__":
    sys.exit(main())
