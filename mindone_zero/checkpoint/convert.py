"""Offline combine: ``convert_checkpoints`` merges per-rank ZeRO checkpoints into one file of
full tensors, reading and writing one tensor at a time. Not collective; one process.
``transform_checkpoints`` is the same function under MindOne 0.2.0's name.
"""
import os
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ..core.partition import merge_arrays
from .readers import FORMATS, format_of_path, open_checkpoint
from ..core.split_info import full_shape_of, read_split_infos
from .export import (cast_tensor, check_copy_files_from, check_dtype, check_export_target, check_max_shard_size,
                     export_names, plan_export, write_export)
from .writers import TensorEntry

__all__ = ["convert_checkpoints", "transform_checkpoints", "OPTIMIZER_STATE_PREFIXES", "OPTIMIZER_SCALAR_NAMES"]

# First dotted component of the names MindSpore / MindOne optimizers give their states
# (nn.Adam: moment1/moment2, AdamWeightDecay: adam_m/adam_v, Momentum: moments, Adagrad: accum,
# ASGD/Rprop-style: stat, AMSGrad: vhat).
OPTIMIZER_STATE_PREFIXES = ("moment1", "moment2", "moments", "adam_m", "adam_v", "accum", "stat", "vhat")
# Whole names of optimizer scalars.
OPTIMIZER_SCALAR_NAMES = ("global_step", "beta1_power", "beta2_power", "learning_rate")
# Copies of network weights, not optimizer states: kept by ``exclude_optimizer_states`` even when
# recognised only by prefix stripping.
_NON_OPTIMIZER_PREFIXES = ("ema",)
_CALLER = "convert_checkpoints"


def _check_convert_args(src_checkpoint, src_param_split_info_json, group_size, output_format, progress) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise ValueError(f"For '{_CALLER}', the argument 'group_size' must be a positive integer, but got "
                         f"{group_size!r}.")
    for arg, value in (("src_checkpoint", src_checkpoint), ("src_param_split_info_json", src_param_split_info_json)):
        ok = isinstance(value, str) and "{}" in value
        try:
            ok = ok and bool(value.format(0))
        except (IndexError, KeyError, ValueError):
            ok = False
        if not ok:
            raise ValueError(
                f"For '{_CALLER}', the argument '{arg}' must be a path with one '{{}}' standing for the rank index "
                f"(and no other braces), but got {value!r}."
            )
    if not src_checkpoint.endswith((".ckpt", ".safetensors")):
        raise ValueError(f"For '{_CALLER}', the argument 'src_checkpoint' must end with '.ckpt' or '.safetensors', but "
                         f"got {src_checkpoint!r}.")
    if output_format is not None and output_format not in FORMATS:
        raise ValueError(f"For '{_CALLER}', the argument 'output_format' must be one of {list(FORMATS)} or None, but "
                         f"got {output_format!r}.")
    if progress is not None and not callable(progress):
        raise TypeError(f"For '{_CALLER}', the argument 'progress' must be callable or None, but got {progress!r}.")


def _output_path(src_checkpoint: str, group_size: int, output_format: Optional[str], sharded: bool) -> Tuple[str, str]:
    """MindOne's output name, with the extension switched when ``output_format`` asks for it, or
    dropped for the folder of a sharded export."""
    path = src_checkpoint.format(f"all_{group_size}")
    if sharded:
        if output_format not in (None, "safetensors"):
            raise ValueError(f"For '{_CALLER}', the argument 'output_format' must be 'safetensors' or None when "
                             f"'max_shard_size' is set (the sharded layout is safetensors only), but got "
                             f"{output_format!r}.")
        return os.path.splitext(path)[0], "safetensors"
    fmt = output_format or format_of_path(path)
    if format_of_path(path) != fmt:
        path = os.path.splitext(path)[0] + "." + fmt
    return path, fmt


def _lookup(name: str, info: Dict[str, dict]) -> Tuple[Optional[str], bool]:
    """The split-info key for ``name`` and whether it was found only after stripping leading
    dotted components ("moment1.dense.weight" -> "dense.weight"): MindOne's JSON lists network
    parameter names only, and optimizer states carry the parameter name behind a prefix."""
    if name in info:
        return name, False
    parts = name.split(".")
    for i in range(1, len(parts)):
        key = ".".join(parts[i:])
        if key in info:
            return key, True
    return None, False


