"""What a ZeRO train network's checkpoint holds and where: each Parameter of the train network's
inventory in a file kind, with its layout. No communication and no writing here.

[Note: checkpoint layout]
``save_train_state(train_net, ckpt_dir, step)`` writes ``ckpt_dir/step_{step:08d}/`` (docs/guides/checkpoints.md,
MindOne's table). ``r`` is the rank's index in the optimizer parallel group, ``g`` its global
rank, ``fmt`` the format (``ckpt`` or ``safetensors``):

==============================================  ===========================  =======================================
file                                            written by                   holds
==============================================  ===========================  =======================================
``network.fmt`` (stages 0-2)                    global rank 0                every network parameter, full
``network_rank{r}.fmt`` (stage 3)               op rank r of replica 0       network shards (and whole 0-d/opted-out
                                                                             or frozen parameters)
``optimizer.fmt`` (stage 0) /                   rank 0 / op rank r of        optimizer states, fp32 master shards
``optimizer_rank{r}.fmt`` (stages >= 1)         replica 0                    ``master.*``, optimizer scalars
                                                                             (``global_step``, beta powers,
                                                                             ``learning_rate``)
``ema.fmt`` / ``ema_rank{r}.fmt`` (with EMA)    as the optimizer file        EMA weights ``ema.*``
``train_state_rank{g}.fmt``                     every global rank            loss scale ``scale_sense`` and the loss-
                                                                             scale update Cell's counters,
                                                                             ``accum_step``, ``accum_overflow``,
                                                                             ``accum_grad.*``, ``ema_updates``
``params_info/params_split_info_{r}.json``      op rank r of replica 0       every name above (``split``,
                                                                             ``group_size``, ``rank_id``, ``shape``,
                                                                             ``pad``)
``meta.json``                                   global rank 0, last          stage, world and group sizes, step,
                                                                             format, accumulation position, files
                                                                             and their sizes
==============================================  ===========================  =======================================

Hybrid groups (``dp_group`` given): ranks with the same index in ``dp_group`` are replicas that
hold identical shards, so only replica 0 (index 0 in ``dp_group``) writes the sharded files and
the JSON; the files of different replicas can never overwrite each other. The train state is
written per *global* rank because at stages 0 and 1 the accumulation buffers hold each rank's
own, not yet reduced, gradient sums.

In the JSON, an entry describes the tensor as the per-rank file holds it. The one exception keeps
MindOne's meaning: at stages 1-2 the network's names say whether their optimizer shards are
split (``ZeroHelper``'s entries), while ``network.fmt`` holds them full.

[Note: resharding]
Loading maps every Parameter of the new train network to the same name in the checkpoint. A
tensor saved in per-op-rank files with ``split`` is rebuilt from its N blocks with
``partition.merge_arrays`` (one tensor at a time) and cut for this rank with
``partition.split_array``; when N equals this run's group size and both sides are split, the
rank's own block is read directly. The accumulation state cannot be resharded mid-way (its
buffers hold per-rank partial sums); at an optimizer-step boundary it is all zeros and is reset.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional

from ..core.comm import group_size_and_rank
from ..train.inventory import Held, inventory
from .naming import KINDS, file_names, per_rank_kind

__all__ = ["KINDS", "Layout", "build_layout", "world_and_rank", "is_accum"]

# the file each kind of the train network's inventory is saved in
_FILE_OF = {"params": "network", "master_shards": "optimizer", "optimizer_states": "optimizer",
            "optimizer_other": "optimizer", "ema": "ema", "accumulation": "train_state", "other": "train_state"}
_ACCUM_SCALARS = ("accum_step", "accum_overflow")
_ACCUM_PREFIX = "accum_grad."


def is_accum(name: str) -> bool:
    """Whether ``name`` is part of the gradient-accumulation state (reset at a step boundary)."""
    return name in _ACCUM_SCALARS or name.startswith(_ACCUM_PREFIX)


@dataclass
class Layout:
    """How one train network's state is spread over the ranks. Built without communication."""

    stage: int
    world: int
    rank: int
    op_size: int
    op_rank: int
    dp_size: int
    replica: int
    accum_steps: int
    items: Dict[str, List[Held]]

    def file_names(self, kind: str, fmt: str) -> List[str]:
        """Every file of ``kind`` in a checkpoint of this layout, in rank order."""
        return file_names(kind, self.stage, self.world, self.op_size, fmt)

    def my_file(self, kind: str) -> Optional[int]:
        """Index of the file of ``kind`` this rank writes, or None."""
        if kind == "train_state":
            return self.rank
        if per_rank_kind(kind, self.stage):
            return self.op_rank if self.replica == 0 else None
        return 0 if self.rank == 0 else None


def world_and_rank() -> tuple:
    """(world size, global rank); (1, 0) without communication."""
    return group_size_and_rank(None)


def build_layout(train_net, caller: str) -> Layout:
    """Classify every Parameter of ``train_net`` (a TrainOneStepWrapper) into a file kind with its
    layout ([Note: checkpoint layout]); raises ValueError naming ``caller`` if names repeat."""
    plan = train_net.zero_plan  # [Note: train records] in train/train_plan.py
    n, r, stage = plan.op.size, plan.op.rank, plan.policy.stage
    world, rank = world_and_rank()
    dp_size, replica = plan.dp.size, plan.dp.rank
    items = {kind: [] for kind in KINDS}
    for held in inventory(train_net):
        items[_FILE_OF[held.kind]].append(held)
    layout = Layout(stage, world, rank, n, r, dp_size, replica, train_net.accum_steps, items)
    _check_layout(layout, caller)
    return layout


def _check_layout(layout: Layout, caller: str) -> None:
    names = {}
    for kind, kind_items in layout.items.items():
        for it in kind_items:
            if it.param.name in names:
                raise ValueError(
                    f"For '{caller}', the argument 'train_net' holds two Parameters named {it.param.name!r} "
                    f"({names[it.param.name]} and {kind}); checkpoint names must be unique."
                )
            names[it.param.name] = kind
            want = it.held.shard_shape
            if tuple(it.param.shape) != want:
                raise ValueError(
                    f"For '{caller}', the {kind} tensor {it.param.name!r} has shape {tuple(it.param.shape)}, "
                    f"but its ZeRO layout (full shape {it.held.shape}, split={it.held.split} over "
                    f"{it.held.group_size} ranks) gives {want}."
                )
