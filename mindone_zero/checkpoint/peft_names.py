"""A PEFT-wrapped network's parameter names, matched to its base model's checkpoint. Reads only.

PEFT (``peft``, ``mindone.peft``) wraps a model as ``base_model.model.<the model>`` and each adapted
layer as a tuner layer holding the original as ``base_layer`` beside its adapters (``lora_A``,
``lora_B``, ...). So ``model.layers.0.self_attn.q_proj.weight`` of the base model's checkpoint is
``base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight`` in the wrapped network, and the
adapters are in no base checkpoint. ``peft_names`` finds both from the network's structure: a base
name for every parameter whose name PEFT changed, and the adapters' names, so that
``load_full_checkpoint`` loads a base checkpoint into a PEFT-wrapped network by itself.
"""
from typing import Dict, Set, Tuple

from mindspore import nn

from ..core.ms_internals import child_cells

__all__ = ["peft_names", "BASE_LAYER", "WRAP_PREFIX"]

BASE_LAYER = "base_layer"
WRAP_PREFIX = "base_model.model."


def _base_name(name: str) -> str:
    """``name`` as the base model has it: PEFT's wrap and every ``.base_layer`` taken out."""
    name = name.replace(f".{BASE_LAYER}.", ".")
    at = name.find(WRAP_PREFIX)
    if at == 0 or (at > 0 and name[at - 1] == "."):
        name = name[:at] + name[at + len(WRAP_PREFIX):]
    return name


def peft_names(network: nn.Cell) -> Tuple[Dict[str, str], Set[str]]:
    """``({base name: parameter name}, adapter parameter names)`` of ``network``; both empty for a
    network without PEFT tuner layers (no Cell holds a ``base_layer`` child)."""
    adapters, tuners = set(), False
    for _, cell in network.cells_and_names():
        base = child_cells(cell).get(BASE_LAYER)
        if not isinstance(base, nn.Cell):
            continue
        tuners = True
        in_base = {p.name for p in base.get_parameters()}
        adapters.update(p.name for p in cell.get_parameters() if p.name not in in_base)
    if not tuners:
        return {}, set()
    aliases = {}
    for p in network.get_parameters():
        base = _base_name(p.name)
        if base != p.name and p.name not in adapters:
            aliases[base] = p.name
    return aliases, adapters
