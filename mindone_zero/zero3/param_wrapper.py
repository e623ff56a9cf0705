"""One ZeRO-3 parameter: sharding it in place, and the Cell that gathers it for use.

``shard_parameter`` cuts a Parameter down to this rank's block (it does not communicate).
``ZeroParamWrapper`` is the Cell that a ZeRO-3 ``construct`` calls on the shard: it all-gathers
the full tensor in forward and, in its custom ``bprop``, reduce-scatters the gradient back to the
shard's shape (mean over the group). All communication goes through ``mindone_zero.core.comm``.

Which parameters are split is [Note: split rule] in ``mindone_zero/core/partition.py``. The
gradient of a trainable one kept whole is local (the train wrapper all-reduces it). A frozen one is
split too (a LoRA fine-tune's base), gathered like the others, and its gather's backward returns
zeros without communicating; running state that a Cell updates in place (BatchNorm's moving
statistics: ``frozen.py``) is left untouched. ``shard_parameter`` says what each gets
(``zero_spec``, ``zero_param``).

[Note: gather order]
A stage-3 gather depends only on its shard Parameter, so a device scheduler may start every gather
at the top of the graph and hold the whole model gathered at once. So a gather waits for an input,
``after``: the ``parallel_modules`` layers pass their input (``ZeroParamWrapper``;
``ZeroGatherGroup.waiting_for`` for a coalesced gather), the generic rewrite (rewrite.py) a
``construct``'s first input, and a gather unit's ``ZeroUnitGather`` (units.py) the unit root's
first input. Not tied: gathers the rewrite puts in methods other than ``construct`` (a helper's
inputs are not known to be the layer's).

The tie is a Depend, on the tensor the collective sends, inside a Cell with a custom bprop: the
gather Cell's ``waiting`` (``GatherGroup.waiting``: gather_group.py), called as
``waiting(x, after)``, whose bprop returns the gather's gradient and zeros for ``after``
(``after_grad``): no number changes. Autodiff does not look inside a custom-bprop Cell, so the
Depend gets no gradient graph of its own; a Depend outside it (in the wrapper, before the call)
cost each gather a J graph, a bprop graph and a ``zeros_like`` graph. The forward is written in the
``waiting`` Cell and the gather Cell's ``construct`` calls it, so a call compiles one graph, not
two, as a test of the mode inside ``construct`` would.

PYNATIVE_MODE calls the gather Cell itself, one input (``waiting.__call__``; a graph compiles
``construct`` and never runs it): MindSpore 2.10's PYNATIVE grad of a recomputed Cell fails on a
custom bprop with two inputs, and eager ops run in program order, so there is nothing to wait for.
hpZ's two Cells keep the Depend in the wrapper. The CPU backend runs the gathers in program order
with or without the tie (tests/unit/test_gather_order.py shows the Depend in the compiled graph, and
tests/dist/test_gather_units.py the all-gathers' inputs at N=2).

[Note: ZeRO++ at build]
ZeRO++'s qwZ and qgZ are wire formats of each parameter's gather (a ``GatherGroup`` of one: [Note:
gather groups] in gather_group.py), so a wrapper is built with them, from the parameter's record:
``shard_network`` shards every parameter first, in the network's order, and stamps its ``ZeroParam``
on it before any layer Cell is built, so every wrapper (of the layer Cells it builds, of the generic
rewrite, of a user's MindOne-style class that knows nothing of ZeRO++) reads the options there. A
gather with ZeRO++ options is never coalesced (``build_gather_group`` in ``coalesce.py``), so a
layer Cell decides at build time to gather per parameter. Whether a wrapper splits its gather for
hpZ is decided with its gather Cell, once its place in the network is known ([Note: gather Cells
built once] in gather_build.py). A layer the user built before calling ``shard_network`` was built
without the options: ``shard_network`` finds it before anything changes, turns its coalescing off
once the network is assembled (``ZeroCell.gather_per_parameter``, before the gathers are planned),
and the gather plan gives its wrappers ZeRO++ gather Cells (``enable_zeropp``; [Note: a frozen
gather plan] in reshard.py).
"""
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Optional

import numpy as np
from mindspore import Parameter, nn, ops

