"""``shard_network``: turn a network into its ZeRO-3 form in place (the entry point)."""
import logging
from dataclasses import replace
from typing import Dict, Optional

from mindspore import nn

from mindspore.communication import GlobalComm

from ..core.comm import group_size_and_rank, world_group
from ..core.ms_internals import child_cells, has_config_recompute, set_child
from ..core.packing import itemsize_of
from ..core.partition import (WHOLE_WARN_SHARE, is_frozen_candidate, is_split_candidate, mark_shard_flag, splits_over,
                              whole_candidates, zero_spec_of)
from ..core.to_float import compute_dtype_of

from .carry import carry_hooks, check_carryable, reapply_recompute, recompute_options
from .frozen import in_place_state
from .layers import PARALLEL_MODULES, ZeroCell
from .auto_units import repeated_blocks
from .options import AUTO_UNITS, Stage3Options
from .gather_build import GatherBuild
from .param_wrapper import cut_parameter
from .direct_reads import record_rewritten_reads
from .reshard import apply_gathers, describe_recomputed, plan_gathers
from .rewrite import apply_rewrites, plan_rewrites
from .state import STATE_ATTR, ZeroState, gather_calls, zero_states
from .units import attach_unit_gathers, find_units

__all__ = ["shard_network", "shard_with_options", "recomputed_cells"]

_logger = logging.getLogger(__name__)


def recomputed_cells(network: nn.Cell) -> tuple:
    """Which Cells ``reshard_after_forward=True`` recomputes whole in backward, and why.

    With ``reshard_after_forward=True`` only the gathers run again in backward, except for a reader
    whose code transforms a gathered tensor before the op that consumes it (a slice, a transpose:
    backward would keep the copy), and for every reader in PYNATIVE_MODE (the mode when the network
    was sharded): those are recomputed whole ([Note: reshard after forward] in ``reshard.py``).
    ``shard_network`` also names them in a warning. Not collective.

    Args:
        network (nn.Cell): a network sharded by ``shard_network`` (or ``prepare_network``).

    Returns:
        tuple: one line (str) per such reader, saying whether it is recomputed whole or re-gathers
            only, and why; empty when every reader re-gathers only, or the network was sharded
            with ``reshard_after_forward=False`` (or not at all).

    Examples:
        Two units in PYNATIVE_MODE, where readers are recomputed whole (in GRAPH_MODE, and with
        plain layers, the list is empty):

        >>> from mindspore import nn
        >>> from parallel_modules import recomputed_cells, shard_network
        >>> class Block(nn.Cell):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc1, self.fc2 = nn.Dense(8, 16), nn.Dense(16, 8)
        ...     def construct(self, x):
        ...         return self.fc2(self.fc1(x))
        >>> net = nn.SequentialCell([Block(), Block()])
        >>> net = shard_network(net, gather_units=(Block,))
        >>> for line in recomputed_cells(net):
        ...     print(line[:60])
        0 (Block) recomputed whole: PYNATIVE_MODE: re-gathering a te
        1 (Block) recomputed whole: PYNATIVE_MODE: re-gathering a te
    """
    return tuple(line for state in zero_states(network) for line in state.recomputed)


# [Note: how shard_network rewrites]
# What ``shard_network`` does to each Cell, beyond what its docstring tells a user.
#
# * Replacement (MindOne's way): the class ``match`` finds (by exact type, else the first
#   ``isinstance`` match in ``special_cases_parallel_module``'s order) is built positionally,
#   ``new = cls(cell, 3, group)`` (MindOne's ``(net, zero_stage, optimizer_parallel_group)``), then
#   ``new.to_float(dtype)`` if ``cell`` had a ``to_float`` dtype that ``new`` does not carry. The
#   places (attributes, ``SequentialCell``, ``CellList``, ``CellDict``, the top Cell) are read from
#   the network as the user built it, before anything changes; matched Cells inside a matched Cell
#   are replaced first, so its replacement is built from (and may take over) replaced children. A
#   Cell that a replacement builds is the replacement's own and is not replaced. A replacement
#   class must gather every split parameter it holds (``ZeroParamWrapper``, either constructor
#   form; its ``need_rewrite`` is False, so a MindOne-style class does not cut the parameter a
#   second time).
# * Every other Cell, including subclasses of the mapped layers, goes through the generic path
#   ([Note: generic rewrite] in ``rewrite.py``); a class with ``zero3_gathers_itself = True`` is
#   left alone.
# * What the user set on the Cells is kept ([Note: carried state] in ``carry.py``), hooks also on
#   user replacement classes; ``recompute()`` is re-applied with the same options around the new
#   ``construct``, so the gathers are recomputed in backward rather than their full tensors kept.
# * Which readers share a gather wrapper: ``apply_rewrites`` in ``rewrite.py``; what
#   ``reshard_after_forward`` marks for recomputation: [Note: reshard after forward] in ``reshard.py``.


