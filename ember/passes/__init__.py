"""Graph passes, one per file, and what runs them.

* ``pipeline.py`` -- the ordered passes of each opt level: read it first;
* ``context.py`` -- :class:`PassContext` and the runner (inference, verification, timing and
  IR dumps around every pass);
* ``rewrite.py`` -- producers/readers of values and routing a value's readers elsewhere;
* ``patterns.py`` -- the op-pattern matcher the composite recognizers share;
* ``anchors.py`` -- Conv/Gemm/MatMul weights absorbing per-channel scales and shifts;
* ``testing.py`` -- Before/Expected pass tests written as printed IR.
"""
