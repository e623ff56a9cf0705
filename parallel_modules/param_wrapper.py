"""One ZeRO-3 parameter: sharding it in place, and the Cell that gathers it for use.

``shard_parameter`` cuts a Parameter down to this rank's block (it does not communicate).
``ZeroParamWrapper`` is the Cell that a ZeRO-3 ``construct`` calls on the shard: it all-gathers
the full tensor in forward and, in its custom ``bprop``, reduce-scatters the gradient back to the
shard's shape (mean over the group). All communication goes through ``mindone_zero.comm``.

Which parameters are sharded (DESIGN section 3):

* trainable (``requires_grad``), ``ndim >= 1`` and not opted out with
  ``param.parallel_optimizer = False``: split along dim 0, zero-padded per [Note: padding] in
  ``mindone_zero/partition.py``; ``param.zero_spec`` is a ``ShardSpec`` with ``split=True``;
* trainable but 0-d or opted out: kept whole; ``param.zero_spec`` has ``split=False`` and the
  gradient the network produces for it is local (the train wrapper all-reduces it);
* not trainable (``requires_grad=False``, e.g. BatchNorm moving statistics, which the forward
  pass updates in place and so cannot live as shards): untouched, no ``zero_spec``.
"""
from typing import Optional

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn

from mindone_zero.comm import GroupComm, group_size_and_rank, pad_dim0, world_group
from mindone_zero.partition import ShardSpec, is_split_candidate, set_zero_spec, split_array, zero_spec_of
from mindone_zero.stage import StagePolicy, check_stage

__all__ = [
    "ZeroParamWrapper", "shard_parameter", "compute_dtype_of", "gather_attr_name",
    "check_group", "check_compute_dtype", "GATHER_SUFFIX",
]

GATHER_SUFFIX = "_zero_gather"


def gather_attr_name(param_attr: str) -> str:
    """Attribute under which a Cell keeps the gather wrapper of its parameter ``param_attr``."""
    return param_attr + GATHER_SUFFIX


def _to_numpy(param: Parameter) -> np.ndarray:
    if param.has_init:
        param.init_data()
    if param.dtype == ms.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
        return param.astype(ms.float32).asnumpy()
    return param.asnumpy()


def shard_parameter(param: Parameter, group: Optional[str] = None) -> ShardSpec:
    """Shard ``param`` in place over ``group`` (if it is a split candidate) and return its layout.

    The same Parameter object keeps its name; its data becomes this rank's padded block
    (``ShardSpec.shard_shape``) and ``param.zero_spec`` records the layout. A trainable parameter
    that stays whole also gets a ``zero_spec`` (``split=False``). A non-trainable parameter is left
    untouched and gets no ``zero_spec``; the returned spec then has ``split=False``.

    Idempotent: a parameter that already has a ``zero_spec`` is not cut again.

    Not collective: every rank cuts its own copy, so ranks that started from different random
    initial values still end with one consistent set of blocks (block r comes from rank r).

    Args:
        param: the Parameter to shard.
        group: communication group name; None means the world group.

    Returns:
        ShardSpec: the layout of ``param``.

    Raises:
        TypeError: if ``param`` is not a Parameter.
        ValueError: if ``param`` was already sharded over a group of another size.
    """
    if not isinstance(param, Parameter):
        raise TypeError(f"For 'shard_parameter', the argument 'param' must be a Parameter, but got {type(param)}.")
    size, rank = group_size_and_rank(group)
    spec = zero_spec_of(param)
    if spec is not None:
        if spec.group_size != size:
            raise ValueError(
                f"For 'shard_parameter', the parameter {param.name!r} is already sharded over {spec.group_size} "
                f"ranks, but the argument 'group' ({group or world_group()!r}) has {size} ranks."
            )
        return spec
    spec = ShardSpec(param.name, tuple(param.shape), size, rank, is_split_candidate(param))
    if not param.requires_grad:
        return spec
    if spec.split:
        block = split_array(_to_numpy(param), size, rank)
        param.set_data(Tensor(block, dtype=param.dtype))
    set_zero_spec(param, spec)
    return spec


_ITEMSIZE = {ms.float16: 2, ms.bfloat16: 2, ms.float32: 4, ms.float64: 8}
_FLAG_DTYPES = (("fp16", ms.float16), ("bf16", ms.bfloat16), ("fp32", ms.float32))


