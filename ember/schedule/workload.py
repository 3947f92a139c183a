"""Workload keys: what makes two kernels the same problem for a schedule.

A tuning record is reused wherever the same kernel meets the same machine, so its key must be
a function of the kernel's *structure* only: the lowered, unscheduled loop IR with every
name replaced by its position (buffers, loop and let variables, in order of first
appearance), its element types, shapes and constants, which parameters are compile-time
constants (they are packed at build time), and the target's instruction set.  Node and value
names never enter it (the kernel's own name, its ``nodes``/``node`` attributes, buffer and
variable names), so a renamed model keeps its keys; another shape, dtype or op changes them.

Sizes that a traced build takes at run time (``ember.core.traced``) enter by their size
class (``[2**k, 2**(k+1))``, the rounding the schedule decides by), so every length a build
serves has one key.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from typing import Any

from ember.core.dtypes import DType
from ember.core.target import Target
from ember.core.traced import is_traced, plain
from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import Var
from ember.ir.loop.stmt import PrimFunc

# Function attributes that carry names of the model (not structure).
_NAME_ATTRS = frozenset({"nodes", "node"})
KEY_VERSION = 1  # bumped when the encoding changes, so old records stop matching


def workload_key(func: PrimFunc, target: Target,
                 constant_params: frozenset[int] = frozenset()) -> str:
    """A hex digest identifying ``func``'s structure on ``target`` (see the module doc)."""
    encoder = _Encoder()
    structure = {
        "version": KEY_VERSION,
        "params": [encoder.encode(p) for p in func.params],
        "body": encoder.encode(func.body),
        "attrs": [[k, encoder.encode(v)] for k, v in func.attrs if k not in _NAME_ATTRS],
        "constants": sorted(constant_params),
        "target": [target.arch, target.vector_bits, sorted(target.features)],
    }
    text = json.dumps(structure, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class _Encoder:
    """Turns loop-IR nodes into JSON-able trees with names replaced by positions."""

    def __init__(self) -> None:
        self.buffers: dict[Buffer, int] = {}
        self.vars: dict[Var, int] = {}

    def encode(self, value: Any) -> Any:
        if isinstance(value, Buffer):
            if value not in self.buffers:
                self.buffers[value] = len(self.buffers)
            return ["buffer", self.buffers[value], value.dtype.name,
                    [self._size(d) for d in value.shape], value.scope, value.align,
                    list(value.layout) if value.layout is not None else None]
        if isinstance(value, Var):
            if value not in self.vars:
                self.vars[value] = len(self.vars)
            return ["var", self.vars[value], value.dtype.name]
        if isinstance(value, bool) or value is None or isinstance(value, str):
            return value
        if isinstance(value, int):
            return self._size(value)
        if isinstance(value, float):
            return ["float", value.hex()]  # exact, and NaN/inf survive JSON
        if isinstance(value, DType):
            return value.name
        if isinstance(value, enum.Enum):
            return [type(value).__name__, value.name]
        if isinstance(value, tuple | list):
            return [self.encode(v) for v in value]
        if isinstance(value, dict):
            return [[self.encode(k), self.encode(v)] for k, v in value.items()]
        if dataclasses.is_dataclass(value):
            return [type(value).__name__,
                    *(self.encode(getattr(value, f.name)) for f in dataclasses.fields(value))]
        return [type(value).__name__, repr(value)]

    @staticmethod
    def _size(value: int) -> Any:
        # a traced size by its class [2**k, 2**(k+1)), from its sample: computing a key must
        # not add guards to the build (size_class would)
        return ["class", plain(value).bit_length()] if is_traced(value) else int(value)
