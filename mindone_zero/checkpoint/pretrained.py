"""Load a full (unsharded) pretrained checkpoint into a prepared network, each rank reading only
the bytes of its own blocks. Collective over the world (one agreement before and one after any
change).

[Note: pretrained load]
A fine-tuning script builds its network, prepares it (``prepare_network``; at stage 3 the split
parameters then hold this rank's block and carry ``param.zero_spec``) and loads published weights:
a ``.ckpt``, a ``.safetensors`` file, or a folder in the Hugging Face sharded layout ([Note:
sharded layout] in hf_index.py). ``load_full_checkpoint`` maps every file tensor to a network
parameter by name, checks names, shapes and dtypes on every rank and agrees (one all-reduce) before
changing anything, then for each parameter reads, one tensor at a time, only what this rank holds:
rows ``[r * rows, min((r + 1) * rows, d0))`` of a split tensor ([Note: ranged reads] in readers.py),
zero-padded to its block ([Note: padding] in core/partition.py), and whole tensors whole. Given a
train network (``prepare_train_network``), the stage 1-2 fp32 master shards and the EMA weights
(and an aligned swap cache) follow the network's values, as they would had the weights been loaded
before ``prepare_train_network`` (MindOne's way): a value goes file dtype -> the network
parameter's dtype -> the holder's dtype. Parameters built under ``no_init_parameters`` are given
their block with ``set_data`` without being initialised first, so no full copy is ever made.
"""
import os
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn

from ..core.partition import ShardSpec, zero_spec_of
from ..train.ema import ema_entries
from ..train.inventory import inventory
from ..train.train_step import TrainOneStepWrapper
from .hf_index import read_index
from .naming import prefix_mapper
from .peft_names import peft_names
from .agreement import agree, attempt
from .readers import SafetensorsFile, open_checkpoint

__all__ = ["load_full_checkpoint"]

CALLER = "load_full_checkpoint"
_BF16 = np.dtype("bfloat16")
_SHOWN = 5  # names listed in one error message


@dataclass
class _Target:
    """One network parameter and every Parameter that holds (a block of) its value."""

    name: str
    shape: Tuple[int, ...]  # full, unpadded
    dtype: np.dtype  # the network parameter's: file values pass through it
    holders: List[Tuple[Parameter, ShardSpec]] = field(default_factory=list)


@dataclass
class _Plan:
    items: List[Tuple[_Target, object, str]]  # (target, reader, file tensor name)
    missing: List[str]
    unexpected: List[str]


