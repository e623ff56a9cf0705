"""Launch ``msrun`` CPU jobs from pytest and collect each rank's results.

A worker script writes its results under ``--out DIR`` (one file per rank and case, npz or
JSON); the test reads them back. Every launch gets a free port and its own log folder, and a
bounded wall time: a hung job is killed and the failing worker's log tail is shown.
"""
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port that is free on loopback right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tails(log_dir: Path, lines: int = 60) -> str:
    chunks = []
    for log in sorted(log_dir.glob("worker_*.log")):
        text = log.read_text(errors="replace").splitlines()
        # MindSpore logs a lot of WARNING/INFO lines; keep the ones that explain a failure.
        useful = [t for t in text if not t.startswith(("[WARNING]", "[INFO]"))]
        chunks.append(f"----- {log.name} (last {lines} non-log lines) -----\n" + "\n".join(useful[-lines:]))
    return "\n".join(chunks) or f"(no worker logs in {log_dir})"


def run_msrun(
    script: str,
    nproc: int,
    out_dir: Path,
    args: Sequence[str] = (),
    timeout: float = 900,
    extra_msrun_args: Sequence[str] = (),
    expect_success: bool = True,
) -> subprocess.CompletedProcess:
    """Run ``script`` under msrun with ``nproc`` CPU workers; results go to ``out_dir``.

    The script receives ``--out out_dir`` followed by ``args``. Raises AssertionError with the
    worker log tails if the job fails (when ``expect_success``) or exceeds ``timeout`` seconds.
    """
    out_dir = Path(out_dir).resolve()
    script = Path(script)
    if not script.is_absolute():
        script = (REPO / script).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = out_dir / "msrun_logs"
    cmd = [
        "msrun",
        f"--worker_num={nproc}",
        f"--local_worker_num={nproc}",
        f"--master_port={free_port()}",
        f"--log_dir={log_dir}",
        "--join=True",
        *extra_msrun_args,
        str(script),
        "--out",
        str(out_dir),
        *args,
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.setdefault("GLOG_v", "3")  # MindSpore: errors only
    proc = subprocess.Popen(
        cmd, cwd=str(out_dir), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        raise AssertionError(f"msrun {script} timed out after {timeout}s\n{_log_tails(log_dir)}")
    result = subprocess.CompletedProcess(cmd, proc.returncode, stdout, "")
    if expect_success and proc.returncode != 0:
        raise AssertionError(
            f"msrun {script} exited with {proc.returncode}\n{stdout[-3000:]}\n{_log_tails(log_dir)}"
        )
    return result


def load_json(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)
