"""Control characters on the way to a terminal (kind ``cli/escapes``).

A model's text -- graph, node and value names, doc strings, op types and domains, producer,
metadata, symbolic dimension names, the file's own name -- reaches the output of ``ember
inspect``, ``run``, ``profile`` and ``compile``, and the messages of the errors they report.
A terminal interprets control characters in it: an escape sequence can clear the screen,
retitle the window, write the clipboard or show one link and open another.  ember escapes
them (``ember/core/text.py``, ``printable()``); this family checks that nothing gets through,
whatever text goes where and whatever the command does with it (import, compile, run, save
an artifact and run that, write graph JSON and inspect it, fail).

Each case draws a seed model, 1-6 fields to fill with hostile text (ordinary words around
1-3 escapes of ``fuzz.hostile.TERMINAL_ESCAPES``), and 1-2 commands; the worker runs them in
process (stdout and stderr captured at the file descriptors) or as ``python -m ember``, as a
plain file or as a terminal (``FORCE_COLOR``: rich adds its own SGR styles, which are then
the only escapes allowed).  The property: exit status 0 or 2 (an EmberError reported), and
no control character but newline and tab in either stream.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import onnx
from onnx import helper

from fuzz.hostile import TERMINAL_ESCAPES
from fuzz.mutate.walk import all_value_names, node_sites, rename_value
from fuzz.seeds import seed

SEEDS = ("mlp", "branch", "function", "shapes")
WORDS = ("conv1", "weight", "layer.0", "out", "x", "relu", "bias", "model", "")
# Placeholders in a command line: the model file and a fresh output directory.
MODEL_ARG, OUT_ARG = "{model}", "{out}"


@dataclass
class CliCase:
    """A hostile model and the ember command lines to run on it."""

    data: bytes
    file_name: str
    commands: list[list[str]]
    mode: str = "in-process"   # or "subprocess"
    terminal: bool = False     # FORCE_COLOR: rich writes as to a terminal
    description: str = ""
    fields: list[str] = field(default_factory=list)


def hostile_text(rng: random.Random) -> tuple[str, list[str]]:
    """Ordinary words around 1-3 escapes; returns the text and the escapes' names."""
    names = rng.sample(sorted(TERMINAL_ESCAPES), rng.randint(1, 3))
    parts = [rng.choice(WORDS)]
    for name in names:
        parts += [TERMINAL_ESCAPES[name], rng.choice(WORDS)]
    return "".join(parts), names


# ---------------------------------------------------------------------------- fields
# Each puts hostile text in one kind of field of the model; returns what it did.


def _graph_name(model: onnx.ModelProto, text: str, rng: random.Random) -> str:
    model.graph.name = text
    return "graph name"


def _node_name(model: onnx.ModelProto, text: str, rng: random.Random) -> str:
    site = rng.choice(node_sites(model))
    site.node.name = text
    return f"name of node {site.label}"


def _value_name(model: onnx.ModelProto, text: str, rng: random.Random) -> str:
    old = rng.choice(all_value_names(model))
    rename_value(model, old, text)
    return f"value '{old}' renamed"


def _output_name(model: onnx.ModelProto, text: str, rng: random.Random) -> str:
    old = model.graph.output[0].name
    rename_value(model, old, text)
    return "output name"


def _doc_string(model: onnx.ModelProto, text: str, rng: random.Random) -> str:
    where = rng.choice(["model", "graph", "node"])
    if where == "model":
        model.doc_string = text
    elif where == "graph":
        model.graph.doc_string = text
    else:
        rng.choice(node_sites(model)).node.doc_string = text
    return f"{where} doc string"


def _producer(model: onnx.ModelProto, text: str, rng: random.Random) -> str:
    if rng.random() < 0.5:
        model.producer_name = text
        return "producer name"
    model.producer_version = text
    return "producer version"


def _metadata(model: onnx.ModelProto, text: str, rng: random.Random) -> str:
    entry = model.metadata_props.add()
    if rng.random() < 0.5:
        entry.key, entry.value = text, "v"
        return "metadata key"
    entry.key, entry.value = "note", text
    return "metadata value"


def _op_type(model: onnx.ModelProto, text: str, rng: random.Random) -> str:
    site = rng.choice(node_sites(model))
    site.node.op_type = text
    return f"op type of node {site.label} (unknown op: an error names it)"


def _domain(model: onnx.ModelProto, text: str, rng: random.Random) -> str:
    site = rng.choice(node_sites(model))
    site.node.domain = text
    return f"domain of node {site.label} (unknown domain: an error names it)"


def _dim_param(model: onnx.ModelProto, text: str, rng: random.Random) -> str:
    dims = model.graph.input[0].type.tensor_type.shape.dim
    index = rng.randrange(len(dims))
    dims[index].dim_param = text
    return f"symbolic name of dim {index} of the first input"


