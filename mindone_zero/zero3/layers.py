"""ZeRO-3 Cells for the common layers, and ``PARALLEL_MODULES`` mapping originals to them.

Each Cell is built from an existing layer (``Dense(net)``) and takes over its Parameters and child
Cells; ``ZeroCell`` gives the constructor contract (MindOne's) and what is kept. Its ``construct``
gathers every parameter (``<name>_zero_gather``, or one coalesced group) and computes what the
original layer computes. ``to_float`` flags of ``net`` are copied onto the new Cell, not onto its
gather wrappers, which cast explicitly. mint Conv and Embedding kernels do not exist on MindSpore's
CPU backend (2.10); their ZeRO-3 Cells are built and checked structurally there and run on
Ascend/GPU.
"""
from collections.abc import Mapping
from typing import Optional

from mindspore import mint, nn, ops

from ..core.group_alias import group_argument
from ..core.ms_internals import (RECOMPUTE_WRAPPER, child_cells, mark_recomputed_child, mint_conv_reversed_padding,
                                  own_params)
from ..core.partition import zero_spec_of
from ..core.stage import StagePolicy, check_stage
from ..core.to_float import compute_dtype_of

from .direct_reads import gather_attrs, source_indirect_reads
from .layer_gathers import LayerGathers
from .carry import carry_cell_state, check_carryable, is_recompute_scoped, reapply_recompute, recompute_options
from .param_wrapper import check_compute_dtype, check_group

__all__ = ["Dense", "Linear", "Conv1d", "Conv2d", "Conv3d", "Mint_Conv2d", "Mint_Conv3d", "Embedding", "ZeroCell",
           "PARALLEL_MODULES"]


