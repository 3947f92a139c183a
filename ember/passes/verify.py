"""Verify a graph against the op registry (the IR verifier plus op arity and attributes)."""

from __future__ import annotations

from ember.ir.graph import Graph
from ember.ir.verifier import verify
from ember.ops.registry import get_op


def verify_graph(graph: Graph, require_types: bool = False) -> None:
    """Raise VerificationError listing every problem of ``graph``."""
    verify(graph, get_op, require_types=require_types)
