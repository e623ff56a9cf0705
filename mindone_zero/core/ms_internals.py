"""MindSpore's private API: every use the package makes of it, and nothing else. Not collective.

[Note: MindSpore internals]
MindSpore has no public way to do some of what ZeRO needs: replace a child Cell without renaming
its parameters, read back what ``recompute()`` stored, hand a replacement its original's hooks, make
a Parameter without its data in one thread only. Those places reach into MindSpore's private
attributes and modules, and a MindSpore upgrade breaks them first. They are reached only through
this module (tests/unit/test_ms_internals.py checks that no other module of ``mindone_zero`` or
``parallel_modules`` touches a private MindSpore name), each through a small function or constant,
and ``INTERNALS`` lists each one: what it is, where MindSpore ``MINDSPORE_VERSION`` has it, and what
breaks without it. ``problem(internal)`` says whether the installed MindSpore still has it;
the test runs it for every entry, so an upgrade that moves one names it and where to look.

Development tools keep their own uses, listed here too (``tools/dev/compile_census_hook`` times
MindSpore's graph executors; ``tools/dev/msrun_other_host.py`` replaces msrun's local-address check).
"""
import contextlib
import importlib
import inspect
import threading
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import mindspore
from mindspore import Parameter, Tensor, lazy_inline, mint, nn
from mindspore._c_expression import MSContext
from mindspore.common.initializer import initializer
from mindspore.common.recompute import _RecomputeCell, null_context_fn
from mindspore.graph.api import _run_in_jit
from mindspore.graph.jit_context import jit_context
from mindspore.ops.operations import _inner_ops
from mindspore.parallel._utils import _get_parallel_mode

__all__ = ["MINDSPORE_VERSION", "Internal", "INTERNALS", "problem", "child_cells", "set_child", "own_params",
           "cell_member", "buffers", "RECOMPUTE_WRAPPER", "recompute_wrapper", "recompute_call_options",
           "is_null_recompute_context", "forget_recompute", "has_config_recompute",
           "in_recompute_scope", "mark_recomputed_child", "CARRIED_CELL_STATE", "SHARED_HOOK_STATE",
           "LAZY_STATE_PREFIX", "bind_backward_hooks", "has_shard_fn", "lazy_inline_key", "mint_conv_reversed_padding",
           "OPTIMIZER_PARAMETERS", "optimizer_parameters", "parallel_mode", "ascend_soc_supports_feature",
           "init_tensor", "forget_init_tensor", "parameter_base_class", "parameter_subclass",
           "parameters_without_data", "in_compiled_graph"]

MINDSPORE_VERSION = "2.10.0"  # every internal below was read from this version's source

# ---------------------------------------------------------------------------- a Cell's members


def child_cells(cell: nn.Cell) -> dict:
    """``cell``'s own child Cells by attribute name (the live dict: None entries, and MindSpore's
    recompute wrapper under ``RECOMPUTE_WRAPPER``, included)."""
    return cell._cells


def set_child(parent: nn.Cell, name: str, child: nn.Cell) -> None:
    """Put ``child`` in ``parent``'s place ``name`` without renaming its parameters (which
    ``Cell.__setattr__`` would do), keeping a ``SequentialCell``'s list in step."""
    parent._cells[name] = child
    if isinstance(parent, nn.SequentialCell):
        parent.cell_list = list(parent._cells.values())


def own_params(cell: nn.Cell) -> dict:
    """The Parameters ``cell`` holds itself, by attribute name (the live dict; values may be None)."""
    return cell._params


_MEMBER_STORES = ("_params", "_cells", "_params_list", "_buffers")


def cell_member(cell: nn.Cell, name: str, missing):
    """What ``cell.<name>`` finds among the members ``nn.Cell`` keeps apart from its ``__dict__``
    (parameters, children, parameter lists, buffers), without running any code; ``missing`` if none."""
    found = cell.__dict__
    for store in _MEMBER_STORES:
        if name in found.get(store, {}):
            return found[store][name]
    return missing