def compute_dtype_of(cell: nn.Cell):
    """The dtype ``cell.to_float(...)`` set on ``cell`` (float16, bfloat16, float32), or None."""
    flags = cell.get_flags()
    for flag, dtype in _FLAG_DTYPES:
        if flags.get(flag):
            return dtype
    return None


_OUR_FORM = ("group", "compute_dtype")
_MINDONE_FORM = ("zero_stage", "optimizer_parallel_group", "cell_type")
_ALIASES = (("group", "optimizer_parallel_group"), ("compute_dtype", "cell_type"))


def _wrapper_args(args: tuple, kwargs: dict):
    """(zero_stage, group, compute_dtype, names used) from either constructor form of ``ZeroParamWrapper``."""
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
    if dtype is not None and dtype not in _ITEMSIZE:
        raise TypeError(f"For '{owner}', the argument '{name}' must be None or a float dtype, but got {dtype!r}.")


class ZeroParamWrapper(nn.Cell):
    """Gather a ZeRO-3 parameter shard for use in forward; reduce-scatter its gradient in backward.

    Call it from ``construct`` with the shard Parameter as the explicit input, e.g.
    ``w = self.weight_zero_gather(self.weight)``. Forward returns the full tensor (padding rows
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

    Attributes:
        need_rewrite (bool): always False. MindOne's wrapper sets it when the parameter still has
            to be cut by the caller (``param.assign_value(block)``); this wrapper has already cut
            it when it was built, so a MindOne-style layer that cuts when ``need_rewrite`` is True
            leaves the shard alone instead of cutting it a second time.
        is_split (bool): whether the parameter is held as a 1/N block (stage 3, split candidate).
        zero_stage, optimizer_parallel_group, cell_type: the constructor arguments (MindOne's names).

    Raises:
        TypeError: if ``param`` is not a Parameter, ``group`` is not None or a str,
            ``compute_dtype`` is not a MindSpore float type, or the arguments fit neither form.
        ValueError: if ``zero_stage`` is not one of 0, 1, 2, 3.
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
        if self.sharded:
            spec = shard_parameter(param, group)
            self.is_split = spec.split
            self.gather = _GatherShard(spec, param.dtype, group, compute_dtype)

    def construct(self, x):
        """The full tensor of shard ``x``, in the compute dtype (``x`` itself below stage 3)."""
        if not self.sharded:
            return x
        # PYNATIVE keeps the autograd leaf a Parameter got at creation, with its full shape;
        # a custom bprop whose input is that leaf is checked against the stale shape. A same-shape
        # reshape (a view, no copy) gives the custom bprop an input with the shard's real shape.
        return self.gather(x.reshape(x.shape))


class _GatherShard(nn.Cell):
    """The custom-bprop half of ``ZeroParamWrapper``: all-gather forward, reduce-scatter backward."""

    def __init__(self, spec: ShardSpec, param_dtype, group: Optional[str], compute_dtype):
        super().__init__(auto_prefix=False)
        self.param_name = spec.name
        self.full_shape = spec.shape
        self.group_size = spec.group_size
        self.param_dtype = param_dtype
        self.pad = spec.pad
        self.full_rows = spec.shape[0] if spec.shape else 0
        self.compute_dtype = param_dtype if compute_dtype is None else compute_dtype
        narrower = _ITEMSIZE.get(self.compute_dtype, 4) < _ITEMSIZE.get(param_dtype, 4)
        self.cast_before_gather = narrower
        self.cast_after_gather = not narrower and self.compute_dtype != param_dtype
        # A split parameter in a group of one is already whole; no collective is needed.
        self.gathers = spec.split and spec.group_size > 1
        self.comm = GroupComm(group) if self.gathers else None

    def construct(self, x):
        if self.cast_before_gather:
            x = x.astype(self.compute_dtype)
        if self.gathers:
            x = self.comm.all_gather(x)
            if self.pad > 0:
                x = x[:self.full_rows]
        if self.cast_after_gather:
            x = x.astype(self.compute_dtype)
        return x

    def bprop(self, x, out, dout):
        """Gradient of the shard: this rank's block of the group mean, in the parameter's dtype."""
        grad = dout.astype(self.param_dtype)
        if self.gathers:
            grad = pad_dim0(grad, self.pad)
            grad = self.comm.reduce_scatter(grad) / self.group_size
        return (grad,)

    def extend_repr(self):
        return (f"param={self.param_name}, full_shape={self.full_shape}, group_size={self.group_size}, "
                f"compute_dtype={self.compute_dtype}, gathers={self.gathers}")
