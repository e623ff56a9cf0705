"""``Stage3Options``: how ZeRO-3 shards a network, as one typed value checked once.

[Note: stage-3 options]
The keywords that say how a network is sharded (``reshard_after_forward``, ``zeropp``,
``gather_units``, ``parallel_modules``, ``special_cases_parallel_module``, ``pad_uneven_params``) are
checked in one place, ``Stage3Options.build``, called once by each public entry point that takes
them (``shard_network``, ``prepare_network``, ``prepare_train_network``), whose name the errors
carry; the layers below do not check again. The network ``shard_network`` returns carries its
options (``ZeroState``, [Note: zero3 state] in ``state.py``; ``options_of``), so that
``prepare_train_network`` on an already-sharded network knows them: a keyword left at its default
means the network's value, and one given with another value raises (``check_same_as``) instead of
being ignored (the network cannot be sharded twice). Below stage 3 only ``pad_uneven_params`` acts
(the optimizer's shards follow the same split rule); ``zeropp`` and ``gather_units`` then raise.
``build`` also reads MindSpore's mode, once: the options carry it (``graph_mode``) to the build,
which decides from it what to recompute and whether gather Cells are shared, and reads it no more.
"""
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Mapping, Optional, Tuple, Union

import mindspore as ms
from mindspore import nn

from ..core.comm import group_members, world_group
from ..core.partition import check_split_rule_flag
from ..core.quantize import check_block_size
from .zeropp import ZeroPPConfig

__all__ = ["Stage3Options", "AUTO_UNITS"]

AUTO_UNITS = "auto"
"""``gather_units``' default: the network's repeated blocks are units ([Note: units by default] in auto_units.py)."""


@dataclass(frozen=True)
class Stage3Options:
    """How ZeRO-3 shards a network ([Note: stage-3 options]). Build it with ``build``.

    Attributes:
        reshard_after_forward (bool): free gathered parameters after forward ([Note: reshard after
            forward] in ``reshard.py``).
        zeropp (ZeroPPConfig): the ZeRO++ options, None when none is on (``zeropp.py``).
        gather_units (tuple): Cell classes whose instances gather as one unit ([Note: gather units]
            in ``units.py``), or None.
        parallel_modules (Mapping): ``{Cell class: ZeRO-3 Cell class}`` matched by exact type, or None.
        special_cases_parallel_module (Mapping): the same, matched with ``isinstance``, or None.
        pad_uneven_params (bool): the padded split rule ([Note: split rule] in ``partition.py``).
        graph_mode (bool): whether MindSpore was in GRAPH_MODE when the options were built: the one
            read of the mode for a shard, which decides what the build marks for recomputation and
            whether gather Cells are shared. Not an option: equality and ``check_same_as`` ignore it.
    """

    reshard_after_forward: bool = True
    zeropp: Optional[ZeroPPConfig] = None
    gather_units: Union[str, Tuple[type, ...], None] = AUTO_UNITS
    parallel_modules: Optional[Mapping] = None
    special_cases_parallel_module: Optional[Mapping] = None
    pad_uneven_params: bool = False
    graph_mode: bool = field(default=True, compare=False)

    @classmethod
    def build(cls, where: str, zero_stage: int = 3, group: Optional[str] = None, reshard_after_forward=True,
              zeropp=None, gather_units=AUTO_UNITS, parallel_modules=None, special_cases_parallel_module=None,
              pad_uneven_params=False) -> "Stage3Options":
        """Check the keywords of the entry point ``where`` and return them as one value.

        ``zero_stage`` is the stage the caller asked for and ``group`` its shard group (hpZ's group
        must lie inside it). Not collective (reads group membership only).

        Raises:
            TypeError / ValueError: naming ``where``, the argument and the value: ``reshard_after_forward``
                not a bool (an int: not supported); ``zeropp`` as ``ZeroPPConfig`` allows, at stage 3
                only, hpZ with ``reshard_after_forward=True``, in GRAPH_MODE, inside ``group``;
                ``gather_units`` not a non-empty tuple of Cell classes, below stage 3 or with ``zeropp``;
                a module map not a dict of Cell classes to ZeRO-3 Cell classes; ``pad_uneven_params``
                not a bool.
        """
        graph_mode = ms.get_context("mode") == ms.GRAPH_MODE
        _check_reshard(where, reshard_after_forward)
        check_split_rule_flag(where, "pad_uneven_params", pad_uneven_params)
        zeropp = _zeropp(where, zeropp, zero_stage, group, reshard_after_forward, graph_mode)
        return cls(reshard_after_forward, zeropp, _gather_units(where, gather_units, zero_stage, zeropp),
                   _module_map(where, "parallel_modules", parallel_modules),
                   _module_map(where, "special_cases_parallel_module", special_cases_parallel_module),
                   pad_uneven_params, graph_mode)

    def check_same_as(self, where: str, prepared: "Stage3Options") -> None:
        """Raise unless every field of ``self`` (given at ``where``) is left at its default or equals
        ``prepared``'s, the options a network was already sharded with ([Note: stage-3 options]).

        Raises:
            ValueError: naming every argument given with a value other than ``prepared``'s, and both values.
        """
        default = Stage3Options()
        differ = [f.name for f in fields(self)
                  if f.compare and getattr(self, f.name) != getattr(default, f.name)
                  and getattr(self, f.name) != getattr(prepared, f.name)]
        if differ:
            pairs = "; ".join(f"'{name}': got {_shown(getattr(self, name))!r}, the network has "
                              f"{_shown(getattr(prepared, name))!r}" for name in differ)
            raise ValueError(
                f"For '{where}', the network was already sharded (by prepare_network or shard_network) with other "
                f"options than the ones given here: {pairs}. Pass the same values, or leave them out to keep the "
                f"network's.")