def buffers(cell: nn.Cell) -> dict:
    """``cell``'s registered buffers by name (the live dict)."""
    return cell._buffers


# ---------------------------------------------------------------------------- recompute

RECOMPUTE_WRAPPER = "_recompute_cell"  # where recompute() keeps its PYNATIVE wrapper
_RECOMPUTE_SCOPE = "recompute_"  # the prefix recompute() puts on the scopes it marks
_NON_REENTRANT_OPTIONS = ("context_fn", "early_stop", "output_recompute")


def recompute_wrapper(cell: nn.Cell):
    """The PYNATIVE wrapper ``cell.recompute(...)`` stored on ``cell`` itself (a child Cell or a
    closure), or None."""
    wrapper = cell._cells.get(RECOMPUTE_WRAPPER)
    return wrapper if wrapper is not None else cell.__dict__.get(RECOMPUTE_WRAPPER)


def recompute_call_options(wrapper) -> Optional[dict]:
    """The keyword arguments of the ``recompute(...)`` call that stored ``wrapper``: a
    ``_RecomputeCell`` (``use_reentrant=True``) or the closure ``recompute_generator`` returns
    otherwise; None for any other form."""
    if isinstance(wrapper, _RecomputeCell):
        return {"use_reentrant": True, "output_recompute": False, "early_stop": True, "context_fn": None}
    code, closure = getattr(wrapper, "__code__", None), getattr(wrapper, "__closure__", None)
    if code is None or closure is None or not set(_NON_REENTRANT_OPTIONS) <= set(code.co_freevars):
        return None
    values = {name: c.cell_contents for name, c in zip(code.co_freevars, closure)}
    return {"use_reentrant": False, **{name: values[name] for name in _NON_REENTRANT_OPTIONS}}


def is_null_recompute_context(context_fn) -> bool:
    """Whether ``context_fn`` is recompute()'s default context (None or MindSpore's own)."""
    return context_fn in (None, null_context_fn)


def forget_recompute(cell: nn.Cell) -> None:
    """Leave ``cell`` as ``nn.Cell.__init__`` does for recompute, so that ``recompute()`` configures
    it afresh."""
    cell._cells.pop(RECOMPUTE_WRAPPER, None)
    object.__setattr__(cell, RECOMPUTE_WRAPPER, None)
    object.__setattr__(cell, "_has_config_recompute", False)


def has_config_recompute(cell: nn.Cell) -> bool:
    """Whether ``recompute()`` configured ``cell`` (on it or, as a descendant, on an ancestor)."""
    return bool(getattr(cell, "_has_config_recompute", False))


def in_recompute_scope(cell: nn.Cell) -> bool:
    """Whether GRAPH_MODE recomputes ``cell``: it, or an ancestor when it was a child, called recompute()."""
    return str(cell._scope or "").startswith(_RECOMPUTE_SCOPE)


def mark_recomputed_child(cell: nn.Cell) -> None:
    """Mark ``cell`` and its children as ``recompute()`` marks the children of the Cell it is
    called on (scope and configured flag, no graph flag)."""
    cell._recompute(False, True)


# ---------------------------------------------------------------------------- state a user sets on a Cell

# Set through public calls (set_inputs, jit config, saved-tensor hooks, amp), kept in private attributes.
CARRIED_CELL_STATE = ("_dynamic_shape_inputs", "_jit_config_dict", "_scope", "_saved_tensors_pack_hook",
                      "_saved_tensors_unpack_hook", "_amp_level")
# The hook containers (created on first use), shared so that a handle the user holds still acts on them.
SHARED_HOOK_STATE = ("_lazy_non_persistent_buffers_set", "_lazy_forward_pre_hook",
                     "_lazy_forward_pre_hook_with_kwargs", "_lazy_forward_hook", "_lazy_forward_hook_with_kwargs",
                     "_lazy_forward_hook_always_called", "_lazy_backward_hook", "_lazy_backward_pre_hook")
