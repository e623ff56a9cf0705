"""The Hugging Face sharded safetensors layout: names, the index file, and how tensors are grouped
into shard files. Pure file-name and JSON work: no tensor data, no communication.

[Note: sharded layout]
A model too large for one file is published (by ``transformers``' ``save_pretrained``, and so by
MindOne's ``mindone.transformers`` and ``mindone.diffusers``) as a folder holding
``model.safetensors.index.json`` and files ``model-00001-of-0000n.safetensors`` ...
``model-0000n-of-0000n.safetensors``. The index is JSON ``{"metadata": {"total_size": bytes},
"weight_map": {tensor name: file name}}``; ``total_size`` is the sum of the tensors' data bytes
(headers excluded). Each file is an ordinary safetensors file holding the tensors the map assigns
to it. Tensors are grouped in order, a new file starting when the next tensor would take the
current one past ``max_shard_size`` bytes; a tensor larger than that gets a file to itself.
"""
import json
import os
import re
from typing import Dict, List, Sequence, Tuple, Union

from ..core.atomic_files import atomic_write_json

__all__ = ["INDEX_NAME", "shard_file_name", "parse_size", "group_into_shards", "index_json", "write_index",
           "read_index"]

INDEX_NAME = "model.safetensors.index.json"
_UNITS = {"B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
          "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40}


def shard_file_name(k: int, n: int) -> str:
    """The name of file ``k`` (1-based) of ``n`` in the sharded layout, e.g. ``model-00001-of-00003.safetensors``."""
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def parse_size(value: Union[int, str], caller: str, arg: str = "max_shard_size") -> int:
    """Bytes from an int or a string such as ``"5GB"``, ``"500MB"``, ``"2GiB"`` (decimal KB/MB/GB, as
    ``transformers`` reads them; binary KiB/MiB/GiB). Raises ValueError naming ``caller``, ``arg``
    and the value unless the result is a positive integer."""
    size = None
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)\s*", value.upper())
        if match:
            size = int(float(match.group(1)) * _UNITS[match.group(2)])
    if size is None or size <= 0:
        raise ValueError(f"For '{caller}', the argument '{arg}' must be a positive number of bytes (an int, or a "
                         f"string such as '5GB' or '500MB'), but got {value!r}.")
    return size


def group_into_shards(sizes: Sequence[Tuple[str, int]], max_shard_size: int) -> List[List[str]]:
    """Names grouped into files in order ([Note: sharded layout]): a file is closed when the next
    tensor would take it past ``max_shard_size`` bytes; a larger tensor gets a file of its own."""
    files, current, used = [], [], 0
    for name, nbytes in sizes:
        if current and used + nbytes > max_shard_size:
            files.append(current)
            current, used = [], 0
        current.append(name)
        used += nbytes
    if current or not files:
        files.append(current)
    return files


def index_json(groups: Sequence[Sequence[str]], total_size: int) -> dict:
    """The index of ``groups`` (one list of names per file, in file order)."""
    n = len(groups)
    weight_map = {name: shard_file_name(k + 1, n) for k, names in enumerate(groups) for name in names}
    return {"metadata": {"total_size": int(total_size)}, "weight_map": weight_map}


def write_index(folder: str, index: dict) -> str:
    """Write ``index`` as ``folder/model.safetensors.index.json`` atomically; return its path."""
    return atomic_write_json(index, os.path.join(folder, INDEX_NAME))


def read_index(folder: str, caller: str, arg: str = "path") -> Dict[str, str]:
    """``{tensor name: absolute file path}`` from ``folder``'s index, checked before any tensor is read.

    Raises:
        ValueError: naming ``caller``, ``arg`` and the value, when the index is missing, is not
            JSON, has no ``weight_map`` of names to file names, names a file outside the folder, or
            names a file that does not exist.
    """
    path = os.path.join(folder, INDEX_NAME)
    if not os.path.isfile(path):
        raise ValueError(f"For '{caller}', the argument '{arg}' ({folder!r}) is a folder without {INDEX_NAME}.")
    try:
        with open(path, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map")
    except (ValueError, AttributeError) as err:
        raise ValueError(f"For '{caller}', the index {path!r} of the argument '{arg}' is not a JSON object: "
                         f"{err}.") from err
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in weight_map.items()):
        raise ValueError(f"For '{caller}', the index {path!r} of the argument '{arg}' must hold a 'weight_map' of "
                         f"tensor names to file names, but got {type(weight_map).__name__}.")
    files = {}
    for file_name in sorted(set(weight_map.values())):
        full = os.path.join(folder, file_name)
        if os.path.basename(file_name) != file_name:
            raise ValueError(f"For '{caller}', the index {path!r} names the file {file_name!r}, which is not in "
                             f"the folder of the argument '{arg}'.")
        if not os.path.isfile(full):
            raise ValueError(f"For '{caller}', the index {path!r} names the shard file {file_name!r}, which does "
                             f"not exist.")
        files[file_name] = full
    return {name: files[file_name] for name, file_name in weight_map.items()}
