"""For users: a command-line tool.

Model-state memory per device of ZeRO stages 0-3, from a checkout (installed:
``mindone-zero-estimate-memory``).

    python tools/estimate_memory.py --params 7.5e9 --world-size 64
    python tools/estimate_memory.py --config configs/train_lm.yaml --world-size 8

A thin wrapper: the command and its helpers live in ``mindone_zero.cli.estimate_memory`` and are
re-exported here for the scripts and tests that import them from ``tools.estimate_memory``.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mindone_zero.cli.estimate_memory import (count_params_from_config, format_gb, main, memory_table,  # noqa: E402
                                              peak_table, transformer_lm_params)

__all__ = ["count_params_from_config", "format_gb", "main", "memory_table", "peak_table", "transformer_lm_params"]

if __name__ == "__main__":
    sys.exit(main())