from ..core.comm import GroupComm, group_size_and_rank, world_group
from ..core.comm_records import GatherRecord
from ..core.quantize import block_layout
from ..core.packing import ITEMSIZE
from ..core.materialize import block_of, materialize, set_value
from ..core.partition import (ShardSpec, check_split_rule_flag, is_frozen_candidate, set_zero_spec, splits_over,
                              zero_spec_of)
from ..core.slicing import copy_slice
from ..core.stage import StagePolicy, check_stage
from .gather_group import GatherGroup, _GroupWaiting, after_grad
from .zeropp import ZeroPPConfig

__all__ = [
    "ZeroParamWrapper", "shard_parameter", "gather_attr_name",
    "check_group", "check_compute_dtype", "GATHER_SUFFIX", "after_grad", "ZeroParam", "zero_param_of",
    "param_gather", "ParamGather", "cut_parameter", "gather_build_of",
]

GATHER_SUFFIX = "_zero_gather"
_RESHAPE, _DEPEND = ops.Reshape(), ops.Depend()
def gather_attr_name(param_attr: str) -> str:
    """Attribute under which a Cell keeps the gather wrapper of its parameter ``param_attr``."""
    return param_attr + GATHER_SUFFIX


ZERO_PARAM_ATTR = "zero_param"


@dataclass(frozen=True)
class ZeroParam:
    """What ZeRO-3 decided for one Parameter (trainable, or frozen and floating), stamped on it as
    ``param.zero_param`` when it is sharded (``shard_parameter``): every gather built for it reads
    this record ([Note: ZeRO++ at build]), so options travel with the parameter, not beside the calls.

    Attributes:
        spec (ShardSpec): its layout (also ``param.zero_spec``, for users and MindOne's callers).
        zeropp (ZeroPPConfig): the ZeRO++ options of its gathers (qwZ, qgZ, hpZ's group), or None.
        build (GatherBuild): while ``shard_network`` builds the network, what builds its gather
            Cells ([Note: gather Cells built once] in gather_build.py); None otherwise.
        group (str): the group it is sharded over, as given (None: the world group).
        owner (object): the ``shard_network`` call that sharded it (one token per call), None for
            ``shard_parameter`` alone: ``gathered_parameters`` refuses parameters of two networks.
    """

    spec: ShardSpec
    zeropp: Optional[ZeroPPConfig] = None
    build: Optional[object] = None
    group: Optional[str] = None
    owner: Optional[object] = None


def zero_param_of(param) -> Optional[ZeroParam]:
    """``param``'s ``ZeroParam`` record, or None for a parameter ZeRO-3 has not sharded."""
    return getattr(param, ZERO_PARAM_ATTR, None)


def gather_build_of(param):
    """The ``GatherBuild`` that builds ``param``'s gather Cells, while ``shard_network`` builds
    ([Note: gather Cells built once] in gather_build.py); None otherwise."""
    record = zero_param_of(param)
    return None if record is None else record.build


