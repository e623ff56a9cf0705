"""Sizes shared by every packed buffer (coalesced gathers, gather units, buckets)."""
import mindspore as ms

__all__ = ["ITEMSIZE", "LARGE_TENSOR_BYTES", "itemsize_of"]

ITEMSIZE = {ms.float16: 2, ms.bfloat16: 2, ms.float32: 4, ms.float64: 8}
"""Bytes per element of the floating dtypes a ZeRO parameter or its compute copy may have."""

LARGE_TENSOR_BYTES = 1024 * 1024
"""A tensor of this many bytes or more is never packed: it is sent alone ([Note: buckets])."""


def itemsize_of(dtype) -> int:
    """Bytes per element of ``dtype`` (4 for a dtype not in ``ITEMSIZE``)."""
    return ITEMSIZE.get(dtype, 4)
