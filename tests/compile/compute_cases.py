"""Helpers shared by the compiled-op tests (test_compute_*.py): many independent single-node
cases in one graph, and the comparison of compiled outputs with the reference executor's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ember.core.dtypes import DType
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType
from ember.passes.infer_shapes import infer_shapes

Tolerance = tuple[float, float]  # (rtol, atol)


@dataclass
class Case:
    """One node: op, input arrays (None for an absent optional input), attributes, which
    inputs are graph constants, and how many outputs it has."""

    op: str
    inputs: Sequence[np.ndarray | None]
    attrs: dict[str, Any] = field(default_factory=dict)
    constants: frozenset[int] | set[int] = frozenset()
    outputs: int = 1


def build_graph(cases: Sequence[Case]) -> tuple[Graph, dict[str, np.ndarray]]:
    """A graph of independent single-node cases, each with its own inputs; and its feeds."""
    graph = Graph(name="cases")
    feeds: dict[str, np.ndarray] = {}
    for k, case in enumerate(cases):
        names = []
        for i, array in enumerate(case.inputs):
            if array is None:
                names.append("")
                continue
            name = f"c{k}_in{i}"
            array = np.asarray(array)
            graph.types[name] = TensorType(DType.from_numpy(array.dtype), tuple(array.shape))
            if i in case.constants:
                graph.constants[name] = array
            else:
                graph.inputs.append(name)
                feeds[name] = array
            names.append(name)
        outputs = [f"c{k}_out{j}" for j in range(case.outputs)]
        graph.nodes.append(Node(case.op, names, outputs, dict(case.attrs),
                                name=f"c{k}_{case.op}"))
        graph.outputs.extend(outputs)
    infer_shapes(graph)
    return graph, feeds


def assert_close(got: np.ndarray, want: np.ndarray, what: str,
                 tolerances: Mapping[np.dtype, Tolerance],
                 tolerance: Tolerance | None = None) -> None:
    """Same dtype and shape; equal values, but for the float dtypes of ``tolerances``, whose
    values must agree within ``tolerance`` or else the dtype's tolerance."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if want.dtype in tolerances:
        rtol, atol = tolerance or tolerances[want.dtype]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                                   atol=atol, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def assert_cases_close(cases: Sequence[Case], got: Mapping[str, np.ndarray],
                       expected: Mapping[str, np.ndarray],
                       tolerances: Mapping[np.dtype, Tolerance],
                       tolerance: Tolerance | None = None) -> None:
    """``assert_close`` for every output of every case of ``build_graph(cases)``."""
    for k, case in enumerate(cases):
        for j in range(case.outputs):
            name = f"c{k}_out{j}"
            assert_close(got[name], expected[name], f"case {k}: {case.op} {case.attrs} output {j}",
                         tolerances, tolerance)