def shard_network(network: nn.Cell, group: Optional[str] = None, parallel_modules: Optional[Dict] = None,
                  special_cases_parallel_module: Optional[Dict] = None, reshard_after_forward: bool = True,
                  zeropp=None, gather_units=AUTO_UNITS, pad_uneven_params: bool = False) -> nn.Cell:
    """Rewrite ``network`` in place for ZeRO-3 over ``group`` and return it.

    MindOne's ``shard_network``, which ``prepare_network`` and ``prepare_train_network`` call at
    stage 3. After the call every trainable Parameter with ``ndim >= 1``, not marked
    ``param.parallel_optimizer = False``, whose dim 0 divides by the group size (every such
    Parameter with ``pad_uneven_params=True``, zero-padded) holds only this rank's block, is the
    same Parameter object with the same name, and has ``param.zero_spec`` (a ``ShardSpec`` with
    ``split=True``). The other trainable parameters (0-d, opted out, dim 0 not dividing) stay
    whole with ``zero_spec.split == False``; their gradients stay local (a train wrapper
    all-reduces them). Frozen floating parameters (``requires_grad=False``: a LoRA fine-tune's
    base) follow the same rule; they are gathered in forward and send no gradient back. Running
    state that a Cell updates in place (BatchNorm's moving statistics, ``IN_PLACE_STATE_CELLS``
    in ``zero3/frozen.py``) and other non-trainable parameters keep their data (no
    ``zero_spec``); ``param.parallel_optimizer = False`` keeps a frozen weight whole too. Every
    Parameter's ``parallel_optimizer`` then says whether this rank holds a shard of it, as after
    ``prepare_train_network`` (the user's opt-out is kept: [Note: split rule] in partition.py).

    A Cell whose exact type is a key of ``PARALLEL_MODULES`` (updated with ``parallel_modules``),
    or failing that an instance of a key of ``special_cases_parallel_module``, is replaced by its
    ZeRO-3 class as MindOne does it, ``cls(cell, 3, group)`` (``ZeroCell`` gives the contract),
    wherever it sits (the top Cell included, hence the return value). Every other Cell that reads
    a split parameter has the reads in its code rewritten to gather (a class that gathers its own
    parameters opts out with a class attribute ``zero3_gathers_itself = True``). What was set on
    the Cells is kept: ``to_float`` flags, hooks, attributes and ``recompute()``. With
    ``reshard_after_forward=True`` the gathers are marked for recomputation, so that the gathered
    tensors are freed after their forward use and gathered again in backward; a reader whose code
    keeps a transformed copy of a gathered tensor, and every reader in PYNATIVE_MODE, is recomputed
    whole instead (``recomputed_cells`` lists them).

    Used without a train wrapper, ``network(x)`` gives the unsharded network's output, and
    autodiff hands back, for a split parameter, the group mean of this rank's block of its
    gradient. Call it once, on every rank of ``group``, after ``to_float`` (and ``recompute``) and
    before anything is compiled. Building is not collective (each rank cuts its own copy), but
    running the network is. The rewritten Cells get dynamic classes, so the network can be
    deep-copied but not pickled.

    Args:
        network (nn.Cell): the network to shard.
        group (str): communication group name; None means the world group (a group of one rank
            when communication is not initialised).
        parallel_modules (dict): ``{original Cell class: ZeRO-3 Cell class}`` extending or
            overriding ``PARALLEL_MODULES`` (matched by exact type); None: ``PARALLEL_MODULES``.
        special_cases_parallel_module (dict): ``{Cell class: ZeRO-3 Cell class}`` matched with
            ``isinstance`` after the exact-type match (MindOne's argument of that name); None: none.
        reshard_after_forward (bool): free each gathered parameter after its forward use and gather
            it again for backward (True, default, 3Φ traffic), or keep it until its backward (False,
            2Φ).
        zeropp (ZeroPPConfig | dict): ZeRO++ options (qwZ, qgZ, hpZ; ``ZeroPPConfig``); None: none.
        gather_units (str | tuple): a tuple of Cell classes (FSDP's ``transformer_layer_cls``): each
            instance is a unit whose split parameters are all-gathered in one collective when its
            forward starts and reduce-scattered in one; with ``reshard_after_forward`` the unit is
            the recomputed region. Cells inside a unit are not replaced by ``parallel_modules``
            classes. See [Note: gather units] in ``units.py`` (what can be threaded, what raises).
            ``"auto"`` (default): the network's repeated blocks, or a gather per reading Cell where
            there are none, they cannot be units, or with ``zeropp`` ([Note: units by default] in
            ``auto_units.py``). None or ``()``: each reading Cell gathers its own parameters.
        pad_uneven_params (bool): split parameters whose dim 0 does not divide by the group size
            too, zero-padded (default False: they stay whole, as MindOne leaves them).

    Returns:
        nn.Cell: the network (a new object only when the top Cell itself was replaced), carrying
            the options it was sharded with ([Note: stage-3 options] in ``options.py``).

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: if ``reshard_after_forward`` is an int (re-gathering from a smaller group is not
            supported).
        ValueError: if ``network`` was already sharded, uses a sharded parameter in a way the
            generic path cannot rewrite (the message names the Cell, method and parameter), or
            holds state that cannot be carried (``Cell.shard``). These checks run before anything
            is modified.
        TypeError / ValueError: ``gather_units`` not a tuple of Cell classes, combined with
            ``zeropp``, naming a class with no instance, or a unit whose code cannot be threaded
            ([Note: gather units]); also before anything is modified.

    Examples:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from parallel_modules import shard_network
        >>> net = nn.SequentialCell([nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4)])
        >>> x = ms.Tensor(np.ones((2, 8), np.float32))
        >>> before = net(x).asnumpy()
        >>> net = shard_network(net)   # one process: each block is the whole tensor
        >>> import parallel_modules
        >>> isinstance(net[0], parallel_modules.Dense), net[0].weight.zero_spec.split
        (True, True)
        >>> bool(np.allclose(net(x).asnumpy(), before))
        True

        On every rank, over a group of 4 (tests/dist/test_zero3_network.py runs these calls):

        >>> net = shard_network(net, group=op_group, reshard_after_forward=True)
        >>> net[0].weight.shape        # this rank's block of the (16, 8) weight
        (4, 8)
    """
    options = Stage3Options.build("shard_network", 3, group, reshard_after_forward, zeropp, gather_units,
                                  parallel_modules, special_cases_parallel_module, pad_uneven_params)
    return shard_with_options(network, group, options)


