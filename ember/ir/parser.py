"""Read the printed graph IR back: :func:`parse_graph` is the inverse of ``print(graph)``.

Pass tests are written as text, Before and Expected, in the format of
:mod:`ember.ir.printer`::

    graph main(%x: f32[2, 8]) -> (%y: f32[2, 8]) {
      const %w: f32[8, 8] = random
      const %b: f32[8] = 0.5
      %t = MatMul(%x, %w)
      %y = Add(%t, %b)                  # bias
    }

Everything the printer writes parses, subgraphs (If/Loop bodies) and all attribute kinds
included.  What the printer cannot write, a test declares:

* a constant's value: ``= [[1, 2], [3, 4]]`` (nested lists as ``tolist()`` prints them; a
  single number fills the whole shape), or ``= random``: deterministic pseudo-random values
  seeded by the constant's name (normal floats, small integers, random booleans), the same in
  every run and on both sides of a test.  The printer shows large constants as a type only;
  such a declaration without a value is an error, because a graph with made-up weights must
  say so.  Tensor attributes take the same two forms after ``tensor<float32[4]>``.
* node types: ``: f32[2, 8]`` after a node is optional (shape inference fills it in).

Lines whose first character (after blanks) is ``#`` are comments; after a node, ``# text`` is
the node's name, as the printer writes it.  Whitespace and line breaks are otherwise free.

Errors are :class:`IRParseError`, naming the line and column.
"""

from __future__ import annotations

import ast
import json
import re
import zlib
from typing import Any

import numpy as np

from ember.core.dims import Dim, parse_dim
from ember.core.dtypes import DType
from ember.core.errors import EmberError
from ember.ir.graph import Graph, Node
from ember.ir.printer import BARE_NAME, domain_of_op
from ember.ir.types import OptionalType, SequenceType, TensorType, ValueType


class IRParseError(EmberError):
    """Text that is not a printed graph; the message names the line and column."""


def parse_graph(text: str) -> Graph:
    """The Graph whose printed form is ``text`` (see the module docstring for the syntax)."""
    parser = _Parser(text)
    graph = parser.graph()
    parser.skip_space()
    if not parser.at_end():
        parser.fail("unexpected text after the graph's closing '}'")
    return graph


# ---------------------------------------------------------------------- lexical pieces

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_NUMBER = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|inf|nan)")
_COMPLEX = re.compile(r"\(\s*([-+0-9.eEnaif]+j)\s*\)")
_DTYPES = {member.value: member for member in DType}
# Tensor attributes print numpy's dtype names (float32, bfloat16, ...).
_NUMPY_DTYPES = {member.numpy.name: member for member in DType}


