"""Keep what a user set on a Cell when ZeRO-3 replaces or rewrites it.

[Note: carried state]
``shard_network`` replaces layers (``nn.Dense`` -> ``parallel_modules.Dense``) and rewrites the
``construct`` of other Cells (a dynamic subclass, same instance). What a user configured on the
original Cell must still hold afterwards:

* ``to_float`` and other graph flags, ``set_train``, ``set_grad``, ``set_inputs``, the jit
  config, saved-tensor hooks and any plain attribute the user added: copied to the replacement
  (``carry_cell_state``);
* forward (pre-)hooks and backward (pre-)hooks: the replacement shares the original's hook
  dictionaries, so a handle the user holds still removes the hook; backward hooks get a
  ``CellBackwardHook`` primitive of their own, bound to the replacement (``carry_hooks``);
* ``Cell.recompute(...)``. MindSpore stores a PYNATIVE wrapper around the bound ``construct`` of
  the Cell *at the time of the call* (``_recompute_cell``), and for GRAPH_MODE a recompute scope
  plus flags on the Cell and the descendants it has then. Both would keep pointing at the old code
  (reading a shard) or miss the new children (the gather wrappers). So ``recompute_options`` reads
  the options back before anything changes, ``reapply_recompute`` calls ``recompute`` again with
  them on the Cell as it is now (the recomputed region is the new ``construct``, gathers included),
  and ``spread_recompute_scope`` extends a scope to children added later. One exception, for a
  MindSpore 2.10 bug: [Note: non-reentrant recompute].

``Cell.shard`` (auto-parallel) cannot be carried: its function wraps the original Cell; a Cell
with it raises.
"""
from typing import Optional

from mindspore import nn

from ..core.ms_internals import (CARRIED_CELL_STATE, LAZY_STATE_PREFIX, SHARED_HOOK_STATE, bind_backward_hooks,
                                  buffers, forget_recompute, has_config_recompute, has_shard_fn, in_recompute_scope,
                                  is_null_recompute_context, mark_recomputed_child, recompute_call_options,
                                  recompute_wrapper)
from .param_wrapper import ZeroParamWrapper

__all__ = ["recompute_options", "reapply_recompute", "spread_recompute_scope", "is_recompute_scoped",
           "carry_hooks", "carry_cell_state", "check_carryable"]

# Cell state that nn.Cell keeps in private attributes and a user sets through public calls.
_CARRIED_INTERNALS = ("training", "requires_grad") + CARRIED_CELL_STATE
_BARE_CELL_KEYS = frozenset(nn.Cell().__dict__)


def recompute_options(cell: nn.Cell, owner: str = "shard_network") -> Optional[dict]:
    """Keyword arguments of the ``cell.recompute(...)`` call made on ``cell`` itself, or None.

    Read back from the PYNATIVE wrapper MindSpore 2.10 stored: a ``_RecomputeCell``
    (``use_reentrant=True``) or the closure ``recompute_generator`` returns otherwise.

    Raises:
        ValueError: if the stored wrapper has neither form (another MindSpore version).
    """
    wrapper = recompute_wrapper(cell)
    if wrapper is None:
        return None
    options = recompute_call_options(wrapper)
    if options is None:
        raise ValueError(
            f"For '{owner}', the Cell {type(cell).__name__} it was given is marked with recompute() "
            f"in a form this MindSpore version stores differently ({wrapper!r}); call recompute() after "
            f"prepare_network instead."
        )
    return options


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
    if (_gathers_inside(cell) and not options["use_reentrant"] and not options["output_recompute"]
            and is_null_recompute_context(options["context_fn"])):
        options = dict(options, use_reentrant=True, context_fn=None)
    forget_recompute(cell)
    cell.recompute(**options)


def _gathers_inside(cell: nn.Cell) -> bool:
    return any(isinstance(c, ZeroParamWrapper) and c.sharded for _, c in cell.cells_and_names())


def is_recompute_scoped(cell: nn.Cell) -> bool:
    """Whether GRAPH_MODE recomputes ``cell`` (it or an ancestor called ``recompute()``)."""
    return in_recompute_scope(cell)


def spread_recompute_scope(cell: nn.Cell) -> None:
    """If ``cell`` is recompute-scoped, mark its children that are not yet marked, as ``recompute()``
    marks children (children added after the call: gather wrappers, replaced layers). Not
    collective."""
    if is_recompute_scoped(cell):
        for child in cell.cells():
            if not has_config_recompute(child):
                mark_recomputed_child(child)


def carry_hooks(src: nn.Cell, dst: nn.Cell) -> None:
    """Make ``dst`` run the hooks registered on ``src`` (shared dictionaries; see [Note: carried state])."""
    for key in SHARED_HOOK_STATE:  # shared, so that a handle the user holds still acts on them
        if src.__dict__.get(key) is not None:
            object.__setattr__(dst, key, src.__dict__[key])
    bind_backward_hooks(src, dst)


def check_carryable(owner: str, cell: nn.Cell) -> None:
    """Raise ValueError naming ``owner`` if ``cell`` holds state a replacement cannot keep."""
    if has_shard_fn(cell):
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
    for name, buffer in buffers(src).items():
        buffers(dst)[name] = buffer
    for key, value in src.__dict__.items():
        if key in _BARE_CELL_KEYS or key in dst.__dict__ or key.startswith(LAZY_STATE_PREFIX):
            continue
        setattr(dst, key, value)
    carry_hooks(src, dst)