def shard_with_options(network: nn.Cell, group: Optional[str], options: Stage3Options) -> nn.Cell:
    """``shard_network`` with its options already built (and checked) by an entry point
    ([Note: stage-3 options] in ``options.py``). The returned network carries ``options``.

    Raises:
        TypeError / ValueError: as ``shard_network`` says of the network and ``group`` (the options
            are not checked again).
    """
    _check_args(network, group)
    cells = tuple(network.cells_and_names())  # as the user built it: what the planning steps read
    _check_not_sharded(cells)
    return _shard(network, cells, group, _matcher(options), options)


def _shard(network, cells: tuple, group, match, options: Stage3Options):
    """``shard_network`` after its checks; ``cells``: ``network.cells_and_names()`` before any change."""
    params = tuple(p for _, p in network.parameters_and_names())
    in_place = in_place_state(cells)  # frozen state a Cell writes: never sharded ([Note: split rule])
    size = group_size_and_rank(group)[0]
    split_ids = {id(p) for p in params if splits_over(p, size, options.pad_uneven_params, id(p) not in in_place)}
    units, match, slots, plans, classes = _plan_units(network, cells, params, split_ids, match, options)
    options = replace(options, gather_units=classes or None)  # what was done, for check_same_as
    recomputed = _recompute_records(cells, {id(child) for _, _, child in slots})
    # layers built before shard_network, without the ZeRO++ options: each gathers per parameter
    per_parameter = [c for _, c in cells if options.zeropp is not None and getattr(c, "zero_coalesce", False)]
    build, owner = GatherBuild(), object()  # owner: this call, on every record (ZeroParam.owner)
    try:
        # Every parameter first, in the network's order ([Note: delayed initialisation]), with its record,
        # before any layer Cell is built ([Note: ZeRO++ at build] in param_wrapper.py); the record
        # carries the build ([Note: gather Cells built once] in gather_build.py).
        for param in params:
            cut_parameter(param, group, options.pad_uneven_params, options.zeropp, build, id(param) not in in_place,
                          owner)
        network, new_cells = _replace_cells(network, slots, match, group)
        _warn_whole([p for p in params if is_split_candidate(p) or (is_frozen_candidate(p) and id(p) not in in_place)],
                    size)
        apply_rewrites(plans, group, options.reshard_after_forward)
        record_rewritten_reads(plans, units)
        attach_unit_gathers(list({id(u): u for u in units.values()}.values()), group, build)
        _restore_recompute(recomputed, new_cells)
        for layer in per_parameter:  # [Note: ZeRO++ at build] in param_wrapper.py
            layer.gather_per_parameter()
        plan = plan_gathers(network, options, build)  # [Note: a frozen gather plan] in reshard.py
        apply_gathers(plan, build)
    finally:
        build.close(params)
    found = plan.readers
    _warn_recomputed(found)
    for _, param in network.parameters_and_names():  # the replacements' own parameters too
        spec = zero_spec_of(param)
        mark_shard_flag(param, spec is not None and spec.split)  # [Note: split rule]
    state = ZeroState(options, tuple(gather_calls(network)), tuple(describe_recomputed(found)))
    object.__setattr__(network, STATE_ATTR, state)  # [Note: zero3 state] in state.py
    return network


