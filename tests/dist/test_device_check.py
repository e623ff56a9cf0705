"""tools/device_check.py under msrun with N=2 CPU workers (issue 21, Build 6): every rank exits 0
and prints PASS for the one-process checks, the stage 1-3 parity checks, and the collectives on
the world group and on the sub-group ``devchk_sub_0_1`` (the CPU emulations), one line each."""
from pathlib import Path

from msrun_harness import run_msrun

TOOL = Path(__file__).resolve().parents[2] / "tools" / "device_check.py"
EXPECTED = {
    "offload_write_back", "step_float16", "overflow_detection", "memory_measure",
    "parity_stage1_float32_N2", "parity_stage2_float32_N2", "parity_stage3_float32_N2", "parity_stage3_float16_N2",
    "device_check",
} | {f"collectives_{group}_{kind}" for group in ("world", "devchk_sub_0_1")
     for kind in ("float32", "float16", "bfloat16", "bfloat16_via_float32", "qgz")}
SKIPPED = {"step_bfloat16", "parity_stage3_bfloat16_N2"}  # no bfloat16 MatMul on MindSpore's CPU backend


def _lines(log: Path, status: str):
    return {line.split()[1] for line in log.read_text(errors="replace").splitlines() if line.startswith(status + " ")}


def test_device_check_passes_under_msrun_n2(tmp_path):
    run_msrun(str(TOOL), 2, tmp_path, ["--device", "CPU"], timeout=900)
    for rank in range(2):
        log = tmp_path / "msrun_logs" / f"worker_{rank}.log"
        assert not _lines(log, "FAIL"), log.read_text()[-3000:]
        assert EXPECTED <= _lines(log, "PASS"), sorted(EXPECTED - _lines(log, "PASS"))
        assert _lines(log, "SKIP") == SKIPPED
