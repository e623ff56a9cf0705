"""Where a checkpoint's files are: the step folders, ``latest``, ``meta.json`` and each kind's
file names ([Note: checkpoint layout] in layout.py). Not collective; no writing.
"""
import json
import os
import re
from typing import Callable, List, Optional

import numpy as np

from ..core.stage import StagePolicy

__all__ = ["KINDS", "META", "LATEST", "SPLIT_INFO_DIR", "per_rank_kind", "file_names", "rank_pattern",
           "split_info_pattern", "check_dir", "check_step", "step_dir_name", "is_complete", "latest_checkpoint",
           "prefix_mapper"]

KINDS = ("network", "optimizer", "ema", "train_state")
META = "meta.json"
LATEST = "latest"
SPLIT_INFO_DIR = "params_info"
_STEP_DIR = re.compile(r"step_(\d+)")


def per_rank_kind(kind: str, stage: int) -> bool:
    """Whether ``kind`` is saved one file per op rank (else one file, or one per global rank)."""
    policy = StagePolicy(stage)
    return kind != "train_state" and (policy.shards_params if kind == "network" else policy.shards_optimizer)


def rank_pattern(kind: str, fmt: str) -> str:
    """The name of a per-rank file of ``kind`` with ``{}`` for the rank (the pattern
    ``convert_checkpoints`` takes); ``train_state`` files are per global rank."""
    return f"{kind}_rank{{}}.{fmt}"


def split_info_pattern() -> str:
    """The split-info JSON of a step folder, relative to it, with ``{}`` for the op rank."""
    return os.path.join(SPLIT_INFO_DIR, "params_split_info_{}.json")


def file_names(kind: str, stage: int, world: int, op_size: int, fmt: str) -> List[str]:
    """Every file of ``kind`` in a checkpoint of ``stage`` over ``world`` ranks, in rank order."""
    if kind == "train_state":
        return [rank_pattern(kind, fmt).format(g) for g in range(world)]
    if per_rank_kind(kind, stage):
        return [rank_pattern(kind, fmt).format(r) for r in range(op_size)]
    return [f"{kind}.{fmt}"]


def check_dir(path, caller: str, arg: str = "ckpt_dir") -> str:
    """``path`` as a str; raises TypeError naming ``arg`` unless it is a non-empty path."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError(f"For '{caller}', the argument '{arg}' must be a non-empty path, but got {path!r}.")
    return os.fspath(path)


def check_step(step, caller: str, allow_none: bool = False) -> None:
    """Raise ValueError unless ``step`` is an integer >= 0 (or None when allowed)."""
    if step is None and allow_none:
        return
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"For '{caller}', the argument 'step' must be an integer >= 0, but got {step!r}.")


def step_dir_name(step: int) -> str:
    """Folder name of the checkpoint of ``step`` under ``ckpt_dir``: ``step_{step:08d}``."""
    return f"step_{int(step):08d}"


def is_complete(step_dir: str) -> bool:
    """Whether ``step_dir`` holds a complete checkpoint ([Note: checkpoint completion] in resume.py)."""
    return os.path.isfile(os.path.join(step_dir, META))


def latest_checkpoint(ckpt_dir) -> Optional[str]:
    """The newest complete checkpoint folder under ``ckpt_dir``, or None.

    Not collective. Takes the folder ``ckpt_dir/latest`` names when it is complete (holds
    ``meta.json``), else the complete ``step_*`` folder with the highest step.

    Args:
        ckpt_dir (str): the root folder given to ``save_train_state``; it need not exist.

    Returns:
        str: the step folder (``ckpt_dir/step_00000100``, say), or None when there is none.

    Raises:
        TypeError: ``ckpt_dir`` is not a path.

    Examples:
        >>> from mindspore import nn
        >>> from mindone_zero import (latest_checkpoint, prepare_train_network,
        ...                           save_train_state)
        >>> latest_checkpoint("ckpt") is None
        True
        >>> net = nn.WithLossCell(nn.Dense(4, 2), nn.MSELoss())
        >>> optimizer = nn.AdamWeightDecay(net.trainable_params())
        >>> train_net = prepare_train_network(net, optimizer)
        >>> for step in (100, 200):
        ...     _ = save_train_state(train_net, "ckpt", step)
        >>> latest_checkpoint("ckpt")
        'ckpt/step_00000200'
    """
    ckpt_dir = check_dir(ckpt_dir, "latest_checkpoint")
    try:
        with open(os.path.join(ckpt_dir, LATEST), encoding="utf-8") as f:
            named = os.path.join(ckpt_dir, json.load(f)["dir"])
        if is_complete(named):
            return named
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no or unreadable pointer: fall back to scanning
    if not os.path.isdir(ckpt_dir):
        return None
    steps = [(int(m.group(1)), name) for name in os.listdir(ckpt_dir)
             if (m := _STEP_DIR.fullmatch(name)) and is_complete(os.path.join(ckpt_dir, name))]
    return os.path.join(ckpt_dir, max(steps)[1]) if steps else None


def prefix_mapper(strip_prefix, add_prefix, caller: str) -> Callable[[str], str]:
    """name -> ``add_prefix`` + name without a leading ``strip_prefix`` (where it has it).

    ``load_full_checkpoint`` maps file names to parameter names with it, ``save_full_checkpoint``
    parameter names to exported names: a loss Cell that holds the network as ``net`` adds ``"net."``
    to every parameter name, which ``strip_prefix="net."`` takes off again.

    Raises:
        TypeError: a prefix that is neither a str nor None, naming ``caller`` and the argument.
    """
    for arg, value in (("strip_prefix", strip_prefix), ("add_prefix", add_prefix)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"For '{caller}', the argument '{arg}' must be a str or None, but got {value!r}.")
    strip, add = strip_prefix or "", add_prefix or ""

    def by_prefix(name: str) -> str:
        if strip and name.startswith(strip):
            name = name[len(strip):]
        return add + name

    return by_prefix