def shard_parameter(param: Parameter, group: Optional[str] = None, pad_uneven: bool = False,
                    zeropp: Optional[ZeroPPConfig] = None) -> ShardSpec:
    """Shard ``param`` in place over ``group`` (if the split rule splits it: [Note: split rule] in
    ``mindone_zero/core/partition.py``) and return its layout.

    The same Parameter object keeps its name; its data becomes this rank's padded block
    (``ShardSpec.shard_shape``), ``param.zero_spec`` records the layout and ``param.zero_param``
    the ``ZeroParam`` record its gathers are built from (the layout and ``zeropp``). A trainable
    parameter that stays whole also gets them (``split=False``), and so does a frozen floating
    parameter (``requires_grad=False``): it is split by the same rule, and its gathers send back no
    gradient. Any other non-trainable parameter (an integer counter, a 0-d value) gets neither; the
    returned spec then has ``split=False``. ``shard_network`` keeps state that a Cell updates in
    place (BatchNorm's moving statistics) whole, without a record. A parameter built without data
    (``no_init_parameters``) runs its initializer here, one tensor at a time ([Note: delayed
    initialisation] in ``mindone_zero/core/materialize.py``).

    Idempotent: a parameter that already has a ``zero_spec`` is not cut again (and keeps its record).

    Not collective: every rank cuts its own copy, so ranks that started from different random
    initial values still end with one consistent set of blocks (block r comes from rank r).

    Args:
        param (Parameter): the Parameter to shard.
        group (str): communication group name; None means the world group.
        pad_uneven (bool): the padded split rule (split a dim 0 that does not divide too, zero-padded);
            False (default): MindOne's rule.
        zeropp (ZeroPPConfig): the ZeRO++ options of the parameter's gathers; None (default): none.

    Returns:
        ShardSpec: the layout of ``param``.

    Raises:
        TypeError: if ``param`` is not a Parameter, ``pad_uneven`` not a bool, or ``zeropp`` not a
            ``ZeroPPConfig`` or None.
        ValueError: if ``param`` was already sharded over a group of another size.

    Examples:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import Parameter
        >>> from parallel_modules import shard_parameter
        >>> w = Parameter(ms.Tensor(np.ones((6, 4), np.float32)), name="w")
        >>> spec = shard_parameter(w)   # one process: the block is the whole tensor
        >>> spec.split, spec.shape, spec.shard_shape, w.zero_spec is spec
        (True, (6, 4), (6, 4), True)
        >>> shard_parameter(w) is w.zero_spec is w.zero_param.spec   # idempotent
        True
    """
    if not isinstance(param, Parameter):
        raise TypeError(f"For 'shard_parameter', the argument 'param' must be a Parameter, but got {type(param)}.")
    check_split_rule_flag("shard_parameter", "pad_uneven", pad_uneven)
    if zeropp is not None and not isinstance(zeropp, ZeroPPConfig):
        raise TypeError(f"For 'shard_parameter', the argument 'zeropp' must be None or a ZeroPPConfig, but got "
                        f"{zeropp!r}.")
    return cut_parameter(param, group, pad_uneven, zeropp)


def cut_parameter(param: Parameter, group: Optional[str], pad_uneven: bool, zeropp: Optional[ZeroPPConfig],
                  build=None, frozen: bool = True, owner=None) -> ShardSpec:
    """``shard_parameter`` after its argument checks; a record it stamps carries ``build`` ([Note:
    gather Cells built once] in gather_build.py) and ``owner`` (``ZeroParam.owner``). ``frozen``: a
    frozen candidate is sharded (False for state a Cell updates in place: ``frozen.py``)."""
    size, rank = group_size_and_rank(group)
    spec = zero_spec_of(param)
    if spec is not None:
        if spec.group_size != size:
            raise ValueError(
                f"For 'shard_parameter', the parameter {param.name!r} is already sharded over {spec.group_size} "
                f"ranks, but the argument 'group' ({group or world_group()!r}) has {size} ranks."
            )
        return spec
    spec = ShardSpec(param.name, tuple(param.shape), size, rank, splits_over(param, size, pad_uneven, frozen))
    # One parameter at a time, in the network's order ([Note: delayed initialisation] in core/materialize.py)
    if spec.split:
        set_value(param, block_of(param, spec))
    else:
        materialize(param)
    if param.requires_grad or (frozen and is_frozen_candidate(param)):
        set_zero_spec(param, spec)
        setattr(param, ZERO_PARAM_ATTR, ZeroParam(spec, zeropp, build, group, owner))
    return spec


_OUR_FORM = ("group", "compute_dtype")
_MINDONE_FORM = ("zero_stage", "optimizer_parallel_group", "cell_type")
_ALIASES = (("group", "optimizer_parallel_group"), ("compute_dtype", "cell_type"))


