"""tools/train.py pieces that need no msrun: config merging and errors, the LM and its data,
the progress line, the history file, and the launcher's refusal to overwrite checkpoints."""
import json
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
import yaml
from mindspore import Tensor

from tools import train
from tools.estimate_memory import count_params_from_config
from tools.lm_model import SEP, LMLoss, build_lm, init_lm_weights, reversal_batch
from tools import lm_model
from tools.train_config import DEFAULTS, build_config, gather_units_of, load_config, per_rank_batch, unit_names

ROOT = Path(__file__).resolve().parents[3]

ms.set_device("CPU")
CONFIG = ROOT / "configs" / "train_lm.yaml"


@pytest.fixture
def pynative():
    """PYNATIVE_MODE for one test, the previous mode restored (other tests share the process)."""
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=mode)


def test_yaml_then_command_line_win_over_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    loaded = {"train": {"zero_stage": 1, "steps": 7, "learning_rate": 1}, "model": {"d_model": 32}}
    path.write_text(yaml.safe_dump(loaded))
    cfg = load_config(str(path), {"steps": 9, "clip_grad": False})
    assert cfg["train"]["zero_stage"] == 1 and cfg["train"]["steps"] == 9 and cfg["train"]["clip_grad"] is False
    assert cfg["train"]["learning_rate"] == 1.0 and cfg["model"]["d_model"] == 32
    assert cfg["train"]["optimizer"] == DEFAULTS["train"]["optimizer"]


def test_stage3_options_from_the_command_line():
    cfg = load_config(str(CONFIG), {"gather_units": " Block, TransformerLM", "reshard_after_forward": False})
    assert unit_names(cfg["train"]["gather_units"]) == ["Block", "TransformerLM"]
    assert cfg["train"]["reshard_after_forward"] is False
    assert DEFAULTS["train"]["gather_units"] == "auto" and DEFAULTS["train"]["reshard_after_forward"] is True
    # the library's default, a gather per Cell, the named classes
    assert gather_units_of("auto", lm_model) == "auto" and gather_units_of("", lm_model) is None
    assert gather_units_of(" Block, TransformerLM", lm_model) == (lm_model.Block, lm_model.TransformerLM)


def test_shipped_config_loads_and_is_the_default_demo():
    cfg = load_config(str(CONFIG), {})
    assert cfg["train"]["zero_stage"] == 3 and cfg["train"]["world_size"] == 2
    assert cfg["train"]["output_dir"].startswith("outputs/")


@pytest.mark.parametrize("loaded,fragment", [
    ({"train": {"zero_stage": 4}}, "'zero_stage' must be one of [0, 1, 2, 3], but got 4"),
    ({"train": {"zero_stagee": 1}}, "'train.zero_stagee'"),
    ({"optim": {}}, "but got 'optim'"),
    ({"train": {"steps": "10"}}, "'train.steps' from the config must be a int, but got '10'"),
    ({"model": {"n_heads": 3}}, "'n_heads' must be a divisor of d_model=64, but got 3"),
    ({"model": {"max_len": 8}}, "'max_len' must be >= 2 * num_digits = 16, but got 8"),
    ({"train": {"ema_decay": 1.0}}, "'ema_decay' must be in (0, 1), but got 1.0"),
    ({"train": {"mode": "eager"}}, "'mode' must be one of ['graph', 'pynative'], but got 'eager'"),
    ({"train": {"ckpt_interval": -1}}, "'ckpt_interval' must be >= 0"),
    ({"train": {"gather_units": "Block,Dense"}},
     "'gather_units' must be 'auto', empty or comma-separated names from ['Block', 'Attention', 'TransformerLM'], but got "
     "'Block,Dense'"),
    ({"train": {"zero_stage": 2, "gather_units": "Block"}}, "'gather_units' must be 'auto' or empty below zero_stage 3, but got "
     "'Block'"),
    ({"train": {"reshard_after_forward": "no"}}, "'train.reshard_after_forward' from the config must be a bool"),
])
def test_bad_config_names_key_and_value(loaded, fragment):
    with pytest.raises(ValueError) as err:
        build_config(loaded, {})
    assert fragment in str(err.value)


