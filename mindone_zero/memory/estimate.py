"""Memory per device by the ZeRO paper's formulas (docs/guides/memory.md); pure arithmetic.

Model states are the parameters, their gradients and the optimizer states (for mixed-precision
Adam: an fp32 master copy, momentum and variance, 4 + 4 + 4 = 12 bytes per parameter).
``estimate_model_states_memory`` gives what each stage keeps of them per device (its docstring has
the table), ``estimate_model_states_placement`` splits those bytes by where they live with
``optimizer_offload``, and ``estimate_peak_memory`` adds what a step holds in full for a while
(DeepSpeed's "largest layer" term). Activations, temporary buffers and fragmentation are not
counted.
"""
import math
import numbers
from fractions import Fraction

from ..core.stage import StagePolicy, check_stage

__all__ = ["estimate_model_states_memory", "estimate_peak_memory", "estimate_model_states_placement"]


def _check_positive(func: str, name: str, value, allow_zero: bool = False, integral: bool = False) -> None:
    """Raise ValueError unless ``value`` is a finite real number > 0 (>= 0 with ``allow_zero``)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and integral:
        ok = isinstance(value, numbers.Integral)
    if ok:
        ok = value >= 0 if allow_zero else value > 0
    if not ok:
        kind = "integer" if integral else "number"
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"For '{func}', the argument '{name}' must be a finite {kind} {bound}, but got {value!r}.")


def estimate_model_states_memory(
    num_params,
    world_size: int,
    zero_stage: int,
    param_bytes=2,
    grad_bytes=2,
    optimizer_bytes=12,
    ema_bytes=0,
    shard_ema=False,
) -> int:
    """Bytes of model states each device holds under ZeRO stage ``zero_stage``.

    Follows the ZeRO paper (Rajbhandari et al., 2020, Table 1): for example 7.5e9 parameters
    on 64 ranks need 120 / 31.4 / 16.6 / 1.88 GB (1 GB = 1e9 bytes) at stages 0 / 1 / 2 / 3.
    Pure arithmetic; not collective. With ``P`` parameters, ``N`` ranks and ``p`` / ``g`` / ``k``
    bytes per parameter of parameters / gradients / optimizer states:

    | stage | bytes per device | partitioned over the ``N`` ranks |
    |---|---|---|
    | 0 | ``(p + g + k) * P`` | nothing (plain data parallel) |
    | 1 | ``(p + g) * P + k * P / N`` | optimizer states |
    | 2 | ``p * P + (g + k) * P / N`` | optimizer states and gradients |
    | 3 | ``(p + g + k) * P / N`` | optimizer states, gradients and parameters |

    Activations, temporary buffers and fragmentation are not model states and are not counted
    (``estimate_peak_memory`` adds the layer held in full during a step).

    Args:
        num_params: number of parameters ``P`` of the whole model (an int or a float such as
            7.5e9), >= 0.
        world_size: ranks ``N`` that the states are partitioned over, an integer >= 1.
        zero_stage: one of 0, 1, 2, 3.
        param_bytes: bytes per parameter of the (fp16) parameters, ``p``; default 2.
        grad_bytes: bytes per parameter of the (fp16) gradients, ``g``; default 2.
        optimizer_bytes: bytes per parameter of the optimizer states, ``k``; default 12
            (mixed-precision Adam: fp32 master weights, momentum, variance).
        ema_bytes: bytes per parameter of an EMA of the weights, ``e`` (default 0: none). Held
            whole at stages 0-2 (``e * P``, as MindOne keeps it) and 1/N at stage 3 (``e * P / N``);
            ``shard_ema=True`` gives 1/N at stages 1-2 too ([Note: ZeRO EMA] in ema.py).
        shard_ema: the EMA layout of ``prepare_train_network(..., shard_ema=True)``.

    Returns:
        int: bytes per device, rounded up to a whole byte.

    Raises:
        ValueError: if an argument is out of range or of the wrong type; the message names
            the argument and its value.

    Examples:
        >>> from mindone_zero import estimate_model_states_memory
        >>> per_stage = [estimate_model_states_memory(7.5e9, 64, s) for s in range(4)]
        >>> [round(n / 1e9, 2) for n in per_stage]
        [120.0, 31.41, 16.64, 1.88]
        >>> with_ema = estimate_model_states_memory(7.5e9, 64, 3, ema_bytes=4)
        >>> with_ema - estimate_model_states_memory(7.5e9, 64, 3)   # 4 * P / N
        468750000
    """
    func = "estimate_model_states_memory"
    _check_positive(func, "num_params", num_params, allow_zero=True)
    _check_positive(func, "world_size", world_size, integral=True)
    check_stage(zero_stage, func)
    for name, value in (("param_bytes", param_bytes), ("grad_bytes", grad_bytes), ("optimizer_bytes", optimizer_bytes),
                        ("ema_bytes", ema_bytes)):
        _check_positive(func, name, value, allow_zero=True)
    if not isinstance(shard_ema, bool):
        raise ValueError(f"For '{func}', the argument 'shard_ema' must be a bool, but got {shard_ema!r}.")

    # Exact rational arithmetic: a float product such as 12 * 7.5e9 / 1024 can land a hair
    # above a whole number and be rounded up one byte too many.
    p, g, k, big_p = (Fraction(v) for v in (param_bytes, grad_bytes, optimizer_bytes, num_params))
    n = int(world_size)
    policy = StagePolicy(zero_stage)

    def held(sharded: bool) -> Fraction:
        return big_p / n if sharded else big_p

    total = p * held(policy.shards_params) + g * held(policy.shards_grads) + k * held(policy.shards_optimizer)
    total += Fraction(ema_bytes) * held(policy.shards_params or (policy.uses_masters and shard_ema))
    return int(math.ceil(total))


def estimate_peak_memory(num_params, world_size: int, zero_stage: int, largest_layer_params, param_bytes=2,
                         grad_bytes=2, optimizer_bytes=12, reshard_after_forward: bool = True,
                         hpz_group_size=None) -> int:
    """Bytes per device at the peak of a step: model states plus what a step holds in full.

    ``estimate_model_states_memory`` plus what is held in full during a step because parameters
    and gradients exist whole for a while (DeepSpeed's ``largest_layer_memory``, ``4 * L`` for
    fp16). With ``L`` the parameters of the largest layer, ``P`` of the model, ``N`` ranks and
    ``p`` / ``g`` bytes per parameter of parameters / gradients, the term added is:

    | stage | added to the model states |
    |---|---|
    | 0, 1 | 0 (parameters and gradients are whole anyway) |
    | 2 | ``g * L``: a layer's full gradient before its reduce-scatter |
    | 3, ``reshard_after_forward=True`` | ``(p + g) * L``: a layer gathered (in forward, or again in backward) and its full gradient |
    | 3, ``reshard_after_forward=False`` | ``p * P * (N - 1) / N + g * L``: every gathered weight is kept until its backward |
    | 3, ZeRO++ hpZ over ``K`` ranks | ``(p + g) * L + p * P / K``: plus the secondary shards kept from forward to backward |

    Activations, workspaces and communication buffers are not counted (they depend on the batch
    and the backend). Pure arithmetic; not collective.

    Args:
        num_params: as in ``estimate_model_states_memory``.
        world_size: as in ``estimate_model_states_memory``.
        zero_stage: as in ``estimate_model_states_memory``.
        largest_layer_params: parameters ``L`` of the largest layer (the most that are gathered at
            once; for a Transformer block recomputed as one Cell, the whole block; with gather
            units, which by default are a model's repeated blocks, the largest unit), 0 <= L <= P.
        param_bytes: as in ``estimate_model_states_memory``.
        grad_bytes: as in ``estimate_model_states_memory``.
        optimizer_bytes: as in ``estimate_model_states_memory``.
        reshard_after_forward: stage 3's option (``prepare_train_network``); ignored below stage 3.
        hpz_group_size: K, the size of ZeRO++'s hpZ secondary group (``zeropp.hpz_group``), or None;
            adds ``p * P / K`` at stage 3 (needs ``reshard_after_forward=True``).

    Returns:
        int: bytes per device, rounded up to a whole byte.

    Raises:
        ValueError: an argument out of range (``largest_layer_params`` above ``num_params``
            included) or of the wrong type, naming it and its value.
        TypeError: ``reshard_after_forward`` is not a bool.

    Examples:
        A 7B model on 8 ranks at stage 3, its largest block 2e8 parameters, fp16 with Adam:

        >>> from mindone_zero import estimate_peak_memory
        >>> GiB = 2**30
        >>> round(estimate_peak_memory(7e9, 8, 3, largest_layer_params=2e8) / GiB, 1)
        13.8
        >>> kept = estimate_peak_memory(7e9, 8, 3, 2e8, reshard_after_forward=False)
        >>> round(kept / GiB, 1)
        24.8
    """
    func = "estimate_peak_memory"
    states = estimate_model_states_memory(num_params, world_size, zero_stage, param_bytes, grad_bytes, optimizer_bytes)
    _check_positive(func, "largest_layer_params", largest_layer_params, allow_zero=True)
    if largest_layer_params > num_params:
        raise ValueError(f"For '{func}', the argument 'largest_layer_params' must be at most 'num_params' "
                         f"({num_params!r}), but got {largest_layer_params!r}.")
    if not isinstance(reshard_after_forward, bool):
        raise TypeError(f"For '{func}', the argument 'reshard_after_forward' must be a bool, but got "
                        f"{reshard_after_forward!r}.")
    if hpz_group_size is not None:
        _check_positive(func, "hpz_group_size", hpz_group_size, integral=True)
        if not reshard_after_forward:
            raise ValueError(f"For '{func}', the argument 'hpz_group_size' ({hpz_group_size!r}) needs "
                             f"reshard_after_forward=True, but got False.")
    p, g, big_l, big_p = (Fraction(v) for v in (param_bytes, grad_bytes, largest_layer_params, num_params))
    policy, n = StagePolicy(zero_stage), int(world_size)
    extra = Fraction(0)
    if policy.shards_params:
        extra = (p + g) * big_l if reshard_after_forward else p * big_p * (n - 1) / n + g * big_l
        if hpz_group_size is not None:
            extra += p * big_p / int(hpz_group_size)
    elif policy.shards_grads:
        extra = g * big_l
    return states + int(math.ceil(extra))


def estimate_model_states_placement(num_params, world_size: int, zero_stage: int, param_bytes=2, grad_bytes=2,
                                    optimizer_bytes=12, optimizer_offload="none", offloaded_bytes=None) -> dict:
    """Bytes of model states per rank by where they live: ``{"device", "host", "file"}``.

    Pure arithmetic; not collective. The three add up to ``estimate_model_states_memory`` with the
    same first six arguments.

    Args:
        num_params: parameters ``P`` of the whole model, as in ``estimate_model_states_memory``.
        world_size: ranks ``N``, as in ``estimate_model_states_memory``.
        zero_stage: 0-3, as in ``estimate_model_states_memory``.
        param_bytes: bytes per parameter of the parameters, ``p``; default 2.
        grad_bytes: bytes per parameter of the gradients, ``g``; default 2.
        optimizer_bytes: bytes per parameter of the optimizer states, ``k``; default 12.
        optimizer_offload: ``"none"`` (default), ``"cpu"`` (host memory) or ``"nvme"`` (files), as
            ``prepare_train_network``'s ``optimizer_offload``.
        offloaded_bytes: bytes per parameter of the optimizer states that leave the device; None
            means all of ``optimizer_bytes``; at most ``optimizer_bytes``. With fp32 masters kept on
            the device (stages 1-2), Adam moves its two moments: 8.

    Returns:
        dict: ``{"device": int, "host": int, "file": int}`` bytes per rank; they add up to
            ``estimate_model_states_memory`` of the same first six arguments.

    Raises:
        ValueError: an argument out of range, naming it and its value.

    Examples:
        >>> from mindone_zero.memory.estimate import estimate_model_states_placement
        >>> placed = estimate_model_states_placement(1e9, 8, 2, optimizer_offload="cpu",
        ...                                          offloaded_bytes=8)
        >>> {where: round(n / 1e9, 2) for where, n in placed.items()}
        {'device': 2.75, 'host': 1.0, 'file': 0.0}
    """
    func = "estimate_model_states_placement"
    total = estimate_model_states_memory(num_params, world_size, zero_stage, param_bytes, grad_bytes, optimizer_bytes)
    where = {"none": None, "cpu": "host", "nvme": "file"}
    if optimizer_offload not in where:
        raise ValueError(f"For '{func}', the argument 'optimizer_offload' must be one of {list(where)}, "
                         f"but got {optimizer_offload!r}.")
    moved_per_param = optimizer_bytes if offloaded_bytes is None else offloaded_bytes
    _check_positive(func, "offloaded_bytes", moved_per_param, allow_zero=True)
    if moved_per_param > optimizer_bytes:
        raise ValueError(f"For '{func}', the argument 'offloaded_bytes' must be at most 'optimizer_bytes' "
                         f"({optimizer_bytes!r}), but got {offloaded_bytes!r}.")
    out = {"device": total, "host": 0, "file": 0}
    if where[optimizer_offload] is not None:
        moved = estimate_model_states_memory(num_params, world_size, zero_stage, 0, 0, moved_per_param)
        out["device"], out[where[optimizer_offload]] = total - moved, moved
    return out