def load_full_checkpoint(network, path, *, strict: bool = True, strip_prefix: Optional[str] = None,
                         add_prefix: Optional[str] = None,
                         name_map: Optional[Callable[[str], Optional[str]]] = None) -> Tuple[List[str], List[str]]:
    """Load a full pretrained checkpoint into a prepared network, each rank reading only its blocks.

    Collective: every rank must call it, with the same arguments. Nothing changes on any rank unless
    every rank has validated the whole load first (names, shapes, dtypes, file sizes); a failure on
    any rank raises on every rank ([Note: pretrained load]). Only an I/O error while reading the
    data, after that agreement, can leave a load half done (it too raises on every rank). Call it
    before training starts: ``set_data`` installs new tensors. String entries of a ``.ckpt``
    (``append_dict``) are ignored. With ``optimizer_offload`` load into the network from
    ``prepare_network`` instead (the host-side masters are out of reach here).

    A network wrapped by PEFT (``peft``, ``mindone.peft``: tuner layers holding the original as
    ``base_layer``) takes its base model's checkpoint as it is: a file name that matches no
    parameter is matched to the parameter PEFT renamed (``base_model.model.`` and ``.base_layer``
    taken out), after the prefixes or ``name_map``, and the adapters (``lora_A``, ``lora_B``, ...),
    which no base checkpoint holds, keep their values and are not reported missing.

    Args:
        network (nn.Cell): the network from ``prepare_network`` (at stage 3 its split parameters hold
            this rank's block; at stages 0-2 it is whole), or a ``TrainOneStepWrapper`` from
            ``prepare_train_network``, whose fp32 master shards (stages 1-2) and EMA weights then
            follow the loaded values. Parameters may be unmaterialized (``no_init_parameters``).
        path (str): a ``.ckpt`` or ``.safetensors`` file, or a folder in the Hugging Face sharded
            layout (``model.safetensors.index.json`` and its ``model-0000k-of-0000n.safetensors``).
        strict (bool): True: a network parameter without a tensor (missing) or a tensor no parameter
            takes (unexpected) raises. False: they are skipped and returned.
        strip_prefix (str): removed from the start of each file tensor name that has it.
        add_prefix (str): then prepended to every file tensor name (e.g. ``"net."`` for a network
            wrapped in a loss Cell).
        name_map (Callable[[str], Optional[str]]): instead of the prefixes, file tensor name ->
            network parameter name; None skips that tensor.

    Returns:
        tuple: ``(missing, unexpected)``: network parameter names that got no tensor and file
            tensor names that went to no parameter (both empty when ``strict``).

    Raises:
        TypeError: ``network``, ``path``, ``strict``, a prefix or ``name_map`` of the wrong type,
            or ``name_map`` returning neither a str nor None.
        ValueError: a path that does not exist or has an unknown extension, a missing shard file,
            a truncated or corrupted file, an index naming a tensor its file lacks, a name map that
            maps two tensors to one parameter, missing or unexpected tensors (``strict``), a shape
            that differs, a dtype numpy cannot hold or that does not convert (only floating types
            convert to one another); each names the argument or the tensor and the file.
        RuntimeError: another rank failed (this one changed nothing).

    Examples:
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from mindone_zero import load_full_checkpoint, prepare_network
        >>> ms.save_checkpoint(nn.Dense(4, 2), "pretrained.ckpt")   # a full checkpoint
        >>> network = prepare_network(nn.Dense(4, 2), zero_stage=3)
        >>> load_full_checkpoint(network, "pretrained.ckpt")   # (missing, unexpected)
        ([], [])

        Into a stage-3 network built without memory, on every rank; each rank reads only its
        blocks (tests/dist/test_pretrained_parity.py runs these calls):

        >>> with sharded_init():
        ...     network = MyModel(config)
        >>> network = prepare_network(network, zero_stage=3)
        >>> load_full_checkpoint(network, "model.safetensors")
        ([], [])
    """
    plan, error = attempt(lambda: _plan(network, path, strict, strip_prefix, add_prefix, name_map))
    agree(network, error, CALLER)
    _, error = attempt(lambda: _apply(plan.items))
    agree(network, error, CALLER)
    return plan.missing, plan.unexpected


# ----------------------------------------------------------------------------- plan


def _plan(network, path, strict, strip_prefix, add_prefix, name_map) -> _Plan:
    """Every check, before any read of tensor data: names, shapes, dtypes."""
    if not isinstance(strict, bool):
        raise TypeError(f"For '{CALLER}', the argument 'strict' must be a bool, but got {strict!r}.")
    mapper = _name_mapper(strip_prefix, add_prefix, name_map)
    targets = _targets(network)
    aliases, adapters = peft_names(network.network if isinstance(network, TrainOneStepWrapper) else network)
    source = _open_source(path)
    taken, unexpected = {}, []
    for file_name in source:
        name = mapper(file_name)
        if name is None:
            continue
        if name not in targets:
            name = aliases.get(name, name)  # a base model's name in a PEFT-wrapped network
        if name in taken:
            how = "the argument 'name_map'" if name_map is not None else "the arguments 'strip_prefix'/'add_prefix'"
            raise ValueError(f"For '{CALLER}', {how} map both tensors {taken[name]!r} and {file_name!r} of the "
                             f"argument 'path' ({path!r}) to the parameter {name!r}.")
        taken[name] = file_name
        if name not in targets:
            unexpected.append(file_name)
    missing = [name for name in targets if name not in taken and name not in adapters]
    if strict and (missing or unexpected):
        raise ValueError(_strict_message(path, source, missing, unexpected))
    items = [(targets[name], source[f], f) for name, f in taken.items() if name in targets]
    for target, reader, file_name in items:
        _check_tensor(target, reader, file_name)
    return _Plan(items, missing, unexpected)


