"""Verify a graph against the op registry (the IR verifier plus op arity and attributes)."""

from __future__ import annotations

from typing import Iterable

from ember.ir.graph import Graph
from ember.ir.verifier import verify
from ember.ops.registry import get_op


def verify_graph(graph: Graph, require_types: bool = False, *, stage: str = "",
                 prior_problems: Iterable[str] = ()) -> None:
    """Raise VerificationError listing every problem of ``graph`` (and ``prior_problems``);
    ``stage`` says when the check ran, for the message."""
    verify(graph, get_op, require_types=require_types, stage=stage,
           prior_problems=prior_problems)
