"""tools/convert_checkpoints.py, run as a user would: a subprocess with command-line arguments (the bad
input cases call its ``main(argv)`` in this process: their subject is the message and the exit status)."""
import os
import re
import subprocess
import sys

import mindspore as ms
import numpy as np

from msrun_harness import REPO as ROOT
from mindone_zero.checkpoint import atomic_save_checkpoint, write_split_info
from mindone_zero.core.partition import ShardSpec, split_all
from tools.convert_checkpoints import main

TOOL = str(ROOT / "tools" / "convert_checkpoints.py")
N = 2
TENSORS = {
    "dense.weight": (np.arange(21, dtype=np.float32).reshape(7, 3) + 1, True),
    "moment1.dense.weight": (np.arange(21, dtype=np.float32).reshape(7, 3) + 100, True),
    "norm.gamma": (np.ones(5, np.float32), False),
    "global_step": (np.array(3, np.int32), False),
}


def _run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=120)


def _main(capsys, *args):
    """``main(args)`` in this process: (exit status, stdout, stderr), as ``_run`` gives them."""
    try:
        code = main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out, err)


def _write_group(folder):
    for r in range(N):
        blocks = {k: split_all(a, N)[r] if s else a for k, (a, s) in TENSORS.items()}
        atomic_save_checkpoint(blocks, os.path.join(folder, f"net_{r}.ckpt"))
        write_split_info([ShardSpec(k, a.shape, N, r, s) for k, (a, s) in TENSORS.items()], folder, r)
    return os.path.join(folder, "net_{}.ckpt"), os.path.join(folder, "params_split_info_{}.json")


def test_help_exits_0():
    res = _run("--help")
    assert res.returncode == 0
    for flag in ("--src_checkpoint", "--src_param_split_info_json", "--group_size", "--output_format",
                 "--exclude_optimizer_states"):
        assert flag in res.stdout


def test_conversion_prints_output_path_and_progress(tmp_path):
    src, info = _write_group(str(tmp_path))
    res = _run("--src_checkpoint", src, "--src_param_split_info_json", info, "--group_size", str(N),
               "--output_format", "safetensors", "--exclude_optimizer_states")
    assert res.returncode == 0, res.stderr
    out = str(tmp_path / f"net_all_{N}.safetensors")
    assert res.stdout.strip() == out
    progress = [line for line in res.stderr.splitlines() if re.match(r"\[\d+/\d+\] ", line)]
    assert progress == ["[1/2] dense.weight", "[2/2] norm.gamma"]
    loaded = ms.load_checkpoint(out, format="safetensors")
    assert sorted(loaded) == ["dense.weight", "norm.gamma"]
    assert np.array_equal(loaded["dense.weight"].asnumpy(), TENSORS["dense.weight"][0])


def test_bad_input_exits_2_with_message_and_no_output(tmp_path, capsys):
    src, info = _write_group(str(tmp_path))
    res = _main(capsys, "--src_checkpoint", src, "--src_param_split_info_json", info, "--group_size", "3")
    assert res.returncode == 2
    assert src.format(2) in res.stderr and "does not exist" in res.stderr
    assert res.stdout == ""
    res = _main(capsys, "--src_checkpoint", src.replace("{}", "0"), "--src_param_split_info_json", info,
               "--group_size", str(N))
    assert res.returncode == 2 and "'src_checkpoint'" in res.stderr
    res = _main(capsys, "--src_checkpoint", src, "--src_param_split_info_json", info, "--group_size", "2",
                "--output_format", "pt")
    assert res.returncode == 2 and "invalid choice" in res.stderr
    assert not [f for f in os.listdir(tmp_path) if "all" in f]