def _wrapper_args(args: tuple, kwargs: dict):
    """``zero_stage, (name, group), (name, compute_dtype)`` from either form of ``ZeroParamWrapper``'s arguments."""
    mindone_form = bool(args) and isinstance(args[0], int) and not isinstance(args[0], bool)
    names = _MINDONE_FORM if mindone_form else _OUR_FORM
    if len(args) > len(names):
        raise TypeError(
            f"For 'ZeroParamWrapper', the arguments after 'param' must be at most {list(names)}, but got "
            f"{len(args)} positional values {args!r}."
        )
    given = dict(zip(names, args))
    for key, value in kwargs.items():
        if key not in _OUR_FORM + _MINDONE_FORM:
            raise TypeError(f"For 'ZeroParamWrapper', got an unexpected keyword argument {key!r}.")
        if key in given:
            raise TypeError(f"For 'ZeroParamWrapper', got multiple values for the argument {key!r}.")
        given[key] = value
    resolved = []
    for ours, theirs in _ALIASES:
        if ours in given and theirs in given:
            raise TypeError(
                f"For 'ZeroParamWrapper', the arguments {ours!r} and {theirs!r} are aliases; pass one, but got "
                f"{given[ours]!r} and {given[theirs]!r}."
            )
        name = theirs if theirs in given else ours
        resolved.append((name, given.get(name)))
    return given.get("zero_stage", 3), resolved[0], resolved[1]


def check_group(owner: str, name: str, group) -> None:
    """Raise TypeError naming ``owner`` and ``name`` unless ``group`` is None or a str."""
    if group is not None and not isinstance(group, str):
        raise TypeError(f"For '{owner}', the argument '{name}' must be None or a str, but got {group!r}.")


def check_compute_dtype(owner: str, name: str, dtype) -> None:
    """Raise TypeError naming ``owner`` and ``name`` unless ``dtype`` is None or a MindSpore float type."""
    if dtype is not None and dtype not in ITEMSIZE:
        raise TypeError(f"For '{owner}', the argument '{name}' must be None or a float dtype, but got {dtype!r}.")


