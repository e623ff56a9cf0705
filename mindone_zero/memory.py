"""Model-state memory per device, by the ZeRO paper's formulas (DESIGN §6).

Model states are the parameters, their gradients and the optimizer states (for mixed-precision
Adam: an fp32 master copy, momentum and variance, 4 + 4 + 4 = 12 bytes per parameter). With
``P`` parameters, ``N`` ranks in the data-parallel group, and ``p``/``g``/``k`` bytes per
parameter for parameters/gradients/optimizer states, ZeRO keeps per device:

=====  ===========================  =========================================
stage  bytes per device             what is partitioned over the N ranks
=====  ===========================  =========================================
0      (p + g + k) * P              nothing (plain data parallel)
1      (p + g) * P + k * P / N      optimizer states
2      p * P + (g + k) * P / N      optimizer states and gradients
3      (p + g + k) * P / N          optimizer states, gradients and parameters
=====  ===========================  =========================================

Activations, temporary buffers and fragmentation are not model states and are not counted.
"""
import math
import numbers
from fractions import Fraction

from .stage import StagePolicy, check_stage

__all__ = ["estimate_model_states_memory"]


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
) -> int:
    """Bytes of model states each device holds under ZeRO stage ``zero_stage``.

    Follows the ZeRO paper (Rajbhandari et al., 2020, Table 1): for example 7.5e9 parameters
    on 64 ranks need 120 / 31.4 / 16.6 / 1.88 GB (1 GB = 1e9 bytes) at stages 0 / 1 / 2 / 3.
    Pure arithmetic; not collective.

    Args:
        num_params: number of parameters ``P`` of the whole model (an int or a float such as
            7.5e9), >= 0.
        world_size: ranks ``N`` that the states are partitioned over, an integer >= 1.
        zero_stage: one of 0, 1, 2, 3.
        param_bytes: bytes per parameter of the (fp16) parameters, ``p``; default 2.
        grad_bytes: bytes per parameter of the (fp16) gradients, ``g``; default 2.
        optimizer_bytes: bytes per parameter of the optimizer states, ``k``; default 12
            (mixed-precision Adam: fp32 master weights, momentum, variance).

    Returns:
        int: bytes per device, rounded up to a whole byte.

    Raises:
        ValueError: if an argument is out of range or of the wrong type; the message names
            the argument and its value.
    """
    func = "estimate_model_states_memory"
    _check_positive(func, "num_params", num_params, allow_zero=True)
    _check_positive(func, "world_size", world_size, integral=True)
    check_stage(zero_stage, func)
    for name, value in (("param_bytes", param_bytes), ("grad_bytes", grad_bytes), ("optimizer_bytes", optimizer_bytes)):
        _check_positive(func, name, value, allow_zero=True)

    # Exact rational arithmetic: a float product such as 12 * 7.5e9 / 1024 can land a hair
    # above a whole number and be rounded up one byte too many.
    p, g, k, big_p = (Fraction(v) for v in (param_bytes, grad_bytes, optimizer_bytes, num_params))
    n = int(world_size)
    policy = StagePolicy(zero_stage)

    def held(sharded: bool) -> Fraction:
        return big_p / n if sharded else big_p

    # stage 0: (p+g+k)P; 1: (p+g)P + kP/N; 2: pP + (g+k)P/N; 3: (p+g+k)P/N
    total = p * held(policy.shards_params) + g * held(policy.shards_grads) + k * held(policy.shards_optimizer)
    return int(math.ceil(total))
