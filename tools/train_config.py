"""For users: part of the demo job (``tools/train.py``).

Configuration of ``tools/train.py``: defaults, YAML file, command-line overrides, checks.

A config has three sections, ``model``, ``data`` and ``train`` (see ``configs/train_lm.yaml``
for what each key means). Values are taken, later winning, from ``DEFAULTS``, the YAML file and
the command line, where every key is a flag of its own name (``--zero_stage 2 --steps 50``);
key names are unique across sections for that reason. A key the defaults do not know is an
error (a typo would otherwise be silently ignored).
"""
import argparse
import copy
from typing import Any, Dict, Optional

import yaml

__all__ = ["DEFAULTS", "add_override_flags", "load_config", "build_config", "check_config", "per_rank_batch",
           "overrides_from_args", "unit_names", "gather_units_of", "UNIT_CLASSES"]

DEFAULTS: Dict[str, Dict[str, Any]] = {
    "model": {"vocab_size": 32, "d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128, "max_len": 16},
    "data": {"num_digits": 8, "seed": 1, "eval_batch_size": 64},
    "train": {
        "world_size": 2,
        "device": "CPU",
        "mode": "graph",
        "zero_stage": 3,
        "reshard_after_forward": True,
        "gather_units": "auto",
        "pad_uneven_params": False,
        "shard_ema": False,
        "steps": 100,
        "global_batch_size": 32,
        "gradient_accumulation_steps": 1,
        "optimizer": "adamw",
        "learning_rate": 1.0e-3,
        "weight_decay": 0.0,
        "clip_grad": True,
        "clip_norm": 1.0,
        "loss_scale": 1024.0,
        "dynamic_loss_scale": False,
        "ema": True,
        "ema_decay": 0.99,
        "ckpt_interval": 50,
        "output_dir": "outputs/train_lm",
        "init_seed": 0,
        # a folder: MindSpore's compile cache in a subfolder keyed by what decides the graphs, so that a
        # restart skips the compile ([Note: compile cache] in tools/compile_cache.py); "": off
        "compile_cache": "",
    },
}

OPTIMIZERS = ("adamw", "adam", "momentum", "sgd")
UNIT_CLASSES = ("Block", "Attention", "TransformerLM")  # tools/lm_model.py Cells that can be gather units
MODES = ("graph", "pynative")
_SECTION_OF = {key: section for section, keys in DEFAULTS.items() for key in keys}
assert len(_SECTION_OF) == sum(len(keys) for keys in DEFAULTS.values()), "config keys must be unique"


def _parse_bool(text: str) -> bool:
    lowered = str(text).lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_override_flags(parser: argparse.ArgumentParser) -> None:
    """Add one ``--<key>`` flag per config key (default None: not overridden)."""
    for section, keys in DEFAULTS.items():
        group = parser.add_argument_group(f"{section} overrides")
        for key, default in keys.items():
            kind = _parse_bool if isinstance(default, bool) else type(default)
            group.add_argument(f"--{key}", type=kind, default=None, metavar=type(default).__name__.upper(),
                               help=f"{section}.{key} (default {default!r})")


def load_config(path: Optional[str], overrides: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Merge ``DEFAULTS``, the YAML file at ``path`` (if any) and ``overrides`` ({key: value}).

    Raises:
        ValueError: unknown section or key in the file or the overrides, or a bad value
            (see ``check_config``).
        OSError: the file cannot be read.
    """
    loaded = {}
    if path:
        with open(path, encoding="utf-8") as f:
            loaded = yaml.safe_load(f) or {}
    return build_config(loaded, overrides, f"the file '{path}'")


def build_config(loaded: Any, overrides: Dict[str, Any], where: str = "the config") -> Dict[str, Dict[str, Any]]:
    """``DEFAULTS`` updated with ``loaded`` ({section: {key: value}}) then ``overrides`` ({key: value}).

    Raises:
        ValueError: unknown section or key, a value of the wrong type, or out of range.
    """
    if not isinstance(loaded, dict):
        raise ValueError(f"For 'load_config', {where} must hold a mapping, but got {type(loaded).__name__}.")
    cfg = copy.deepcopy(DEFAULTS)
    for section, values in loaded.items():
        if section not in cfg or not isinstance(values, dict):
            raise ValueError(
                f"For 'load_config', {where} must have only the sections {sorted(cfg)} (mappings), but got {section!r}."
            )
        for key, value in values.items():
            _set(cfg, section, key, value, where)
    for key, value in overrides.items():
        if value is not None:
            if key not in _SECTION_OF:
                raise ValueError(f"For 'load_config', the override {key!r} is not a config key.")
            _set(cfg, _SECTION_OF[key], key, value, "the command line")
    check_config(cfg)
    return cfg


def _set(cfg, section, key, value, where):
    if key not in DEFAULTS[section]:
        raise ValueError(
            f"For 'load_config', the key '{section}.{key}' from {where} is unknown; known keys are "
            f"{sorted(DEFAULTS[section])}."
        )
    default = DEFAULTS[section][key]
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if type(value) is not type(default):
        raise ValueError(
            f"For 'load_config', the key '{section}.{key}' from {where} must be a {type(default).__name__}, "
            f"but got {value!r}."
        )
    cfg[section][key] = value


def _require(ok: bool, key: str, what: str, value) -> None:
    if not ok:
        raise ValueError(f"For 'tools/train.py', the argument '{key}' must be {what}, but got {value!r}.")


def check_config(cfg: Dict[str, Dict[str, Any]]) -> None:
    """Raise ValueError, naming the key and value, for a value out of range."""
    model, data, train = cfg["model"], cfg["data"], cfg["train"]
    for key in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len"):
        _require(model[key] >= 1, key, ">= 1", model[key])
    _require(model["vocab_size"] >= 4, "vocab_size", ">= 4 (two special tokens and two symbols)", model["vocab_size"])
    _require(model["d_model"] % model["n_heads"] == 0, "n_heads", f"a divisor of d_model={model['d_model']}",
             model["n_heads"])
    _require(data["num_digits"] >= 1, "num_digits", ">= 1", data["num_digits"])
    _require(model["max_len"] >= 2 * data["num_digits"], "max_len", f">= 2 * num_digits = {2 * data['num_digits']}",
             model["max_len"])
    _require(data["eval_batch_size"] >= 1, "eval_batch_size", ">= 1", data["eval_batch_size"])
    _require(train["world_size"] >= 1, "world_size", ">= 1", train["world_size"])
    from mindone_zero.core.stage import STAGES

    _require(train["zero_stage"] in STAGES, "zero_stage", f"one of {list(STAGES)}", train["zero_stage"])
    _require(train["mode"] in MODES, "mode", f"one of {list(MODES)}", train["mode"])
    units = [] if train["gather_units"] == "auto" else unit_names(train["gather_units"])
    _require(all(name in UNIT_CLASSES for name in units), "gather_units",
             f"'auto', empty or comma-separated names from {list(UNIT_CLASSES)}", train["gather_units"])
    _require(not units or train["zero_stage"] == 3, "gather_units", "'auto' or empty below zero_stage 3",
             train["gather_units"])
    _require(train["optimizer"] in OPTIMIZERS, "optimizer", f"one of {list(OPTIMIZERS)}", train["optimizer"])
    _require(train["steps"] >= 1, "steps", ">= 1", train["steps"])
    _require(train["gradient_accumulation_steps"] >= 1, "gradient_accumulation_steps", ">= 1",
             train["gradient_accumulation_steps"])
    for key in ("learning_rate", "clip_norm", "loss_scale"):
        _require(train[key] > 0, key, "> 0", train[key])
    _require(train["weight_decay"] >= 0, "weight_decay", ">= 0", train["weight_decay"])
    _require(0 < train["ema_decay"] < 1, "ema_decay", "in (0, 1)", train["ema_decay"])
    _require(train["ckpt_interval"] >= 0, "ckpt_interval", ">= 0 (0: no checkpoints)", train["ckpt_interval"])
    _require(train["global_batch_size"] >= 1, "global_batch_size", ">= 1", train["global_batch_size"])


def unit_names(text: str) -> list:
    """``gather_units`` ("Block,TransformerLM") as a list of names; [] for an empty string."""
    return [name.strip() for name in text.split(",") if name.strip()]


def gather_units_of(text: str, module):
    """The ``gather_units`` argument for the config's text: "auto" as it is (the library's default:
    the model's repeated blocks), an empty string None (a gather per Cell), names the classes of
    ``module``."""
    if text == "auto":
        return "auto"
    return tuple(getattr(module, name) for name in unit_names(text)) or None


def per_rank_batch(cfg: Dict[str, Dict[str, Any]], world: int) -> int:
    """Samples per rank and micro-step; the global batch must split evenly over both.

    Raises:
        ValueError: if ``global_batch_size`` is not a multiple of ``world * gradient_accumulation_steps``.
    """
    train = cfg["train"]
    chunks = world * train["gradient_accumulation_steps"]
    _require(train["global_batch_size"] % chunks == 0, "global_batch_size",
             f"a multiple of world size x gradient_accumulation_steps = {chunks}", train["global_batch_size"])
    return train["global_batch_size"] // chunks


def overrides_from_args(args: argparse.Namespace) -> Dict[str, Any]:
    """{key: value} of the config flags given on the command line."""
    return {key: getattr(args, key) for key in _SECTION_OF if getattr(args, key, None) is not None}