def _shown(value):
    return dict(value) if isinstance(value, MappingProxyType) else value


def _check_reshard(where: str, value) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        raise ValueError(
            f"For '{where}', the argument 'reshard_after_forward' must be a bool, but got {value!r}; an int (re-gather "
            f"from a smaller group) is not supported: ZeRO++'s hpZ is zeropp={{'hpz_group': <group name>}}."
        )
    raise TypeError(f"For '{where}', the argument 'reshard_after_forward' must be a bool, but got {value!r}.")


def _module_map(where: str, name: str, value) -> Optional[Mapping]:
    """A read-only copy of a ``{Cell class: ZeRO-3 Cell class}`` dict, or None."""
    if value is None:
        return None
    if not isinstance(value, Mapping):  # a dict, or PARALLEL_MODULES itself
        raise TypeError(f"For '{where}', the argument '{name}' must be None or a dict of Cell classes to ZeRO-3 Cell "
                        f"classes, but got {type(value).__name__}.")
    for key, cls in value.items():
        if not (isinstance(key, type) and issubclass(key, nn.Cell)) or not callable(cls):
            raise TypeError(f"For '{where}', the argument '{name}' must map Cell classes to ZeRO-3 Cell classes, but "
                            f"got {key!r}: {cls!r}.")
    return MappingProxyType(dict(value))


def _gather_units(where: str, value, zero_stage: int, zeropp: Optional[ZeroPPConfig]):
    if value is None or (isinstance(value, (tuple, list)) and not value):  # a gather per reading Cell
        return None
    if isinstance(value, str) and value == AUTO_UNITS:
        return AUTO_UNITS  # shard_network finds the blocks, or none ([Note: units by default] in auto_units.py)
    ok = isinstance(value, (tuple, list)) and len(value) > 0 and all(
        isinstance(c, type) and issubclass(c, nn.Cell) for c in value)
    if not ok:
        raise TypeError(f"For '{where}', the argument 'gather_units' must be 'auto', None, () or a tuple of Cell "
                        f"classes, but got {value!r}.")
    if zero_stage != 3:
        raise ValueError(f"For '{where}', the argument 'gather_units' applies to zero_stage 3 only, but got "
                         f"gather_units={value!r} with zero_stage={zero_stage}.")
    if zeropp is not None:
        raise ValueError(f"For '{where}', the argument 'gather_units' cannot be combined with ZeRO++ options "
                         f"(zeropp={zeropp!r}): ZeRO++ gathers are per parameter; got gather_units={value!r}.")
    return tuple(value)


