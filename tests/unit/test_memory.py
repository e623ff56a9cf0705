"""estimate_model_states_memory against the ZeRO paper's Table 1, its errors, and the CLI."""
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
import yaml

from mindone_zero.memory.estimate import estimate_model_states_memory
from tools.estimate_memory import count_params_from_config, format_gb, transformer_lm_params
from tools.estimate_memory import main as estimate_memory_main

# Not `from conftest import ROOT`: with tests/dist/conftest.py also present, which module is
# `conftest` depends on collection order.
ROOT = Path(__file__).resolve().parents[2]

# ZeRO paper (Rajbhandari et al., 2020), Table 1: GB per device for stages 0 / 1 / 2 / 3,
# printed to 3 significant digits; 1 GB = 1e9 bytes.
TABLE_1 = {
    (7.5e9, 1): ("120", "120", "120", "120"),
    (7.5e9, 4): ("120", "52.5", "41.3", "30"),
    (7.5e9, 16): ("120", "35.6", "21.6", "7.5"),
    (7.5e9, 64): ("120", "31.4", "16.6", "1.88"),
    (7.5e9, 256): ("120", "30.4", "15.4", "0.47"),
    (7.5e9, 1024): ("120", "30.1", "15.1", "0.12"),
    (128e9, 64): ("2048", "536", "284", "32"),
}


@pytest.mark.parametrize("num_params,world_size", sorted(TABLE_1))
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_matches_zero_paper_table_1(num_params, world_size, stage):
    paper = Decimal(TABLE_1[(num_params, world_size)][stage])
    gb = Decimal(estimate_model_states_memory(num_params, world_size, stage)) / Decimal(10**9)
    # The paper rounds to its last printed digit: we must lie within half a unit of it.
    half_unit = Decimal(1).scaleb(paper.as_tuple().exponent) / 2
    assert abs(gb - paper) <= half_unit, (gb, paper)


def test_exact_bytes_for_7_5b_on_64_ranks():
    expected = [120_000_000_000, 31_406_250_000, 16_640_625_000, 1_875_000_000]
    assert [estimate_model_states_memory(7.5e9, 64, s) for s in range(4)] == expected


def test_formulas_with_custom_byte_counts_and_rounding_up():
    # p=4, g=4, k=8, P=10, N=3: stage 1 = 80 + 80/3 = 106.67 -> 107 bytes (a whole byte, rounded up).
    args = dict(param_bytes=4, grad_bytes=4, optimizer_bytes=8)
    assert estimate_model_states_memory(10, 3, 0, **args) == 160
    assert estimate_model_states_memory(10, 3, 1, **args) == 107
    assert estimate_model_states_memory(10, 3, 2, **args) == 40 + 40
    assert estimate_model_states_memory(10, 3, 3, **args) == 54
    # Whole results are not pushed up by floating-point error: 12 * 7.5e9 / 1024 is exact.
    assert estimate_model_states_memory(7.5e9, 1024, 1, param_bytes=0, grad_bytes=0) == 87_890_625


def test_world_size_one_equals_stage_0_and_stages_never_grow():
    for stage in range(4):
        assert estimate_model_states_memory(1e6, 1, stage) == 16_000_000
    values = [estimate_model_states_memory(1e6, 8, s) for s in range(4)]
    assert values == sorted(values, reverse=True) and values[0] > values[3]


@pytest.mark.parametrize(
    "kwargs,name,shown",
    [
        (dict(num_params=-1, world_size=8, zero_stage=1), "num_params", "-1"),
        (dict(num_params=float("nan"), world_size=8, zero_stage=1), "num_params", "nan"),
        (dict(num_params="7.5e9", world_size=8, zero_stage=1), "num_params", "'7.5e9'"),
        (dict(num_params=1e9, world_size=0, zero_stage=1), "world_size", "0"),
        (dict(num_params=1e9, world_size=2.5, zero_stage=1), "world_size", "2.5"),
        (dict(num_params=1e9, world_size=True, zero_stage=1), "world_size", "True"),
        (dict(num_params=1e9, world_size=8, zero_stage=4), "zero_stage", "4"),
        (dict(num_params=1e9, world_size=8, zero_stage=-1), "zero_stage", "-1"),
        (dict(num_params=1e9, world_size=8, zero_stage=True), "zero_stage", "True"),
        (dict(num_params=1e9, world_size=8, zero_stage=1, param_bytes=-2), "param_bytes", "-2"),
        (dict(num_params=1e9, world_size=8, zero_stage=1, grad_bytes=None), "grad_bytes", "None"),
        (dict(num_params=1e9, world_size=8, zero_stage=1, optimizer_bytes=float("inf")), "optimizer_bytes", "inf"),
    ],
)
def test_bad_arguments_name_argument_and_value(kwargs, name, shown):
    with pytest.raises(ValueError) as err:
        estimate_model_states_memory(**kwargs)
    msg = str(err.value)
    assert "estimate_model_states_memory" in msg and f"'{name}'" in msg and msg.endswith(f"but got {shown}.")


