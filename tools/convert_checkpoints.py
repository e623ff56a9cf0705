"""For users: a command-line tool.

Combine per-rank ZeRO checkpoints offline, from a checkout (installed: ``mindone-zero-convert``).

    python tools/convert_checkpoints.py --src_checkpoint "ckpt/rank_{}/net.ckpt" \\
        --src_param_split_info_json "params_info/params_split_info_{}.json" --group_size 4

A thin wrapper: the command is ``mindone_zero.cli.convert.main`` (see its docstring).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mindone_zero.cli.convert import main  # noqa: E402

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