class ZeroCell(LayerGathers, nn.Cell):
    """Base of the ZeRO-3 layer Cells, and the constructor contract of MindOne-style layers.

    Every class in ``PARALLEL_MODULES``, and every class you map in the ``parallel_modules`` or
    ``special_cases_parallel_module`` argument of ``prepare_network``, ``prepare_train_network`` or
    ``shard_network``, is built as ``Cls(net, zero_stage=0, optimizer_parallel_group=None,
    cell_type=None)``: MindOne's order and defaults (``shard_network`` calls ``Cls(cell, 3,
    group)``). A class of your own need not derive from ``ZeroCell``: it must take that constructor
    and gather each split parameter it reads through a ``ZeroParamWrapper`` (whose example is such a
    layer).

    The library's ZeRO-3 Cells (``Dense``, ``Linear``, ``Conv1d`` to ``Conv3d``, ``Embedding``)
    derive from it and take over ``net``:

    * ``zero_stage == 3``: the parameters are sharded in place over ``optimizer_parallel_group``
      and ``construct`` gathers them (``<name>_zero_gather``, a ``ZeroParamWrapper`` returning
      ``cell_type``). Calling it is collective over the group.
    * ``zero_stage < 3``: a no-op as in MindOne: nothing is sharded, the gather attributes are
      identities, and the Cell computes exactly what ``net`` computes.

    Either way the Cell keeps the same Parameter objects under the same attribute names (so
    names and checkpoints match) and what the user set on ``net`` ([Note: carried state] in
    ``carry.py``): flags such as ``to_float``, train/grad mode, hooks, plain attributes, extra
    parameters and child Cells, and ``recompute()``, re-applied around the new ``construct``.
    ``shard_network`` does not rewrite the ``construct`` of a ZeroCell: it gathers its parameters
    itself. A ZeroCell is not an instance of the layer it replaces (``isinstance(layer, nn.Dense)``
    is False), on purpose: a library that picks layers by type (PEFT's LoRA) would read their
    weights outside a graph, where they are shards. Apply such a library before sharding.

    Args:
        net (nn.Cell): the layer to take over, of a type the class accepts (``PARALLEL_MODULES``
            lists them: ``nn.Dense`` for ``Dense``, ``nn.Conv2d`` or ``mint.nn.Conv2d`` for
            ``Conv2d``, ...).
        zero_stage (int): 0-3; 3 shards the parameters, below 3 the Cell computes what ``net``
            computes.
        optimizer_parallel_group (str): the group the parameters are sharded over; None
            (default): the world group.
        cell_type (mindspore.dtype): the dtype the gathered parameters are returned in; None
            (default): ``net``'s ``to_float`` dtype, else the parameter's.
        op_group (str): keyword-only alias of ``optimizer_parallel_group`` (MindOne 0.2.0's name);
            give one or the other.

    Raises:
        TypeError: if ``net`` is not one of the accepted layer types, the group is not None or a
            str, ``cell_type`` is not a float dtype, or both group keywords are given.
        ValueError: if ``zero_stage`` is not one of 0, 1, 2, 3, or ``net`` holds state that cannot
            be carried over (``Cell.shard``). All checks run before anything is modified.

    Examples:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from parallel_modules import Dense
        >>> dense = nn.Dense(4, 3, activation="relu")
        >>> x = ms.Tensor(np.ones((2, 4), np.float32))
        >>> expected = dense(x).asnumpy()
        >>> layer = Dense(dense, zero_stage=3)     # one process: a group of one rank
        >>> layer.weight is dense.weight, layer.weight.zero_spec.split
        (True, True)
        >>> bool(np.allclose(layer(x).asnumpy(), expected))
        True

        Your own class for a layer of your own, used at stage 3 on every rank
        (tests/dist/test_mindone_dropin.py runs a script with such a class):

        >>> train_net = prepare_train_network(loss_net, optimizer, zero_stage=3,
        ...                                   parallel_modules={MyLayer: ZeroMyLayer})
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
        for attr, param in own_params(net).items():
            setattr(self, attr, param)
        for attr, child in child_cells(net).items():
            if attr not in self.child_cells and attr != RECOMPUTE_WRAPPER:
                setattr(self, attr, child)
        for attr in param_attrs:
            setattr(self, attr, getattr(net, attr, None))
        self._build_gathers(group, cell_type)
        self._build(net)
        carry_cell_state(net, self)
        options = recompute_options(net)
        if options is not None:
            reapply_recompute(self, options)
        elif is_recompute_scoped(self):
            mark_recomputed_child(self)

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
        group = group_argument(name, group, op_group)
        check_group(name, "optimizer_parallel_group", group)
        check_compute_dtype(name, "cell_type", cell_type)
        check_carryable(name, net)
        return group

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
    """ZeRO-3 ``nn.Dense``: ``y = activation(x @ W.T + b)`` with W and b gathered.

    Parameters, contract and errors: [ZeroCell][mindone_zero.zero3.layers.ZeroCell]'s.

    Examples:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from parallel_modules import Dense
        >>> layer = nn.Dense(4, 3)
        >>> x = ms.Tensor(np.ones((2, 4), np.float32))
        >>> expected = layer(x).asnumpy()
        >>> bool(np.allclose(Dense(layer, zero_stage=3)(x).asnumpy(), expected))
        True
    """

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
    """ZeRO-3 ``mint.nn.Linear`` and ``nn.Linear``: ``y = x @ W.T + b`` with W and b gathered.

    Parameters, contract and errors: [ZeroCell][mindone_zero.zero3.layers.ZeroCell]'s.

    Examples:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import mint
        >>> from parallel_modules import Linear
        >>> layer = mint.nn.Linear(4, 3)
        >>> x = ms.Tensor(np.ones((2, 4), np.float32))
        >>> expected = layer(x).asnumpy()
        >>> bool(np.allclose(Linear(layer, zero_stage=3)(x).asnumpy(), expected))
        True
    """

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
    (``mint_class``) their functional op and padding config."""

    nn_attrs = ()
    mint_attrs = ("padding_mode", "stride", "padding", "dilation", "groups")
    mint_op = ""
    mint_class = None

    def _build(self, net):
        self.is_mint = isinstance(net, self.mint_class)
        if self.is_mint:
            self.reversed_padding = mint_conv_reversed_padding(net)

    def _layout(self, net):
        if isinstance(net, self.mint_class):
            return self.mint_attrs + (self.mint_op,), self.param_attrs
        return self.nn_attrs, self.param_attrs

    def _mint_bias(self, x):
        if self.bias is None:
            return None
        return self.bias_zero_gather(self.bias, x)


class Conv1d(_Conv):
    """ZeRO-3 ``nn.Conv1d`` and ``mint.nn.Conv1d``, weight and bias gathered.

    Parameters, contract and errors: [ZeroCell][mindone_zero.zero3.layers.ZeroCell]'s.

    Examples:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from parallel_modules import Conv1d
        >>> layer = nn.Conv1d(3, 8, 3, has_bias=True)
        >>> x = ms.Tensor(np.ones((1, 3, 16), np.float32))
        >>> expected = layer(x).asnumpy()
        >>> bool(np.allclose(Conv1d(layer, zero_stage=3)(x).asnumpy(), expected))
        True
    """

    accepts = (nn.Conv1d, mint.nn.Conv1d)
    mint_class = mint.nn.Conv1d
    nn_attrs = ("conv2d", "bias_add", "expand_dims", "squeeze", "has_bias")
    mint_op = "conv1d"

    def construct(self, x):
        weight = self.weight_zero_gather(self.weight, x)
        if self.is_mint:
            if self.padding_mode != "zeros":
                return self.conv1d(mint.nn.functional.pad(x, self.reversed_padding, mode=self.padding_mode),
                                   weight, self._mint_bias(x), self.stride, (0,), self.dilation, self.groups)
            return self.conv1d(x, weight, self._mint_bias(x), self.stride, self.padding, self.dilation, self.groups)
        out = self.conv2d(self.expand_dims(x, 2), weight)
        if self.has_bias:
            out = self.bias_add(out, self.bias_zero_gather(self.bias, x))
        return self.squeeze(out)