@pytest.mark.parametrize("stage,shard_ema,ema_per_device", [
    (0, False, 4e6), (1, False, 4e6), (2, False, 4e6), (3, False, 0.5e6),
    (0, True, 4e6), (1, True, 0.5e6), (2, True, 0.5e6), (3, True, 0.5e6),
])
def test_ema_bytes_follow_the_ema_layout(stage, shard_ema, ema_per_device):
    """[Note: ZeRO EMA]: whole at stages 0-2 (MindOne's layout), 1/N at stage 3 or with shard_ema."""
    without = estimate_model_states_memory(1e6, 8, stage)
    with_ema = estimate_model_states_memory(1e6, 8, stage, ema_bytes=4, shard_ema=shard_ema)
    assert with_ema - without == ema_per_device


@pytest.mark.parametrize("kwargs,name", [(dict(ema_bytes=-4), "ema_bytes"), (dict(shard_ema=1), "shard_ema")])
def test_bad_ema_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=f"'{name}'"):
        estimate_model_states_memory(1e6, 8, 1, **kwargs)


def test_transformer_lm_param_count_matches_shape_list():
    v, d, n_layers, f, max_len = 11, 4, 2, 8, 6
    layer_shapes = [(d, d), (d,)] * 4 + [(d, f), (f,), (f, d), (d,)] + [(d,), (d,)] * 2
    shapes = [(v, d), (max_len, d)] + layer_shapes * n_layers + [(d,), (d,), (d, v), (v,)]
    expected = sum(int(np.prod(s)) for s in shapes)
    assert transformer_lm_params(v, d, n_layers, f, max_len) == expected == 475
    cfg = {"model": dict(vocab_size=v, d_model=d, n_layers=n_layers, d_ff=f, max_len=max_len, dropout=0.1)}
    assert count_params_from_config(cfg) == 475
    assert count_params_from_config({"num_params": 7.5e9}) == 7_500_000_000


@pytest.mark.parametrize(
    "cfg,fragment",
    [
        ({"train": {}}, "'num_params' key or a 'model' section"),
        ({"model": {"vocab_size": 11, "d_model": 4}}, "lacks keys ['n_layers', 'd_ff', 'max_len']"),
        ({"model": dict(vocab_size=11, d_model=0, n_layers=1, d_ff=2, max_len=3)}, "'model.d_model' must be a positive integer, but got 0."),
        ({"num_params": -5}, "'num_params' must be >= 0, but got -5."),
        ([1, 2], "the argument 'cfg' must be a mapping, but got [1, 2]."),
    ],
)
def test_count_params_from_config_errors(cfg, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        count_params_from_config(cfg)


@pytest.mark.parametrize("num_bytes,text", [(120e9, "120"), (31_406_250_000, "31.4"), (1_875_000_000, "1.88"),
                                            (41_250_000_000, "41.3"), (2048e9, "2048"), (0, "0"), (5225, "0.00000523")])
def test_format_gb_three_significant_digits_half_up(num_bytes, text):
    assert format_gb(int(num_bytes)) == text


def _cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "estimate_memory.py"), *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_prints_paper_row_for_7_5b_on_64():
    proc = _cli("--params", "7.5e9", "--world-size", "64")
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split("|")[1].strip()[0] for r in rows] == ["0", "1", "2", "3"]
    assert [r.split("|")[3].strip() for r in rows] == ["120", "31.4", "16.6", "1.88"]
    assert [int(r.split("|")[2]) for r in rows] == [120_000_000_000, 31_406_250_000, 16_640_625_000, 1_875_000_000]


def test_cli_reads_config(tmp_path, capsys):
    cfg = tmp_path / "lm.yaml"
    cfg.write_text(yaml.safe_dump({"model": dict(vocab_size=11, d_model=4, n_layers=2, d_ff=8, max_len=6)}))
    assert estimate_memory_main(["--config", str(cfg), "--world-size", "2"]) == 0
    stdout = capsys.readouterr().out
    assert "475 parameters" in stdout and "| 7600 |" in stdout  # 16 bytes * 475 at stage 0


@pytest.mark.parametrize(
    "args,fragment",
    [
        (("--params", "7.5e9", "--world-size", "0"), "the argument 'world_size' must be a finite integer > 0, but got 0."),
        (("--params", "-3", "--world-size", "2"), "the argument 'num_params' must be a finite number >= 0, but got -3.0."),
        (("--config", "/nonexistent/x.yaml", "--world-size", "2"), "No such file"),
        (("--world-size", "2"), "one of the arguments --params --config is required"),
    ],
)
def test_cli_errors_exit_2_with_message(args, fragment, capsys):
    # In-process: each subprocess pays MindSpore's import (the package's __init__) once more.
    with pytest.raises(SystemExit) as exc:
        estimate_memory_main(list(args))
    captured = capsys.readouterr()
    assert exc.value.code == 2 and fragment in captured.err and captured.out == "", captured.err
