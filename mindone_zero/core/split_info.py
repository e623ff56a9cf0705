"""The split-info JSON (``params_split_info_{rank}.json``): its format, its one validator, and
the checks that tie a group's files together and a shard's shape to its entry. Not collective.

Each entry has MindOne's keys ``split``, ``group_size``, ``rank_id`` plus ours, ``shape`` (full,
unpadded) and ``pad`` (padding rows; [Note: padding] in partition.py). MindOne's files lack
``shape`` and ``pad`` and are accepted.
"""
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

from .partition import ShardSpec, is_int, padding_rows, shard_rows
from .atomic_files import atomic_write_json

__all__ = ["write_split_info", "read_split_info", "read_split_infos", "full_shape_of"]


def write_split_info(
    specs: Sequence[ShardSpec], folder: str, rank_id: int, prefix: str = "params_split_info", tag: str = ""
) -> str:
    """Write ``{folder}/{prefix}_{rank_id}{tag}.json`` = ``{name: spec.to_json()}`` atomically (not collective).

    With hybrid groups (several data-parallel replicas of one optimizer group writing to the same
    folder), ranks of different replicas share ``rank_id``; give each replica its own ``tag``
    (for example ``f"_dp{replica}"``) so the files stay distinct, and pass the matching pattern
    (``"params_split_info_{}_dp0.json"``) to ``convert_checkpoints``. The default tag ``""`` gives
    MindOne's name ``params_split_info_{rank_id}.json``.

    Args:
        specs: one ShardSpec per saved name (network params, optimizer states, EMA).
        folder: destination folder (created if needed).
        rank_id: this rank's index in the optimizer parallel group; every spec's ``rank`` must equal it.
        prefix: file name prefix.
        tag: suffix placed after ``rank_id``.

    Returns:
        The path written.

    Raises:
        ValueError: if a spec's rank differs from ``rank_id``, group sizes differ, or names repeat.
    """
    entries = {}
    for spec in specs:
        if spec.rank != rank_id or spec.group_size != specs[0].group_size or spec.name in entries:
            raise ValueError(
                f"For 'write_split_info', every spec must have rank {rank_id}, one group size and a unique name, "
                f"but got {spec}."
            )
        entries[spec.name] = spec.to_json()
    return atomic_write_json(entries, os.path.join(folder, f"{prefix}_{rank_id}{tag}.json"))


def _check_entry(entry) -> Optional[str]:
    """The problem with one split-info entry, or None."""
    if not isinstance(entry, dict):
        return f"the entry is a {type(entry).__name__}, not an object"
    if not isinstance(entry.get("split"), bool):
        return f"'split' must be a bool, got {entry.get('split')!r}"
    size, rank = entry.get("group_size"), entry.get("rank_id")
    if not is_int(size) or size < 1 or not is_int(rank) or not 0 <= rank < size:
        return f"'group_size' and 'rank_id' must be integers with 0 <= rank_id < group_size, got {size!r}, {rank!r}"
    shape, pad = entry.get("shape"), entry.get("pad")
    if shape is not None and (not isinstance(shape, list) or not all(is_int(s) and s >= 0 for s in shape)):
        return f"'shape' must be a list of non-negative integers, got {shape!r}"
    if shape is not None and entry["split"] and len(shape) == 0:
        return "a 0-d tensor cannot be split"
    if pad is not None and not (is_int(pad) and pad >= 0):
        return f"'pad' must be a non-negative integer, got {pad!r}"
    if shape is not None and pad is not None:
        want = padding_rows(shape[0], size) if entry["split"] else 0
        if pad != want:
            return f"'pad' is {pad}, but shape {shape} over {size} ranks needs {want}"
    return None


