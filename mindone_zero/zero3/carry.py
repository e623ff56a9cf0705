"""Keep what a user set on a Cell when ZeRO-3 replaces or rewrites it.

[Note: carried state]
``shard_network`` replaces layers (``nn.Dense`` -> ``parallel_modules.Dense``) and rewrites the
``construct`` of other Cells (a dynamic subclass, same instance). What a user configured on the
original Cell before that must still hold afterwards:

* ``to_float`` and other graph flags, ``set_train``, ``set_grad``, ``set_inputs``, the jit
  config, saved-tensor hooks and any plain attribute the user added: copied to the replacement
  (``carry_cell_state``);
* forward pre-hooks, forward hooks, backward hooks and backward pre-hooks: the replacement
  shares the original's hook dictionaries, so a handle the user holds still removes the hook;
  backward hooks get a ``CellBackwardHook`` primitive of their own, bound to the replacement
  (``carry_hooks``);
* ``Cell.recompute(...)``. MindSpore stores two things: a PYNATIVE wrapper around the bound
  ``construct`` of the Cell *at the time of the call* (``_recompute_cell``), and a recompute
  scope plus flags on the Cell and its descendants for GRAPH_MODE. Both would keep pointing at
  the old code (the original layer's ``construct``, reading a shard) or miss the new children
  (the gather wrappers). ``recompute_options`` reads the options back before anything changes;
  ``reapply_recompute`` calls ``recompute`` again with the same options on the Cell as it is
  now, so the recomputed region is the new ``construct``, gathers included: the all-gathered
  full weight is not kept for backward but gathered again; ``spread_recompute_scope`` extends
  a recompute scope to children added after it was set (MindSpore sets it on the descendants
  that exist at call time only). One exception, for a MindSpore 2.10 bug: see
  [Note: non-reentrant recompute].

``Cell.shard`` (auto-parallel) cannot be carried: its function wraps the original Cell; a Cell
with it raises.
"""
from typing import Optional

from mindspore import nn
from mindspore.common.recompute import _RecomputeCell, null_context_fn
from mindspore.ops.operations import _inner_ops as inner

from .param_wrapper import ZeroParamWrapper

__all__ = ["recompute_options", "reapply_recompute", "spread_recompute_scope", "is_recompute_scoped",
           "carry_hooks", "carry_cell_state", "check_carryable"]

_RECOMPUTE_ATTR = "_recompute_cell"
_RECOMPUTE_SCOPE = "recompute_"
# Cell state that nn.Cell keeps in private attributes and a user sets through public calls.
_CARRIED_INTERNALS = ("training", "requires_grad", "_dynamic_shape_inputs", "_jit_config_dict", "_scope",
                      "_saved_tensors_pack_hook", "_saved_tensors_unpack_hook", "_amp_level")
# Containers shared with the replacement, so that a handle the user holds still acts on them.
_SHARED = ("_lazy_non_persistent_buffers_set", "_lazy_forward_pre_hook", "_lazy_forward_pre_hook_with_kwargs",
           "_lazy_forward_hook", "_lazy_forward_hook_with_kwargs", "_lazy_forward_hook_always_called",
           "_lazy_backward_hook", "_lazy_backward_pre_hook")
_BARE_CELL_KEYS = frozenset(nn.Cell().__dict__)


def _recompute_wrapper(cell: nn.Cell):
    wrapper = cell._cells.get(_RECOMPUTE_ATTR)
    return wrapper if wrapper is not None else cell.__dict__.get(_RECOMPUTE_ATTR)


def recompute_options(cell: nn.Cell, owner: str = "shard_network") -> Optional[dict]:
    """Keyword arguments of the ``cell.recompute(...)`` call made on ``cell`` itself, or None.

    Read back from the PYNATIVE wrapper MindSpore 2.10 stored: a ``_RecomputeCell``
    (``use_reentrant=True``) or the closure ``recompute_generator`` returns otherwise.

    Raises:
        ValueError: if the stored wrapper has neither form (another MindSpore version).
    """
    wrapper = _recompute_wrapper(cell)
    if wrapper is None:
        return None
    if isinstance(wrapper, _RecomputeCell):
        return {"use_reentrant": True, "output_recompute": False, "early_stop": True, "context_fn": None}
    code, closure = getattr(wrapper, "__code__", None), getattr(wrapper, "__closure__", None)
    names = ("context_fn", "early_stop", "output_recompute")
    if code is None or closure is None or not set(names) <= set(code.co_freevars):
        raise ValueError(
            f"For '{owner}', the Cell {type(cell).__name__} it was given is marked with recompute() "
            f"in a form this MindSpore version stores differently ({wrapper!r}); call recompute() after "
            f"prepare_network instead."
        )
    values = {name: c.cell_contents for name, c in zip(code.co_freevars, closure)}
    return {"use_reentrant": False, **{name: values[name] for name in names}}