LAZY_STATE_PREFIX = "_lazy_"  # every container nn.Cell creates on first use is named so


def bind_backward_hooks(src: nn.Cell, dst: nn.Cell) -> None:
    """Give ``dst`` a backward hook primitive of its own for each kind ``src`` has (its hook
    dictionaries are shared beforehand: ``SHARED_HOOK_STATE``)."""
    name = f"{dst.cls_name}({id(dst)})"
    if src._cell_backward_hook is not None and dst._cell_backward_hook is None:
        dst._cell_backward_hook = _inner_ops.CellBackwardHook(name, dst, dst._backward_hook)
        dst._cell_backward_hook.register_backward_hook()
    if src._cell_backward_pre_hook is not None and dst._cell_backward_pre_hook is None:
        dst._cell_backward_pre_hook = _inner_ops.CellBackwardHook(name, dst, dst._backward_pre_hook)
        dst._cell_backward_pre_hook.register_backward_pre_hook()


def has_shard_fn(cell: nn.Cell) -> bool:
    """Whether ``Cell.shard()`` (auto-parallel) was called on ``cell``."""
    return cell._shard_fn is not None


def lazy_inline_key(cell: nn.Cell) -> Optional[str]:
    """The key ``@lazy_inline`` keeps on ``cell`` (public as ``cell_init_args``), or None without one."""
    return getattr(cell, "_cell_init_args", None)


def mint_conv_reversed_padding(conv: nn.Cell) -> tuple:
    """The padding a ``mint.nn.ConvNd`` with a non-zeros ``padding_mode`` pads its input with."""
    return conv._reversed_padding


# ---------------------------------------------------------------------------- optimizer, context

OPTIMIZER_PARAMETERS = "_parameters"  # where nn.Optimizer keeps the Parameters it updates


def optimizer_parameters(optimizer: nn.Optimizer):
    """The Parameters an ``nn.Optimizer`` updates, in its order (a ParameterTuple)."""
    return optimizer._parameters


def parallel_mode() -> str:
    """MindSpore's parallel mode in effect (a ``ParallelMode`` value)."""
    return _get_parallel_mode()


def ascend_soc_supports_feature(feature: str) -> bool:
    """Whether the Ascend SoC has ``feature`` (False off Ascend)."""
    return bool(MSContext.get_instance().ascend_soc_supports_feature(feature))


# ---------------------------------------------------------------------------- Parameters without data


def init_tensor(param):
    """The initializer Tensor an unmaterialized ``param`` was made from (None once it has data)."""
    return getattr(param, "init_mode", None)


def forget_init_tensor(param) -> None:
    """Drop the initializer Tensor ``param`` keeps, after its data was set."""
    if getattr(param, "init_mode", None) is not None:
        param.init_mode = None


def parameter_base_class() -> type:
    """The class every Parameter made from a Tensor is an instance of: ``Parameter.__new__`` makes
    one subclass of ``Parameter`` and ``Tensor`` and caches it."""
    return Parameter._get_base_class(Tensor)


def _new_without_data(cls, default_input, *args, **kwargs):
    obj = Parameter.__new__(cls, default_input, *args, **kwargs)  # reads cls.init_param: False
    obj.__class__ = cls  # Parameter.__new__ makes an instance of the base class, whatever cls is
    return obj


def parameter_subclass(base: type, namespace: dict) -> type:
    """A subclass of ``base`` (``parameter_base_class()``) with ``namespace``, named "Parameter"
    as ``base``. Called with an initializer Tensor and Parameter's arguments, it makes an instance of
    itself without data, as ``no_init_parameters`` does, changing nothing on ``Parameter``."""
    body = {"init_param": False, "__new__": _new_without_data, **namespace}
    return type(base.__name__, (base,), body)