def _strict_message(path, source, missing, unexpected) -> str:
    parts = []
    if missing:
        parts.append(f"the parameters {missing[:_SHOWN]} ({len(missing)} in all) have no tensor in it")
    if unexpected:
        where = [f"{f!r} of '{source[f].path}'" for f in unexpected[:_SHOWN]]
        parts.append(f"the tensors {', '.join(where)} ({len(unexpected)} in all) match no parameter")
    return (f"For '{CALLER}', the checkpoint of the argument 'path' ({path!r}) does not match the argument "
            f"'network' with strict=True: {'; '.join(parts)}. Map the names (strip_prefix, add_prefix, name_map) "
            f"or pass strict=False.")


def _name_mapper(strip_prefix, add_prefix, name_map) -> Callable[[str], Optional[str]]:
    by_prefix = prefix_mapper(strip_prefix, add_prefix, CALLER)
    if name_map is None:
        return by_prefix
    if not callable(name_map):
        raise TypeError(f"For '{CALLER}', the argument 'name_map' must be a callable or None, but got "
                        f"{name_map!r}.")
    if strip_prefix or add_prefix:
        raise ValueError(f"For '{CALLER}', give either the argument 'name_map' or the prefixes, but got "
                         f"name_map={name_map!r}, strip_prefix={strip_prefix!r}, add_prefix={add_prefix!r}.")
    return lambda file_name: _checked_name(file_name, name_map(file_name))


def _checked_name(file_name: str, name) -> Optional[str]:
    if name is not None and not isinstance(name, str):
        raise TypeError(f"For '{CALLER}', the argument 'name_map' must return a str or None, but got {name!r} for "
                        f"the tensor {file_name!r}.")
    return name


def _numpy_dtype(param: Parameter) -> np.dtype:
    return _BF16 if param.dtype == ms.bfloat16 else np.dtype(ms.dtype_to_nptype(param.dtype))


def _add_holder(targets: Dict[str, _Target], owner: Parameter, holder: Parameter, spec: ShardSpec) -> None:
    target = targets.setdefault(owner.name, _Target(owner.name, spec.shape, _numpy_dtype(owner)))
    if tuple(holder.shape) != spec.shard_shape or spec.shape != target.shape:
        raise ValueError(f"For '{CALLER}', the argument 'network' holds {holder.name!r} of shape "
                         f"{tuple(holder.shape)}, but its ZeRO layout (full shape {spec.shape}, split={spec.split} "
                         f"over {spec.group_size} ranks) gives {spec.shard_shape}.")
    target.holders.append((holder, spec))


def _targets(network) -> Dict[str, _Target]:
    """{network parameter name: its target}; from the inventory for a train network."""
    if isinstance(network, TrainOneStepWrapper):
        return _train_targets(network)
    if not isinstance(network, nn.Cell):
        raise TypeError(f"For '{CALLER}', the argument 'network' must be a Cell (from prepare_network) or a "
                        f"TrainOneStepWrapper (from prepare_train_network), but got {type(network).__name__}.")
    targets = {}
    for p in network.get_parameters():
        spec = zero_spec_of(p)  # set by ZeRO-3's shard_network; its name may predate a wrapper's prefix
        held = replace(spec, name=p.name) if spec is not None else ShardSpec(p.name, tuple(p.shape), 1, 0, False)
        _add_holder(targets, p, p, held)
    return targets


def _train_targets(train_net) -> Dict[str, _Target]:
    shards = train_net.optimizer_shards  # [Note: train records] in train/train_plan.py
    if train_net.zero_plan.offload.enabled:
        raise ValueError(f"For '{CALLER}', the argument 'network' runs its optimizer on the host "
                         f"(optimizer_offload), whose master values this function cannot reach: load into the "
                         f"network from prepare_network before prepare_train_network.")
    owners = {id(q): p for q, p in zip(shards.opt_params, shards.params)}
    if train_net.ema is not None:
        owners.update({id(e): w for w, e, _ in ema_entries(train_net.ema)})
    targets = {}
    for held in inventory(train_net):
        owner = held.param if held.kind == "params" else owners.get(id(held.param))
        if held.kind in ("params", "master_shards", "ema") and owner is not None:
            _add_holder(targets, owner, held.param, held.held)
    return targets


