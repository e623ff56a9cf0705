"""What ``Cell.to_float(dtype)`` leaves on a Cell: the flag that names its compute dtype.

MindSpore's ``to_float`` sets one of the flags ``fp16``, ``bf16`` or ``fp32`` on the Cell and on
every Cell below it; a stage-3 gather casts its full tensor to that dtype, and Cells with different
flags cannot share one gather Cell ([Note: shared gather graphs] in zero3/gather_build.py).
"""
from typing import Optional

import mindspore as ms
from mindspore import nn

__all__ = ["compute_dtype_of", "dtype_flags"]

FLAG_DTYPES = (("fp16", ms.float16), ("bf16", ms.bfloat16), ("fp32", ms.float32))
_FLAGS = tuple(flag for flag, _ in FLAG_DTYPES)


def compute_dtype_of(cell: nn.Cell) -> Optional[object]:
    """The dtype ``cell.to_float(...)`` set on ``cell`` (float16, bfloat16, float32), or None."""
    flags = cell.get_flags()
    for flag, dtype in FLAG_DTYPES:
        if flags.get(flag):
            return dtype
    return None


def dtype_flags(cell: nn.Cell) -> tuple:
    """The ``to_float`` flags set on ``cell``, as sorted ``(flag, value)`` pairs."""
    return tuple((k, v) for k, v in sorted(cell.get_flags().items()) if k in _FLAGS)
