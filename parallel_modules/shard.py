"""``shard_network``: turn a network into its ZeRO-3 form in place (the entry point)."""
from typing import Dict, Optional

from mindspore import nn

from mindspore.communication import GlobalComm

from mindone_zero.comm import world_group

from .layers import PARALLEL_MODULES
from .param_wrapper import ZeroParamWrapper, compute_dtype_of, is_split_candidate, shard_parameter
from .rewrite import apply_rewrites, plan_rewrites

__all__ = ["shard_network"]


def shard_network(network: nn.Cell, group: Optional[str] = None, parallel_modules: Optional[Dict] = None) -> nn.Cell:
    """Rewrite ``network`` in place for ZeRO-3 over ``group`` and return it.

    After the call every trainable Parameter with ``ndim >= 1`` not marked
    ``param.parallel_optimizer = False`` holds only this rank's block (zero-padded per
    [Note: padding] in ``mindone_zero/partition.py``), is the same Parameter object with the same
    name, and has ``param.zero_spec`` (a ``ShardSpec`` with ``split=True``). Trainable 0-d and
    opted-out parameters stay whole with ``zero_spec.split == False``; their gradients stay local
    (a train wrapper all-reduces them). Non-trainable parameters are untouched (no ``zero_spec``).

    How the parameters are used:

    * Cells whose exact type is a key of ``PARALLEL_MODULES`` (updated with ``parallel_modules``)
      are replaced by ``cls(cell, zero_stage=3, op_group=group, cell_type=<to_float dtype>)``,
      wherever they sit (attributes, ``SequentialCell``, ``CellList``, ``CellDict``, the top Cell,
      hence the return value). Replacement keeps the Parameter objects and their attribute names,
      so names and checkpoints match. A replacement class must gather every split parameter it
      holds (``ZeroParamWrapper``) and must not rely on the generic path.
    * Every other Cell, including subclasses of the mapped layers, goes through the generic path
      ([Note: generic rewrite] in ``rewrite.py``): reads of sharded parameters in its code are
      rewritten to gather. A Cell class that gathers its own parameters can opt out with a class
      attribute ``zero3_gathers_itself = True``.

    In forward a sharded parameter is all-gathered (in the reading Cell's ``to_float`` dtype, cast
    before the gather when that is narrower); in backward its gradient is reduce-scattered and
    divided by the group size in the parameter's dtype, so autodiff hands back the group mean of
    this rank's block, shaped like the shard. Used without a train wrapper, ``network(x)`` gives
    the unsharded network's output.

    Call it once, on every rank of ``group``, after ``to_float`` and before anything is compiled.
    Building is not collective (each rank cuts its own copy; ranks starting from different
    initial values end up with one consistent set of blocks), but running the network is.
    The rewritten Cells get dynamic classes, so the network can be deep-copied but not pickled.

    Args:
        network: the network to shard.
        group: communication group name; None means the world group.
        parallel_modules: ``{original Cell class: ZeRO-3 Cell class}`` extending or overriding
            ``PARALLEL_MODULES``.

    Returns:
        nn.Cell: the network (a new object only when the top Cell itself was replaced).

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: if ``network`` was already sharded, or uses a sharded parameter in a way the
            generic path cannot rewrite (the message names the Cell, method and parameter). These
            checks run before anything is modified.
    """
    mapping = _check_args(network, group, parallel_modules)
    replaced = {id(c) for _, c in network.cells_and_names() if type(c) in mapping}
    trainable = [p for _, p in network.parameters_and_names() if p.requires_grad]
    split_ids = {id(p) for p in trainable if is_split_candidate(p)}

    def skip(cell):
        return id(cell) in replaced or getattr(cell, "zero3_gathers_itself", False)

    plans = plan_rewrites(network, split_ids, skip)
    network = _replace_cells(network, mapping, group)
    for param in trainable:
        shard_parameter(param, group)
    wrappers = {}

    def make_wrapper(param, compute_dtype):
        key = (id(param), compute_dtype)
        if key not in wrappers:
            wrappers[key] = ZeroParamWrapper(param, group, compute_dtype)
        return wrappers[key]

    apply_rewrites(plans, make_wrapper)
    return network


def _check_args(network, group, parallel_modules) -> dict:
    if not isinstance(network, nn.Cell):
        raise TypeError(f"For 'shard_network', the argument 'network' must be a Cell, but got {type(network)}.")
    if group is not None and not isinstance(group, str):
        raise TypeError(f"For 'shard_network', the argument 'group' must be None or a str, but got {group!r}.")
    if parallel_modules is not None and not isinstance(parallel_modules, dict):
        raise TypeError(
            f"For 'shard_network', the argument 'parallel_modules' must be None or a dict, but got "
            f"{type(parallel_modules)}."
        )
    for key, value in (parallel_modules or {}).items():
        if not (isinstance(key, type) and issubclass(key, nn.Cell)) or not callable(value):
            raise TypeError(
                f"For 'shard_network', the argument 'parallel_modules' must map Cell classes to ZeRO-3 Cell "
                f"classes, but got {key!r}: {value!r}."
            )
    for name, cell in network.cells_and_names():
        if "zero3_original_class" in type(cell).__dict__:
            raise ValueError(
                f"For 'shard_network', the argument 'network' is already sharded (Cell {name or '<top>'!r} "
                f"was rewritten by an earlier call)."
            )
    mapping = dict(PARALLEL_MODULES)
    mapping.update(parallel_modules or {})
    return mapping


def _replace_cells(network: nn.Cell, mapping: dict, group: Optional[str]) -> nn.Cell:
    """Replace every Cell whose exact type is mapped, at any depth; shared Cells stay shared."""
    new_cells = {}
    # MindOne-style classes expect a group name; there is none before communication is initialised.
    op_group = group if group is not None or not GlobalComm.INITED else world_group()

    def convert(cell):
        if id(cell) not in new_cells:
            cls = mapping[type(cell)]
            new_cells[id(cell)] = cls(cell, zero_stage=3, op_group=op_group, cell_type=compute_dtype_of(cell))
        return new_cells[id(cell)]

    seen = set()

    def walk(parent):
        if id(parent) in seen:
            return
        seen.add(id(parent))
        for name, child in list(parent._cells.items()):
            if child is None:
                continue
            if type(child) in mapping:
                # Direct dict assignment: Cell.__setattr__ would rename the parameters.
                parent._cells[name] = convert(child)
                if isinstance(parent, nn.SequentialCell):
                    parent.cell_list = list(parent._cells.values())
            walk(parent._cells[name])

    top = convert(network) if type(network) in mapping else network
    walk(top)
    return top
