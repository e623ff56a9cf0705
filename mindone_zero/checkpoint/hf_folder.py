"""The files of a Hugging Face model folder that are not weights (its config, generation config and
tokenizer files), found and copied so that an export can stand in for the folder the model was
loaded from. Not collective; file-system work only.

[Note: companion files]
A Hugging Face model folder holds, beside the weights (``model*.safetensors``, ``pytorch_model*.bin``,
their ``*.index.json``, ``tf_model.h5``, ``flax_model.msgpack``), the files that ``from_pretrained``
and the tokenizer read: ``config.json``, ``generation_config.json``, ``tokenizer.json``,
``tokenizer_config.json``, ``special_tokens_map.json``, ``tokenizer.model`` and the like. An export
with ``copy_files_from`` copies every regular file at the top of that folder whose name has none of
``WEIGHT_SUFFIXES`` and does not start with ``.``, as it is (bytes and permission bits), into its
folder before the folder is moved into place ([Note: export folder] in export.py). Symbolic links
(a Hugging Face cache's snapshot folder is made of them) are followed and their targets' bytes
copied. Sub-folders are left out. A weight file is never copied, so the export's own weight files
and index are never replaced.
"""
import os
import shutil
from typing import List, Sequence

__all__ = ["WEIGHT_SUFFIXES", "companion_files", "copy_companion_files"]

# Names with these endings are weights (or the index of weights), never copied.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".ckpt", ".pt", ".pth", ".h5", ".msgpack", ".gguf", ".onnx", ".npz",
                   ".index.json")


def companion_files(folder, caller: str, arg: str = "copy_files_from") -> List[str]:
    """The paths of ``folder``'s files to copy ([Note: companion files]), sorted by name.

    Raises:
        TypeError: ``folder`` is not a path, naming ``caller`` and ``arg``.
        ValueError: ``folder`` is not an existing folder, naming ``caller``, ``arg`` and the value.
    """
    if not isinstance(folder, (str, os.PathLike)) or not os.fspath(folder):
        raise TypeError(f"For '{caller}', the argument '{arg}' must be a folder path or None, but got {folder!r}.")
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise ValueError(f"For '{caller}', the argument '{arg}' must be an existing folder, but got {folder!r}.")
    names = sorted(n for n in os.listdir(folder) if not n.startswith(".") and not n.endswith(WEIGHT_SUFFIXES))
    return [os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))]


def copy_companion_files(paths: Sequence[str], destination: str) -> List[str]:
    """Copy each of ``paths`` into the folder ``destination`` under its own name, as it is (bytes and
    permission bits, symbolic links followed); return the names copied.

    Raises:
        OSError: a file could not be read or written.
    """
    names = []
    for path in paths:
        name = os.path.basename(path)
        shutil.copyfile(path, os.path.join(destination, name))
        shutil.copymode(path, os.path.join(destination, name))
        names.append(name)
    return names