def _is_optimizer_state(name: str, stripped: bool) -> bool:
    """The ``exclude_optimizer_states`` rule; see ``convert_checkpoints``."""
    first = name.split(".", 1)[0]
    if name in OPTIMIZER_SCALAR_NAMES or ("." in name and first in OPTIMIZER_STATE_PREFIXES):
        return True
    return stripped and first not in _NON_OPTIMIZER_PREFIXES


def _check_same_names(files) -> None:
    ref = files[0]
    for f in files[1:]:
        if set(f.infos) != set(ref.infos):
            missing, extra = sorted(set(ref.infos) - set(f.infos)), sorted(set(f.infos) - set(ref.infos))
            raise ValueError(
                f"For '{_CALLER}', the checkpoint '{f.path}' holds other names than '{ref.path}': "
                f"missing {missing[:5]}, extra {extra[:5]}."
            )
        for name, info in ref.infos.items():
            if f.infos[name] != info:
                raise ValueError(
                    f"For '{_CALLER}', the shard {name!r} has shape {f.infos[name].shape} ({f.infos[name].dtype}) in "
                    f"'{f.path}' but {info.shape} ({info.dtype}) in '{ref.path}'."
                )


def _plan(files, info: Dict[str, dict], json_path: str, n: int, exclude: bool) -> List[Tuple[str, Optional[int]]]:
    """(name, full dim 0 or None when taken whole from rank 0), in rank 0's order; raises on
    every inconsistency between the files and the split info before anything is read."""
    plan = []
    for name, tensor in files[0].infos.items():
        key, stripped = _lookup(name, info)
        if exclude and _is_optimizer_state(name, stripped):
            continue
        entry = info.get(key) if key is not None else None
        where = f"the split info '{json_path}'"
        if entry is not None and entry["split"]:
            plan.append((name, full_shape_of(name, tensor.shape, entry, n, _CALLER, where)[0]))
            continue
        # A state found by prefix stripping may legitimately differ in shape from its
        # replicated parameter (factored second moments), so only direct matches are checked.
        if entry is not None and not stripped and "shape" in entry and tuple(entry["shape"]) != tensor.shape:
            raise ValueError(
                f"For '{_CALLER}', the replicated tensor {name!r} has shape {tensor.shape} in '{files[0].path}', "
                f"but {where} gives {tuple(entry['shape'])}."
            )
        plan.append((name, None))
    return plan


