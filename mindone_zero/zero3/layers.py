"""ZeRO-3 Cells for the common layers, and ``PARALLEL_MODULES`` mapping originals to them.

Each ZeRO-3 Cell is built from an existing layer (``Dense(net)``) and takes over its Parameters:
the same Parameter objects under the same attribute names (``weight``/``bias``, or
``embedding_table`` for ``nn.Embedding``), so parameter names, and therefore checkpoints, are the
same before and after wrapping. Its ``construct`` gathers every parameter through a
``ZeroParamWrapper`` (attribute ``<name>_zero_gather``) and computes what the original layer
computes. Child Cells of the original (``nn.Dense``'s activation) are kept as children.

The constructor signature follows MindOne's ``mindone.models.modules.parallel`` Cells:
``Cls(net, zero_stage=0, optimizer_parallel_group=None, cell_type=None)`` (``op_group=`` is a
keyword alias of the group); below stage 3 the Cell is a no-op wrapper computing what ``net``
computes. ``cell_type`` is the compute dtype (None: taken from ``net.to_float(...)``, else the
parameter dtype). ``to_float`` flags of ``net`` are copied onto the new Cell (not onto its
gather wrappers, which cast explicitly), so inputs are cast as before. At stage 3 building one
shards its parameters in place (``shard_parameter``) and calling it is collective over the group.

mint Conv and Embedding kernels do not exist on MindSpore's CPU backend (2.10); their ZeRO-3
Cells are built and checked structurally there and run on Ascend/GPU.
"""
from typing import Optional

from mindspore import mint, nn, ops

from ..core.partition import zero_spec_of
from ..core.stage import StagePolicy, check_stage

from .coalesce import build_gather_group
from .direct_reads import gather_attrs, source_indirect_reads
from .carry import carry_cell_state, check_carryable, is_recompute_scoped, reapply_recompute, recompute_options
from .param_wrapper import (ZeroParamWrapper, check_compute_dtype, check_group, compute_dtype_of,
                            gather_attr_name)

__all__ = ["Dense", "Linear", "Conv1d", "Conv2d", "Conv3d", "Embedding", "ZeroCell", "PARALLEL_MODULES"]


