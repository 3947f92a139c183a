"""Upgrades of control-flow, recurrent and ai.onnx.ml ops to their newest form.

* Scan-8 scanned a batch: axis 0 of every input was a batch axis, axis 1 the sequence axis,
  and an optional first input ``sequence_lens`` gave each batch entry its own length.  It
  becomes a Loop over the batch whose body runs a newest-form Scan on one batch entry.
* RNN/GRU/LSTM before opset 7 had an ``output_sequence`` attribute that only said whether
  the optional output Y is wanted, which the node's outputs already say.
* ai.onnx.ml LabelEncoder-1 mapped strings to their index in ``classes_strings`` (or back);
  LabelEncoder-2 spells that mapping out as keys and values.
"""

from __future__ import annotations

import copy

import numpy as np

from ember.core.dtypes import DType
from ember.frontend.onnx.table import ML_DOMAIN, Builder, upgrade
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType

# ----------------------------------------------------------------------------- Scan-8


class _BodyBuilder:
    """Collects the nodes of a Loop body built by an upgrade (names come from ``b.fresh``)."""

    def __init__(self, b: Builder, node_name: str):
        self.b = b
        self.node_name = node_name
        self.nodes: list[Node] = []

    def add(self, op: str, inputs: list[str], hint: str, **attrs) -> str:
        output = self.b.fresh(hint)
        self.nodes.append(Node(op=op, inputs=list(inputs), outputs=[output], attrs=attrs,
                               name=f"{self.node_name}_{op}_{len(self.nodes)}"))
        return output

    def add_multi(self, op: str, inputs: list[str], outputs: list[str], **attrs) -> None:
        self.nodes.append(Node(op=op, inputs=list(inputs), outputs=list(outputs), attrs=attrs,
                               name=f"{self.node_name}_{op}_{len(self.nodes)}"))


def _unstack(b: Builder, value: str, hint: str) -> str:
    """Outer-graph node splitting ``value`` along axis 0 into a sequence of its entries."""
    name = b.fresh(hint)
    b.add_node("SplitToSequence", [value], [name], axis=0, keepdims=0)
    return name


@upgrade("Scan", before=9)
def scan8_batch_to_loop(node: Node, b: Builder, opset: int) -> list[Node]:
    """Scan-8 over a batch becomes Loop(batch) { Scan-9 over one batch entry }."""
    body: Graph = node.attrs["body"]
    n_scan = int(node.attrs["num_scan_inputs"])
    directions = node.attrs.get("directions")
    inputs = node.inputs + [""] * max(0, 1 + n_scan - len(node.inputs))
    sequence_lens, states = inputs[0], inputs[1:len(inputs) - n_scan]
    scans = inputs[len(inputs) - n_scan:]
    n_state = len(states)

    state_seqs = [_unstack(b, s, "scan8_state") for s in states]
    scan_seqs = [_unstack(b, s, "scan8_input") for s in scans]
    batch_dims, batch = b.fresh("scan8_batch_dims"), b.fresh("scan8_batch")
    b.add_node("Shape", [scans[0]], [batch_dims], start=0, end=1)  # folds to [B] in inference
    b.add_node("Squeeze", [batch_dims, b.constant(np.array([0], np.int64), "axes")], [batch])
    lens_seq = _unstack(b, sequence_lens, "scan8_lens") if sequence_lens else ""

    loop_body = _BodyBuilder(b, node.name)
    iteration, cond = b.fresh("scan8_b"), b.fresh("scan8_cond")
    entry_states = [loop_body.add("SequenceAt", [s, iteration], "scan8_state_b")
                    for s in state_seqs]
    entry_scans = [loop_body.add("SequenceAt", [s, iteration], "scan8_input_b")
                   for s in scan_seqs]
    scan_attrs = {"body": body, "num_scan_inputs": n_scan}
    if directions is not None:
        scan_attrs["scan_input_directions"] = list(directions)
    n_out_scan = len(node.outputs) - n_state
    finals = [b.fresh("scan8_final") for _ in range(n_state)]
    outs = [b.fresh("scan8_out") for _ in range(n_out_scan)]
    if not lens_seq:
        loop_body.add_multi("Scan", entry_states + entry_scans, finals + outs, **scan_attrs)
    else:
        _scan_entry_with_length(loop_body, lens_seq, iteration, entry_states, entry_scans,
                                finals, outs, scan_attrs)
    loop_graph = Graph(name=f"{node.name}_batch_body", inputs=[iteration, cond],
                       outputs=[cond] + finals + outs, nodes=loop_body.nodes,
                       types={iteration: TensorType(DType.INT64, ()),
                              cond: TensorType(DType.BOOL, ())})
    return [Node(op="Loop", inputs=[batch, ""], outputs=list(node.outputs),
                 attrs={"body": loop_graph}, name=node.name, domain=node.domain)]


