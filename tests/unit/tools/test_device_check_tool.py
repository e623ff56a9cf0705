"""tools/device_check.py in one process on CPU (issue 21, Build 6): it exits 0 and prints a PASS
line for every one-process check, a SKIP (with the reason) for what CPU cannot run, and an
exit status of 1 when a check fails. The msrun N=2 run is in tests/dist/test_device_check.py."""
import subprocess
import sys
from pathlib import Path

import pytest

from tools import device_check

ROOT = Path(__file__).resolve().parents[3]
TOOL = ROOT / "tools" / "device_check.py"
ONE_PROCESS = ("offload_write_back", "step_float16", "overflow_detection", "memory_measure")


def _lines(stdout: str, status: str):
    return {line.split()[1] for line in stdout.splitlines() if line.startswith(status + " ")}


def test_device_check_passes_in_one_cpu_process(tmp_path):
    proc = subprocess.run([sys.executable, str(TOOL), "--device", "CPU", "--out", str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert set(ONE_PROCESS) | {"device_check"} <= _lines(proc.stdout, "PASS"), proc.stdout
    assert {"step_bfloat16", "parity"} == _lines(proc.stdout, "SKIP"), proc.stdout
    assert not _lines(proc.stdout, "FAIL")


@pytest.mark.usefixtures("restore_ms_context")  # main() sets the mode it checks
def test_a_failed_check_fails_the_run(monkeypatch, capsys, tmp_path):
    """One FAIL line per failed check and exit status 1 (a check forced to fail, in this process)."""
    def broken():
        raise AssertionError("forced")

    monkeypatch.setattr(device_check, "run_one_process", lambda report: report.run("forced_failure", broken))
    assert device_check.main(["--device", "CPU", "--only", "one_process", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL forced_failure AssertionError: forced" in out
    assert "FAIL device_check 1 failed forced_failure" in out