class ZeroCell(nn.Cell):
    """Base of the ZeRO-3 layer Cells: takes over ``net``'s parameters, children and settings.

    ``Cls(net, zero_stage=0, optimizer_parallel_group=None, cell_type=None)``, MindOne's order
    and defaults; ``op_group=`` is accepted as a keyword alias of ``optimizer_parallel_group``.

    * ``zero_stage == 3``: the parameters are sharded in place over ``optimizer_parallel_group``
      (None: the world group) and ``construct`` gathers them (``<name>_zero_gather``, a
      ``ZeroParamWrapper`` returning ``cell_type``; None: ``net``'s ``to_float`` dtype, else the
      parameter's). Calling it is collective over the group.
    * ``zero_stage < 3``: a no-op as in MindOne: nothing is sharded, the gather attributes are
      identities, and the Cell computes exactly what ``net`` computes.

    Either way the Cell keeps the same Parameter objects under the same attribute names (so
    names and checkpoints match) and what the user set on ``net`` ([Note: carried state] in
    ``carry.py``): flags such as ``to_float``, train/grad mode, hooks, plain attributes, extra
    parameters and child Cells, and ``recompute()``, re-applied around the new ``construct``.
    ``shard_network`` does not rewrite the ``construct`` of a ZeroCell: it gathers its parameters
    itself.

    Raises:
        TypeError: if ``net`` is not one of the accepted layer types, the group is not None or a
            str, ``cell_type`` is not a float dtype, or both group keywords are given.
        ValueError: if ``zero_stage`` is not one of 0, 1, 2, 3, or ``net`` holds state that cannot
            be carried over (``Cell.shard``). All checks run before anything is modified.
    """

    zero3_gathers_itself = True
    coalesces = False  # construct reads zero_gather_group when zero_coalesce ([Note: coalesced gathers])
    accepts = ()
    copy_attrs = ()
    child_cells = ()
    param_attrs = ("weight", "bias")

    def __init__(self, net: nn.Cell, zero_stage: int = 0, optimizer_parallel_group: Optional[str] = None,
                 cell_type=None, *, op_group: Optional[str] = None):
        # auto_prefix=False: taking over child Cells must not rename their parameters.
        super().__init__(auto_prefix=False)
        group = self._check_args(net, zero_stage, optimizer_parallel_group, cell_type, op_group)
        copy_attrs, param_attrs = self._layout(net)
        cell_type = compute_dtype_of(net) if cell_type is None else cell_type
        self.zero_stage = zero_stage
        self.optimizer_parallel_group = group
        for attr in copy_attrs:
            setattr(self, attr, getattr(net, attr))
        for attr in self.child_cells:
            setattr(self, attr, getattr(net, attr, None))
        self.zero3_param_attrs = param_attrs
        for attr, param in net._params.items():
            setattr(self, attr, param)
        for attr, child in net._cells.items():
            if attr not in self.child_cells and attr != "_recompute_cell":
                setattr(self, attr, child)
        for attr in param_attrs:
            param = getattr(net, attr, None)
            setattr(self, attr, param)
            if param is not None:
                setattr(self, gather_attr_name(attr), ZeroParamWrapper(param, zero_stage, group, cell_type))
        self._build_gather_group(param_attrs)
        self._build(net)
        carry_cell_state(net, self)
        options = recompute_options(net)
        if options is not None:
            reapply_recompute(self, options)
        elif is_recompute_scoped(self):
            self._recompute(False, True)

    def zero3_indirect_reads_of_code(self) -> list:
        """[Note: direct reads] of this layer's ``construct`` (empty: every gathered tensor goes
        straight to its op, so ``reshard_after_forward`` re-gathers it without recomputing the layer)."""
        return source_indirect_reads(self, gather_attrs(self))

    def _check_args(self, net, zero_stage, group, cell_type, op_group) -> Optional[str]:
        name = type(self).__name__
        if not isinstance(net, self.accepts):
            accepted = [f"{c.__module__}.{c.__name__}" for c in self.accepts]
            raise TypeError(f"For '{name}', the argument 'net' must be one of {accepted}, but got {type(net)}.")
        check_stage(zero_stage, name)
        if op_group is not None and group is not None:
            raise TypeError(
                f"For '{name}', the arguments 'optimizer_parallel_group' and 'op_group' are aliases; pass one, but "
                f"got {group!r} and {op_group!r}."
            )
        group = op_group if group is None else group
        check_group(name, "optimizer_parallel_group", group)
        check_compute_dtype(name, "cell_type", cell_type)
        check_carryable(name, net)
        return group

    def _build_gather_group(self, param_attrs):
        # [Note: coalesced gathers] in coalesce.py: all the split parameters in one all-gather, or none
        # (none with ZeRO++ options: [Note: ZeRO++ at build] in param_wrapper.py).
        self.zero_gather_group = None
        self.zero_coalesce = False
        if self.coalesces and StagePolicy(self.zero_stage).shards_params:
            wrappers = [getattr(self, gather_attr_name(a)) for a in param_attrs if getattr(self, a, None) is not None]
            self.zero_gather_group = build_gather_group(wrappers)
            self.zero_coalesce = self.zero_gather_group is not None

    def gather_cells(self) -> list:
        """The gather Cells ``construct`` calls: the coalesced group when the Cell coalesces ([Note:
        coalesced gathers]), else the per-parameter wrappers; the others are built and never called.
        Not collective."""
        if self.zero_coalesce:
            return [self.zero_gather_group]
        return [getattr(self, gather_attr_name(a)) for a in self.zero3_param_attrs
                if getattr(self, a, None) is not None]

    def _build(self, net):
        """Subclass hook: set up the Cell's own primitives (after the parameters are taken over)."""

    def _layout(self, net):
        """(config attributes to copy, parameter attributes to take over) for ``net``."""
        return self.copy_attrs, self.param_attrs

    def extend_repr(self):
        parts = []
        for attr in self.zero3_param_attrs:
            param = getattr(self, attr, None)
            spec = zero_spec_of(param) if param is not None else None
            if spec is not None:
                parts.append(f"{attr}={spec.shape} split={spec.split} over {spec.group_size}")
        return ", ".join(parts)


