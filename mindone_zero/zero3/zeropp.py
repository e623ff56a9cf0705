"""ZeRO++ options (Wang et al., 2023): qwZ, hpZ, qgZ, as one typed config.

``prepare_network(..., zeropp=ZeroPPConfig(...))`` and ``prepare_train_network(..., zeropp=...)``
take it (or a dict of its fields, as a YAML config gives). All three act on ZeRO-3's collectives
only; the fp32 master shards and the optimizer step are exact whatever is chosen.

* ``quantize_weights`` (qwZ): the forward all-gather moves each rank's shard as int8 blocks with a
  float32 scale per block ([Note: block quantization] in ``quantize.py``), dequantized after the
  gather and cast to the compute dtype. The shard itself is not changed; the gradient is that of the
  dequantized weights.
* ``quantize_gradients`` (qgZ): the backward reduce-scatter quantizes each rank's full gradient per
  destination block, exchanges the int8 blocks and scales (an all-to-all natively), and each rank
  dequantizes the N pieces of its block and sums them in float32.
* ``hpz_group`` (hpZ): a communication group inside the shard group (for example the ranks of one
  node). After the forward all-gather each rank keeps a secondary shard, its 1/K of the weights for
  the K ranks of that group, and the backward re-gather of ``reshard_after_forward=True`` runs in
  that group only ([Note: hpZ] in ``mindone_zero/zero3/param_wrapper.py``). Exact: the numbers are
  those without it.
"""
from dataclasses import dataclass
from typing import Optional

import mindspore as ms

from ..core.comm import group_members, world_group
from ..core.quantize import check_block_size

__all__ = ["ZeroPPConfig", "check_zeropp", "DEFAULT_BLOCK_SIZE"]

DEFAULT_BLOCK_SIZE = 2048  # DeepSpeed's default quantization group size


@dataclass(frozen=True)
class ZeroPPConfig:
    """Which ZeRO++ techniques stage 3 uses (all off by default).

    Attributes:
        quantize_weights (bool): qwZ, int8 weight all-gather.
        quantize_gradients (bool): qgZ, int8 gradient reduce-scatter.
        hpz_group (str): hpZ secondary group name, or None. Its size must divide the shard group's
            and its ranks must be in it; needs ``reshard_after_forward=True`` and GRAPH_MODE.
        block_size (int): elements per quantization block (default 2048, DeepSpeed's).
    """

    quantize_weights: bool = False
    quantize_gradients: bool = False
    hpz_group: Optional[str] = None
    block_size: int = DEFAULT_BLOCK_SIZE

    @property
    def enabled(self) -> bool:
        return self.quantize_weights or self.quantize_gradients or self.hpz_group is not None


def _from_value(where: str, value) -> Optional[ZeroPPConfig]:
    if value is None or isinstance(value, ZeroPPConfig):
        config = value
    elif isinstance(value, dict):
        unknown = sorted(set(value) - set(ZeroPPConfig.__dataclass_fields__))
        if unknown:
            raise ValueError(f"For '{where}', the argument 'zeropp' has unknown keys {unknown}; allowed: "
                             f"{sorted(ZeroPPConfig.__dataclass_fields__)}, but got {value!r}.")
        config = ZeroPPConfig(**value)
    else:
        raise TypeError(f"For '{where}', the argument 'zeropp' must be None, a ZeroPPConfig or a dict, but got {value!r}.")
    if config is None:
        return None
    for name in ("quantize_weights", "quantize_gradients"):
        if not isinstance(getattr(config, name), bool):
            raise TypeError(f"For '{where}', the argument 'zeropp.{name}' must be a bool, but got "
                            f"{getattr(config, name)!r}.")
    check_block_size(where, "zeropp.block_size", config.block_size)
    if config.hpz_group is not None and not isinstance(config.hpz_group, str):
        raise TypeError(f"For '{where}', the argument 'zeropp.hpz_group' must be None or a group name (str), but "
                        f"got {config.hpz_group!r}.")
    return config if config.enabled else None


def check_zeropp(where: str, value, zero_stage: int, optimizer_parallel_group: Optional[str],
                 reshard_after_forward: bool) -> Optional[ZeroPPConfig]:
    """Validate ``zeropp`` before anything is modified; return the config, or None when nothing is on.

    Not collective (reads group membership only).

    Raises:
        TypeError / ValueError: naming the argument (``zeropp.<field>``) and the value: a block size
            <= 0, an hpZ group whose size does not divide the shard group's or whose ranks are not in
            it, hpZ without ``reshard_after_forward`` or in PYNATIVE_MODE, any option below stage 3.
    """
    config = _from_value(where, value)
    if config is None:
        return None
    if zero_stage != 3:
        raise ValueError(f"For '{where}', the argument 'zeropp' applies to zero_stage 3 only, but got zeropp={config!r} "
                         f"with zero_stage={zero_stage}.")
    if config.hpz_group is not None:
        _check_hpz(where, config.hpz_group, optimizer_parallel_group, reshard_after_forward)
    return config


def _check_hpz(where: str, hpz_group: str, op_group: Optional[str], reshard_after_forward: bool) -> None:
    if reshard_after_forward is not True:
        raise ValueError(f"For '{where}', the argument 'zeropp.hpz_group' ({hpz_group!r}) needs "
                         f"reshard_after_forward=True (it shortens the backward re-gather), but got "
                         f"reshard_after_forward={reshard_after_forward!r}.")
    if ms.get_context("mode") != ms.GRAPH_MODE:
        raise ValueError(f"For '{where}', the argument 'zeropp.hpz_group' ({hpz_group!r}) needs GRAPH_MODE (PYNATIVE "
                         f"recompute re-runs the whole Cell, primary gather included), but the mode is PYNATIVE_MODE.")
    op_members = group_members(op_group or world_group())
    try:
        members = group_members(hpz_group)
    except Exception as err:  # MindSpore raises RuntimeError/ValueError for an unknown group
        raise ValueError(f"For '{where}', the argument 'zeropp.hpz_group' must name a created group, but got "
                         f"{hpz_group!r} ({err}).") from err
    if len(members) < 2:
        raise ValueError(f"For '{where}', the argument 'zeropp.hpz_group' must hold at least 2 ranks (a secondary "
                         f"group of one rank keeps whole weights: use reshard_after_forward=False), but got "
                         f"{hpz_group!r} with ranks {members}.")
    if len(op_members) % len(members) != 0 or not set(members) <= set(op_members):
        raise ValueError(f"For '{where}', the argument 'zeropp.hpz_group' must be a group of ranks of the shard group "
                         f"{op_members} whose size divides {len(op_members)}, but got {hpz_group!r} with ranks "
                         f"{members}.")