def _scan_entry_with_length(body: _BodyBuilder, lens_seq: str, iteration: str,
                            states: list[str], scans: list[str], finals: list[str],
                            outs: list[str], scan_attrs: dict) -> None:
    """Scan the first ``sequence_lens[b]`` steps of one batch entry for its final states and
    scan outputs, then pad the outputs to the full length.

    Scan-8 leaves the padding undefined; it is taken from a second scan over the whole entry
    (rather than over the remaining steps, which are often none: a scan without iterations
    cannot always tell the shape of its empty outputs).
    """
    length = body.add("SequenceAt", [lens_seq, iteration], "scan8_len")
    steps = body.add("SplitToSequence", [scans[0]], "scan8_steps", axis=0)
    total = body.add("SequenceLength", [steps], "scan8_total")
    rest = body.add("Sub", [total, length], "scan8_rest")

    def sizes(a: str, b: str) -> str:
        pair = body.add("SequenceConstruct", [a, b], "scan8_pair")
        return body.add("ConcatFromSequence", [pair], "scan8_sizes", axis=0, new_axis=1)

    def leading_part(value: str, split: str) -> str:
        parts = body.add("SplitToSequence", [value, split], "scan8_parts", axis=0)
        return body.add("SequenceAt", [parts, first], "scan8_part")

    first = body.b.constant(np.array(0, np.int64), hint="scan8_first")
    head_sizes, pad_sizes = sizes(length, rest), sizes(rest, length)
    heads = [leading_part(scan_input, head_sizes) for scan_input in scans]
    head_outs = [body.b.fresh("scan8_head_out") for _ in outs]
    body.add_multi("Scan", states + heads, finals + head_outs, **scan_attrs)
    pad_attrs = dict(scan_attrs, body=copy.deepcopy(scan_attrs["body"]))
    unused = [body.b.fresh("scan8_unused") for _ in finals]
    full_outs = [body.b.fresh("scan8_full_out") for _ in outs]
    body.add_multi("Scan", finals + scans, unused + full_outs, **pad_attrs)
    for out, head, full in zip(outs, head_outs, full_outs):
        both = body.add("SequenceConstruct", [head, leading_part(full, pad_sizes)], "scan8_both")
        body.add_multi("ConcatFromSequence", [both], [out], axis=0)


# ----------------------------------------------------------------------------- RNN family


def _drop_output_sequence(node: Node, b: Builder, opset: int) -> None:
    node.attrs.pop("output_sequence", None)


for _rnn_op in ("RNN", "GRU", "LSTM"):
    upgrade(_rnn_op, before=7)(_drop_output_sequence)


# ----------------------------------------------------------------------------- ai.onnx.ml


@upgrade("LabelEncoder", before=2, domain=ML_DOMAIN)
def label_encoder_classes_to_keys(node: Node, b: Builder, opset: int) -> None:
    """LabelEncoder-1 (``classes_strings`` + one default) becomes explicit keys/values.

    With ``default_string`` set it maps an index to its class name, otherwise a class name
    to its index.
    """
    classes = list(node.attrs.pop("classes_strings", []))
    indices = list(range(len(classes)))
    if "default_string" in node.attrs:
        node.attrs["keys_int64s"], node.attrs["values_strings"] = indices, classes
    else:
        node.attrs["keys_strings"], node.attrs["values_int64s"] = classes, indices