class Dense(ZeroCell):
    """ZeRO-3 ``nn.Dense``: ``y = activation(x @ W.T + b)`` with W and b gathered. See ``ZeroCell``."""

    accepts = (nn.Dense,)
    copy_attrs = ("in_channels", "out_channels", "has_bias", "activation_flag")
    child_cells = ("activation",)
    coalesces = True

    def _build(self, net):
        self.matmul = ops.MatMul(transpose_b=True)
        self.bias_add = ops.BiasAdd()

    def construct(self, x):
        x_shape = x.shape
        if len(x_shape) != 2:
            x = x.reshape(-1, x_shape[-1])
        if self.zero_coalesce:
            weight, bias = self.zero_gather_group.waiting_for(x, self.weight, self.bias)  # [Note: gather order]
            x = self.bias_add(self.matmul(x, weight), bias)
        else:
            out = self.matmul(x, self.weight_zero_gather(self.weight, x))
            if self.has_bias:
                out = self.bias_add(out, self.bias_zero_gather(self.bias, x))
            x = out
        if self.activation_flag:
            x = self.activation(x)
        if len(x_shape) != 2:
            x = x.reshape(x_shape[:-1] + (x.shape[-1],))
        return x


class Linear(ZeroCell):
    """ZeRO-3 ``mint.nn.Linear`` (``nn.Linear``): ``y = x @ W.T + b`` with W and b gathered."""

    accepts = (nn.Linear, mint.nn.Linear)
    copy_attrs = ("in_features", "out_features", "has_bias")
    coalesces = True

    def _build(self, net):
        self.dense = ops.Dense()

    def construct(self, x):
        if self.zero_coalesce:
            weight, bias = self.zero_gather_group.waiting_for(x, self.weight, self.bias)  # [Note: gather order]
            return self.dense(x, weight, bias)
        weight = self.weight_zero_gather(self.weight, x)
        if self.has_bias:
            return self.dense(x, weight, self.bias_zero_gather(self.bias, x))
        return self.dense(x, weight, None)


class _Conv(ZeroCell):
    """Shared init of the ZeRO-3 convolutions: ``nn.ConvNd`` keep their primitives, ``mint.nn.ConvNd``
    their functional op and padding config."""

    nn_attrs = ()
    mint_attrs = ("padding_mode", "_reversed_padding", "stride", "padding", "dilation", "groups")
    mint_op = ""

    def _build(self, net):
        self.is_mint = isinstance(net, self.accepts[1])

    def _layout(self, net):
        if isinstance(net, self.accepts[1]):
            return self.mint_attrs + (self.mint_op,), self.param_attrs
        return self.nn_attrs, self.param_attrs

    def _mint_bias(self, x):
        if self.bias is None:
            return None
        return self.bias_zero_gather(self.bias, x)


class Conv1d(_Conv):
    """ZeRO-3 ``nn.Conv1d`` and ``mint.nn.Conv1d`` with weight and bias gathered."""

    accepts = (nn.Conv1d, mint.nn.Conv1d)
    nn_attrs = ("conv2d", "bias_add", "expand_dims", "squeeze", "has_bias")
    mint_op = "conv1d"

    def construct(self, x):
        weight = self.weight_zero_gather(self.weight, x)
        if self.is_mint:
            if self.padding_mode != "zeros":
                return self.conv1d(mint.nn.functional.pad(x, self._reversed_padding, mode=self.padding_mode),
                                   weight, self._mint_bias(x), self.stride, (0,), self.dilation, self.groups)
            return self.conv1d(x, weight, self._mint_bias(x), self.stride, self.padding, self.dilation, self.groups)
        out = self.conv2d(self.expand_dims(x, 2), weight)
        if self.has_bias:
            out = self.bias_add(out, self.bias_zero_gather(self.bias, x))
        return self.squeeze(out)


class Conv2d(_Conv):
    """ZeRO-3 ``nn.Conv2d`` and ``mint.nn.Conv2d`` with weight and bias gathered."""

    accepts = (nn.Conv2d, mint.nn.Conv2d)
    nn_attrs = ("conv2d", "bias_add", "has_bias")
    mint_op = "conv2d"

    def construct(self, x):
        weight = self.weight_zero_gather(self.weight, x)
        if self.is_mint:
            if self.padding_mode != "zeros":
                return self.conv2d(mint.nn.functional.pad(x, self._reversed_padding, mode=self.padding_mode),
                                   weight, self._mint_bias(x), self.stride, (0, 0), self.dilation, self.groups)
            return self.conv2d(x, weight, self._mint_bias(x), self.stride, self.padding, self.dilation, self.groups)
        out = self.conv2d(x, weight)
        if self.has_bias:
            out = self.bias_add(out, self.bias_zero_gather(self.bias, x))
        return out