_LOCK = threading.Lock()
_THREAD = threading.local()  # .blocks: [(on_created, maker)] of the blocks open in this thread
_PATCH = {"open": 0, "original": None}  # blocks open (all threads), MindSpore's own staticmethod
_NEW_ARGS = "_get_parameter_new_args"


def _maker(parameter_class: Callable[[type], type]) -> type:
    """What ``Parameter.__new__`` builds its instance with, in place of ``Tensor``: it calls
    ``input_class.__new__(base)``, then ``input_class.__init__(obj, *args)``."""

    class _Make:
        def __new__(base):  # an instance of parameter_class(base) instead of base
            return Tensor.__new__(parameter_class(base))

        def __init__(obj, *args):
            Tensor.__init__(obj, *args)

    return _Make


def _new_args_hook(original: Callable) -> Callable:
    """``Parameter._get_parameter_new_args`` while a block is open: MindSpore's ``original``, except
    in a thread inside ``parameters_without_data``, for a Tensor with an initializer."""

    def new_args(data, rc, init_param=True):
        blocks = getattr(_THREAD, "blocks", None)
        if not blocks or not (isinstance(data, Tensor) and data.has_init):
            return original(data, rc, init_param)
        args = original(data, rc, False)
        if args[0] is not Tensor or len(args) < 2 or args[1] is not None:
            return args  # MindSpore gives it data all the same (a meta Tensor)
        on_created, make = blocks[-1]
        on_created(data)
        return (make,) + tuple(args[1:])

    return new_args


@contextlib.contextmanager
def parameters_without_data(on_created: Callable[[Tensor], None], parameter_class: Callable[[type], type]):
    """In the calling thread, while the block runs: a Parameter made from a Tensor with an
    initializer gets no data (as under ``no_init_parameters``), is made an instance of
    ``parameter_class(parameter_base_class())``, and ``on_created(tensor)`` is called, in creation
    order. Other threads make their Parameters as MindSpore does. Blocks nest.

    MindSpore 2.10's only switch for this is process-wide (the class attribute
    ``Parameter.init_param`` that ``no_init_parameters`` sets), and ``Parameter.__new__`` reaches
    no hook of the instance before the instance exists. So one class attribute,
    ``Parameter._get_parameter_new_args``, is replaced while a block is open in any thread, by a
    function that acts only in threads inside a block; the same object is put back when the last
    block closes, also on an exception.
    """
    parameter_base_class()  # cached before Parameter.__new__ looks it up with a maker as input class
    blocks = _THREAD.__dict__.setdefault("blocks", [])
    with _LOCK:
        if not _PATCH["open"]:
            _PATCH["original"] = Parameter.__dict__[_NEW_ARGS]
            setattr(Parameter, _NEW_ARGS, staticmethod(_new_args_hook(_PATCH["original"].__func__)))
        _PATCH["open"] += 1
    blocks.append((on_created, _maker(parameter_class)))
    try:
        yield
    finally:
        blocks.pop()
        with _LOCK:
            _PATCH["open"] -= 1
            if not _PATCH["open"]:
                setattr(Parameter, _NEW_ARGS, _PATCH["original"])


# ---------------------------------------------------------------------------- compiled code


def in_compiled_graph() -> bool:
    """Whether the caller runs while MindSpore compiles a graph (a ``jit`` function or a ``construct`` in
    GRAPH_MODE being parsed or traced), where eager collectives and ``set_data`` cannot run."""
    return bool(_run_in_jit()) or jit_context() is not None


# ---------------------------------------------------------------------------- the list, and its check


@dataclass(frozen=True)
class Internal:
    """One private MindSpore name the package (or a development tool) relies on.

    Attributes:
        name: as MindSpore spells it.
        where: where MindSpore ``MINDSPORE_VERSION`` defines it.
        kind: what it must be: one of ``KINDS``.
        needed_by: what uses it, and what breaks without it.
        probe: reads it from the installed MindSpore (for "behaves": True when it behaves as read).
    """

    name: str
    where: str
    kind: str
    needed_by: str
    probe: Callable[[], object]


