"""``ember bench --ops``: every distinct Conv / ConvTranspose / MatMul / Gemm of the zoo, alone.

A whole-model ratio mixes hundreds of kernels; it says ember is slower, not where.  The heavy
ops of the zoo come in few distinct configurations (BERT-base's 96 MatMuls are 5 shapes), so
this module benchmarks each configuration once, as a single-op ONNX model, against ONNX
Runtime and -- for MatMul/Gemm -- torch's matmul (its BLAS, MKL/oneDNN, reported as "mkl"),
and weighs it by how often the zoo uses it:

- :mod:`~ember.bench.ops.configs` -- the distinct configurations of the exported files
  (:func:`extract_configs`) and the nodes that had to be skipped
- :mod:`~ember.bench.ops.summary` -- their one-line names (``Conv 3x3/s2 64->128 @ 56x56``)
- :mod:`~ember.bench.ops.single` -- a configuration as a one-node model
  (:func:`build_single_op`), its FLOPs, and the torch matmul contender ("mkl")
- :mod:`~ember.bench.ops.run` -- prepare, check against ORT and time each one
  (:func:`run_ops`)
- :mod:`~ember.bench.ops.report` -- the table, the summary line and the JSON rows

``ember bench --ops`` (ember/bench/cli.py) runs them in that order.
"""

from ember.bench.ops.configs import (BENCHED_OPS, ConfigUse, Extraction, OpConfig, SkippedNode,
                                     extract_configs, node_config, normalize_attributes,
                                     value_types)
from ember.bench.ops.run import CONTENDERS, LABELS, OpResult, run_op, run_ops
from ember.bench.ops.single import (SingleOp, build_single_op, prepare_torch_matmul,
                                    single_op_flops, torch_matmul_available)

__all__ = ["BENCHED_OPS", "CONTENDERS", "LABELS", "ConfigUse", "Extraction", "OpConfig",
           "OpResult", "SingleOp", "SkippedNode", "build_single_op", "extract_configs",
           "node_config", "normalize_attributes", "prepare_torch_matmul", "run_op", "run_ops",
           "single_op_flops", "torch_matmul_available", "value_types"]