def _plan_units(network, cells: tuple, params: tuple, split_ids: set, match, options: Stage3Options):
    """The gather units, the Cell matcher outside them, the replacement slots, the rewrite plans and the
    unit classes used (a tuple, empty for none); with ``gather_units="auto"`` the repeated blocks, or no
    units where they cannot be ([Note: units by default] in ``auto_units.py``). Nothing is modified."""
    classes = options.gather_units
    if classes == AUTO_UNITS:
        per_cell = options.zeropp is not None or options.parallel_modules or options.special_cases_parallel_module
        classes = () if per_cell else repeated_blocks(network, lambda p: id(p) in split_ids)
        if classes:
            try:
                return _plan_with(network, cells, params, split_ids, match, classes)
            except ValueError as err:
                _logger.info("shard_network: the repeated blocks %s gather per reading Cell, not as units ([Note: "
                             "units by default] in mindone_zero/zero3/auto_units.py): %s",
                             [c.__name__ for c in classes], err)
                classes = ()
    return _plan_with(network, cells, params, split_ids, match, classes)


def _plan_with(network, cells: tuple, params: tuple, split_ids: set, match, classes):
    classes = tuple(classes or ())
    units = find_units(network, classes) if classes else {}
    if units:
        match = _outside_units(match, units)
    slots = _replacement_slots(network, match)
    plans = plan_rewrites(network, cells, params, split_ids, {id(child) for _, _, child in slots}, units)
    return units, match, slots, plans, classes


def _warn_whole(candidates, size: int) -> None:
    """One warning naming the big parameters MindOne's split rule leaves whole ([Note: split rule])."""
    whole = whole_candidates([(p.name, zero_spec_of(p), itemsize_of(p.dtype)) for p in candidates], WHOLE_WARN_SHARE)
    if not whole:
        return
    listed = ", ".join(f"{name} ({nbytes / 2 ** 20:.2f} MiB, {share:.1%})" for name, nbytes, share in whole)
    _logger.warning(
        "ZeRO stage 3 over %d ranks keeps %d parameter(s) whole on every rank because dim 0 does not divide by %d "
        "(MindOne's split rule): %s; %.1f%% of the model's bytes. Pass pad_uneven_params=True to split them with "
        "zero padding ([Note: split rule] in mindone_zero/core/partition.py).", size, len(whole), size, listed,
        100.0 * sum(s for _, _, s in whole))


def _warn_recomputed(found) -> None:
    """One warning per reason naming the readers whose code is not direct ([Note: reshard after forward])."""
    by_reason = {}
    for path, _, reasons, whole in found:
        what = "recomputes whole in backward" if whole else "re-gathers only (backward may keep transformed copies)"
        by_reason.setdefault((what, "; ".join(reasons)), []).append(path)
    for (what, reason), paths in by_reason.items():
        _logger.warning("shard_network: reshard_after_forward %s %d Cell(s) ([Note: reshard after forward] in "
                        "mindone_zero/zero3/reshard.py): %s. Cells: %s", what, len(paths), reason, ", ".join(paths))


