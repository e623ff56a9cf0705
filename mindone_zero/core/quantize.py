"""Blockwise int8 quantization for ZeRO++ (qwZ weights, qgZ gradients): the math only.

[Note: block quantization]
A tensor is flattened and cut into blocks of ``block`` consecutive elements, ``block =
min(block_size, numel)`` (a tensor smaller than one block is one block, so a 32-element bias does
not travel as 2048); the last block is zero-padded. Each block ``b`` gets one float32 scale
``s_b = max|x_b| / 127`` and int8 values ``q = round(x / s_b)`` in [-127, 127]; dequantization is
``q * s_b``. Per element the error is at most ``s_b / 2 = max|x_b| / 254`` (round-to-nearest),
plus float32 round-off of the division; an all-zero block has scale 0 and dequantizes to exact
zeros.

Non-finite values are kept non-finite, not rejected (a graph cannot raise at run time): a block
holding an inf or a NaN gets a NaN scale, and every element of that block dequantizes to NaN. A
gradient overflow under loss scaling therefore still reaches the overflow check (which tests for
non-finite values); the other blocks are unaffected.

The functions here are MindSpore ops on static shapes, usable in ``construct`` in either mode; they
never communicate (comm.py does). ``carrier`` is the dtype the int8 values are held in: int8, or
float16 where the collectives lack int8, which holds every integer in [-127, 127] exactly, so sums
with zeros (the all-gather emulation) stay exact ([Note: int8 on CPU] in comm.py).
"""
import math
from typing import Tuple

import mindspore as ms
from mindspore import ops

from .slicing import narrow

__all__ = ["QMAX", "block_layout", "quantized_nbytes", "quantize_blocks", "dequantize_blocks", "check_block_size"]

QMAX = 127.0
SCALE_BYTES = 4  # float32 scales


def check_block_size(where: str, name: str, value) -> int:
    """Return ``value`` if it is a positive int; raise naming ``where`` and ``name`` otherwise.

    Raises:
        TypeError: not an int (bool included).
        ValueError: an int <= 0.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"For '{where}', the argument '{name}' must be a positive int, but got {value!r}.")
    if value <= 0:
        raise ValueError(f"For '{where}', the argument '{name}' must be a positive int, but got {value}.")
    return value


def block_layout(numel: int, block_size: int) -> Tuple[int, int, int]:
    """``(block, blocks, pad)`` of a tensor of ``numel`` elements, per [Note: block quantization]."""
    block = max(1, min(block_size, numel))
    blocks = math.ceil(numel / block) if numel else 1
    return block, blocks, blocks * block - numel


def quantized_nbytes(numel: int, block_size: int) -> int:
    """Native bytes of the quantized form: one int8 per (padded) element plus a float32 scale per block."""
    block, blocks, _ = block_layout(numel, block_size)
    return blocks * block + blocks * SCALE_BYTES


def quantize_blocks(x, block: int, blocks: int, carrier=ms.int8):
    """Quantize the rows of ``x`` blockwise.

    Args:
        x: a tensor of shape ``(rows, numel)`` (each row quantized on its own, zero-padded to
            ``blocks * block``) or ``(numel,)``; any float dtype.
        block, blocks: from ``block_layout(numel, block_size)``.
        carrier: dtype of the returned values (int8, or float16 on backends without int8 collectives).

    Returns:
        (q, scales): ``q`` of shape ``(rows, blocks * block)`` (``(blocks * block,)`` for 1-D input) in
        ``carrier``; ``scales`` of shape ``(rows, blocks)`` (``(blocks,)``), float32.
    """
    flat = x.ndim == 1
    rows = 1 if flat else x.shape[0]
    x = x.astype(ms.float32).reshape((rows, -1))
    pad = blocks * block - x.shape[1]
    if pad > 0:
        x = ops.concat((x, ops.zeros((rows, pad), ms.float32)), 1)
    x = x.reshape((rows, blocks, block))
    scales = ops.amax(ops.abs(x), 2, True) / QMAX
    # amax skips NaN: mark a block with any non-finite value explicitly (its scale becomes NaN).
    scales = ops.select(ops.all(ops.isfinite(x), 2, True), scales, ops.full_like(scales, float("nan")))
    safe = ops.select(scales > 0, scales, ops.ones_like(scales))
    q = ops.clamp(ops.round(x / safe), -QMAX, QMAX).astype(carrier)
    q, scales = q.reshape((rows, blocks * block)), scales.reshape((rows, blocks))
    return (q[0], scales[0]) if flat else (q, scales)


def dequantize_blocks(q, scales, block: int, numel: int):
    """Inverse of ``quantize_blocks``: float32 of shape ``(rows, numel)`` (``(numel,)`` for 1-D input).

    Non-finite scales give non-finite values in their block ([Note: block quantization]).
    """
    flat = q.ndim == 1
    rows = 1 if flat else q.shape[0]
    blocks = scales.shape[-1]
    values = q.astype(ms.float32).reshape((rows, blocks, block)) * scales.reshape((rows, blocks, 1))
    values = values.reshape((rows, blocks * block))
    if blocks * block != numel:  # [Note: slices] in slicing.py: cut only when there is padding
        values = narrow(values, 1, 0, numel)
    return values[0] if flat else values