def reapply_recompute(cell: nn.Cell, options: dict) -> None:
    """Call ``cell.recompute(**options)`` again on ``cell`` as it is now (its current ``construct``
    and children), replacing the configuration an earlier call left. Not collective.

    [Note: non-reentrant recompute] In MindSpore 2.10 PYNATIVE, a Cell with a custom ``bprop``
    inside a ``use_reentrant=False`` recompute region fails in backward ("The pointer[top_cell_]
    is null") when a ``use_reentrant=True`` region runs later in forward, with or without ZeRO.
    The gathers are such Cells, so a region that holds a stage-3 gather is recomputed with
    ``use_reentrant=True`` instead, when the options allow it (``output_recompute`` False and the
    default ``context_fn``): the same numbers, only tensors inside tuple/list inputs get no
    gradient there. GRAPH_MODE does not use these options.
    """
    if _gathers_inside(cell) and not options["use_reentrant"] and not options["output_recompute"] \
            and options["context_fn"] in (None, null_context_fn):
        options = dict(options, use_reentrant=True, context_fn=None)
    cell._cells.pop(_RECOMPUTE_ATTR, None)
    # The state nn.Cell.__init__ leaves, so that recompute() configures the Cell afresh.
    object.__setattr__(cell, _RECOMPUTE_ATTR, None)
    object.__setattr__(cell, "_has_config_recompute", False)
    cell.recompute(**options)


def _gathers_inside(cell: nn.Cell) -> bool:
    return any(isinstance(c, ZeroParamWrapper) and c.sharded for _, c in cell.cells_and_names())


def is_recompute_scoped(cell: nn.Cell) -> bool:
    """Whether GRAPH_MODE recomputes ``cell`` (it or an ancestor called ``recompute()``)."""
    return str(cell._scope or "").startswith(_RECOMPUTE_SCOPE)


def spread_recompute_scope(network: nn.Cell) -> None:
    """Mark, as ``recompute()`` does, the children of recompute-scoped Cells that are not yet marked
    (children added after the call: gather wrappers, replaced layers). Not collective."""
    for _, cell in network.cells_and_names():
        if is_recompute_scoped(cell):
            for child in cell.cells():
                if not child._has_config_recompute:
                    child._recompute(False, True)


def carry_hooks(src: nn.Cell, dst: nn.Cell) -> None:
    """Make ``dst`` run the hooks registered on ``src`` (shared dictionaries; see [Note: carried state])."""
    for key in _SHARED:
        if src.__dict__.get(key) is not None:
            object.__setattr__(dst, key, src.__dict__[key])
    name = f"{dst.cls_name}({id(dst)})"
    if src._cell_backward_hook is not None and dst._cell_backward_hook is None:
        dst._cell_backward_hook = inner.CellBackwardHook(name, dst, dst._backward_hook)
        dst._cell_backward_hook.register_backward_hook()
    if src._cell_backward_pre_hook is not None and dst._cell_backward_pre_hook is None:
        dst._cell_backward_pre_hook = inner.CellBackwardHook(name, dst, dst._backward_pre_hook)
        dst._cell_backward_pre_hook.register_backward_pre_hook()


def check_carryable(owner: str, cell: nn.Cell) -> None:
    """Raise ValueError naming ``owner`` if ``cell`` holds state a replacement cannot keep."""
    if cell._shard_fn is not None:
        raise ValueError(
            f"For '{owner}', the argument 'net' has Cell.shard() set (auto-parallel), which wraps the original "
            f"Cell and cannot be carried to its ZeRO-3 replacement; remove it (ZeRO runs in DATA_PARALLEL)."
        )
    recompute_options(cell, owner)


def carry_cell_state(src: nn.Cell, dst: nn.Cell) -> None:
    """Copy onto ``dst`` what a user set on ``src``: flags, carried internals, hooks, buffers and the
    plain attributes ``dst`` does not have yet. Not collective.

    Recompute is not copied here (it must wrap ``dst``'s own construct): see ``reapply_recompute``.
    """
    flags = {k: v for k, v in src.get_flags().items() if k not in dst.get_flags()}
    if flags:
        dst.add_flags(**flags)
    for key in _CARRIED_INTERNALS:
        object.__setattr__(dst, key, src.__dict__[key])
    for name, buffer in src._buffers.items():
        dst._buffers[name] = buffer
    for key, value in src.__dict__.items():
        if key in _BARE_CELL_KEYS or key in dst.__dict__ or key.startswith("_lazy_"):
            continue
        setattr(dst, key, value)
    carry_hooks(src, dst)