def _outside_units(match, units: dict):
    """``match`` that leaves the Cells of gather units alone: the unit gathers their parameters."""
    return lambda cell: None if id(cell) in units else match(cell)


def _recompute_records(cells: tuple, replaced: set) -> list:
    """[(cell, recompute options)] for the Cells marked with ``recompute()``; checks the replaced
    Cells can be carried (raises before anything is modified)."""
    records = []
    for _, cell in cells:
        if id(cell) in replaced:
            check_carryable("shard_network", cell)
        options = recompute_options(cell)
        if options is not None:
            records.append((cell, options))
    return records


def _restore_recompute(records: list, new_cells: dict) -> None:
    """Re-apply each recorded ``recompute()`` on the Cell as it is now (its construct may have been
    rewritten, its children replaced), except on replacements that did it themselves."""
    for cell, options in records:
        target = new_cells.get(id(cell), cell)
        if target is cell or not has_config_recompute(target):
            reapply_recompute(target, options)


def _check_args(network, group) -> None:
    if not isinstance(network, nn.Cell):
        raise TypeError(f"For 'shard_network', the argument 'network' must be a Cell, but got {type(network)}.")
    if group is not None and not isinstance(group, str):
        raise TypeError(f"For 'shard_network', the argument 'group' must be None or a str, but got {group!r}.")


def _check_not_sharded(cells: tuple) -> None:
    for name, cell in cells:
        if "zero3_original_class" in type(cell).__dict__:
            raise ValueError(
                f"For 'shard_network', the argument 'network' is already sharded (Cell {name or '<top>'!r} "
                f"was rewritten by an earlier call)."
            )


def _matcher(options: Stage3Options):
    """``match(cell) -> replacement class or None``."""
    mapping = dict(PARALLEL_MODULES)
    mapping.update(options.parallel_modules or {})
    special = list((options.special_cases_parallel_module or {}).items())

    def match(cell):
        if type(cell) in mapping:
            return mapping[type(cell)]
        return next((cls for key, cls in special if isinstance(cell, key)), None)

    return match


def _replacement_slots(network: nn.Cell, match) -> list:
    """Where the matched Cells sit: ``(parent, attribute name, Cell)`` for each place, read from the
    network as the user built it, a Cell's matched descendants before it (so a replacement is built
    from a Cell whose children are replaced already), siblings in order; the top Cell, if matched,
    last with parent None. A Cell in several places has one entry per place. Reads only."""
    slots, seen = [], set()

    def walk(parent):
        if id(parent) in seen:
            return
        seen.add(id(parent))
        for name, child in child_cells(parent).items():
            if child is None:
                continue
            walk(child)
            if match(child) is not None:
                slots.append((parent, name, child))

    walk(network)
    if match(network) is not None:
        slots.append((None, None, network))
    return slots


def _replace_cells(network: nn.Cell, slots: list, match, group: Optional[str]):
    """Replace the Cells at ``slots`` (``_replacement_slots``), in that order; a Cell in several
    places gets one replacement. Only the planned Cells are replaced: a Cell a replacement builds is
    that class's own.

    Returns:
        (the network, {id(original Cell): its replacement}).
    """
    new_cells = {}
    # MindOne-style classes expect a group name; there is none before communication is initialised.
    op_group = group if group is not None or not GlobalComm.INITED else world_group()

    def convert(cell):
        if id(cell) not in new_cells:
            new = match(cell)(cell, 3, op_group)
            dtype = compute_dtype_of(cell)
            if dtype is not None and compute_dtype_of(new) is None:
                new.to_float(dtype)
            if not isinstance(new, ZeroCell):  # the library's Cells carry the rest themselves
                carry_hooks(cell, new)
            # The original stays referenced (outside the Cell tree) for as long as its replacement
            # lives: MindSpore 2.10 keys what it parsed of a Cell by the object's id, and a freed
            # original's id reused by a later Cell compiled with the stale entry.
            object.__setattr__(new, "_zero3_original", cell)
            new_cells[id(cell)] = new
        return new_cells[id(cell)]

    top = network
    for parent, name, cell in slots:
        if parent is None:
            top = convert(cell)
        else:
            set_child(parent, name, convert(cell))  # not Cell.__setattr__: it would rename the parameters
    return top, new_cells