class ZeroParamWrapper(nn.Cell):
    """Gather a ZeRO-3 parameter shard for use in forward; reduce-scatter its gradient in backward.

    Call it from ``construct`` with the shard Parameter as the explicit input and the layer's
    input as ``after``, e.g. ``w = self.weight_zero_gather(self.weight, x)`` ([Note: gather order]). Forward returns the full tensor (padding rows
    dropped) in ``compute_dtype``; when that dtype is narrower than the parameter's the cast is
    done before the all-gather, so half the bytes travel. The custom ``bprop`` casts the incoming
    gradient to the parameter's dtype, pads it, reduce-scatters it over the group and divides by
    the group size, so the gradient autodiff delivers for the parameter is already the group mean
    of this rank's block. For a parameter that is not split (``zero_spec.split`` False) forward
    only casts and backward returns the local gradient in the parameter's dtype.

    Two constructor forms, told apart by the type of the second argument:

    * ours: ``ZeroParamWrapper(param, group=None, compute_dtype=None)``; the stage is 3;
    * MindOne's: ``ZeroParamWrapper(param, zero_stage, optimizer_parallel_group=None, cell_type=None)``
      (second argument an int). Keywords ``zero_stage=``, ``optimizer_parallel_group=`` (alias of
      ``group``) and ``cell_type=`` (alias of ``compute_dtype``) are accepted with either form.

    At stage 3, building it shards ``param`` in place if that has not happened yet
    (``shard_parameter``), and calling it is collective over ``group`` when the parameter is
    split: every rank must run the same forward and backward. Below stage 3 it is an identity
    (no cast, no sharding, no communication), as MindOne's layers use ``nn.Identity`` there.

    Args:
        param (Parameter): the parameter to gather (sharded here at stage 3 if it is not yet).
        *args: after ``param``, positionally, either ``group, compute_dtype`` (ours: ``group`` a
            group name, None for the world group; ``compute_dtype`` the dtype forward returns, None
            for the parameter's) or ``zero_stage, optimizer_parallel_group, cell_type`` (MindOne's,
            told apart by an int ``zero_stage``: 0-3, below 3 the wrapper is an identity).
        **kwargs: the same by name: ``group`` or its alias ``optimizer_parallel_group``,
            ``compute_dtype`` or its alias ``cell_type``, and ``zero_stage`` (default 3).

    Attributes:
        need_rewrite (bool): always False. MindOne's wrapper sets it when the parameter still has
            to be cut by the caller (``param.assign_value(block)``); this wrapper has already cut
            it when it was built, so a MindOne-style layer that cuts when ``need_rewrite`` is True
            leaves the shard alone instead of cutting it a second time.
        is_split (bool): whether the parameter is held as a 1/N block (stage 3, split candidate).
        zero_stage: the constructor argument (MindOne's name).
        optimizer_parallel_group: the constructor argument (MindOne's name).
        cell_type: the constructor argument (MindOne's name).

    Raises:
        TypeError: if ``param`` is not a Parameter, ``group`` is not None or a str,
            ``compute_dtype`` is not a MindSpore float type, the arguments fit neither form, or a
            value is given under both of its names.
        ValueError: if ``zero_stage`` is not one of 0, 1, 2, 3.

    Examples:
        A layer of your own that gathers its weight (MindOne's form; one process, so a group of one
        rank):

        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import Parameter, nn, ops
        >>> from parallel_modules import ZeroParamWrapper
        >>> class Scale(nn.Cell):
        ...     def __init__(self, zero_stage=3):
        ...         super().__init__()
        ...         value = ms.Tensor(np.full((4, 3), 2.0, np.float32))
        ...         self.w = Parameter(value, name="w")
        ...         self.w_gather = ZeroParamWrapper(self.w, zero_stage, None,
        ...                                          ms.float16)
        ...     def construct(self, x):
        ...         return ops.matmul(x, self.w_gather(self.w, x))
        >>> layer = Scale()
        >>> layer.w_gather.is_split, layer.w_gather.need_rewrite
        (True, False)
        >>> layer(ms.Tensor(np.ones((1, 4), np.float16))).asnumpy().tolist()
        [[8.0, 8.0, 8.0]]
    """

    def __init__(self, param: Parameter, *args, **kwargs):
        super().__init__(auto_prefix=False)
        zero_stage, (group_name, group), (dtype_name, compute_dtype) = _wrapper_args(args, kwargs)
        if not isinstance(param, Parameter):
            raise TypeError(f"For 'ZeroParamWrapper', the argument 'param' must be a Parameter, but got {type(param)}.")
        check_stage(zero_stage, "ZeroParamWrapper")
        check_group("ZeroParamWrapper", group_name, group)
        check_compute_dtype("ZeroParamWrapper", dtype_name, compute_dtype)
        self.zero_stage = zero_stage
        self.optimizer_parallel_group = group
        self.cell_type = compute_dtype
        self.need_rewrite = False
        self.sharded = StagePolicy(zero_stage).shards_params
        self.is_split = False
        self.hpz = False
        self.param_name = param.name
        self.gather_record = None
        if self.sharded:
            spec = shard_parameter(param, group)
            self.is_split = spec.split
            self.param_name = spec.name  # the name it was sharded under, as ZeroHelper and CommPlan know it
            self.gather_plan = plan = param_gather(param, group, compute_dtype, spec)
            # its own ([Note: comm records]): its gather Cell may be shared ([Note: shared gather graphs])
            self.gather_record = plan.record
            self.shard_shape = tuple(spec.shard_shape)
            build = gather_build_of(param)
            if build is not None and plan.record.gathers:
                build.defer(self)  # [Note: gather Cells built once] in gather_build.py
            else:
                self.gather = plan.build()

    def construct(self, x, after=None):
        """The full tensor of shard ``x``, in the compute dtype (``x`` itself below stage 3).
        Collective over the group when the parameter is split.

        Args:
            x (Parameter): the shard, the Parameter this wrapper was built for.
            after (Tensor): a tensor the gather must wait for, the calling layer's input ([Note:
                gather order]); None: no order.
        """
        if not self.sharded:
            return x
        # A same-shape reshape (a view): PYNATIVE checks a custom bprop's input against the full shape of
        # the Parameter's autograd leaf. ``after`` goes to the gather even when None ([Note: gather
        # order]): an ``if after is not None`` would compile each branch as a subgraph of its own.
        x = _RESHAPE(x, self.shard_shape)
        if self.hpz:
            x = _DEPEND(x, after)
            return self.hpz_secondary(x, self.hpz_primary(x))
        return self.gather.waiting(x, after)

    def use_gather(self, gather: GatherGroup, hpz_group: Optional[str] = None) -> None:
        """Call ``gather``, a Cell built from ``gather_plan`` (maybe for other wrappers too: [Note:
        shared gather graphs] in gather_build.py); ``hpz_group``: split it for hpZ's secondary group
        ([Note: hpZ]). Not collective."""
        self.gather = gather
        if hpz_group is not None:
            size, rank = group_size_and_rank(hpz_group)
            self.gather_record = replace(self.gather_plan.record, hpz_group=hpz_group, hpz_size=size)
            self.hpz_primary = _HpzPrimary(gather, self.gather_record, rank)
            self.hpz_secondary = _HpzSecondary(gather, hpz_group)
            self.hpz = True

    def enable_zeropp(self, zeropp, hpz_group: Optional[str]) -> None:
        """``use_gather`` a gather with ZeRO++ options ``zeropp`` (a ``ZeroPPConfig``), rebuilt if this
        wrapper was built without them, before ``shard_network`` ([Note: ZeRO++ at build]). Not collective."""
        gather = self.gather
        if gather.zeropp is None:
            self.gather_plan = replace(self.gather_plan, zeropp=zeropp)
            self.gather_record = self.gather_plan.record
            object.__setattr__(self, "_replaced_gather", gather)  # MindSpore 2.10 keys parsed Cells by id: keep it
            gather = self.gather_plan.build()
        self.use_gather(gather, hpz_group)

    def extend_repr(self):
        return self.gather_plan.describe() if self.sharded else ""