KINDS = {
    "dict": lambda v: isinstance(v, dict), "list": lambda v: isinstance(v, list),
    "tuple": lambda v: isinstance(v, tuple), "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool), "callable": callable, "class": inspect.isclass,
    "staticmethod": lambda v: isinstance(v, staticmethod), "attribute": lambda v: True, "behaves": lambda v: v is True,
}


class _Plain(nn.Cell):
    def construct(self, x):
        return x


def _cell() -> nn.Cell:
    return nn.SequentialCell([_Plain()])


def _recomputed(use_reentrant: bool) -> nn.Cell:
    cell = _cell()
    cell.recompute(use_reentrant=use_reentrant)
    return cell


def _lazy_inline_cell() -> nn.Cell:
    class Block(nn.Cell):
        @lazy_inline
        def __init__(self):
            super().__init__()

    return Block()


def _zeros(shape=(2,)):
    return initializer("zeros", shape)


def _made_without_data() -> bool:
    created, base = [], parameter_base_class()
    mark = parameter_subclass(base, {})
    with parameters_without_data(created.append, lambda b: mark):
        param = Parameter(_zeros(), name="probe")
    return type(param) is mark and param.has_init and init_tensor(param) is created[0]


def _module_attr(module: str, *path: str):
    value = importlib.import_module(module)
    for name in path:
        value = getattr(value, name)
    return value


_CELL = "mindspore/nn/cell.py, Cell.__init__"
_RECOMPUTE = "mindspore/nn/cell.py, Cell.recompute and Cell._recompute"
_PARAM = "mindspore/common/parameter.py, Parameter"
_CARRY = "a replaced layer keeps what its user set (zero3/carry.py)"


def _on_cell(name: str, kind: str, needed_by: str, where: str = _CELL, probe=None) -> Internal:
    """An attribute of ``nn.Cell`` (by default read from a bare Cell)."""
    return Internal(f"nn.Cell.{name}", where, kind, needed_by, probe or (lambda: getattr(_cell(), name)))