def test_global_batch_must_split_over_ranks_and_micro_steps():
    cfg = build_config({"train": {"global_batch_size": 12, "gradient_accumulation_steps": 2}}, {})
    assert per_rank_batch(cfg, 2) == 3
    with pytest.raises(ValueError, match="multiple of world size x gradient_accumulation_steps = 8, but got 12"):
        per_rank_batch(cfg, 4)


def test_model_parameter_count_matches_estimate_tool():
    cfg = load_config(str(CONFIG), {})
    net = build_lm(cfg["model"])
    counted = sum(int(np.prod(p.shape)) for p in net.trainable_params())
    assert counted == count_params_from_config(cfg)


def test_reversal_batch_is_deterministic_and_scored_on_the_reversed_half():
    ids, targets, weights = reversal_batch(1, 5, 4, 6, 16)
    again = reversal_batch(1, 5, 4, 6, 16)
    assert all(np.array_equal(a, b) for a, b in zip((ids, targets, weights), again))
    assert not np.array_equal(ids, reversal_batch(1, 6, 4, 6, 16)[0])
    assert ids.shape == targets.shape == weights.shape == (4, 12)
    assert (ids[:, 6] == SEP).all() and (ids[:, :6] >= 2).all()
    np.testing.assert_array_equal(targets[:, 6:], ids[:, :6][:, ::-1])  # the answer is the reversed first half
    np.testing.assert_array_equal(weights, np.repeat([[0] * 6 + [1] * 6], 4, axis=0))


def test_attention_is_causal(pynative):
    net = init_lm_weights(build_lm(dict(vocab_size=16, d_model=16, n_layers=1, d_ff=32, max_len=8, n_heads=2)), 0)
    ids, _, _ = reversal_batch(0, 0, 2, 4, 16)
    changed = ids.copy()
    changed[:, 5] = 2 + (changed[:, 5] - 1) % 14
    a, b = net(Tensor(ids)).asnumpy(), net(Tensor(changed)).asnumpy()
    np.testing.assert_array_equal(a[:, :5], b[:, :5])  # positions before the change cannot see it
    assert np.abs(a[:, 5:] - b[:, 5:]).max() > 0


def test_initial_loss_is_about_uniform(pynative):
    net = init_lm_weights(build_lm(dict(vocab_size=16, d_model=16, n_layers=1, d_ff=32, max_len=8, n_heads=2)), 0)
    loss = float(LMLoss(net)(*(Tensor(a) for a in reversal_batch(0, 0, 32, 4, 16))).asnumpy())
    assert abs(loss - np.log(16)) < 1.0


def test_progress_line_and_bytes():
    line = train.format_progress(5, 20, 1.23456, 0.0421, 760.0, 65)
    assert line.startswith("[#####...............]  5/20 loss 1.2346")
    assert "42.1 ms/step" in line and "760.0 samples/s" in line and line.endswith("eta 01:05")
    assert train.format_progress(0, 3, 2.0, 1.0, 1.0, None).endswith("eta --:--")
    assert [train.format_bytes(n) for n in (512, 36 * 1024, 3 << 20)] == ["512 B", "36.0 KiB", "3.00 MiB"]


def test_history_keeps_steps_up_to_the_resumed_one(tmp_path):
    path = tmp_path / "history.jsonl"
    h = train.History(path, 0, True)
    for step in range(1, 6):
        h.add({"step": step, "loss": float(step)})
    assert train.History(path, 3, True).losses() == [1.0, 2.0, 3.0]
    assert train.History(path, 0, True).losses() == []
    assert train.History(path, 0, False).losses() == []  # ranks other than 0 write nothing


def test_launcher_refuses_to_start_over_on_earlier_checkpoints(tmp_path, capsys):
    step = tmp_path / "ckpt" / "step_00000003"
    step.mkdir(parents=True)
    (step / "meta.json").write_text(json.dumps({"step": 3}))
    code = train.main(["--config", str(CONFIG), "--output_dir", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "holds checkpoints of an earlier run" in err and "--resume" in err


def test_bad_flag_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", str(CONFIG), "--zero_stage", "7"])
    assert exit_info.value.code == 2
    assert "'zero_stage' must be one of [0, 1, 2, 3], but got 7" in capsys.readouterr().err