@dataclass(frozen=True)
class ParamGather:
    """What one parameter's gather is built from, before any Cell is: its layout, dtypes, group and
    ZeRO++ options, and the ``GatherRecord`` they give ([Note: comm records]). A coalesced group
    (``coalesce.py``) and a gather unit (``units.py``) are built from these, so no per-parameter
    gather Cell is built for a parameter that one collective gathers with others; ``build()`` makes
    the ``GatherGroup`` of a parameter gathered alone (a group of one)."""

    spec: ShardSpec
    param_dtype: object
    group: Optional[str]
    compute_dtype: object
    zeropp: Optional[ZeroPPConfig] = None
    frozen: bool = False  # requires_grad False: no gradient goes back ([Note: split rule] in core/partition.py)

    @cached_property
    def record(self) -> GatherRecord:
        return _gather_record(self.spec, self.param_dtype, self.group, self.compute_dtype, self.zeropp, self.frozen)

    def build(self) -> GatherGroup:
        """The gather Cell, a group of one (not collective)."""
        return GatherGroup(self.record, (self,), self)

    def graph_key(self) -> tuple:
        """Everything the graph of its gather Cell reads ([Note: shared gather graphs] in gather_build.py)."""
        record, spec = self.record, self.spec  # the rest (padding, rows, casts) follows from these
        quantized = (record.block, record.blocks) if record.quantize_weights or record.quantize_grads else ()
        return (self.group, spec.group_size, spec.split, tuple(spec.shape), tuple(spec.padded_shape),
                tuple(spec.shard_shape), self.param_dtype, record.compute_dtype, record.quantize_weights,
                record.quantize_grads, record.reduces) + quantized

    def describe(self) -> str:
        record = self.record
        return (f"param={self.spec.name}, full_shape={self.spec.shape}, group_size={record.group_size}, "
                f"compute_dtype={record.compute_dtype}, gathers={record.gathers}, zeropp={self.zeropp}"
                + (", frozen" if self.frozen else ""))


def param_gather(param: Parameter, group: Optional[str], compute_dtype,
                 spec: Optional[ShardSpec] = None) -> ParamGather:
    """The ``ParamGather`` of ``param``, sharded already, from its record: its spec and ZeRO++
    options ([Note: ZeRO++ at build]); ``spec`` for a parameter without a record (not trainable).
    Not collective."""
    record = zero_param_of(param)
    spec = record.spec if record is not None else spec
    return ParamGather(spec, param.dtype, group, compute_dtype, record and record.zeropp, not param.requires_grad)