def _open_source(path) -> Dict[str, object]:
    """{file tensor name: its reader}, headers only; string entries of a ``.ckpt`` are left out."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"For '{CALLER}', the argument 'path' must be a str, but got {type(path).__name__}.")
    path = os.fspath(path)
    if os.path.isdir(path):
        return _open_folder(path)
    if not os.path.isfile(path):
        raise ValueError(f"For '{CALLER}', the argument 'path' must be an existing file or folder, but got {path!r}.")
    if not path.endswith((".ckpt", ".safetensors")):
        raise ValueError(f"For '{CALLER}', the argument 'path' must end with '.ckpt' or '.safetensors' (or be a "
                         f"folder in the Hugging Face sharded layout), but got {path!r}.")
    reader = open_checkpoint(path, CALLER)
    return {name: reader for name, info in reader.infos.items() if info.dtype != "str"}


def _open_folder(folder: str) -> Dict[str, object]:
    readers, out = {}, {}
    for name, file in read_index(folder, CALLER).items():
        if file not in readers:
            readers[file] = SafetensorsFile(file, CALLER)
        if name not in readers[file].infos:
            raise ValueError(f"For '{CALLER}', the index of the argument 'path' ({folder!r}) names the tensor "
                             f"{name!r} in '{file}', which does not hold it.")
        out[name] = readers[file]
    return out


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype == _BF16


def _file_dtype(reader, name: str) -> np.dtype:
    try:
        return np.dtype(reader.numpy_dtype(name))
    except ValueError as err:
        raise ValueError(f"For '{CALLER}', the argument 'path': {err}") from None


def _check_tensor(target: _Target, reader, name: str) -> None:
    shape = tuple(reader.infos[name].shape)
    if shape != target.shape:
        raise ValueError(f"For '{CALLER}', the tensor {name!r} of '{reader.path}' has shape {shape}, but the "
                         f"parameter {target.name!r} of the argument 'network' has shape {target.shape}.")
    dtype = _file_dtype(reader, name)
    wanted = [target.dtype] + [_numpy_dtype(p) for p, _ in target.holders]
    bad = [d for d in wanted if d != dtype and not (_is_float(d) and _is_float(dtype))]
    if bad:
        raise ValueError(f"For '{CALLER}', the tensor {name!r} of '{reader.path}' has dtype {dtype}, which does not "
                         f"convert to {bad[0]} of the parameter {target.name!r} (only floating types convert).")


# ----------------------------------------------------------------------------- apply


def _apply(items) -> None:
    """Read and install each target's blocks, one tensor at a time."""
    for target, reader, name in items:
        splits = [spec for _, spec in target.holders if spec.split]
        # a whole holder needs the whole tensor anyway: its blocks are cut from it, not read again
        whole = None if len(splits) == len(target.holders) else _as(reader.read_rows(name), target.dtype)
        block = None
        for param, spec in target.holders:
            if not spec.split:
                value = whole
            else:
                if block is None:
                    block = _block(reader, name, spec, target.dtype, whole)
                value = block
            param.set_data(Tensor(_as(value, _numpy_dtype(param)), param.dtype))


def _as(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return arr if arr.dtype == dtype else arr.astype(dtype)


def _block(reader, name: str, spec: ShardSpec, dtype: np.dtype, whole) -> np.ndarray:
    """This rank's block of ``spec`` ([Note: padding]): its rows only, then the zero padding rows."""
    start = min(spec.rank * spec.rows, spec.shape[0])
    stop = min(start + spec.rows, spec.shape[0])
    rows = whole[start:stop] if whole is not None else _as(reader.read_rows(name, start, stop), dtype)
    if rows.shape[0] == spec.rows:
        return np.ascontiguousarray(rows)
    out = np.zeros(spec.shard_shape, dtype=dtype)
    out[:rows.shape[0]] = rows
    return out
