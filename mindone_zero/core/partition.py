"""Pure shard arithmetic: padding, row blocks, split and merge of numpy arrays.

Nothing here communicates or touches MindSpore, so every rule can be unit-tested in one
process.

[Note: padding]
A sharded tensor of full shape ``(d0, *rest)`` in a group of ``n`` ranks is cut along dim 0
into ``n`` blocks of ``rows = ceil(d0 / n)`` rows. The full tensor is first zero-padded at the
tail to ``rows * n`` rows, so every rank holds a block of the same shape ``(rows, *rest)``;
rank ``r`` holds padded rows ``[r * rows, (r + 1) * rows)``. Recovering the full tensor
concatenates the blocks in rank order and drops the last ``pad = rows * n - d0`` rows.
Padding rows are zero at the start and stay zero during training: their gradient is zero,
so plain SGD/Adam/Momentum never move them (weight decay of zero is zero).
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "ShardSpec",
    "shard_rows",
    "padding_rows",
    "row_range",
    "pad_rows",
    "split_array",
    "split_all",
    "merge_arrays",
    "is_int",
    "user_opted_out",
    "is_split_candidate",
    "is_frozen_candidate",
    "splits_over",
    "check_split_rule_flag",
    "uneven_split_names",
    "mark_shard_flag",
    "zero_spec_of",
    "set_zero_spec",
    "whole_candidates",
    "WHOLE_WARN_SHARE",
]


def is_int(x) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_group(n: int, rank: int = 0) -> None:
    if not is_int(n) or n < 1:
        raise ValueError(f"The argument 'group_size' must be a positive integer, but got {n!r}.")
    if not is_int(rank) or not 0 <= rank < n:
        raise ValueError(f"The argument 'rank' must be an integer in [0, {n}), but got {rank!r}.")


def shard_rows(d0: int, n: int) -> int:
    """Rows of dim 0 held by each of ``n`` ranks: ``ceil(d0 / n)``. See [Note: padding]."""
    _check_group(n)
    if not is_int(d0) or d0 < 0:
        raise ValueError(f"The argument 'd0' must be a non-negative integer, but got {d0!r}.")
    return -(-int(d0) // n)


def padding_rows(d0: int, n: int) -> int:
    """Zero rows appended to dim 0 so that it divides by ``n``. See [Note: padding]."""
    return shard_rows(d0, n) * n - int(d0)


def row_range(d0: int, n: int, rank: int) -> Tuple[int, int]:
    """Rows ``[start, stop)`` of the *padded* tensor held by ``rank``."""
    _check_group(n, rank)
    rows = shard_rows(d0, n)
    return rank * rows, (rank + 1) * rows


@dataclass(frozen=True)
class ShardSpec:
    """How one named tensor is laid out over a group. Holds no data and never communicates.

    Attributes:
        name: the tensor's name in the network or optimizer.
        shape: the full, unpadded shape.
        group_size: ranks in the optimizer parallel group.
        rank: this rank's index in that group.
        split: whether the tensor is sharded along dim 0 (False: replicated whole).
    """

    name: str
    shape: Tuple[int, ...]
    group_size: int
    rank: int
    split: bool

    def __post_init__(self):
        _check_group(self.group_size, self.rank)
        if not all(is_int(s) and s >= 0 for s in self.shape):
            raise ValueError(f"For 'ShardSpec', the argument 'shape' must hold non-negative integers, but got {self.shape!r}.")
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if self.split and len(self.shape) == 0:
            raise ValueError(f"For 'ShardSpec', the 0-d tensor {self.name!r} cannot be split along dim 0.")

    @property
    def rows(self) -> int:
        """Rows of dim 0 in each rank's block (the full dim 0 when not split)."""
        return shard_rows(self.shape[0], self.group_size) if self.split else (self.shape[0] if self.shape else 0)

    @property
    def pad(self) -> int:
        """Zero rows appended to dim 0 before splitting (0 when not split)."""
        return padding_rows(self.shape[0], self.group_size) if self.split else 0

    @property
    def shard_shape(self) -> Tuple[int, ...]:
        """Shape of the block this rank holds."""
        return (self.rows,) + self.shape[1:] if self.split else self.shape

    @property
    def padded_shape(self) -> Tuple[int, ...]:
        """Full shape with the padding rows included."""
        return (self.rows * self.group_size,) + self.shape[1:] if self.split else self.shape

    def to_json(self) -> dict:
        """Entry for ``params_split_info_{rank}.json``: MindOne's keys plus ``shape`` and ``pad``."""
        return {
            "split": self.split,
            "group_size": self.group_size,
            "rank_id": self.rank,
            "shape": list(self.shape),
            "pad": self.pad,
        }

    @classmethod
    def from_json(cls, name: str, entry: dict) -> "ShardSpec":
        """Inverse of ``to_json``. MindOne's entries (no ``shape``) raise KeyError on ``shape``;
        callers that accept them derive the shape from the shards instead."""
        return cls(name, tuple(entry["shape"]), int(entry["group_size"]), int(entry["rank_id"]), bool(entry["split"]))


