"""Write RNN, GRU and LSTM layers out as graph nodes, one cell per time step.

Why: ember has no compiled kernel for a recurrence, so a recurrent layer ran as its numpy
reference on the host, a time step at a time -- an LSTM of two layers over 32 steps took
4.6 ms against ONNX Runtime's 0.37 ms.  Written out over its (static) time steps, a layer
is ops ember compiles well, as TVM's ONNX importer does too:

* the input projections of *all* time steps are one matrix product, ``X W^T + b`` over
  ``T * batch`` rows (the gate GEMMs batched over time), split into the steps' rows;
* each step is one small GEMM of the hidden state by ``R^T`` with the step's projection as
  its bias (``Gemm`` with C), and one fused elementwise kernel for the gates: slices of the
  GEMM's result through the gate activations into the new states;
* Y is the steps' hidden states concatenated in time order; Y_h and Y_c the final states.

Every step's kernels are the same code on other buffers, so the C compiler sees each once.

Written out: float32 layers with constant W, R (and B, P), no ``sequence_lens`` (or one that
holds the full length for every entry), static shapes, at most ``MAX_UNROLLED_STEPS`` steps
over all directions, and gate functions from :data:`_ACTIVATION_NODES`.  Anything else keeps
the reference.  Gates follow ONNX: LSTM (i, o, f, c) with peepholes (i, o, f) and
``input_forget``; GRU (z, r, h) with both ``linear_before_reset`` forms; ``clip`` bounds the
inputs of the gate functions f and g.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType
from ember.core.dtypes import DType
from ember.ops.rnn import CELL_KINDS, ActivationSpec, CellKind, activation_specs
from ember.passes.rewrite import expand_nodes

# Time steps (all directions of one layer) up to which a layer is written out; a longer one
# keeps the reference (the graph and the compile time grow with the steps).
MAX_UNROLLED_STEPS = 256


class _Refuse(Exception):
    """The layer is not written out (it keeps its reference)."""


def unroll_recurrent(graph: Graph) -> int:
    """Rewrite in place; returns how many recurrent layers were written out."""
    return expand_nodes(graph, CELL_KINDS, lambda node: _Unroller(graph, node).nodes(),
                        _Refuse)


def _refuse(message: str) -> Exception:
    return _Refuse(message)


class _Unroller:
    """The nodes that compute one recurrent layer ``node``, step by step."""

    def __init__(self, graph: Graph, node: Node):
        self.graph, self.node = graph, node
        self.kind: CellKind = CELL_KINDS[node.op]
        self.stem = node.name or node.op.lower()
        self.out: list[Node] = []
        attrs = node.attrs
        inputs = list(node.inputs) + [""] * (8 - len(node.inputs))
        x_type = graph.types.get(inputs[0])
        if not isinstance(x_type, TensorType) or x_type.dtype is not DType.FLOAT32 or \
                not x_type.is_static or len(x_type.shape) != 3:
            raise _refuse("X is not a static float32 tensor of rank 3")
        self.layout = int(attrs.get("layout", 0) or 0)
        direction = attrs.get("direction", "forward") or "forward"
        if self.layout not in (0, 1) or direction not in ("forward", "reverse",
                                                           "bidirectional"):
            raise _refuse("layout or direction")
        self.direction = direction
        self.num_dir = 2 if direction == "bidirectional" else 1
        shape = [int(d) for d in x_type.shape]
        self.steps, self.batch = (shape[0], shape[1]) if self.layout == 0 else \
            (shape[1], shape[0])
        self.input_size = shape[2]
        if self.steps < 1 or self.batch < 1 or \
                self.steps * self.num_dir > MAX_UNROLLED_STEPS:
            raise _refuse("too many (or no) time steps")
        self.w = self._constant(inputs[1])
        self.r = self._constant(inputs[2])
        gates = self.kind.gates
        hidden = attrs.get("hidden_size") or self.r.shape[-1]
        self.hidden = int(hidden)
        if self.w.shape != (self.num_dir, gates * self.hidden, self.input_size) or \
                self.r.shape != (self.num_dir, gates * self.hidden, self.hidden):
            raise _refuse("weights of another shape")
        self.b = self._constant(inputs[3]) if inputs[3] else \
            np.zeros((self.num_dir, 2 * gates * self.hidden), np.float32)
        if self.b.shape != (self.num_dir, 2 * gates * self.hidden):
            raise _refuse("bias of another shape")
        if inputs[4]:
            lengths = graph.constants.get(inputs[4])
            if lengths is None or not np.all(np.asarray(lengths) == self.steps):
                raise _refuse("sequence_lens shorter than the sequence")
        self.initial = [inputs[5], inputs[6] if node.op == "LSTM" else ""]
        self.peepholes = None
        if node.op == "LSTM" and inputs[7]:
            self.peepholes = self._constant(inputs[7])
            if self.peepholes.shape != (self.num_dir, 3 * self.hidden):
                raise _refuse("peepholes of another shape")
        clip = attrs.get("clip")
        self.clip = float(clip) if clip is not None else None
        self.functions = activation_specs(
            _refuse, attrs.get("activations"), self.kind.activations,
            attrs.get("activation_alpha"), attrs.get("activation_beta"), self.num_dir)
        if any(spec.name not in _ACTIVATION_NODES for d in self.functions for spec in d):
            raise _refuse("a gate function without a node form")
        for name in self.initial:
            if name and not self._is_state(name):
                raise _refuse("an initial state of another shape or type")

    # ------------------------------------------------------------------ helpers
    def _constant(self, name: str) -> np.ndarray:
        value = self.graph.constants.get(name) if name else None
        if value is None or value.dtype != np.float32:
            raise _refuse(f"input '{name}' is not a float32 constant")
        return np.asarray(value)

    def _is_state(self, name: str) -> bool:
        vtype = self.graph.types.get(name)
        shape = (self.num_dir, self.batch, self.hidden) if self.layout == 0 else \
            (self.batch, self.num_dir, self.hidden)
        return isinstance(vtype, TensorType) and vtype.dtype is DType.FLOAT32 and \
            vtype.is_static and tuple(int(d) for d in vtype.shape) == shape

    def value(self, hint: str) -> str:
        return self.graph.fresh_name(f"{self.stem}_{hint}")

    def const(self, array: np.ndarray, hint: str) -> str:
        # (np.array, not ascontiguousarray: that makes a scalar a 1-element vector)
        return self.graph.add_constant(np.array(array, order="C"), hint=f"{self.stem}_{hint}")

    def emit(self, op: str, inputs: list[str], hint: str, attrs: dict | None = None,
             outputs: int = 1) -> str | list[str]:
        names = [self.value(hint if outputs == 1 else f"{hint}{i}") for i in range(outputs)]
        self.out.append(Node(op, inputs, names, dict(attrs or {}),
                             name=self.value(f"{hint}_node")))
        return names[0] if outputs == 1 else names

    def columns(self, value: str, start: int, stop: int, hint: str) -> str:
        """``value[:, start:stop]``."""
        return self.emit("Slice", [value, self.const(np.array([start], np.int64), "start"),
                                   self.const(np.array([stop], np.int64), "stop"),
                                   self.const(np.array([1], np.int64), "axis")], hint)

    def activate(self, spec: ActivationSpec, value: str, hint: str) -> str:
        if self.clip is not None and spec.clipped:
            bound = self.clip
            value = self.emit("Clip", [value, self.const(np.float32(-bound), "clip_low"),
                                       self.const(np.float32(bound), "clip_high")],
                              f"{hint}_clipped")
        return _ACTIVATION_NODES[spec.name](self, spec, value, hint)

    # ------------------------------------------------------------------ the layer
    def nodes(self) -> list[Node]:
        node, steps, batch, hidden = self.node, self.steps, self.batch, self.hidden
        x = node.inputs[0]
        if self.layout == 1:  # [batch, seq, input] -> [seq, batch, input]
            x = self.emit("Transpose", [x], "x_seq_major", {"perm": [1, 0, 2]})
        rows = self.emit("Reshape", [x, self.const(np.array([steps * batch, self.input_size],
                                                            np.int64), "rows_shape")],
                         "x_rows")
        per_direction, finals = [], []
        for d in range(self.num_dir):
            reverse = self.direction == "reverse" or d == 1
            states = [self._initial_state(k, d) for k in range(self.kind.states)]
            step_outputs, states = self._direction(rows, d, states, reverse)
            per_direction.append(step_outputs)
            finals.append(states)
        # Y [seq, dirs, batch, hidden] is the steps' states in (time, direction) order: one
        # Concat of [batch, hidden] pieces, which lowering partitions into plain copies
        pieces = [per_direction[d][t] for t in range(steps) for d in range(self.num_dir)]
        joined = self.emit("Concat", pieces, "y_rows", {"axis": 0}) if len(pieces) > 1 \
            else pieces[0]
        y = self.emit("Reshape", [joined, self.const(
            np.array([steps, self.num_dir, batch, hidden], np.int64), "y_shape")], "y")
        outputs = list(node.outputs) + [""] * (3 - len(node.outputs))
        results = {0: y}
        for k in range(self.kind.states):
            per_dir = [self.emit("Unsqueeze", [finals[d][k], self.const(
                np.array([0], np.int64), "axis0")], f"final{k}_{d}")
                for d in range(self.num_dir)]
            results[k + 1] = per_dir[0] if self.num_dir == 1 else \
                self.emit("Concat", per_dir, f"final{k}", {"axis": 0})
        for position, name in enumerate(outputs[:1 + self.kind.states]):
            if not name:
                continue
            value = results[position]
            if self.layout == 1:
                perm = [2, 0, 1, 3] if position == 0 else [1, 0, 2]
                self.out.append(Node("Transpose", [value], [name], {"perm": perm},
                                     name=self.value("layout_node")))
            else:
                self.out.append(Node("Identity", [value], [name],
                                     name=self.value("output_node")))
        return self.out

    def _initial_state(self, k: int, d: int) -> str:
        name = self.initial[k]
        if not name:
            return self.const(np.zeros((self.batch, self.hidden), np.float32), f"state{k}_zero")
        if self.layout == 1:
            name = self.emit("Transpose", [name], f"state{k}_dir_major", {"perm": [1, 0, 2]})
        return self.emit("Gather", [name, self.const(np.array(d, np.int64), "direction")],
                         f"state{k}_{d}", {"axis": 0})

    def _projection(self, rows: str, w: np.ndarray, bias: np.ndarray, hint: str) -> list[str]:
        """``rows @ w^T + bias`` for every step at once, split into the steps' rows."""
        projected = self.emit("Gemm", [rows, self.const(w, f"{hint}_weight"),
                                       self.const(bias, f"{hint}_bias")], hint, {"transB": 1})
        if self.steps == 1:
            return [projected]
        return self.emit("Split", [projected, self.const(
            np.full(self.steps, self.batch, np.int64), "split")], f"{hint}_t", {"axis": 0},
            outputs=self.steps)

    def _direction(self, rows: str, d: int, states: list[str], reverse: bool
                   ) -> tuple[dict[int, str], list[str]]:
        op, hidden, gates = self.node.op, self.hidden, self.kind.gates
        w, r = self.w[d], self.r[d]
        wb, rb = self.b[d, :gates * hidden], self.b[d, gates * hidden:]
        functions = self.functions[d]
        y: dict[int, str] = {}
        if op == "GRU":
            linear_before_reset = bool(self.node.attrs.get("linear_before_reset", 0))
            return self._gru(rows, d, w, r, wb, rb, functions, states, reverse,
                             linear_before_reset)
        projections = self._projection(rows, w, wb + rb, f"x{d}_projection")
        r_const = self.const(r, f"r{d}")
        for step in range(self.steps):
            t = self.steps - 1 - step if reverse else step
            gate_sum = self.emit("Gemm", [states[0], r_const, projections[t]], f"g{d}",
                                 {"transB": 1})
            if op == "RNN":
                states = [self.activate(functions[0], gate_sum, f"h{d}")]
            else:
                states = self._lstm_cell(gate_sum, states, functions, d)
            y[t] = states[0]
        return y, states

    def _lstm_cell(self, gate_sum: str, states: list[str], functions: list[ActivationSpec],
                   d: int) -> list[str]:
        hidden = self.hidden
        h, c = states
        gi, go, gf, gc = (self.columns(gate_sum, k * hidden, (k + 1) * hidden, f"{name}{d}")
                          for k, name in enumerate("iofc"))
        peep = None if self.peepholes is None else \
            [self.const(self.peepholes[d, k * hidden:(k + 1) * hidden], f"p{name}{d}")
             for k, name in enumerate("iof")]
        if peep is not None:
            gi = self.emit("Add", [gi, self.emit("Mul", [c, peep[0]], "pic")], "gi")
        i = self.activate(functions[0], gi, f"i{d}")
        if self.node.attrs.get("input_forget", 0):
            f = self.emit("Sub", [self.const(np.float32(1), "one"), i], f"f{d}")
        else:
            if peep is not None:
                gf = self.emit("Add", [gf, self.emit("Mul", [c, peep[2]], "pfc")], "gf")
            f = self.activate(functions[0], gf, f"f{d}")
        candidate = self.activate(functions[1], gc, f"candidate{d}")
        c_new = self.emit("Add", [self.emit("Mul", [f, c], "fc"),
                                  self.emit("Mul", [i, candidate], "ic")], f"c{d}")
        if peep is not None:
            go = self.emit("Add", [go, self.emit("Mul", [c_new, peep[1]], "poc")], "go")
        o = self.activate(functions[0], go, f"o{d}")
        h_new = self.emit("Mul", [o, self.activate(functions[2], c_new, f"cell_out{d}")],
                          f"h{d}")
        return [h_new, c_new]

    def _gru(self, rows: str, d: int, w: np.ndarray, r: np.ndarray, wb: np.ndarray,
             rb: np.ndarray, functions: list[ActivationSpec], states: list[str],
             reverse: bool, linear_before_reset: bool) -> tuple[dict[int, str], list[str]]:
        hidden = self.hidden
        two = 2 * hidden
        y: dict[int, str] = {}
        (h,) = states
        if linear_before_reset:
            # candidate = g(x_h + wb_h + r * (h R_h^T + rb_h)): R's product keeps its bias
            projections = self._projection(rows, w, wb + np.concatenate(
                [rb[:two], np.zeros(hidden, np.float32)]), f"x{d}_projection")
            r_const = self.const(r, f"r{d}")
            rb_h = self.const(np.concatenate([np.zeros(two, np.float32), rb[two:]]),
                              f"rb{d}")
            for step in range(self.steps):
                t = self.steps - 1 - step if reverse else step
                recurrent = self.emit("Gemm", [h, r_const, rb_h], f"hr{d}", {"transB": 1})
                z, reset = self._update_and_reset(projections[t], recurrent, functions, d)
                candidate_in = self.emit("Add", [
                    self.columns(projections[t], two, 3 * hidden, f"xh{d}"),
                    self.emit("Mul", [reset, self.columns(recurrent, two, 3 * hidden,
                                                          f"hh{d}")], "reset_h")], "gh")
                h = self._gru_state(z, self.activate(functions[1], candidate_in,
                                                     f"candidate{d}"), h, d)
                y[t] = h
            return y, [h]
        # candidate = g(x_h + wb_h + (r * h) R_h^T + rb_h): both biases into the projection
        projections = self._projection(rows, w, wb + rb, f"x{d}_projection")
        r_zr = self.const(r[:two], f"r_zr{d}")
        r_h = self.const(r[two:], f"r_h{d}")
        zero_bias = self.const(np.zeros(two, np.float32), f"no_bias{d}")
        for step in range(self.steps):
            t = self.steps - 1 - step if reverse else step
            recurrent = self.emit("Gemm", [h, r_zr, zero_bias], f"hr{d}", {"transB": 1})
            z, reset = self._update_and_reset(projections[t], recurrent, functions, d)
            candidate_in = self.emit("Gemm", [self.emit("Mul", [reset, h], "reset_h"), r_h,
                                              self.columns(projections[t], two, 3 * hidden,
                                                           f"xh{d}")], f"gh{d}",
                                     {"transB": 1})
            h = self._gru_state(z, self.activate(functions[1], candidate_in, f"candidate{d}"),
                                h, d)
            y[t] = h
        return y, [h]

    def _update_and_reset(self, projection: str, recurrent: str,
                          functions: list[ActivationSpec], d: int) -> tuple[str, str]:
        hidden = self.hidden
        gates = []
        for k, name in enumerate("zr"):
            total = self.emit("Add", [
                self.columns(projection, k * hidden, (k + 1) * hidden, f"x{name}{d}"),
                self.columns(recurrent, k * hidden, (k + 1) * hidden, f"h{name}{d}")],
                f"g{name}{d}")
            gates.append(self.activate(functions[0], total, f"{name}{d}"))
        return gates[0], gates[1]

    def _gru_state(self, z: str, candidate: str, h: str, d: int) -> str:
        """``(1 - z) * candidate + z * h``, as ``candidate + z * (h - candidate)``."""
        return self.emit("Add", [candidate, self.emit("Mul", [z, self.emit(
            "Sub", [h, candidate], "h_minus_candidate")], "z_delta")], f"h{d}")


