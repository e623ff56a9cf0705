"""Print the model-state memory per device of ZeRO stages 0-3 as a markdown table.

    mindone-zero-estimate-memory --params 7.5e9 --world-size 64
    mindone-zero-estimate-memory --config configs/train_lm.yaml --world-size 8

With ``--config``, the parameter count comes from the YAML file: either a top-level
``num_params:`` key, or a ``model:`` section describing the demo Transformer language model
(keys ``vocab_size``, ``d_model``, ``n_layers``, ``d_ff``, ``max_len``), counted by
``count_params_from_config``. Memory follows ``mindone_zero.estimate_model_states_memory``
(docs/guides/memory.md); 1 GB = 1e9 bytes.

The same command runs as ``python -m mindone_zero.cli.estimate_memory`` and, in a checkout, as
``python tools/estimate_memory.py``. Not collective: pure arithmetic, no communication.
"""
import argparse
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import yaml

from ..memory.estimate import estimate_model_states_memory, estimate_peak_memory

_MODEL_KEYS = ("vocab_size", "d_model", "n_layers", "d_ff", "max_len")
_STAGE_NAMES = {
    0: "0 (data parallel)",
    1: "1 (optimizer states)",
    2: "2 (+ gradients)",
    3: "3 (+ parameters)",
}


def transformer_lm_params(vocab_size: int, d_model: int, n_layers: int, d_ff: int, max_len: int) -> int:
    """Parameters of the demo Transformer LM (pre-LN decoder, biases everywhere, untied head).

    With V = vocab_size, d = d_model, f = d_ff, L = max_len:

    * token embedding V*d, learned positional embedding L*d;
    * per layer: attention Q, K, V and output projections 4*d*d + 4*d; MLP d*f + f + f*d + d;
      two LayerNorms 2 * 2*d;
    * final LayerNorm 2*d; output head d*V + V.
    """
    d, v, f = d_model, vocab_size, d_ff
    per_layer = (4 * d * d + 4 * d) + (2 * d * f + f + d) + 4 * d
    return v * d + max_len * d + n_layers * per_layer + 2 * d + d * v + v


def count_params_from_config(cfg: dict) -> int:
    """Parameter count of the model a config describes (see the module docstring).

    Raises:
        ValueError: if the config has neither ``num_params`` nor a complete ``model:`` section,
            or a value is not a positive integer.
    """
    if not isinstance(cfg, dict):
        raise ValueError(f"For 'count_params_from_config', the argument 'cfg' must be a mapping, but got {cfg!r}.")
    if "num_params" in cfg:
        value = float(cfg["num_params"])
        if not value >= 0:
            raise ValueError(f"For 'count_params_from_config', 'num_params' must be >= 0, but got {cfg['num_params']!r}.")
        return int(value)
    model = cfg.get("model")
    if not isinstance(model, dict):
        raise ValueError(
            "For 'count_params_from_config', the config must have a 'num_params' key or a 'model' section "
            f"with keys {list(_MODEL_KEYS)}, but got top-level keys {sorted(cfg)}."
        )
    missing = [k for k in _MODEL_KEYS if k not in model]
    if missing:
        raise ValueError(f"For 'count_params_from_config', the 'model' section lacks keys {missing}, but got {sorted(model)}.")
    for key in _MODEL_KEYS:
        if isinstance(model[key], bool) or not isinstance(model[key], int) or model[key] < 1:
            raise ValueError(
                f"For 'count_params_from_config', 'model.{key}' must be a positive integer, but got {model[key]!r}."
            )
    return transformer_lm_params(**{k: model[k] for k in _MODEL_KEYS})


def format_gb(num_bytes: int) -> str:
    """``num_bytes`` in GB (1e9 bytes) as the ZeRO paper prints it: 3 significant digits, halves
    rounded up, whole GB never rounded away (2048, not 2050)."""
    value = Decimal(num_bytes) / Decimal(10**9)
    if value == 0:
        return "0"
    exponent = min(value.adjusted() - 2, 0)
    rounded = value.quantize(Decimal(1).scaleb(exponent), rounding=ROUND_HALF_UP)
    return f"{rounded:f}" if exponent < 0 else str(int(rounded))


