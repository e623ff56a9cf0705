"""What the device target supports: the decisions that differ between Ascend, GPU and CPU.

Nothing here builds a collective (``comm.py`` does, and asks these functions how). Every
decision reads the target through ``device_target()`` (and the Ascend SoC through
``ascend_soc_supports``), so a test fakes a device by replacing those two functions.

[Note: device targets]
Sources: MindSpore 2.10's own code and documentation, read for each contract.

* Host memory. On the CPU backend ``Parameter.asnumpy()`` is a view of the Parameter's memory, so
  a host update written into it lands in place. On Ascend and GPU it is a copy of device memory.
  Before any graph has run every Parameter still lives on the host there too, so a build-time
  "do two ``asnumpy()`` calls share memory" check would wrongly say "in place": the decision
  is taken from the target (``host_updates_in_place``).
* AlltoAll. ``ops.AlltoAll`` lists ``Ascend`` alone under "Supported Platforms"
  (``ops/operations/comm_ops.py``); GPU registers an AllToAllv of its own, with another contract.
  qgZ's all-to-all is native on Ascend only; GPU and CPU run the all-gather emulation of
  ``GroupComm.reduce_scatter_quantized`` (N times the bytes, the same numbers).
* Int8. The int8 values of ZeRO++'s quantized collectives travel as int8 on Ascend only; on GPU
  and CPU they travel in float16, which holds [-127, 127] exactly ([Note: int8 on CPU] in comm.py).
* bfloat16. ``check_collective_target_dtype`` (``ops/operations/comm_ops.py``) gives GPU a dtype list
  without bfloat16; Ascend's and CPU's list holds it, but the CPU kernels that comm.py's emulations
  use (Select, ReduceSum) have no bfloat16 in MindSpore 2.10. On GPU and CPU a bfloat16 tensor is
  therefore cast to float32 around every collective (``bf16_collective_carrier``, twice the bytes):
  exact for all-gather and broadcast; an all-reduce or reduce-scatter sums in float32 and rounds
  once, at least as accurate as a bfloat16 sum. Float16 would keep the bytes but not the range
  (bfloat16 has 8 exponent bits). Ascend carries bfloat16 natively.
* All-reduce buckets. MindSpore's CPU all-reduce is a ring whose chunks set the order in which
  each element's values are added, so there a fused bucket is laid out in ring chunks to give
  every element the bits it gets sent alone ([Note: chunk-aligned all-reduce] in train/fusion.py);
  with two ranks every sum is a + b and any layout gives those bits. HCCL and NCCL choose their
  algorithm (ring, tree, recursive halving) by message size and topology, so a bucket agrees with
  its tensors sent alone within rounding whatever its layout: on Ascend and GPU a bucket is packed
  flat, with no padding copied (``ring_aligned_buckets``).
* Overflow. ``TrainOneStepWithLossScaleCell.get_overflow_status`` (``nn/wrap/loss_scale.py``)
  reads the float-status register (``NPUGetFloatStatusV2`` / ``NPUClearFloatStatusV2``) on Ascend
  unless the SoC is 910B-class (feature ``train_hq_dtype_line``) and
  ``MS_ASCEND_CHECK_OVERFLOW_MODE`` is not ``SATURATION_MODE``; in saturation mode an overflow
  saturates to the largest finite value, which ``ops.isfinite`` cannot see. GPU and CPU compute
  with inf/nan, and ``isfinite`` sees them. ``overflow_uses_float_status`` follows that rule.
"""
import os
from typing import Optional

import mindspore as ms

from .ms_internals import ascend_soc_supports_feature

__all__ = [
    "device_target",
    "ascend_soc_supports",
    "host_updates_in_place",
    "native_all_to_all",
    "int8_carrier",
    "bf16_collective_carrier",
    "ring_aligned_buckets",
    "overflow_uses_float_status",
    "OVERFLOW_MODE_ENV",
]

OVERFLOW_MODE_ENV = "MS_ASCEND_CHECK_OVERFLOW_MODE"


def device_target() -> str:
    """The device target MindSpore runs on: "Ascend", "GPU" or "CPU"."""
    return ms.get_context("device_target")


def ascend_soc_supports(feature: str) -> bool:
    """Whether the Ascend SoC has ``feature`` (MindSpore's ``ascend_soc_supports_feature``; False
    off Ascend). "train_hq_dtype_line": 910B-class; "amp_loss_scale_train_classic_target": 910A."""
    return ascend_soc_supports_feature(feature)


def host_updates_in_place() -> bool:
    """Whether a host update written into ``Parameter.asnumpy()`` lands in the Parameter
    (CPU backend only; [Note: device targets])."""
    return device_target() == "CPU"


def native_all_to_all() -> bool:
    """Whether ``ops.AlltoAll`` runs on this target (Ascend only)."""
    return device_target() == "Ascend"


def int8_carrier():
    """The dtype int8 values of quantized collectives travel in: int8 on Ascend, float16 elsewhere."""
    return ms.int8 if device_target() == "Ascend" else ms.float16


def bf16_collective_carrier() -> Optional[object]:
    """The dtype a bfloat16 tensor is cast to around a collective: float32 on GPU (NCCL's dtype
    check has no bfloat16) and CPU (the emulations' kernels have none), None (native) on Ascend."""
    return None if device_target() == "Ascend" else ms.float32


def ring_aligned_buckets(group_size: int) -> bool:
    """Whether a fused all-reduce bucket over ``group_size`` ranks is laid out in ring chunks: on the
    CPU backend with more than two ranks, where the layout decides the bits ([Note: device targets])."""
    return device_target() == "CPU" and group_size > 2


def overflow_uses_float_status() -> bool:
    """Whether overflow must be read from Ascend's float-status register, as MindSpore's own
    loss-scale cell does: on Ascend, except a 910B-class SoC in INFNAN mode (the
    ``MS_ASCEND_CHECK_OVERFLOW_MODE`` environment variable not ``SATURATION_MODE``)."""
    if device_target() != "Ascend":
        return False
    saturation = os.environ.get(OVERFLOW_MODE_ENV) == "SATURATION_MODE"
    return saturation or not ascend_soc_supports("train_hq_dtype_line")