class Conv2d(_Conv):
    """ZeRO-3 ``nn.Conv2d`` and ``mint.nn.Conv2d``, weight and bias gathered.

    Parameters, contract and errors: [ZeroCell][mindone_zero.zero3.layers.ZeroCell]'s.

    Examples:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from parallel_modules import Conv2d
        >>> layer = nn.Conv2d(3, 8, 3)
        >>> x = ms.Tensor(np.ones((1, 3, 8, 8), np.float32))
        >>> expected = layer(x).asnumpy()
        >>> bool(np.allclose(Conv2d(layer, zero_stage=3)(x).asnumpy(), expected))
        True
    """

    accepts = (nn.Conv2d, mint.nn.Conv2d)
    mint_class = mint.nn.Conv2d
    nn_attrs = ("conv2d", "bias_add", "has_bias")
    mint_op = "conv2d"

    def construct(self, x):
        weight = self.weight_zero_gather(self.weight, x)
        if self.is_mint:
            if self.padding_mode != "zeros":
                return self.conv2d(mint.nn.functional.pad(x, self.reversed_padding, mode=self.padding_mode),
                                   weight, self._mint_bias(x), self.stride, (0, 0), self.dilation, self.groups)
            return self.conv2d(x, weight, self._mint_bias(x), self.stride, self.padding, self.dilation, self.groups)
        out = self.conv2d(x, weight)
        if self.has_bias:
            out = self.bias_add(out, self.bias_zero_gather(self.bias, x))
        return out