def pad_rows(arr: np.ndarray, n: int) -> np.ndarray:
    """Return ``arr`` zero-padded along dim 0 to a multiple of ``n`` rows (no copy if none needed)."""
    arr = np.asarray(arr)
    if arr.ndim == 0:
        raise ValueError("For 'pad_rows', the argument 'arr' must have ndim >= 1, but got a 0-d array.")
    pad = padding_rows(arr.shape[0], n)
    if pad == 0:
        return arr
    return np.concatenate([arr, np.zeros((pad,) + arr.shape[1:], dtype=arr.dtype)], axis=0)


def split_array(arr: np.ndarray, n: int, rank: int) -> np.ndarray:
    """Block ``rank`` of ``arr`` over ``n`` ranks, zero-padded per [Note: padding]."""
    _check_group(n, rank)
    padded = pad_rows(arr, n)
    start, stop = row_range(np.asarray(arr).shape[0], n, rank)
    return np.ascontiguousarray(padded[start:stop])


def split_all(arr: np.ndarray, n: int) -> List[np.ndarray]:
    """All ``n`` blocks of ``arr`` in rank order."""
    return [split_array(arr, n, r) for r in range(n)]


def merge_arrays(blocks: Sequence[np.ndarray], full_d0: int) -> np.ndarray:
    """Concatenate ``blocks`` in rank order and drop the padding rows beyond ``full_d0``.

    Raises:
        ValueError: if the blocks differ in shape or hold fewer than ``full_d0`` rows.
    """
    if len(blocks) == 0:
        raise ValueError("For 'merge_arrays', the argument 'blocks' must not be empty.")
    shapes = {tuple(np.shape(b)) for b in blocks}
    if len(shapes) != 1:
        raise ValueError(f"For 'merge_arrays', all blocks must have the same shape, but got {sorted(shapes)}.")
    shape = shapes.pop()
    if len(shape) == 0:
        raise ValueError("For 'merge_arrays', the blocks must have ndim >= 1, but got 0-d blocks.")
    if shape[0] * len(blocks) < full_d0 or shape[0] != shard_rows(full_d0, len(blocks)):
        raise ValueError(
            f"For 'merge_arrays', {len(blocks)} blocks of {shape[0]} rows cannot hold a dim 0 of {full_d0} "
            f"(expected blocks of ceil({full_d0} / {len(blocks)}) = {shard_rows(full_d0, len(blocks))} rows)."
        )
    return np.concatenate([np.asarray(b) for b in blocks], axis=0)[:full_d0]


# [Note: split rule] The one rule for which Parameters ZeRO shards, at every stage. A *candidate* is
# trainable, ndim >= 1, and not opted out by the user with ``param.parallel_optimizer = False``. At
# stage 3 a *frozen candidate* is one too: a floating Parameter with ``requires_grad=False``, ndim >= 1,
# not opted out, that no Cell updates in place (``zero3/frozen.py`` names the Cells that do, such as
# BatchNorm's moving statistics): for a LoRA fine-tune the frozen base is nearly all the memory, and
# DeepSpeed's and FSDP's stage 3 shard it too. A frozen split parameter is gathered like the others and
# gets no gradient, no reduce-scatter and no optimizer state; at stages 1-2 it holds no state, so
# nothing about it changes there. Over a
# group of N ranks a candidate is split when its dim 0 divides by N (MindOne's rule, the default:
# MindOne's callers observe it, e.g. its online combine all-gathers every flagged Parameter and must
# get exact shapes back); the others stay whole on every rank and their gradients are all-reduced.
# With the opt-in padded rule (``pad_uneven_params=True``) every candidate is split, zero-padded per
# [Note: padding], so that per-rank memory follows the ZeRO formulas for models whose big tensors do
# not divide. The rule is chosen once per ``prepare_*`` call and handed to the code that shards as an
# argument (``splits_over``'s and ``shard_parameter``'s ``pad_uneven``); ZeRO-3 shards every parameter
# first, so a layer Cell built afterwards (a user's MindOne-style class calling ``ZeroParamWrapper``
# without knowing of the rule) finds its parameters cut already.
# ``parallel_optimizer`` has MindOne's two meanings: before ``prepare_train_network`` the user's input
# (False: keep it whole), after it whether this rank holds a shard of the Parameter (MindOne's
# online-combine recipe all-gathers the Parameters whose flag is True). ``mark_shard_flag``, the one
# writer of the output, first saves the input in ``param.zero_opt_out``, and ``user_opted_out``, the
# one reader of the input, reads that saved value once it exists. So a later preparation of the same
# Parameters still honours the user's choice, not the flag the last one wrote (to change the choice
# after a preparation, set ``param.zero_opt_out``).
_OPT_OUT_ATTR = "zero_opt_out"
# A Parameter sharded by ZeRO-3's shard_network records its layout here (read it with zero_spec_of).
_SPEC_ATTR = "zero_spec"


