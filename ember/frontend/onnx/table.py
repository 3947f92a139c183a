"""The ONNX op table: which ember op each ONNX op becomes, and how older versions are upgraded.

Most ONNX ops map one-to-one onto the ember op of the same name, whose semantics are those of
the newest opset.  When an op changed between opsets (an attribute that became an input, a
changed default), an *upgrade* registered here rewrites a node of an older version into the
newest form.  Upgrades live in ``upgrades.py``; this module holds the registry.
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from ember.ir.graph import Node

DEFAULT_DOMAINS = ("", "ai.onnx")
ML_DOMAIN = "ai.onnx.ml"


class Builder(Protocol):
    """What an upgrade may do besides editing its node: add constants and nodes."""

    def constant(self, array: np.ndarray, hint: str = "const") -> str: ...

    def fresh(self, hint: str = "v") -> str: ...

    def add_node(self, op: str, inputs: list[str], outputs: list[str], **attrs) -> Node: ...


# An upgrade edits ``node`` in place (return None) or returns the nodes that replace it.
UpgradeFn = Callable[[Node, Builder, int], "list[Node] | None"]


_UPGRADES: dict[tuple[str, str], list[tuple[int, UpgradeFn]]] = {}
_RENAMES: dict[tuple[str, str], str] = {}


def upgrade(op_type: str, before: int, domain: str = "") -> Callable[[UpgradeFn], UpgradeFn]:
    """Register ``fn`` to rewrite nodes of ``op_type`` whose opset version is < ``before``.

    Upgrades of one op apply in increasing ``before`` order, so each one only bridges one
    change and can assume the ones for older changes already ran.
    """

    def register(fn: UpgradeFn) -> UpgradeFn:
        key = (_canonical_domain(domain), op_type)
        _UPGRADES.setdefault(key, []).append((before, fn))
        _UPGRADES[key].sort(key=lambda entry: entry[0])
        return fn

    return register


def rename(op_type: str, ember_op: str, domain: str = "") -> None:
    """Map an ONNX op onto an ember op of another name."""
    _RENAMES[(_canonical_domain(domain), op_type)] = ember_op


def _canonical_domain(domain: str) -> str:
    return "" if domain in DEFAULT_DOMAINS else domain


def ember_op_name(domain: str, op_type: str) -> str:
    """The ember op name of an ONNX (domain, op_type): plain for the default domain,
    ``domain.op_type`` otherwise (``ai.onnx.ml.Binarizer``)."""
    domain = _canonical_domain(domain)
    _load_upgrades()
    if (domain, op_type) in _RENAMES:
        return _RENAMES[(domain, op_type)]
    return op_type if not domain else f"{domain}.{op_type}"


def upgrades_for(domain: str, op_type: str, opset: int) -> list[UpgradeFn]:
    _load_upgrades()
    return [fn for before, fn in _UPGRADES.get((_canonical_domain(domain), op_type), [])
            if opset < before]


_loaded = False


def _load_upgrades() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        import ember.frontend.onnx.upgrades  # noqa: F401  (registers every upgrade module)
