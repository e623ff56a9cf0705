"""The optimizer parallel group under either of MindOne's names.

MindOne 0.2.0 called the group ``op_group``; 0.3.0 onward call it ``optimizer_parallel_group``.
Every entry point (``prepare_train_network``, ``prepare_network``, ``prepare_ema``, ``ZeroHelper``)
and every ZeRO-3 layer Cell accepts both, through this one rule.
"""
from typing import Optional

__all__ = ["group_argument"]


def group_argument(where: str, optimizer_parallel_group: Optional[str], op_group: Optional[str]) -> Optional[str]:
    """The group given as ``optimizer_parallel_group`` or as its alias ``op_group`` (None: neither).

    Not collective; checks nothing but the pair, so call it first, before any work.

    Raises:
        TypeError: both are given (not None), naming both arguments and both values.
    """
    if op_group is not None and optimizer_parallel_group is not None:
        raise TypeError(
            f"For '{where}', the arguments 'optimizer_parallel_group' and 'op_group' are aliases (op_group is "
            f"MindOne 0.2.0's name); pass one, but got optimizer_parallel_group={optimizer_parallel_group!r} and "
            f"op_group={op_group!r}."
        )
    return op_group if optimizer_parallel_group is None else optimizer_parallel_group
