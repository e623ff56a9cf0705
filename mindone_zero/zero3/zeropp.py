"""ZeRO++ options (Wang et al., 2023): qwZ, hpZ, qgZ, as one typed config.

``Stage3Options.build`` checks it with the other stage-3 options ([Note: stage-3 options] in
``options.py``). All three act on ZeRO-3's collectives only; the fp32 master shards and the
optimizer step are exact whatever is chosen.

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

[Note: full-precision tensors]
qwZ and qgZ quantize a parameter only if it has at least two dimensions and at least
``min_quantize_numel`` elements (its full, unpadded tensor); the others (biases, LayerNorm gammas and
betas, any tensor below the threshold) are gathered and reduce-scattered in full precision, and
``comm_plan`` counts their full-precision bytes. Why: a vector is O(d) of a layer's O(d^2) bytes, so
quantizing it saves almost nothing, while its per-element error is the largest: every element is
rounded to 1/254 of its block's largest magnitude, so a LayerNorm gamma near 1.0 moves in steps of
about 0.8% and the small entries of a bias or beta block with one large entry round to zero, which
shows in the loss at a high learning rate (tests/dist/test_zeropp.py checks the final loss).
DeepSpeed reaches the same end by keeping parameters below its persistence threshold (1e5 elements
by default) whole on every rank, so they are never gathered and never quantized;
``min_quantize_numel`` is that knob here (default 0: only the vectors are kept).
"""
from dataclasses import dataclass
from typing import Optional

__all__ = ["ZeroPPConfig", "DEFAULT_BLOCK_SIZE", "DEFAULT_MIN_QUANTIZE_NUMEL"]

DEFAULT_BLOCK_SIZE = 2048  # DeepSpeed's default quantization group size
DEFAULT_MIN_QUANTIZE_NUMEL = 0  # only vectors stay in full precision ([Note: full-precision tensors])


@dataclass(frozen=True)
class ZeroPPConfig:
    """Which ZeRO++ techniques stage 3 uses (all off by default).

    Pass it (or a dict of its fields, as a YAML config gives) as ``zeropp`` to
    ``prepare_train_network`` or ``prepare_network`` at stage 3. Frozen; building it checks
    nothing: those entry points check it with the other stage-3 options, before anything is
    modified. All three act on ZeRO-3's collectives only; the optimizer step is exact whatever is
    chosen. See the ZeRO++ guide for when each pays off.

    Args:
        quantize_weights (bool): qwZ: the forward all-gather moves int8 blocks with a float32
            scale per block, dequantized after the gather.
        quantize_gradients (bool): qgZ: the backward reduce-scatter moves int8 blocks, summed in
            float32.
        hpz_group (str): hpZ: a group inside the shard group (the ranks of one node, say); the
            backward re-gather runs in it only, exactly. Its size must divide the shard group's
            and its ranks must be in it; needs ``reshard_after_forward=True`` and GRAPH_MODE.
            None: off.
        block_size (int): elements per quantization block (2048: DeepSpeed's default).
        min_quantize_numel (int): a parameter with fewer elements (its full tensor) is gathered and
            reduce-scattered in full precision under qwZ and qgZ; 1-D parameters always are
            ([Note: full-precision tensors]). 0: only those; raise it to keep e.g. small embedding or
            position tables exact.

    Raises:
        TypeError / ValueError: raised by ``prepare_train_network`` / ``prepare_network``, naming
            the field (``zeropp.block_size``, say) and its value: a flag that is not a bool, a
            ``block_size`` that is not a positive int, a negative ``min_quantize_numel``, ZeRO++
            below stage 3, or an ``hpz_group`` that is not a created group inside the shard group,
            or without GRAPH_MODE or ``reshard_after_forward=True``.

    Examples:
        >>> from mindone_zero import ZeroPPConfig
        >>> config = ZeroPPConfig(quantize_weights=True, block_size=256)
        >>> config.enabled, config.hpz_group
        (True, None)
        >>> config.quantizes((1024, 1024)), config.quantizes((1024,))  # not vectors
        (True, False)

        At stage 3 on every rank, in GRAPH_MODE (tests/dist/test_zeropp.py runs these calls):

        >>> ms.set_context(mode=ms.GRAPH_MODE)
        >>> zeropp = ZeroPPConfig(quantize_weights=True, hpz_group=node_group)
        >>> train_net = prepare_train_network(loss_net, optimizer, zero_stage=3,
        ...                                   zeropp=zeropp)
    """

    quantize_weights: bool = False
    quantize_gradients: bool = False
    hpz_group: Optional[str] = None
    block_size: int = DEFAULT_BLOCK_SIZE
    min_quantize_numel: int = DEFAULT_MIN_QUANTIZE_NUMEL

    @property
    def enabled(self) -> bool:
        """Whether any ZeRO++ technique is on."""
        return self.quantize_weights or self.quantize_gradients or self.hpz_group is not None

    def quantizes(self, shape) -> bool:
        """Whether qwZ and qgZ (when on) quantize a parameter of full shape ``shape``; the others
        travel in full precision ([Note: full-precision tensors]).

        Args:
            shape (tuple): the parameter's full (unsharded) shape.
        """
        numel = 1
        for dim in shape:
            numel *= int(dim)
        return len(shape) >= 2 and numel >= self.min_quantize_numel