def _gather_record(spec: ShardSpec, param_dtype, group: Optional[str], compute_dtype, zeropp,
                   frozen: bool = False) -> GatherRecord:
    """The record a parameter's gather is built from ([Note: comm records] in core/comm_records.py)."""
    gathers = spec.split and spec.group_size > 1
    # [Note: full-precision tensors] in zeropp.py: vectors and small tensors are not quantized.
    quantizes = gathers and zeropp is not None and zeropp.quantizes(spec.shape)
    weights, grads = quantizes and zeropp.quantize_weights, quantizes and zeropp.quantize_gradients and not frozen
    block, blocks = 0, 0
    if weights or grads:
        block, blocks, _ = block_layout(int(np.prod(spec.shard_shape)), zeropp.block_size)
    compute_dtype = param_dtype if compute_dtype is None else compute_dtype
    return GatherRecord("layer", group or world_group(), spec.group_size, (spec.name,), (tuple(spec.padded_shape),),
                        (tuple(spec.shard_shape),), param_dtype, compute_dtype, gathers, weights, grads, block, blocks,
                        reduces=not frozen)


# [Note: hpZ]
# ZeRO++'s hierarchical partitioning, built on [Note: reshard after forward] (reshard.py): a gather
# wrapper inside a recomputed region (its collective marked, or its reader recomputed whole) gathers
# again in backward. With hpZ the gather is split in two Cells inside that region:
#   _HpzPrimary(shard) -> secondary shard: the all-gather over the shard group (quantized with
#       qwZ), then a cut of rows [j R2, (j+1) R2) of the padded tensor, j this rank's index in the
#       secondary group of K ranks and R2 = padded rows / K. The cut is a Slice primitive marked
#       `recompute(False)`, so GRAPH_MODE keeps its output (1/K of the parameter, compute dtype)
#       until backward instead of recomputing it: backward does not touch the primary group.
#   _HpzSecondary(shard, secondary shard) -> full tensor: an all-gather in the secondary group,
#       which the recomputation runs again in backward: the re-gather stays inside the group.
# Gradients: _HpzSecondary is a waiting Cell of the group (gather_group.py) with the group's bprop:
# for the shard, the same reduce-scatter as without hpZ, and zeros for the secondary shard;
# _HpzPrimary's bprop returns zeros, so autodiff adds an exact zero. The forward values are copies
# of the same gathered tensor, so losses and updates are bit-identical to those without hpZ. Cost:
# one more all-gather in forward (in the secondary group), and the secondary shards of all
# recomputed Cells held from forward to backward (estimate_peak_memory's hpZ term). PYNATIVE's
# recompute re-runs a Cell's whole construct (the primary gather too), so hpZ needs GRAPH_MODE.


class _HpzPrimary(nn.Cell):
    """hpZ, first half: the primary all-gather, then this rank's secondary shard; zero gradient
    ([Note: hpZ])."""

    def __init__(self, base: GatherGroup, record: GatherRecord, sec_rank: int):
        super().__init__(auto_prefix=False)
        self.base = base
        padded = base.spec.padded_shape
        rows = padded[0] // record.hpz_size
        # Not recomputed: its output, the secondary shard, is what backward keeps ([Note: hpZ]).
        self.cut = ops.Slice().recompute(False)
        self.begin = (sec_rank * rows,) + (0,) * (len(padded) - 1)
        self.size = (rows,) + tuple(padded[1:])
        self.cast_dtype = base.compute_dtype if base.cast_after_gather else None
        self.nbytes = record.hpz_shard_nbytes  # the secondary shard

    def construct(self, x):
        full = self.base.gather_padded(x)
        if self.cast_dtype is not None:
            full = full.astype(self.cast_dtype)
        return self.cut(full, self.begin, self.size)

    def bprop(self, x, out, dout):
        return (ops.zeros_like(x),)


class _HpzSecondary(_GroupWaiting):
    """hpZ, second half, a mode of the group: ``cell(x, sec)`` all-gathers the secondary shard ``sec``
    in the secondary group. Its gradients are the group's own (``_GroupWaiting.bprop``): the
    reduce-scatter for the shard ``x``, zeros for ``sec`` ([Note: hpZ])."""

    def __init__(self, base: GatherGroup, sec_group: str):
        super().__init__(base)
        self.comm = GroupComm(sec_group)

    def __call__(self, x, sec):
        return nn.Cell.__call__(self, x, sec)  # the same Cells in every mode ([Note: gather order])

    def construct(self, x, sec):
        full = self.comm.all_gather(sec)
        g = self.base
        if g.pads[0] > 0:
            full = copy_slice(full, 0, 0, g.full_rows[0])
        return full