def _zeropp_config(where: str, value) -> Optional[ZeroPPConfig]:
    """``value`` (None, a ``ZeroPPConfig`` or a dict of its fields) as a checked config; None when nothing is on."""
    if value is None or isinstance(value, ZeroPPConfig):
        config = value
    elif isinstance(value, dict):
        unknown = sorted(set(value) - set(ZeroPPConfig.__dataclass_fields__))
        if unknown:
            raise ValueError(f"For '{where}', the argument 'zeropp' has unknown keys {unknown}; allowed: "
                             f"{sorted(ZeroPPConfig.__dataclass_fields__)}, but got {value!r}.")
        config = ZeroPPConfig(**value)
    else:
        raise TypeError(f"For '{where}', the argument 'zeropp' must be None, a ZeroPPConfig or a dict, but got {value!r}.")
    if config is None:
        return None
    for name in ("quantize_weights", "quantize_gradients"):
        if not isinstance(getattr(config, name), bool):
            raise TypeError(f"For '{where}', the argument 'zeropp.{name}' must be a bool, but got "
                            f"{getattr(config, name)!r}.")
    check_block_size(where, "zeropp.block_size", config.block_size)
    _check_min_quantize_numel(where, config.min_quantize_numel)
    if config.hpz_group is not None and not isinstance(config.hpz_group, str):
        raise TypeError(f"For '{where}', the argument 'zeropp.hpz_group' must be None or a group name (str), but "
                        f"got {config.hpz_group!r}.")
    return config if config.enabled else None


def _check_min_quantize_numel(where: str, value) -> None:
    message = f"For '{where}', the argument 'zeropp.min_quantize_numel' must be a non-negative int, but got {value!r}."
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(message)
    if value < 0:
        raise ValueError(message)


def _zeropp(where: str, value, zero_stage: int, group: Optional[str], reshard_after_forward: bool, graph_mode: bool):
    config = _zeropp_config(where, value)
    if config is None:
        return None
    if zero_stage != 3:
        raise ValueError(f"For '{where}', the argument 'zeropp' applies to zero_stage 3 only, but got zeropp={config!r} "
                         f"with zero_stage={zero_stage}.")
    if config.hpz_group is not None:
        _check_hpz(where, config.hpz_group, group, reshard_after_forward, graph_mode)
    return config


def _check_hpz(where: str, hpz_group: str, op_group: Optional[str], reshard_after_forward: bool,
               graph_mode: bool) -> None:
    if reshard_after_forward is not True:
        raise ValueError(f"For '{where}', the argument 'zeropp.hpz_group' ({hpz_group!r}) needs "
                         f"reshard_after_forward=True (it shortens the backward re-gather), but got "
                         f"reshard_after_forward={reshard_after_forward!r}.")
    if not graph_mode:
        raise ValueError(f"For '{where}', the argument 'zeropp.hpz_group' ({hpz_group!r}) needs GRAPH_MODE (PYNATIVE "
                         f"recompute re-runs the whole Cell, primary gather included), but the mode is PYNATIVE_MODE.")
    op_members = group_members(op_group or world_group())
    try:
        members = group_members(hpz_group)
    except Exception as err:  # MindSpore raises RuntimeError/ValueError for an unknown group
        raise ValueError(f"For '{where}', the argument 'zeropp.hpz_group' must name a created group, but got "
                         f"{hpz_group!r} ({err}).") from err
    if len(members) < 2:
        raise ValueError(f"For '{where}', the argument 'zeropp.hpz_group' must hold at least 2 ranks (a secondary "
                         f"group of one rank keeps whole weights: use reshard_after_forward=False), but got "
                         f"{hpz_group!r} with ranks {members}.")
    if len(op_members) % len(members) != 0 or not set(members) <= set(op_members):
        raise ValueError(f"For '{where}', the argument 'zeropp.hpz_group' must be a group of ranks of the shard group "
                         f"{op_members} whose size divides {len(op_members)}, but got {hpz_group!r} with ranks "
                         f"{members}.")