def convert_checkpoints(
    src_checkpoint: str,
    src_param_split_info_json: str,
    group_size: int,
    *,
    output_format: Optional[str] = None,
    exclude_optimizer_states: bool = False,
    progress: Optional[Callable[[int, int, str], None]] = None,
    dtype=None,
    max_shard_size=None,
    strip_prefix: Optional[str] = None,
    add_prefix: Optional[str] = None,
    copy_files_from: Optional[str] = None,
) -> str:
    """Combine per-rank ZeRO checkpoints into one file of full tensors (MindOne's naming).

    Not collective; runs in one process. Reads ``src_checkpoint.format(r)`` and
    ``src_param_split_info_json.format(r)`` for ``r`` in ``0 .. group_size - 1`` and writes
    ``src_checkpoint.format(f"all_{group_size}")`` (extension switched to ``output_format``); with
    ``max_shard_size``, the folder of that name without its extension, in the Hugging Face
    sharded layout ([Note: sharded layout] in hf_index.py; it must not exist or be empty,
    [Note: export folder] in export.py).

    For each name, in rank 0's order:

    * found in the split info (directly, or after stripping leading dotted components, as for
      optimizer states "moment1.w" or "adam_m.w" of a network parameter "w") with ``split``:
      the blocks of all ranks are concatenated in rank order and the padding dropped
      ([Note: padding] in partition.py). The full dim 0 is the JSON ``shape``; MindOne's JSON has
      no ``shape``, but MindOne split only tensors whose dim 0 divides by the group, so nothing
      is dropped;
    * otherwise (not split, or unknown to the split info): replicated, taken from rank 0 (every
      rank must hold the same shape and dtype).

    ``exclude_optimizer_states`` drops a name when: it is one of ``OPTIMIZER_SCALAR_NAMES``; or
    its first dotted component is one of ``OPTIMIZER_STATE_PREFIXES``; or it is absent from the
    split info and found there only by prefix stripping, unless its first component is ``ema``
    (EMA weights are copies of the network, not optimizer states).

    Every check runs before anything is written, and the output is written atomically ([Note: atomic
    files] in core/atomic_files.py): after any error no output file exists (or a previous one is intact).

    Memory: tensors are read lazily, one at a time (``readers``), and the output is written as it
    goes, one tensor at a time (``writers``), byte for byte the file ``mindspore.save_checkpoint``
    would write for the same tensors (a safetensors file declares ``{"format": "pt"}``, which
    ``transformers`` reads: [Note: safetensors metadata] in writers.py). At most one tensor's blocks
    from all ranks and their concatenation are held at once: the call raises the peak RSS by
    about twice the largest tensor (three times with a ``dtype`` cast), whatever the checkpoint's
    size. ``tools/bench/measure_combine_memory.py`` measures it (docs/guides/checkpoints.md);
    ``tests/unit/test_checkpoint_io.py`` checks the bound.

    Args:
        src_checkpoint: per-rank checkpoint path with ``{}`` for the rank index, ending with
            ``.ckpt`` or ``.safetensors``, e.g. ``"ckpt/rank_{}/net.ckpt"``.
        src_param_split_info_json: per-rank split-info path with ``{}``, e.g.
            ``"params_info/params_split_info_{}.json"``; ours or MindOne's format.
        group_size: ranks in the optimizer parallel group that wrote the files.
        output_format: ``"ckpt"``, ``"safetensors"`` or None (the input's format).
        exclude_optimizer_states: drop optimizer states (rule above).
        progress: called as ``progress(done, total, name)`` after each tensor.
        dtype: None (as stored), ``"fp32"``, ``"fp16"``, ``"bf16"`` (or ``mindspore.float32`` /
            ``float16`` / ``bfloat16``): floating tensors are written in that dtype; others unchanged.
        max_shard_size: None (one file), or bytes as an int or a string such as ``"5GB"``: write
            the sharded safetensors folder, files of at most that many bytes of data (a larger
            tensor gets a file of its own).
        strip_prefix: taken off the front of every tensor name that has it (e.g. ``"net."``);
            EMA weights keep ``ema.`` in front of their mapped name ([Note: export names] in
            export.py). None keeps the names.
        add_prefix: then put in front of every tensor name.
        copy_files_from: with ``max_shard_size``, a folder (the Hugging Face folder the model was
            loaded from) whose non-weight files at its top are copied as they are into the output
            ([Note: companion files] in hf_folder.py); the names copied are logged (INFO).

    Returns:
        str: the output path (a folder with ``max_shard_size``).

    Raises:
        ValueError: bad arguments; a JSON whose ``group_size`` or ``rank_id`` disagrees with the
            argument or its file index, or that disagrees with rank 0's; rank files with different
            names, shapes or dtypes; a shard shape inconsistent with the JSON ``shape``; a
            truncated or corrupted checkpoint; strings requested in ``.safetensors`` output; an
            unknown ``dtype``; a bad ``max_shard_size``; a sharded output folder that is a file
            or not empty; prefixes that give two tensors one name; ``copy_files_from`` without
            ``max_shard_size`` or not an existing folder.
            Each message names the file and the problem.
        FileNotFoundError: a rank's checkpoint or JSON is missing.

    Examples:
        >>> import os
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from mindone_zero import convert_checkpoints, prepare_train_network
        >>> net = nn.WithLossCell(nn.Dense(4, 2), nn.MSELoss())
        >>> optimizer = nn.AdamWeightDecay(net.trainable_params())
        >>> train_net = prepare_train_network(net, optimizer)
        >>> # prepare_train_network writes the split info at stages >= 1:
        >>> train_net.zero_helper.dump_params_split_info("params_info")
        >>> os.makedirs("rank_0")
        >>> ms.save_checkpoint(train_net, "rank_0/net.ckpt")   # MindOne's per-rank save
        >>> info = "params_info/params_split_info_{}.json"
        >>> convert_checkpoints("rank_{}/net.ckpt", info, 1,
        ...                     exclude_optimizer_states=True)
        'rank_all_1/net.ckpt'
        >>> sorted(ms.load_checkpoint("rank_all_1/net.ckpt"))
        ['bias', 'scale_sense', 'weight']

        The files of a 4-rank job, into a Hugging Face folder in bf16 (tests/unit/test_checkpoint_io.py
        and tests/unit/test_hf_export.py run these calls on files they write for 1 to 4 ranks):

        >>> convert_checkpoints("ckpt/rank_{}/net.ckpt", info, 4, dtype="bf16",
        ...                     output_format="safetensors", max_shard_size="5GB")
        'ckpt/rank_all_4/net'
    """
    _check_convert_args(src_checkpoint, src_param_split_info_json, group_size, output_format, progress)
    target, max_size = check_dtype(dtype, _CALLER), check_max_shard_size(max_shard_size, _CALLER)
    copies = check_copy_files_from(copy_files_from, max_size is not None, _CALLER)
    n = int(group_size)
    ckpt_paths = [src_checkpoint.format(r) for r in range(n)]
    json_paths = [src_param_split_info_json.format(r) for r in range(n)]
    for kind, path in [("checkpoint", p) for p in ckpt_paths] + [("split info", p) for p in json_paths]:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"For '{_CALLER}', the {kind} file '{path}' of the group of {n} ranks does "
                                    f"not exist.")
    out_path, out_format = _output_path(src_checkpoint, n, output_format, max_size is not None)
    check_export_target(out_path, max_size is not None, _CALLER, "output (named after 'src_checkpoint')")
    info = read_split_infos(json_paths, n, _CALLER, f"the argument 'group_size' is {n}")[0]
    files = [open_checkpoint(p, _CALLER) for p in ckpt_paths]
    _check_same_names(files)
    plan = _plan(files, info, json_paths[0], n, exclude_optimizer_states)
    strings = [name for name, _ in plan if files[0].infos[name].dtype == "str"]
    if strings and out_format == "safetensors":
        raise ValueError(f"For '{_CALLER}', '{ckpt_paths[0]}' holds strings {strings[:5]}, which safetensors cannot "
                         f"store.")
    entries = _entries(files[0], plan)
    exported = export_names([name for name, _ in plan], strip_prefix, add_prefix, _CALLER)
    source = dict(zip(exported, plan))  # exported name -> (name in the rank files, full dim 0 or None)

    def produce(name):
        stored, full_d0 = source[name]
        if full_d0 is None:
            return cast_tensor(files[0].read(stored), target)
        return cast_tensor(merge_arrays([f.read(stored) for f in files], full_d0), target)

    done = []

    def written(name):
        done.append(name)
        if progress is not None:
            progress(len(done), len(plan), name)

    export = plan_export([(new,) + tuple(e[1:]) for new, e in zip(exported, entries)], out_format, target, max_size)
    return write_export(out_path, export, produce, written, copy_files=copies)


