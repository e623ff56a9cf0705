"""Save and resume a ZeRO train network, with resharding, and the agreements that keep the ranks in
step. Both public functions are collective over the world. What each rank writes and reads:
[Note: checkpoint layout] and [Note: resharding] in layout.py.

[Note: checkpoint completion]
A step folder is complete when it holds ``meta.json``; nothing reads an incomplete one.
``save_train_state`` (1) checks its arguments on every rank and agrees (one all-reduce) that all
ranks can go on; (2) each rank writes its files, each atomically ([Note: atomic files] in
core/atomic_files.py); (3) agrees that every rank succeeded, else global rank 0 removes the step
folder and every rank raises; (4) global rank 0 writes ``meta.json`` and only then rewrites
``ckpt_dir/latest``, both atomically; (5) agrees once more and returns. A crash at any point
leaves ``latest`` naming the previous complete checkpoint. The agreements are also what keeps a
failure on one rank from hanging the others in a later collective.
"""
import os
import shutil
from typing import Optional

import numpy as np
from mindspore import Tensor

from ..train.train_step import TrainOneStepWrapper
from ..core.atomic_files import atomic_write_json
from .agreement import agree, attempt
from .atomic import atomic_save_checkpoint
from .layout import KINDS, Layout, build_layout
from .load_plan import LOAD, SavedCheckpoint, plan_load, resolve_step_dir
from .naming import (LATEST, META, SPLIT_INFO_DIR, check_dir, check_step, is_complete, split_info_pattern,
                     step_dir_name)
from .readers import FORMATS
from ..core.split_info import write_split_info

__all__ = ["save_train_state", "load_train_state"]


def _check_train_net(train_net, caller: str) -> None:
    if not isinstance(train_net, TrainOneStepWrapper):
        raise TypeError(
            f"For '{caller}', the argument 'train_net' must be a TrainOneStepWrapper (from prepare_train_network), "
            f"but got {type(train_net).__name__}."
        )


def save_train_state(train_net, ckpt_dir, step: int, format: str = "ckpt") -> str:  # noqa: A002 (MindSpore's name)
    """Save everything needed to resume ``train_net`` into ``ckpt_dir/step_{step:08d}/``.

    Collective: every rank of the world must call it with the same arguments; it returns on
    every rank only when the checkpoint is complete. What each rank writes, and the JSON, follow
    [Note: checkpoint layout]; the protocol that keeps a crash from leaving a half checkpoint is
    [Note: checkpoint completion]. The network keeps training normally afterwards (in
    GRAPH_MODE the agreements run eagerly and the mode is restored).

    Save at optimizer-step boundaries when you may resume on another number of ranks: a
    checkpoint taken between micro-steps of gradient accumulation resumes only on the same
    world size and groups (see ``load_train_state``).

    Args:
        train_net (TrainOneStepWrapper): from ``prepare_train_network``.
        ckpt_dir (str): root folder (shared by all ranks); created if needed.
        step (int): step number recorded in the checkpoint and its folder name.
        format (str): ``"ckpt"`` or ``"safetensors"``.

    Returns:
        str: the step folder.

    Raises:
        TypeError / ValueError: bad arguments (before anything is written).
        FileExistsError: a complete checkpoint of ``step`` already exists in ``ckpt_dir``.
        RuntimeError: another rank failed; the step folder was removed and ``latest`` is unchanged.
        Exception: whatever failed on this rank (a full disk, say), after the same clean-up.

    Examples:
        >>> from mindspore import nn
        >>> from mindone_zero import (load_train_state, prepare_train_network,
        ...                           save_train_state)
        >>> def build():
        ...     net = nn.WithLossCell(nn.Dense(4, 2), nn.MSELoss())
        ...     optimizer = nn.AdamWeightDecay(net.trainable_params())
        ...     return prepare_train_network(net, optimizer)
        >>> save_train_state(build(), "ckpt", step=100)
        'ckpt/step_00000100'
        >>> load_train_state(build(), "ckpt")   # the latest complete step
        100

        Saved by 4 ranks at stage 3 and resumed on 2 (tests/dist/test_checkpoint_resume.py runs
        these calls):

        >>> save_train_state(train_net, "ckpt", step, format="safetensors")
    """
    caller = "save_train_state"
    _check_train_net(train_net, caller)
    ckpt_dir = check_dir(ckpt_dir, caller)
    check_step(step, caller)
    if format not in FORMATS:
        raise ValueError(f"For '{caller}', the argument 'format' must be one of {list(FORMATS)}, but got {format!r}.")
    layout = build_layout(train_net, caller)
    step_dir = os.path.join(ckpt_dir, step_dir_name(step))
    _, error = attempt(lambda: _prepare_step_dir(layout, step_dir))
    agree(train_net, error, caller)
    _, error = attempt(lambda: _write_rank_files(layout, step_dir, format))
    _agree_or_clean(train_net, error, caller, layout, step_dir)
    error = None
    if layout.rank == 0:
        _, error = attempt(lambda: _write_meta(train_net, layout, ckpt_dir, step_dir, int(step), format))
    _agree_or_clean(train_net, error, caller, layout, step_dir)
    return step_dir


def _prepare_step_dir(layout: Layout, step_dir: str) -> None:
    if is_complete(step_dir):
        raise FileExistsError(
            f"For 'save_train_state', the checkpoint '{step_dir}' already exists and is complete; "
            f"remove it or save under another 'step'."
        )
    if layout.rank == 0:
        # Left by an interrupted save. Only rank 0 touches the folder here; the others write (and
        # create folders) only after the agreement that follows, so they cannot race this.
        if os.path.isdir(step_dir):
            shutil.rmtree(step_dir)
        os.makedirs(step_dir)