def read_split_info(path: str) -> Dict[str, dict]:
    """Read and validate one ``params_split_info_*.json``.

    Accepts our entries and MindOne's (which lack ``shape`` and ``pad``). Not collective.

    Args:
        path: the JSON file.

    Returns:
        ``{name: entry}``; each entry has ``split``, ``group_size``, ``rank_id`` and, when the
        file has them, ``shape`` and ``pad``.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the file is not JSON, not an object, or an entry is malformed; the
            message names the file and the entry.
    """
    with open(path, encoding="utf-8") as f:
        try:
            info = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"For 'read_split_info', the file '{path}' is not valid JSON: {err}.") from err
    if not isinstance(info, dict):
        raise ValueError(
            f"For 'read_split_info', the file '{path}' must hold a JSON object,"
            f" but got {type(info).__name__}."
        )
    for name, entry in info.items():
        problem = _check_entry(entry)
        if problem:
            raise ValueError(f"For 'read_split_info', the entry {name!r} in '{path}' is malformed: {problem}.")
    return info


def read_split_infos(paths: Sequence[str], group_size: int, caller: str, expected: str) -> List[Dict[str, dict]]:
    """Read the JSON of every rank of a group (file ``r`` of ``paths`` is rank ``r``'s) and check
    them together: each entry's ``group_size`` is ``group_size`` and its ``rank_id`` the file's
    index, and every file lists rank 0's names with rank 0's ``split`` and ``shape``. Not collective.

    Args:
        paths: the files in rank order.
        group_size: the size of the group that wrote them.
        caller: the public function named in errors.
        expected: where ``group_size`` comes from, for errors ("the argument 'group_size' is 2").

    Raises:
        ValueError: naming the file, the entry and the disagreement.
    """
    infos = [read_split_info(p) for p in paths]
    for rank, (path, info) in enumerate(zip(paths, infos)):
        for name, entry in info.items():
            if entry["group_size"] != group_size:
                raise ValueError(
                    f"For '{caller}', the split info '{path}' gives {name!r} group_size {entry['group_size']} (a group "
                    f"of {entry['group_size']} ranks), but {expected}."
                )
            if entry["rank_id"] != rank:
                raise ValueError(
                    f"For '{caller}', the split info '{path}' is file {rank} of the group, but its entry {name!r} "
                    f"has rank_id {entry['rank_id']}."
                )
        if set(info) != set(infos[0]):
            diff = sorted(set(info) ^ set(infos[0]))[:5]
            raise ValueError(f"For '{caller}', the split info '{path}' lists other names than '{paths[0]}': {diff}.")
        for name, entry in info.items():
            ref = infos[0][name]
            if (entry["split"], entry.get("shape")) != (ref["split"], ref.get("shape")):
                raise ValueError(
                    f"For '{caller}', the split info '{path}' disagrees with '{paths[0]}' on {name!r}: {entry} vs {ref}."
                )
    return infos


def full_shape_of(name: str, shard: Tuple[int, ...], entry: dict, n: int, caller: str, where: str) -> Tuple[int, ...]:
    """Full shape of the split tensor ``name`` whose blocks over ``n`` ranks have shape ``shard``,
    from its split-info ``entry``; MindOne's entries have no ``shape``, but MindOne split only
    tensors whose dim 0 divides by the group, so there is no padding to drop.

    Raises:
        ValueError: the tensor is 0-d, or ``shard`` is not the block shape of the entry's full
            shape (naming ``where`` the entry comes from).
    """
    shard = tuple(shard)
    if len(shard) == 0:
        raise ValueError(f"For '{caller}', {name!r} is split in {where}, but the checkpoint holds a 0-d tensor.")
    if "shape" not in entry:
        return (shard[0] * n,) + shard[1:]
    full = tuple(entry["shape"])
    expected = (shard_rows(full[0], n),) + full[1:] if full else ()
    if shard != expected:
        raise ValueError(
            f"For '{caller}', the shard {name!r} has shape {shard}, but {where} gives it the full shape {full}, "
            f"whose shards over {n} ranks have shape {expected} (rows = ceil({full[0] if full else 0} / {n}))."
        )
    return full