def _attribute_name(model: onnx.ModelProto, text: str, rng: random.Random) -> str:
    site = rng.choice(node_sites(model))
    site.node.attribute.append(helper.make_attribute(text, 1))
    return f"unknown attribute on node {site.label}"


def _function_name(model: onnx.ModelProto, text: str, rng: random.Random) -> str:
    if not model.functions:
        return _graph_name(model, text, rng)
    function = model.functions[0]
    old = function.name
    function.name = text
    for site in node_sites(model):
        if site.node.op_type == old:
            site.node.op_type = text
    return "model-local function name"


FIELDS = {"graph-name": _graph_name, "node-name": _node_name, "value-name": _value_name,
          "output-name": _output_name, "doc-string": _doc_string, "producer": _producer,
          "metadata": _metadata, "op-type": _op_type, "domain": _domain,
          "dim-param": _dim_param, "attribute-name": _attribute_name,
          "function-name": _function_name}
# Fields that make the model fail to import: drawn less often, so that most cases reach
# the commands' normal output.
FAILING = {"op-type": 0.3, "domain": 0.3, "attribute-name": 0.4}


# ---------------------------------------------------------------------------- commands


def _commands(rng: random.Random, dim_names: list[str]) -> tuple[list[list[str]], str]:
    """1-2 command lines; a symbolic dim is bound with --dim (its hostile name in argv)
    unless left unbound on purpose (the error message names it)."""
    dims = []
    if dim_names and rng.random() < 0.7:
        dims = ["--dim", f"{dim_names[0]}=2"]
    choices = {
        "inspect": [["inspect", MODEL_ARG]],
        "inspect --ir": [["inspect", MODEL_ARG, "--ir", *dims]],
        "inspect --stages": [["inspect", MODEL_ARG, "--stages", *dims]],
        "inspect --json, inspect the JSON": [
            ["inspect", MODEL_ARG, "--json", f"{OUT_ARG}/graph.json"],
            ["inspect", f"{OUT_ARG}/graph.json"]],
        "run": [["run", MODEL_ARG, *dims]],
        "run --mode compiled": [["run", MODEL_ARG, "--mode", "compiled", *dims]],
        "run --output-dir": [["run", MODEL_ARG, "--output-dir", f"{OUT_ARG}/outputs", *dims]],
        "profile": [["profile", MODEL_ARG, "--repeat", "2", "--warmup", "0", *dims]],
        "compile, run the artifact": [
            ["compile", MODEL_ARG, "-o", f"{OUT_ARG}/artifact", *dims],
            ["run", f"{OUT_ARG}/artifact"]],
    }
    weights = {"inspect": 3, "inspect --ir": 2, "inspect --stages": 1,
               "inspect --json, inspect the JSON": 1, "run": 3, "run --mode compiled": 1,
               "run --output-dir": 1, "profile": 1, "compile, run the artifact": 2}
    names = sorted(choices)
    name = rng.choices(names, [weights[n] for n in names])[0]
    return choices[name], name


def escapes_case(rng: random.Random, number: int) -> CliCase:
    """A seed model with hostile text in 1-6 fields (sometimes its file name too, or bytes
    that are no model at all), and the commands to run on it."""
    base = rng.choice(SEEDS)
    model = onnx.ModelProto()
    model.CopyFrom(seed(base).model)
    filled: list[str] = []
    dim_names: list[str] = []
    count = rng.randint(1, 6)
    names = sorted(FIELDS)
    weights = [FAILING.get(n, 1.0) for n in names]
    for _ in range(count):
        which = rng.choices(names, weights)[0]
        text, escapes = hostile_text(rng)
        done = FIELDS[which](model, text, rng)
        if which == "dim-param":
            dim_names.append(text)
        filled.append(f"{done}: {'+'.join(escapes)}")
    file_name = "model.onnx"
    if rng.random() < 0.3:
        text, escapes = hostile_text(rng)
        file_name = text.replace("/", "_").replace("\x00", "_") + ".onnx"
        filled.append(f"file name: {'+'.join(escapes)}")
    data = model.SerializeToString()
    if rng.random() < 0.05:
        data = b"\x1b[2J not a model \x9b2J\x07"
        filled.append("file content: not a protobuf, with escapes")
    commands, command_name = _commands(rng, dim_names)
    mode = "subprocess" if rng.random() < 0.25 else "in-process"
    terminal = rng.random() < 0.3
    description = (f"{base}: {command_name} ({mode}{', as a terminal' if terminal else ''}); "
                   f"hostile text in " + "; ".join(filled))
    return CliCase(data, file_name, commands, mode, terminal, description, filled)