INTERNALS = (
    _on_cell("_cells", "dict", "child_cells, set_child: shard_network walks and replaces layers (zero3/shard.py), "
             "ZeroCell copies its original's children (zero3/layers.py), gather units, reshard, the rewrite, "
             "the communication plan's walk (train/comm_accounting.py). Without it ZeRO-3 replaces no layer."),
    _on_cell("_params", "dict", "own_params: ZeroCell copies its original's parameters, gather units find a "
             "parameter's path, the rewrite finds split parameters' names. Without it ZeRO-3 gathers nothing."),
    _on_cell("_params_list", "dict", "cell_member: the rewrite's static lookup of a name a construct reads."),
    _on_cell("_buffers", "dict", "buffers, cell_member: " + _CARRY + ", its buffers included."),
    Internal("nn.SequentialCell.cell_list", "mindspore/nn/layer/container.py, SequentialCell", "list",
             "set_child: without it a SequentialCell would run its original layers, not their replacements.",
             lambda: _cell().cell_list),
    _on_cell("_recompute_cell", "behaves", "recompute_wrapper, forget_recompute: " + _CARRY + ", recompute() "
             "included; walks skip the wrapper.", _RECOMPUTE,
             lambda: all(recompute_wrapper(_recomputed(r)) is not None for r in (True, False))),
    Internal("mindspore.common.recompute._RecomputeCell", "mindspore/common/recompute.py", "class",
             "recompute_call_options: reads back recompute(use_reentrant=True).", lambda: _RecomputeCell),
    Internal("recompute_generator's closure (context_fn, early_stop, output_recompute)",
             "mindspore/common/recompute.py, recompute_generator", "behaves",
             "recompute_call_options: reads back recompute(use_reentrant=False); without it shard_network refuses "
             "a Cell marked with recompute().",
             lambda: (recompute_call_options(recompute_wrapper(_recomputed(False))) or {}).get("use_reentrant")
             is False),
    Internal("mindspore.common.recompute.null_context_fn", "mindspore/common/recompute.py", "callable",
             "is_null_recompute_context: [Note: non-reentrant recompute] (zero3/carry.py).", lambda: null_context_fn),
    _on_cell("_has_config_recompute", "bool", "has_config_recompute, forget_recompute: which Cells recompute() "
             "configured (zero3/carry.py, reshard.py, shard.py, train/comm_accounting.py).", _RECOMPUTE),
    _on_cell("_recompute", "callable", "mark_recomputed_child: gathers added under a recomputed Cell are "
             "recomputed too.", _RECOMPUTE),
    _on_cell("_scope", "behaves", "in_recompute_scope: which gathers GRAPH_MODE recomputes "
             "(zero3/reshard.py, carry.py); carried to replacements.",
             _RECOMPUTE + ", Cell._set_recompute_scope ('recompute_' prefix)",
             lambda: _cell()._scope is None
             and all(in_recompute_scope(c) for _, c in _recomputed(True).cells_and_names())),
    _on_cell("_shard_fn", "attribute", "has_shard_fn: shard_network refuses a Cell with Cell.shard() instead of "
             "losing it."),
    _on_cell("_cell_backward_hook", "attribute", "bind_backward_hooks: " + _CARRY + ", backward hooks included."),
    _on_cell("_cell_backward_pre_hook", "attribute", "bind_backward_hooks: as _cell_backward_hook."),
    _on_cell("_backward_hook", "dict", "bind_backward_hooks: the dictionary the hook primitive reads.",
             "mindspore/nn/cell.py, a property"),
    _on_cell("_backward_pre_hook", "dict", "bind_backward_hooks: as _backward_hook.",
             "mindspore/nn/cell.py, a property"),
    Internal("mindspore.ops.operations._inner_ops.CellBackwardHook", "mindspore/ops/operations/_inner_ops.py",
             "class", "bind_backward_hooks: the primitive that runs a Cell's backward hooks.",
             lambda: _inner_ops.CellBackwardHook),
) + tuple(
    _on_cell(name, "attribute", "CARRIED_CELL_STATE: " + _CARRY + " (carry_cell_state).",
             probe=lambda name=name: _cell().__dict__[name]) for name in CARRIED_CELL_STATE
) + tuple(
    _on_cell(name, "attribute", "SHARED_HOOK_STATE: a replaced layer shares its original's hooks, so a user's "
             "handle still removes them (zero3/carry.py, carry_hooks).", probe=lambda name=name: _cell().__dict__[name])
    for name in SHARED_HOOK_STATE
) + (
    Internal("nn.Cell._cell_init_args", "mindspore/nn/cell.py, Cell.cell_init_args (set by @lazy_inline)", "str",
             "lazy_inline_key: a @lazy_inline block keeps a key free of parameter names ([Note: lazy_inline key] "
             "in zero3/rewrite.py).", lambda: lazy_inline_key(_lazy_inline_cell())),
    Internal("mint.nn.ConvNd._reversed_padding", "mindspore/mint/nn/layer/conv.py, _ConvNd.__init__", "tuple",
             "mint_conv_reversed_padding: the ZeRO-3 mint convolutions pad as the original (zero3/layers.py).",
             lambda: mint_conv_reversed_padding(mint.nn.Conv1d(1, 1, 3, padding=1, padding_mode="reflect"))),
    Internal("nn.Optimizer._parameters", "mindspore/nn/optim/optimizer.py, Optimizer.__init__", "tuple",
             "optimizer_parameters, OPTIMIZER_PARAMETERS: which parameters an optimizer updates and which of its "
             "tuples are states (train/optimizer_states.py, offload/host_optimizer.py).",
             lambda: optimizer_parameters(nn.SGD([Parameter(Tensor([0.0]), name="probe")]))),
    Internal("mindspore.parallel._utils._get_parallel_mode", "mindspore/parallel/_utils.py", "callable",
             "parallel_mode: ZeRO shards only in DATA_PARALLEL (core/comm.py, is_data_parallel).",
             lambda: _get_parallel_mode),
    Internal("mindspore._c_expression.MSContext.ascend_soc_supports_feature", "mindspore/_c_expression (C++)",
             "callable", "ascend_soc_supports_feature: which Ascend SoC runs (core/backend.py).",
             lambda: MSContext.get_instance().ascend_soc_supports_feature),
    Internal("Parameter._get_parameter_new_args", _PARAM + ".__new__", "staticmethod",
             "parameters_without_data: sharded_init (core/materialize.py) builds a network without its data.",
             lambda: Parameter.__dict__[_NEW_ARGS]),
    Internal("Parameter._get_base_class (one cached class)", _PARAM + "._get_base_class", "behaves",
             "parameter_base_class, parameters_without_data: Parameter.__new__ looks its class up by name.",
             lambda: Parameter._get_base_class(_Plain) is parameter_base_class()),
    Internal("Parameter.__new__ (init_param, input_class) and Parameter.init_mode", _PARAM + ".__new__", "behaves",
             "parameters_without_data, parameter_subclass, init_tensor: sharded_init's Parameters and their "
             "copies stay without data ([Note: delayed initialisation] in core/materialize.py).",
             lambda: _made_without_data() and parameter_subclass(parameter_base_class(), {})(_zeros(), "p").has_init),
    Internal("mindspore.graph.api._run_in_jit and mindspore.graph.jit_context.jit_context",
             "mindspore/graph/api.py, mindspore/graph/jit_context.py", "behaves",
             "in_compiled_graph: gathered_parameters (zero3/gathered.py) refuses a call inside a compiled graph.",
             lambda: in_compiled_graph() is False),
    Internal("mindspore.graph.api._CellGraphExecutor.compile", "mindspore/graph/api.py", "callable",
             "tools/dev/compile_census_hook (a development tool): times each graph compile.",
             lambda: _module_attr("mindspore.graph.api", "_CellGraphExecutor", "compile")),
    Internal("mindspore.graph.api._JitExecutor.compile", "mindspore/graph/api.py", "callable",
             "tools/dev/compile_census_hook (a development tool): times each jit compile.",
             lambda: _module_attr("mindspore.graph.api", "_JitExecutor", "compile")),
    Internal("mindspore.parallel.cluster.process_entity._api._is_local_ip",
             "mindspore/parallel/cluster/process_entity/_api.py", "callable",
             "tools/dev/msrun_other_host.py (a development tool): two msrun nodes on one host.",
             lambda: _module_attr("mindspore.parallel.cluster.process_entity._api", "_is_local_ip")),
)


def problem(internal: Internal) -> Optional[str]:
    """None when the installed MindSpore still has ``internal`` as read; else what to fix, and where."""
    state = np.random.get_state()  # a probe that builds a layer must not move the caller's random stream
    try:
        value = internal.probe()
        wrong = None if KINDS[internal.kind](value) else f"it is {type(value).__name__} {value!r}, not {internal.kind}"
    except Exception as error:  # noqa: BLE001 - whatever it raises is the finding
        wrong = f"reading it raised {error!r}"
    finally:
        np.random.set_state(state)
    if wrong is None:
        return None
    return (f"MindSpore {mindspore.__version__} changed a private API mindone_zero relies on: {internal.name} "
            f"({wrong}). mindone_zero read it from MindSpore {MINDSPORE_VERSION}, {internal.where}. Needed by "
            f"{internal.needed_by} Update its function in mindone_zero/core/ms_internals.py.")