def transform_checkpoints(src_checkpoint: str, src_param_split_info_json: str, group_size: int, **options) -> str:
    """MindOne 0.2.0's name for ``convert_checkpoints`` (0.3.0 onward call it that): the same call.

    Not collective; runs in one process. Takes MindOne's three arguments in MindOne's order and
    ``convert_checkpoints``' keyword-only options (``output_format``, ``dtype``, ``max_shard_size``
    and the others), writes the same file, ``src_checkpoint.format(f"all_{group_size}")``, and
    returns its path (MindOne's returns None).

    Args:
        src_checkpoint (str): per-rank checkpoint path with ``{}`` for the rank index.
        src_param_split_info_json (str): per-rank split-info path with ``{}``.
        group_size (int): ranks in the optimizer parallel group that wrote the files.
        **options: ``convert_checkpoints``' keyword-only arguments.

    Returns:
        str: the output path.

    Raises:
        ValueError / FileNotFoundError / TypeError: as ``convert_checkpoints``, whose name the
            messages give.

    Examples:
        A MindOne 0.2.0 script's offline combine, unchanged (tests/unit/test_mindone_compat.py runs
        it against ``convert_checkpoints``):

        >>> from mindone_zero import transform_checkpoints
        >>> transform_checkpoints("ckpt/rank_{}/net.ckpt",
        ...                       "params_info/params_split_info_{}.json", 4)
        'ckpt/rank_all_4/net.ckpt'
    """
    return convert_checkpoints(src_checkpoint, src_param_split_info_json, group_size, **options)


def _entries(rank0, plan) -> List[TensorEntry]:
    """(name, full shape, numpy dtype or str) of every output tensor, in ``plan``'s order."""
    entries = []
    for name, full_d0 in plan:
        shape = rank0.infos[name].shape
        if full_d0 is not None:
            shape = (full_d0,) + tuple(shape[1:])
        entries.append((name, tuple(shape), rank0.numpy_dtype(name)))
    return entries