class Conv3d(_Conv):
    """ZeRO-3 ``nn.Conv3d`` and ``mint.nn.Conv3d``, weight and bias gathered.

    Parameters, contract and errors: [ZeroCell][mindone_zero.zero3.layers.ZeroCell]'s.

    Examples:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from parallel_modules import Conv3d
        >>> layer = nn.Conv3d(2, 4, 3)
        >>> x = ms.Tensor(np.ones((1, 2, 6, 6, 6), np.float32))
        >>> expected = layer(x).asnumpy()
        >>> bool(np.allclose(Conv3d(layer, zero_stage=3)(x).asnumpy(), expected))
        True
    """

    accepts = (nn.Conv3d, mint.nn.Conv3d)
    mint_class = mint.nn.Conv3d
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
                return self.conv3d(mint.nn.functional.pad(x, self.reversed_padding, mode=self.padding_mode),
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


class Mint_Conv2d(Conv2d):
    """ZeRO-3 ``mint.nn.Conv2d``: MindOne 0.3.0+'s name (``mindone.models.modules.parallel.Mint_Conv2d``).

    ``Conv2d`` restricted to ``mint.nn.Conv2d``, with the same constructor
    ``(net, zero_stage=0, optimizer_parallel_group=None, cell_type=None)`` and the same computation.
    A subclass rather than an alias, because MindOne's ``Mint_Conv2d`` computes only a mint
    convolution: an ``nn.Conv2d`` given to it is refused here when it is built (``TypeError``), not
    when the graph compiles; ``PARALLEL_MODULES[mint.nn.Conv2d]`` is this class, as in MindOne, and
    ``isinstance(cell, Conv2d)`` still holds. mint convolution kernels do not exist on MindSpore's
    CPU backend (2.10): on CPU it is built, not run.

    Examples:
        >>> from mindspore import mint
        >>> from parallel_modules import Conv2d, Mint_Conv2d
        >>> layer = Mint_Conv2d(mint.nn.Conv2d(3, 8, 3), zero_stage=3)
        >>> isinstance(layer, Conv2d), layer.weight.shape
        (True, (8, 3, 3, 3))
    """

    accepts = (mint.nn.Conv2d,)


class Mint_Conv3d(Conv3d):
    """ZeRO-3 ``mint.nn.Conv3d``: MindOne 0.3.0+'s name (``mindone.models.modules.parallel.Mint_Conv3d``).

    ``Conv3d`` restricted to ``mint.nn.Conv3d``, for the reasons ``Mint_Conv2d`` gives.

    Examples:
        >>> from mindspore import mint
        >>> from parallel_modules import Conv3d, Mint_Conv3d
        >>> layer = Mint_Conv3d(mint.nn.Conv3d(2, 4, 3), zero_stage=3)
        >>> isinstance(layer, Conv3d), layer.weight.shape
        (True, (4, 2, 3, 3, 3))
    """

    accepts = (mint.nn.Conv3d,)


class Embedding(ZeroCell):
    """ZeRO-3 ``nn.Embedding`` (parameter ``embedding_table``) and ``mint.nn.Embedding``
    (parameter ``weight``) with the table gathered.

    Parameters, contract and errors: [ZeroCell][mindone_zero.zero3.layers.ZeroCell]'s, and:

    Raises:
        ValueError: at stage 3, for a ``mint.nn.Embedding`` with ``max_norm``: it renormalises the
            table in place, which a gathered copy cannot do.

    Examples:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from parallel_modules import Embedding
        >>> table = nn.Embedding(10, 4)
        >>> ids = ms.Tensor(np.array([[1, 2, 7]], np.int32))
        >>> layer = Embedding(table, zero_stage=3)
        >>> layer(ids).shape, layer.embedding_table is table.embedding_table
        ((1, 3, 4), True)
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


class _ReadOnlyModules(Mapping):
    """A mapping that cannot change: ``PARALLEL_MODULES``. Setting or deleting a key raises a
    ``TypeError`` that names the argument that extends it for one call."""

    def __init__(self, mapping: dict):
        self._mapping = dict(mapping)

    def __getitem__(self, key):
        return self._mapping[key]

    def __iter__(self):
        return iter(self._mapping)

    def __len__(self):
        return len(self._mapping)

    def __repr__(self):
        return repr(self._mapping)

    def copy(self) -> dict:
        """A plain dict of the mapping, to change and pass as ``parallel_modules``."""
        return dict(self._mapping)

    def _refuse(self, *args):
        raise TypeError(
            "PARALLEL_MODULES is read-only: pass your own {original Cell class: ZeRO-3 Cell class} as the "
            "argument 'parallel_modules' of shard_network, prepare_network or prepare_train_network, which "
            f"extends it for that call; got a change with {args!r}."
        )

    __setitem__ = __delitem__ = _refuse


def _default_modules() -> Mapping:
    mapping = {nn.Dense: Dense, nn.Linear: Linear, mint.nn.Linear: Linear}
    for cls in (Conv1d, Conv2d, Conv3d, Mint_Conv2d, Mint_Conv3d, Embedding):  # later ones win, as in MindOne
        for original in cls.accepts:
            mapping[original] = cls
    return _ReadOnlyModules(mapping)


# tests/unit/test_docs_api.py checks the table in this docstring against the mapping.
PARALLEL_MODULES = _default_modules()
"""``{original Cell class: ZeRO-3 Cell class}``, MindOne's ``PARALLEL_MODULES``, read-only.

``shard_network`` (and so ``prepare_network`` and ``prepare_train_network`` at stage 3) replaces
each Cell whose type is exactly a key by its value, built as ``ZeroCell`` says; subclasses go
through the generic path, which keeps their own ``construct`` and methods. A ``parallel_modules``
dict given to those functions extends or overrides it for that call; the mapping itself cannot be
changed (setting a key raises a ``TypeError``), so one network's classes never leak into the
next. The mapping:

| original Cell class | ZeRO-3 Cell class |
|---|---|
| ``nn.Dense`` | ``parallel_modules.Dense`` |
| ``mint.nn.Linear`` | ``parallel_modules.Linear`` |
| ``nn.Conv1d`` | ``parallel_modules.Conv1d`` |
| ``mint.nn.Conv1d`` | ``parallel_modules.Conv1d`` |
| ``nn.Conv2d`` | ``parallel_modules.Conv2d`` |
| ``mint.nn.Conv2d`` | ``parallel_modules.Mint_Conv2d`` |
| ``nn.Conv3d`` | ``parallel_modules.Conv3d`` |
| ``mint.nn.Conv3d`` | ``parallel_modules.Mint_Conv3d`` |
| ``nn.Embedding`` | ``parallel_modules.Embedding`` |
| ``mint.nn.Embedding`` | ``parallel_modules.Embedding`` |

(MindSpore 2.10's ``nn.Linear`` is ``mint.nn.Linear``.)
"""
