"""Benchmarks of ember against the runtimes users would otherwise pick.

    ember bench --quick                      # the command line (ember/bench/cli.py)

- :mod:`ember.bench.zoo` -- the models (plain torch and transformers), seeded, two sizes
- :mod:`ember.bench.nets` -- ResNet, MobileNetV2 and the MLP in plain torch
- :mod:`ember.bench.export` -- ONNX export with both PyTorch exporters, cached on disk
- :mod:`ember.bench.peers` -- ember, ONNX Runtime, OpenVINO, PyTorch eager, torch.compile
- :mod:`ember.bench.timing` -- interleaved rounds, medians, output agreement
- :mod:`ember.bench.runner` -- one (model, batch) case against every peer
- :mod:`ember.bench.report` -- the table, JSON and the bar chart
- :mod:`ember.bench.ops` -- ``--ops``: the zoo's distinct Conv/MatMul/Gemm configurations,
  each as a single-op model, against ONNX Runtime and torch's matmul (a subpackage)

This is the top layer of ember (only the CLI sits above it): it may import any other part,
and nothing but ``ember.cli`` imports it.  Heavy dependencies (torch, the peers, matplotlib)
are imported where they are used, so importing this package is cheap.
"""
