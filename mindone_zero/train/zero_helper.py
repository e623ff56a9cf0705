"""ZeroHelper: MindOne's face over the train records, and the one place they are built.

``build_zero`` makes the records of [Note: train records] (train_plan.py) from checked
``ZeroOptions``; ``ZeroHelper`` holds them under MindOne's constructor, methods and attribute names.
``prepare_train_network`` builds one with ``ZeroHelper.from_parts``; ``ZeroHelper(...)`` checks its
arguments first.
"""
from operator import attrgetter
from typing import List, NamedTuple, Optional

from mindspore import nn

from ..core.comm_plan import CommPlan, PlanContext
from ..core.group_alias import group_argument
from ..core.partition import ShardSpec, check_split_rule_flag
from ..core.split_info import write_split_info
from ..offload import HostOffload
from .comm_accounting import step_plan
from .grad_sync import GradSync
from .optimizer_states import OptimizerShards, optimizer_parameters, shard_optimizer
from .train_plan import TrainPlan, ZeroOptions, plan_train

__all__ = ["ZeroHelper", "ZeroParts", "build_zero", "split_info_entries"]


class ZeroParts(NamedTuple):
    """The train records of one optimizer ([Note: train records] in train_plan.py)."""

    plan: TrainPlan
    shards: OptimizerShards
    sync: GradSync
    host: Optional[HostOffload]


def build_zero(options: ZeroOptions, optimizer, states=None) -> ZeroParts:
    """Plan, shard the optimizer, build the ``GradSync`` and (``options.offload``) the host step, in
    that order; nothing is checked again. Not collective.

    Args:
        options (ZeroOptions): checked already.
        optimizer: the optimizer ``options`` were checked for.
        states (dict): the optimizer's states, if the caller found them already (``find_optimizer_states``).
    """
    plan = plan_train(options, optimizer_parameters(optimizer))
    shards = shard_optimizer(plan, optimizer, states)
    sync = GradSync(plan, shards)
    host = None
    if options.offload.enabled:
        host = HostOffload(options.offload, options.host_rule, shards, sync)
        shards = shards.with_host_states(host.states, host.placeholders)
    return ZeroParts(plan, shards, sync, host)


def split_info_entries(plan: TrainPlan, shards: OptimizerShards) -> List[ShardSpec]:
    """One split-info entry per name: the parameters, then the optimizer's states."""
    entries = list(plan.specs)
    for values in shards.opt_states.values():
        entries += [ShardSpec(v.name, s.shape, s.group_size, s.rank, s.split) for v, s in zip(values, plan.specs)]
    return entries


def _read(path: str, doc: str) -> property:
    """A read-only attribute of ``ZeroHelper``: ``path`` read from its records."""
    return property(attrgetter(path), doc=doc)