def memory_table(num_params, world_size: int, param_bytes=2, grad_bytes=2, optimizer_bytes=12) -> str:
    """Markdown table of bytes and GB per device for ZeRO stages 0-3."""
    lines = [
        f"Model states per device: {num_params:g} parameters, world size {world_size}, "
        f"{param_bytes:g}+{grad_bytes:g}+{optimizer_bytes:g} bytes per parameter (params+grads+optimizer).",
        "",
        "| ZeRO stage | bytes per device | GB per device |",
        "|---|---:|---:|",
    ]
    for stage, name in _STAGE_NAMES.items():
        nbytes = estimate_model_states_memory(num_params, world_size, stage, param_bytes, grad_bytes, optimizer_bytes)
        lines.append(f"| {name} | {nbytes} | {format_gb(nbytes)} |")
    return "\n".join(lines)


def peak_table(num_params, world_size: int, largest_layer, param_bytes=2, grad_bytes=2, optimizer_bytes=12,
               hpz_group_size=None) -> str:
    """Markdown table of the peak estimate (``estimate_peak_memory``) per stage, and at stage 3
    for both ``reshard_after_forward`` values (and with ZeRO++'s hpZ over ``hpz_group_size`` ranks)."""
    lines = [
        f"Peak per device: model states plus the full-layer term, largest layer {largest_layer:g} parameters "
        f"(activations not counted).",
        "",
        "| ZeRO stage | reshard_after_forward | bytes per device | GB per device |",
        "|---|---|---:|---:|",
    ]
    for stage, name in _STAGE_NAMES.items():
        for reshard in ((False, True) if stage == 3 else (True,)):
            nbytes = estimate_peak_memory(num_params, world_size, stage, largest_layer, param_bytes, grad_bytes,
                                          optimizer_bytes, reshard_after_forward=reshard)
            option = str(reshard) if stage == 3 else "-"
            lines.append(f"| {name} | {option} | {nbytes} | {format_gb(nbytes)} |")
    if hpz_group_size is not None:
        nbytes = estimate_peak_memory(num_params, world_size, 3, largest_layer, param_bytes, grad_bytes,
                                      optimizer_bytes, hpz_group_size=hpz_group_size)
        lines.append(f"| {_STAGE_NAMES[3]} | True, hpZ over {hpz_group_size} ranks | {nbytes} | {format_gb(nbytes)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Print the memory table(s) for command-line arguments ``argv`` (default: ``sys.argv[1:]``).

    Returns:
        0 after printing.

    Raises:
        SystemExit: with status 2 and a message on stderr for bad arguments or an unreadable or
            incomplete config, with status 0 after ``--help``.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--params", type=float, help="number of model parameters, e.g. 7.5e9")
    source.add_argument("--config", type=Path, help="YAML with 'num_params' or a 'model' section")
    parser.add_argument("--world-size", type=int, required=True, help="ranks the states are partitioned over")
    parser.add_argument("--param-bytes", type=float, default=2, help="bytes per parameter (default 2, fp16)")
    parser.add_argument("--grad-bytes", type=float, default=2, help="bytes per gradient (default 2, fp16)")
    parser.add_argument("--optimizer-bytes", type=float, default=12, help="optimizer bytes per parameter (default 12, Adam)")
    parser.add_argument("--largest-layer", type=float,
                        help="parameters of the largest layer: also print the peak estimate (estimate_peak_memory)")
    parser.add_argument("--hpz-group-size", type=int,
                        help="with --largest-layer: add stage 3 with ZeRO++'s hpZ secondary shards over this many ranks")
    args = parser.parse_args(argv)

    try:
        if args.config is not None:
            with open(args.config, encoding="utf-8") as f:
                num_params = count_params_from_config(yaml.safe_load(f))
        else:
            num_params = args.params
        print(memory_table(num_params, args.world_size, args.param_bytes, args.grad_bytes, args.optimizer_bytes))
        if args.largest_layer is not None:
            print()
            print(peak_table(num_params, args.world_size, args.largest_layer, args.param_bytes, args.grad_bytes,
                             args.optimizer_bytes, args.hpz_group_size))
    except (ValueError, OSError) as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