def zero_spec_of(param) -> "Optional[ShardSpec]":
    """The ``ShardSpec`` ZeRO-3 recorded on ``param`` when sharding the network (``split`` False
    for a trainable parameter kept whole), or None for a parameter ZeRO-3 has not seen."""
    return getattr(param, _SPEC_ATTR, None)


def set_zero_spec(param, spec: "ShardSpec") -> None:
    """Record ``spec`` as ``param``'s ZeRO-3 layout (done once, by ``shard_parameter``)."""
    setattr(param, _SPEC_ATTR, spec)


def user_opted_out(param) -> bool:
    """Whether the user opted ``param`` out of sharding: the input meaning of ``parallel_optimizer``,
    as saved before ``mark_shard_flag`` first overwrote it ([Note: split rule])."""
    opted_out = getattr(param, _OPT_OUT_ATTR, None)
    if opted_out is None:
        opted_out = getattr(param, "parallel_optimizer", True) is False
    return bool(opted_out)


def is_split_candidate(param) -> bool:
    """Whether ``param`` is a trainable candidate for sharding ([Note: split rule]); reads attributes only."""
    return bool(param.requires_grad) and len(param.shape) >= 1 and not user_opted_out(param)


_FLOAT_DTYPES = ("Float16", "Float32", "Float64", "BFloat16")


def is_frozen_candidate(param) -> bool:
    """Whether ``param`` is a frozen candidate for sharding at stage 3 ([Note: split rule]): a floating
    Parameter with ``requires_grad`` False, ndim >= 1, not opted out. Reads attributes only; whether a
    Cell updates it in place is the caller's to know."""
    return (not param.requires_grad and len(param.shape) >= 1 and not user_opted_out(param)
            and str(param.dtype) in _FLOAT_DTYPES)


def splits_over(param, group_size: int, pad_uneven: bool = False, frozen: bool = False) -> bool:
    """Whether ZeRO splits ``param`` over ``group_size`` ranks ([Note: split rule]).

    Args:
        param: a Parameter (only its attributes and shape are read).
        group_size: ranks in the optimizer parallel group.
        pad_uneven: the padded rule (split every candidate); False: MindOne's (split only when dim 0
            divides).
        frozen: frozen candidates count too (stage 3, for a parameter no Cell updates in place).
    """
    if not (is_split_candidate(param) or (frozen and is_frozen_candidate(param))):
        return False
    return bool(pad_uneven) or int(param.shape[0]) % int(group_size) == 0


def check_split_rule_flag(where: str, name: str, value) -> None:
    """Raise TypeError naming ``where``, ``name`` and ``value`` unless ``value`` is a bool (the
    ``pad_uneven_params`` and ``shard_ema`` keywords of the entry points)."""
    if not isinstance(value, bool):
        raise TypeError(f"For '{where}', the argument '{name}' must be a bool, but got {value!r}.")


def uneven_split_names(specs) -> List[str]:
    """Names of the split ``ShardSpec``s whose dim 0 was padded (the padded rule's doing)."""
    return [s.name for s in specs if s.split and s.pad > 0]


def mark_shard_flag(param, holds_shard: bool) -> None:
    """Set ``param.parallel_optimizer`` (its output meaning) to whether this rank holds a shard of
    it, saving the user's opt-out (its input meaning) first ([Note: split rule])."""
    setattr(param, _OPT_OUT_ATTR, user_opted_out(param))
    param.parallel_optimizer = bool(holds_shard)


# Stage 3 warns about candidates left whole that hold at least this share of the model's bytes.
WHOLE_WARN_SHARE = 0.01


def whole_candidates(candidates, min_share: float) -> List[Tuple[str, int, float]]:
    """``(name, bytes, share of all candidates' bytes)`` of the candidates the split rule left whole
    ([Note: split rule]) whose share is at least ``min_share``, largest first.

    Args:
        candidates: ``(name, ShardSpec, itemsize)`` of every split candidate.
        min_share: the smallest share of the candidates' bytes to report.
    """
    sizes = [(name, int(np.prod(spec.shape)) * itemsize, spec.split) for name, spec, itemsize in candidates]
    total = sum(b for _, b, _ in sizes)
    found = [(name, b, b / total) for name, b, split in sizes if not split and total and b / total >= min_share]
    return sorted(found, key=lambda x: -x[1])