def _unary(op: str, **fixed: str) -> Callable[["_Unroller", ActivationSpec, str, str], str]:
    """A gate function that is one node ``op`` (``fixed`` maps its attributes to the spec's
    ``alpha``/``beta``)."""
    def build(unroller: _Unroller, spec: ActivationSpec, value: str, hint: str) -> str:
        attrs = {attr: float(getattr(spec, field)) for attr, field in fixed.items()}
        return unroller.emit(op, [value], hint, attrs)
    return build


def _affine(unroller: _Unroller, spec: ActivationSpec, value: str, hint: str) -> str:
    scaled = unroller.emit("Mul", [value, unroller.const(np.float32(spec.alpha), "alpha")],
                           f"{hint}_scaled")
    return unroller.emit("Add", [scaled, unroller.const(np.float32(spec.beta), "beta")], hint)


def _scaled_tanh(unroller: _Unroller, spec: ActivationSpec, value: str, hint: str) -> str:
    inner = unroller.emit("Mul", [value, unroller.const(np.float32(spec.beta), "beta")],
                          f"{hint}_in")
    return unroller.emit("Mul", [unroller.emit("Tanh", [inner], f"{hint}_tanh"),
                                 unroller.const(np.float32(spec.alpha), "alpha")], hint)


# gate function name (lower case, as ops/rnn.py knows them) -> its nodes
_ACTIVATION_NODES: dict[str, Callable[[_Unroller, ActivationSpec, str, str], str]] = {
    "sigmoid": _unary("Sigmoid"),
    "tanh": _unary("Tanh"),
    "relu": _unary("Relu"),
    "leakyrelu": _unary("LeakyRelu", alpha="alpha"),
    "thresholdedrelu": _unary("ThresholdedRelu", alpha="alpha"),
    "hardsigmoid": _unary("HardSigmoid", alpha="alpha", beta="beta"),
    "elu": _unary("Elu", alpha="alpha"),
    "softsign": _unary("Softsign"),
    "softplus": _unary("Softplus"),
    "affine": _affine,
    "scaledtanh": _scaled_tanh,
}