def _agree_or_clean(train_net, error, caller, layout, step_dir) -> None:
    try:
        agree(train_net, error, caller)
    except BaseException:
        if layout.rank == 0 and not is_complete(step_dir):
            shutil.rmtree(step_dir, ignore_errors=True)
        raise


def _write_rank_files(layout: Layout, step_dir: str, fmt: str) -> None:
    for kind in KINDS:
        index = layout.my_file(kind)
        if not layout.items[kind] or index is None:
            continue
        path = os.path.join(step_dir, layout.file_names(kind, fmt)[index])
        atomic_save_checkpoint({it.param.name: it.param for it in layout.items[kind]}, path, fmt)
    if layout.replica == 0:
        entries = [it.entry for kind in KINDS for it in layout.items[kind]]
        write_split_info(entries, os.path.join(step_dir, SPLIT_INFO_DIR), layout.op_rank)


def _write_meta(train_net, layout: Layout, ckpt_dir: str, step_dir: str, step: int, fmt: str) -> None:
    files = {kind: layout.file_names(kind, fmt) for kind in KINDS if layout.items[kind]}
    split_info = [split_info_pattern().format(r) for r in range(layout.op_size)]
    sizes = {}
    for name in [f for names in files.values() for f in names] + split_info:
        path = os.path.join(step_dir, name)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"For 'save_train_state', the file '{path}' is missing after every rank reported success; "
                f"is 'ckpt_dir' on a file system shared by all ranks?"
            )
        sizes[name] = os.path.getsize(path)
    micro = int(train_net.accum_step.asnumpy()) if layout.accum_steps > 1 else 0
    meta = {
        "format_version": 1, "step": step, "zero_stage": layout.stage, "world_size": layout.world,
        "op_group_size": layout.op_size, "dp_size": layout.dp_size, "format": fmt,
        "gradient_accumulation_steps": layout.accum_steps, "accum_step": micro,
        "files": files, "split_info": split_info, "sizes": sizes,
    }
    atomic_write_json(meta, os.path.join(step_dir, META))
    atomic_write_json({"step": step, "dir": os.path.basename(step_dir)}, os.path.join(ckpt_dir, LATEST))


def _apply(plan: list) -> None:
    for param, fetch in plan:
        block = np.asarray(fetch())
        if tuple(block.shape) != tuple(param.shape):  # guarded by _plan; set_data must never change shapes
            raise RuntimeError(f"For '{LOAD}', {param.name!r}: block {block.shape} != held {tuple(param.shape)}.")
        param.set_data(Tensor(block, param.dtype))


def load_train_state(train_net, ckpt_dir, step: Optional[int] = None) -> int:
    """Load a checkpoint of ``save_train_state`` into a freshly prepared ``train_net``.

    Collective: every rank must call it. Build ``train_net`` with ``prepare_train_network`` (same
    stage, same network and optimizer types) *before* loading; every Parameter keeps the shape it
    has (``set_data`` with the same shape), so nothing compiled changes. Nothing is changed on any
    rank unless every rank validated the whole checkpoint first.

    Resharding: a checkpoint written by N ranks loads into M != N ranks. Each rank builds each of
    its blocks (network at stage 3, optimizer states, masters, EMA) from the full tensor, merging
    the N saved shards one tensor at a time (``partition.merge_arrays``) and cutting its own
    block (``partition.split_array``). A checkpoint saved between micro-steps of gradient
    accumulation cannot be resharded (its buffers hold per-rank partial sums): it loads only with
    the same world size, optimizer group size and ``gradient_accumulation_steps``. At a step
    boundary the accumulation buffers are zero and are simply reset. Split-info JSON written by
    MindOne (no ``shape``) is accepted; its split tensors are taken to have no padding.

    Args:
        train_net (TrainOneStepWrapper): the train network to fill.
        ckpt_dir (str): root folder of ``save_train_state``, or one complete step folder.
        step (int): step to load; None loads ``latest_checkpoint(ckpt_dir)``.

    Returns:
        int: the step of the loaded checkpoint.

    Raises:
        FileNotFoundError: no complete checkpoint, or a file listed in ``meta.json`` is missing.
        ValueError: another stage, names or shapes that differ from ``train_net`` or across rank
            files, a split-info JSON whose group size or rank disagrees with ``meta.json``, a
            truncated or corrupted file, or a mid-accumulation checkpoint on another layout. The
            message names the file and the problem.
        RuntimeError: the same failure happened on another rank.

    Examples:
        >>> from mindspore import nn
        >>> import mindone_zero as mz
        >>> dense = nn.Dense(4, 2)
        >>> loss_net = nn.WithLossCell(dense, nn.MSELoss())
        >>> optimizer = nn.SGD(dense.trainable_params())
        >>> train_net = mz.prepare_train_network(loss_net, optimizer)
        >>> for step in (100, 200):
        ...     _ = mz.save_train_state(train_net, "ckpt", step)
        >>> mz.load_train_state(train_net, "ckpt")      # the latest complete step
        200
        >>> mz.load_train_state(train_net, "ckpt", step=100)
        100

        On every rank of a job of any size, after ``prepare_train_network``
        (tests/dist/test_checkpoint_resume.py resumes on 2 ranks what 4 saved):

        >>> start = load_train_state(train_net, "ckpt") + 1
    """
    _check_train_net(train_net, LOAD)
    ckpt_dir = check_dir(ckpt_dir, LOAD)
    check_step(step, LOAD, allow_none=True)

    def prepare():
        saved = SavedCheckpoint(resolve_step_dir(ckpt_dir, step))
        return saved.meta["step"], plan_load(build_layout(train_net, LOAD), saved)

    result, error = attempt(prepare)
    agree(train_net, error, LOAD)
    _, error = attempt(lambda: _apply(result[1]))
    agree(train_net, error, LOAD)
    return result[0]