class Conv3d(_Conv):
    """ZeRO-3 ``nn.Conv3d`` and ``mint.nn.Conv3d`` with weight and bias gathered."""

    accepts = (nn.Conv3d, mint.nn.Conv3d)
    nn_attrs = ("conv3d", "bias_add", "has_bias", "group", "split_0", "split_1", "concat", "out_channels")
    mint_op = "conv3d"

    def zero3_indirect_reads_of_code(self) -> list:
        # [Note: direct reads]: only the grouped nn.Conv3d path transforms its gathered tensors.
        if self.is_mint or self.group == 1:
            return []
        return [f"Conv3d(group={self.group}) splits the gathered weight by group and reshapes the gathered bias"]

    def construct(self, x):
        weight = self.weight_zero_gather(self.weight, x)
        if self.is_mint:
            if self.padding_mode != "zeros":
                return self.conv3d(mint.nn.functional.pad(x, self._reversed_padding, mode=self.padding_mode),
                                   weight, self._mint_bias(x), self.stride, (0, 0, 0), self.dilation, self.groups)
            return self.conv3d(x, weight, self._mint_bias(x), self.stride, self.padding, self.dilation, self.groups)
        if self.group == 1:
            out = self.conv3d(x, weight)
            if self.has_bias:
                out = self.bias_add(out, self.bias_zero_gather(self.bias, x))
            return out
        features = self.split_1(x)
        weights = self.split_0(weight)
        outputs = ()
        for i in range(self.group):
            outputs = outputs + (self.conv3d(features[i], weights[i]),)
        out = self.concat(outputs)
        if self.has_bias:
            shape = (1, self.out_channels) + (1,) * (out.ndim - 2)
            out = out + self.bias_zero_gather(self.bias, x).reshape(shape)
        return out


class Embedding(ZeroCell):
    """ZeRO-3 ``nn.Embedding`` (parameter ``embedding_table``) and ``mint.nn.Embedding``
    (parameter ``weight``) with the table gathered.

    Raises:
        ValueError: at stage 3, for a ``mint.nn.Embedding`` with ``max_norm``: it renormalises the
            table in place, which a gathered copy cannot do.
    """

    accepts = (nn.Embedding, mint.nn.Embedding)

    def _check_args(self, net, zero_stage, group, cell_type, op_group):
        if StagePolicy(zero_stage).shards_params and isinstance(net, mint.nn.Embedding) and getattr(net, "max_norm", None) is not None:
            raise ValueError(
                f"For 'Embedding', the argument 'net' must have max_norm None at ZeRO-3 (it renormalises "
                f"the table in place), but got max_norm={net.max_norm}."
            )
        return super()._check_args(net, zero_stage, group, cell_type, op_group)

    def _build(self, net):
        self.is_mint = isinstance(net, mint.nn.Embedding)

    def _layout(self, net):
        if isinstance(net, mint.nn.Embedding):
            return (("num_embeddings", "embedding_dim", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq"),
                    ("weight",))
        return ("vocab_size", "embedding_size", "use_one_hot", "on_value", "off_value", "one_hot", "array_mul",
                "gather", "padding_idx"), ("embedding_table",)

    def construct(self, ids):
        if self.is_mint:
            return ops.embedding(ids, self.weight_zero_gather(self.weight, ids), self.padding_idx, self.max_norm,
                                 self.norm_type, self.scale_grad_by_freq)
        table = self.embedding_table_zero_gather(self.embedding_table, ids)
        out_shape = ids.shape + (self.embedding_size,)
        flat_ids = ids.reshape(-1)
        if self.use_one_hot:
            out = self.array_mul(self.one_hot(flat_ids, self.vocab_size, self.on_value, self.off_value), table)
        else:
            out = self.gather(table, flat_ids, 0)
        return out.reshape(out_shape)


def _default_modules() -> dict:
    mapping = {nn.Dense: Dense, nn.Linear: Linear, mint.nn.Linear: Linear}
    for cls in (Conv1d, Conv2d, Conv3d, Embedding):
        for original in cls.accepts:
            mapping[original] = cls
    return mapping


PARALLEL_MODULES = _default_modules()
"""{original Cell class: ZeRO-3 Cell class}. ``shard_network`` replaces Cells whose type is exactly
a key (subclasses go through the generic path, which keeps their own ``construct`` and methods).
A user's ``parallel_modules`` dict extends or overrides it."""
