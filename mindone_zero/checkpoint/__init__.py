"""Checkpoints of a ZeRO train network: per-rank save and resume with resharding, the online
and offline combine into full tensors, and the file formats underneath. One module per job:

============== ==========================================================================
atomic         files that appear under their name only once complete ([Note: atomic files])
split_info     the split-info JSON: format, its one validator, group and shard-shape checks
readers        lazy, one-tensor-at-a-time readers of ``.ckpt`` and ``.safetensors``
writers        streaming writers of the same formats
naming         step folders, ``latest``, ``meta.json``, each kind's file names
agreement      every rank raises or none: the collective error agreement
layout         what a train network saves where ([Note: checkpoint layout], [Note: resharding])
load_plan      how a saved checkpoint maps onto a train network
resume         ``save_train_state`` / ``load_train_state`` (collective)
online         ``gather_full_params`` / ``save_full_checkpoint`` (collective, streamed)
export         an export's dtype, files (one, or the sharded folder) and writing
hf_index       the Hugging Face sharded layout: file names, index, grouping
hf_folder      a Hugging Face folder's other files (config, tokenizer), copied into an export
convert        ``convert_checkpoints`` and its MindOne 0.2.0 name ``transform_checkpoints``: the offline
               combine (one process)
pretrained     ``load_full_checkpoint``: a full pretrained file into a prepared network (collective)
============== ==========================================================================
"""
from ..core.atomic_files import atomic_write_json
from .atomic import atomic_save_checkpoint
from .convert import OPTIMIZER_SCALAR_NAMES, OPTIMIZER_STATE_PREFIXES, convert_checkpoints, transform_checkpoints
from .naming import latest_checkpoint, step_dir_name
from .online import gather_full_params, save_full_checkpoint
from .pretrained import load_full_checkpoint
from .readers import FORMATS, open_checkpoint
from .resume import load_train_state, save_train_state
from ..core.split_info import read_split_info, write_split_info

__all__ = [
    "save_train_state",
    "load_train_state",
    "latest_checkpoint",
    "step_dir_name",
    "gather_full_params",
    "save_full_checkpoint",
    "load_full_checkpoint",
    "convert_checkpoints",
    "transform_checkpoints",
    "atomic_save_checkpoint",
    "atomic_write_json",
    "write_split_info",
    "read_split_info",
    "open_checkpoint",
    "FORMATS",
    "OPTIMIZER_STATE_PREFIXES",
    "OPTIMIZER_SCALAR_NAMES",
]