class _Parser:
    """A recursive-descent parser over the characters of the text."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    # ------------------------------------------------------------------ scanning
    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def skip_space(self) -> None:
        """Skip blanks, line breaks and whole-line ``#`` comments."""
        while not self.at_end():
            char = self.text[self.pos]
            if char.isspace():
                self.pos += 1
            elif char == "#" and self._line_is_blank_before():
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            else:
                return

    def _line_is_blank_before(self) -> bool:
        start = self.text.rfind("\n", 0, self.pos) + 1
        return not self.text[start:self.pos].strip()

    def peek(self, literal: str) -> bool:
        self.skip_space()
        return self.text.startswith(literal, self.pos)

    def accept(self, literal: str) -> bool:
        if self.peek(literal):
            self.pos += len(literal)
            return True
        return False

    def expect(self, literal: str, what: str = "") -> None:
        if not self.accept(literal):
            self.fail(f"expected '{literal}'" + (f" {what}" if what else ""))

    def match(self, pattern: re.Pattern[str]) -> str | None:
        self.skip_space()
        found = pattern.match(self.text, self.pos)
        if found is None:
            return None
        self.pos = found.end()
        return found.group(0)

    def fail(self, message: str) -> None:
        line = self.text.count("\n", 0, self.pos) + 1
        start = self.text.rfind("\n", 0, self.pos) + 1
        end = self.text.find("\n", self.pos)
        source = self.text[start:end if end >= 0 else len(self.text)]
        column = self.pos - start + 1
        raise IRParseError(f"line {line}, column {column}: {message}\n  {source}\n"
                           f"  {' ' * (column - 1)}^")

    # ------------------------------------------------------------------ names
    def name(self, what: str) -> str:
        """A bare name or a JSON-quoted one."""
        self.skip_space()
        if self.peek('"'):
            return self.json_string()
        found = self.match(BARE_NAME)
        if found is None:
            self.fail(f"expected {what}")
        return found

    def value_name(self) -> str:
        self.expect("%", "before a value name")
        # No blank between '%' and the name.
        if self.text.startswith('"', self.pos):
            return self.json_string()
        found = BARE_NAME.match(self.text, self.pos)
        if found is None:
            self.fail("expected a value name after '%'")
        self.pos = found.end()
        return found.group(0)

    def json_string(self) -> str:
        decoder = json.JSONDecoder()
        try:
            value, end = decoder.raw_decode(self.text, self.pos)
        except json.JSONDecodeError:
            self.fail("malformed quoted name")
        if not isinstance(value, str):
            self.fail("expected a quoted name")
        self.pos = end
        return value

    def ident(self, what: str) -> str:
        found = self.match(_IDENT)
        if found is None:
            self.fail(f"expected {what}")
        return found

    # ------------------------------------------------------------------ graphs
    def graph(self) -> Graph:
        self.skip_space()
        if not self.accept("graph"):
            self.fail("expected 'graph'")
        graph = Graph(name=self.name("a graph name"))
        graph.inputs = self.signature(graph, "inputs")
        self.expect("->", "between the inputs and the outputs")
        graph.outputs = self.signature(graph, "outputs")
        self.expect("{", "to open the graph body")
        while not self.accept("}"):
            if self.at_end():
                self.fail("the graph body is not closed with '}'")
            self.item(graph)
        return graph

    def signature(self, graph: Graph, what: str) -> list[str]:
        self.expect("(", f"to open the graph {what}")
        names: list[str] = []
        if self.accept(")"):
            return names
        while True:
            name = self.value_name()
            if self.accept(":"):
                graph.types[name] = self.value_type()
            names.append(name)
            if self.accept(")"):
                return names
            self.expect(",", f"or ')' in the graph {what}")

    def item(self, graph: Graph) -> None:
        self.skip_space()
        if self.text.startswith("const", self.pos) and \
                re.match(r"const\s*%", self.text[self.pos:]):
            self.constant(graph)
        elif self.peek("%") or re.match(r"_\s*[,=]", self.text[self.pos:]):
            graph.nodes.append(self.node(graph))
        else:
            key = self.ident("a node, 'const' or a subgraph attribute")
            self.expect("=", f"after the subgraph attribute '{key}'")
            if not graph.nodes:
                self.fail(f"subgraph attribute '{key}' before any node")
            body = self.graph()
            attrs = graph.nodes[-1].attrs
            if key in attrs:  # a list of graphs prints one line per graph
                previous = attrs[key]
                attrs[key] = (previous if isinstance(previous, list) else [previous]) + [body]
            else:
                attrs[key] = body

    def constant(self, graph: Graph) -> None:
        self.expect("const")
        name = self.value_name()
        self.expect(":", f"and the type of constant '{name}'")
        vtype = self.value_type()
        if not isinstance(vtype, TensorType) or not vtype.is_static:
            self.fail(f"constant '{name}' needs a tensor type with a static shape")
        if not self.accept("="):
            self.fail(f"constant '{name}' has no value: declare it '= random' or give its "
                      f"values ('= [...]')")
        graph.constants[name] = self.array_value(vtype.dtype, vtype.shape, name)
        graph.types[name] = vtype

    def node(self, graph: Graph) -> Node:
        outputs = []
        while True:
            outputs.append("" if self.accept("_") else self.value_name())
            if not self.accept(","):
                break
        self.expect("=", "after the node outputs")
        op = self.ident("an op name")
        domain = domain_of_op(op)
        if self.accept("::"):
            domain, op = op, self.ident("an op name after '::'")
        self.expect("(", f"after the op name '{op}'")
        inputs: list[str] = []
        if not self.accept(")"):
            while True:
                inputs.append("" if self.accept("_") else self.value_name())
                if self.accept(")"):
                    break
                self.expect(",", "or ')' between node inputs")
        attrs = self.attributes() if self.peek("{") else {}
        if self.accept(":"):
            for position, vtype in enumerate(self.output_types(len(outputs))):
                if vtype is not None and outputs[position]:
                    graph.types[outputs[position]] = vtype
        return Node(op, inputs, outputs, attrs, name=self.node_name(), domain=domain)

    def output_types(self, count: int) -> list[ValueType | None]:
        types: list[ValueType | None] = []
        while True:
            types.append(None if self.accept("_") else self.value_type())
            if not self.accept(","):
                break
        if len(types) != count:
            self.fail(f"{len(types)} output types for {count} outputs")
        return types

    def node_name(self) -> str:
        """The ``# name`` comment that may end a node's line."""
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1
        if not self.text.startswith("#", self.pos):
            return ""
        end = self.text.find("\n", self.pos)
        comment = self.text[self.pos + 1:end if end >= 0 else len(self.text)].strip()
        self.pos = len(self.text) if end < 0 else end
        if comment.startswith('"'):
            try:
                decoded = json.loads(comment)
            except json.JSONDecodeError:
                return comment
            return decoded if isinstance(decoded, str) else comment
        return comment

    # ------------------------------------------------------------------ types
    def value_type(self) -> ValueType:
        for keyword, kind in (("seq<", SequenceType), ("opt<", OptionalType)):
            if self.accept(keyword):
                elem = None if self.accept("?") else self.value_type()
                self.expect(">", f"to close '{keyword}'")
                return kind(elem)
        word = self.ident("a type such as f32[2, 3]")
        dtype = _DTYPES.get(word)
        if dtype is None:
            self.fail(f"unknown element type '{word}' (ember's names: "
                      f"{', '.join(sorted(_DTYPES))})")
        return TensorType(dtype, self.shape())

    def shape(self) -> tuple[Dim, ...] | None:
        self.expect("[", "to open a shape")
        close = self.text.find("]", self.pos)
        if close < 0:
            self.fail("the shape is not closed with ']'")
        inside = self.text[self.pos:close].strip()
        self.pos = close + 1
        if inside == "*":
            return None
        if not inside:
            return ()
        try:
            return tuple(parse_dim(part) for part in inside.split(","))
        except (ValueError, TypeError):
            self.fail(f"malformed shape [{inside}]")
        raise AssertionError  # fail() raised

    # ------------------------------------------------------------------ attributes
    def attributes(self) -> dict[str, Any]:
        self.expect("{")
        attrs: dict[str, Any] = {}
        if self.accept("}"):
            return attrs
        while True:
            key = self.ident("an attribute name")
            self.expect("=", f"after attribute '{key}'")
            attrs[key] = self.attribute_value(key)
            if self.accept("}"):
                return attrs
            self.expect(",", "or '}' between attributes")

    def attribute_value(self, key: str) -> Any:
        if self.accept("tensor<"):
            dtype_name = self.match(re.compile(r"[A-Za-z0-9_<>]+?(?=\[)"))
            dtype = _NUMPY_DTYPES.get(dtype_name or "") or _DTYPES.get(dtype_name or "")
            if dtype is None:
                self.fail(f"unknown tensor element type '{dtype_name}'")
            shape = self.shape()
            self.expect(">", "to close 'tensor<'")
            if not self.accept("="):
                self.fail(f"tensor attribute '{key}' has no value: declare it '= random' or "
                          f"give its values")
            return self.array_value(dtype, shape, key)
        self.skip_space()
        if re.match(r"(seq|opt)<|[a-z][a-z0-9]*\[", self.text[self.pos:]):
            word = re.match(r"[a-z0-9]+", self.text[self.pos:])
            if word is not None and (word.group(0) in _DTYPES or word.group(0) in
                                     ("seq", "opt")):
                return self.value_type()
        return self.literal()

    # ------------------------------------------------------------------ literals
    def literal(self) -> Any:
        """A Python-like literal: number, string, True/False/None, [list] or (tuple)."""
        self.skip_space()
        if self.accept("["):
            return self.sequence("]")
        complex_match = _COMPLEX.match(self.text, self.pos)
        if complex_match is not None:
            self.pos = complex_match.end()
            return complex(complex_match.group(1).replace(" ", ""))
        if self.accept("("):
            return tuple(self.sequence(")"))
        if self.peek("'") or self.peek('"'):
            return self.python_string()
        for word, value in (("True", True), ("False", False), ("None", None)):
            if re.match(word + r"\b", self.text[self.pos:]):
                self.pos += len(word)
                return value
        number = self.match(_NUMBER)
        if number is None:
            self.fail("expected a value (number, string, list, True/False/None)")
        if re.fullmatch(r"[-+]?\d+", number):
            return int(number)
        return float(number)

    def sequence(self, close: str) -> list[Any]:
        items: list[Any] = []
        if self.accept(close):
            return items
        while True:
            items.append(self.literal())
            if self.accept(close):
                return items
            self.expect(",", f"or '{close}' in a list")
            if self.accept(close):  # a trailing comma, as in (1,)
                return items

    def python_string(self) -> str:
        quote = self.text[self.pos]
        end = self.pos + 1
        while end < len(self.text) and self.text[end] != quote:
            end += 2 if self.text[end] == "\\" else 1
        if end >= len(self.text):
            self.fail("the string is not closed")
        try:
            value = ast.literal_eval(self.text[self.pos:end + 1])
        except (ValueError, SyntaxError):
            self.fail("malformed string")
        self.pos = end + 1
        return value

    def array_value(self, dtype: DType, shape: tuple[Dim, ...] | None, name: str) -> np.ndarray:
        """``random`` or a literal, as an array of ``dtype`` and ``shape``."""
        assert shape is not None
        static = tuple(int(d) for d in shape)  # type: ignore[arg-type]
        if re.match(r"\s*random\b", self.text[self.pos:]):
            self.accept("random")
            return random_array(dtype, static, name)
        start = self.pos
        value = self.literal()
        holder = object if dtype == DType.STRING else dtype.numpy
        try:
            if isinstance(value, (list, tuple)):
                array = np.array(value, dtype=holder)
            else:
                array = np.full(static, value, dtype=holder)
        except (ValueError, TypeError, OverflowError) as error:
            self.pos = start
            self.fail(f"'{name}': the values do not fit {dtype}: {error}")
        if array.shape != static:
            self.pos = start
            self.fail(f"'{name}' is declared {list(static)} but its values have shape "
                      f"{list(array.shape)}")
        return array


def random_array(dtype: DType, shape: tuple[int, ...], name: str) -> np.ndarray:
    """Deterministic test values of ``dtype`` seeded by ``name`` (the same in every run)."""
    rng = np.random.default_rng(zlib.crc32(name.encode("utf-8")))
    if dtype == DType.BOOL:
        return rng.random(shape) < 0.5
    if dtype.is_float:
        return rng.standard_normal(shape).astype(dtype.numpy)
    if dtype in (DType.COMPLEX64, DType.COMPLEX128):
        values = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
        return values.astype(dtype.numpy)
    if dtype.is_int:
        low = 0 if not dtype.is_signed else -4
        return rng.integers(low, low + 8, size=shape).astype(dtype.numpy)
    raise IRParseError(f"'{name}': no random values of element type {dtype}")


__all__ = ["IRParseError", "parse_graph", "random_array"]