class ZeroHelper(nn.Cell):
    """Shards one optimizer's work over ``optimizer_parallel_group`` (ZeRO stages 0-3): MindOne's ``ZeroHelper``.

    ``prepare_train_network`` builds one; ``TrainOneStepWrapper`` runs its gradient synchronization
    (``grad_sync``, [Note: gradient reduction] in grad_sync.py). It holds the records of [Note: train
    records] (``zero_plan``, ``optimizer_shards``). Building it is not collective;
    ``reduce_grads`` and ``run_optimizer`` are collective over the world.

    Args:
        optimizer (nn.Optimizer | mindspore.experimental.optim.Optimizer): built over the network's
            trainable parameters (at stage 3, the network must be sharded by ``prepare_network``).
        zero_stage (int): 0, 1, 2 or 3. Outside ``ParallelMode.DATA_PARALLEL`` a stage > 0 warns and
            falls back to 0, as MindOne does.
        optimizer_parallel_group (str): group whose ranks share one copy of the model states; None
            means the world group.
        dp_group (str): group of the ranks holding the same shard (hybrid sharding); required when
            ``optimizer_parallel_group`` is not the world group.
        optimizer_offload (bool | dict): ``True`` or ``{"device": "cpu"}`` keeps the optimizer states
            in host memory and runs the update there; ``{"device": "nvme", "path": ...}`` in files
            ([Note: offload argument] in offload/config.py). An optimizer the host update does not
            cover warns and runs on the device without offload, as MindOne does.
        comm_fusion (dict): MindOne's communication-fusion dict; None (the default) buckets by 25 MiB,
            ``{}`` sends one collective per tensor ([Note: buckets] in fusion.py).
        params_split_info (str): folder for ``params_split_info_{rank}.json`` (``dump_params_split_info``).
        pad_uneven_params (bool): stages 1-2: also split parameters whose dim 0 does not divide by the
            group size, zero-padded ([Note: split rule] in partition.py; default False, as MindOne).
        op_group (str): MindOne 0.2.0's name for ``optimizer_parallel_group``; give one or the other.

    Attributes:
        zero_stage (int): the stage in force (0 outside ``ParallelMode.DATA_PARALLEL``).
        op_group (str): the optimizer parallel group (None in one process); ``op_size``, ``op_rank``
            (int): its size and this rank's index. ``dp_group``, ``dp_size``: the replica group.
        is_parallel (bool): whether the job runs in ``ParallelMode.DATA_PARALLEL``.
        optimizer: the optimizer (re-pointed at the master shards at stages 1-2).
        params, opt_params (ParameterTuple): the parameters the optimizer updates, and what it updates
            them through: the fp32 master shards at stages 1-2, the parameters themselves otherwise.
        host_offload: the host side of ``optimizer_offload``, else None.

    Raises:
        TypeError: ``optimizer`` is not an optimizer, or both group keywords are given.
        ValueError: bad stage, groups, or optimizer states not shaped like their parameters.

    Examples:
        >>> from mindspore import nn
        >>> from mindone_zero import ZeroHelper
        >>> optimizer = nn.AdamWeightDecay(nn.Dense(4, 2).trainable_params())
        >>> helper = ZeroHelper(optimizer, zero_stage=2)
        >>> helper.zero_stage, helper.op_size   # one process: stage 0, nothing sharded
        (0, 1)

        On every rank, the train step around it (tests/dist/test_zero_parity.py runs these calls):

        >>> helper = ZeroHelper(optimizer, zero_stage=2,
        ...                     optimizer_parallel_group=op_group, dp_group=dp_group)
        >>> train_net = TrainOneStepWrapper(loss_net, optimizer, zero_helper=helper)
    """

    def __init__(self, optimizer, zero_stage=0, optimizer_parallel_group=None, dp_group=None,
                 optimizer_offload=False, comm_fusion=None, params_split_info="params_info",
                 pad_uneven_params=False, *, op_group=None):
        super().__init__(auto_prefix=False)
        group = group_argument("ZeroHelper", optimizer_parallel_group, op_group)
        check_split_rule_flag("ZeroHelper", "pad_uneven_params", pad_uneven_params)
        options = ZeroOptions.check("ZeroHelper", optimizer, zero_stage, group, dp_group, optimizer_offload,
                                    comm_fusion, pad_uneven_params)
        self._hold(build_zero(options, optimizer), params_split_info)

    zero_stage = _read("zero_plan.policy.stage", "int: the stage in force.")
    is_parallel = _read("zero_plan.is_parallel", "bool: the job runs in ParallelMode.DATA_PARALLEL.")
    op_group = _read("zero_plan.op.name", "str: the optimizer parallel group (None in one process).")
    op_size = _read("zero_plan.op.size", "int: the optimizer parallel group's size.")
    op_rank = _read("zero_plan.op.rank", "int: this rank's index in the optimizer parallel group.")
    dp_group = _read("zero_plan.dp.name", "str: the replica group, or None.")
    dp_size = _read("zero_plan.dp.size", "int: the replica group's size.")
    optimizer_offload = _read("zero_plan.offload.enabled", "bool: the optimizer steps on the host.")
    optimizer = _read("optimizer_shards.optimizer", "The optimizer (re-pointed at the master shards at stages 1-2).")
    params = _read("optimizer_shards.params", "ParameterTuple: the parameters the optimizer updates.")
    opt_params = _read("optimizer_shards.opt_params", "ParameterTuple: what the optimizer updates them through.")

    @classmethod
    def from_parts(cls, parts: ZeroParts, params_split_info="params_info") -> "ZeroHelper":
        """The helper over records ``build_zero`` made from checked options (``prepare_train_network``'s)."""
        helper = cls.__new__(cls)
        nn.Cell.__init__(helper, auto_prefix=False)
        helper._hold(parts, params_split_info)
        return helper

    def _hold(self, parts: ZeroParts, params_split_info) -> None:
        self.zero_plan, self.optimizer_shards, self.grad_sync, self.host_offload = parts
        self.params_split_info = params_split_info
        self.extra_split_entries = []

    def comm_plan(self, micro_steps: int = 1, reduce_each_micro_step: bool = True, clip_grad: bool = False) -> CommPlan:
        """This helper's collectives of one optimizer step on this rank (``zero_plan.comm_record``);
        the network's ZeRO-3 gathers are not in it (``TrainOneStepWrapper.comm_plan`` has both).

        Args:
            micro_steps (int): forward/backward passes per optimizer step (gradient accumulation).
            reduce_each_micro_step (bool): gradients are reduced every micro-step (else once per step).
            clip_grad (bool): a global-norm all-reduce is added (stages >= 1).

        Returns:
            CommPlan: one entry per collective.
        """
        return step_plan(self.zero_plan.comm_record, (), PlanContext(micro_steps, reduce_each_micro_step, clip_grad))

    def register_split_entries(self, specs: List[ShardSpec]) -> None:
        """Add entries (EMA weights, say) for ``dump_params_split_info``."""
        self.extra_split_entries = self.extra_split_entries + list(specs)

    def dump_params_split_info(self, folder: Optional[str] = None) -> None:
        """Write ``params_split_info_{op rank}.json`` into ``folder``, MindOne's name for it: the
        parameters, the optimizer's states, then registered extras. Not collective; file I/O only.

        Args:
            folder (str): where to write it; None (default): the constructor's ``params_split_info``.
        """
        entries = split_info_entries(self.zero_plan, self.optimizer_shards) + self.extra_split_entries
        write_split_info(entries, folder or self.params_split_info, self.op_rank)

    def reduce_grads(self, grads):
        """Mean of ``grads`` over every data-parallel rank ([Note: gradient reduction] in grad_sync.py),
        shaped like ``opt_params``. Collective.

        Args:
            grads (tuple): this rank's gradients, one per ``params`` entry.
        """
        return self.grad_sync.reduce_grads(grads)

    def cal_gradients(self, grads):
        """MindOne's name for ``reduce_grads``. Collective.

        Args:
            grads (tuple): this rank's gradients, one per ``params`` entry.
        """
        return self.grad_sync.reduce_grads(grads)

    def run_optimizer(self, grads):
        """Optimizer step on the shards, then (stages 1-2) all-gather the new shards into the
        network's parameters. Collective at stages 1-2.

        Args:
            grads (tuple): the reduced gradients (``reduce_grads``), shaped like ``opt_params``.
        """
        return self.grad_sync.run_optimizer(grads)

    def split_params(self):
        """MindOne compatibility: sharding already happened at construction."""
        return None
