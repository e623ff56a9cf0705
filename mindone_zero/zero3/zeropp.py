"""ZeRO++ options (Wang et al., 2023): qwZ, hpZ, qgZ, as one typed config.

``prepare_network(..., zeropp=ZeroPPConfig(...))`` and ``prepare_train_network(..., zeropp=...)``
take it (or a dict of its fields, as a YAML config gives); ``Stage3Options.build`` checks it with the
other stage-3 options ([Note: stage-3 options] in ``options.py``). All three act on ZeRO-3's
collectives only; the fp32 master shards and the optimizer step are exact whatever is chosen.

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

__all__ = ["ZeroPPConfig", "DEFAULT_BLOCK_SIZE"]

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
