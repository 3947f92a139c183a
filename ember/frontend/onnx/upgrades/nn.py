"""Upgrades of the neural-network ops (matmul, convolution, pooling, quantization).

Most of their version bumps only widened the accepted types or added attributes whose
defaults keep the old behaviour (MaxPool's ``storage_order``/``ceil_mode``/``dilations``,
AveragePool's ``count_include_pad``, QuantizeLinear's ``axis``/``saturate``/``block_size``,
DequantizeLinear's ``output_dtype`` ...), so they need no rewrite.  What does:

* Gemm < 7 has a ``broadcast`` attribute; Gemm-7 always broadcasts C (unidirectionally), which
  accepts every C an older model could give.
* LpPool < 2 and GlobalLpPool < 2 take ``p`` as a float; it became an int.
"""

from __future__ import annotations

from ember.frontend.onnx.table import Builder, upgrade
from ember.ir.graph import Node


@upgrade("Gemm", before=7)
def gemm_drop_broadcast(node: Node, b: Builder, opset: int) -> None:
    """Gemm-7 broadcasts C whenever its shape allows; the ``broadcast`` flag is gone."""
    node.attrs.pop("broadcast", None)


def _p_to_int(node: Node) -> None:
    if "p" in node.attrs:
        node.attrs["p"] = int(round(float(node.attrs["p"])))


@upgrade("LpPool", before=2)
def lp_pool_integer_p(node: Node, b: Builder, opset: int) -> None:
    """LpPool-2 takes ``p`` as an int instead of a float."""
    _p_to_int(node)


@upgrade("GlobalLpPool", before=2)
def global_lp_pool_integer_p(node: Node, b: Builder, opset: int) -> None:
    """GlobalLpPool-2 takes ``p`` as an int instead of a float."""
    _p_to_int(node)
