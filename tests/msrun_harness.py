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
from typing import Sequence

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


def _msrun_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.setdefault("GLOG_v", "3")  # MindSpore: errors only
    return env


def _resolve(script) -> Path:
    script = Path(script)
    return script if script.is_absolute() else (REPO / script).resolve()


def run_msrun_nodes(script: str, nodes: int, workers_per_node: int, out_dir: Path, args: Sequence[str] = (),
                    timeout: float = 900) -> None:
    """Run ``script`` as ``nodes`` msrun "machines" on loopback, each with its own ``--node_rank``
    and ``workers_per_node`` workers (ranks node * workers_per_node + i), as a multi-node launch
    would. Raises AssertionError with the log tails if any node fails or the job exceeds ``timeout``."""
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    for node in range(nodes):
        log_dir = out_dir / f"msrun_logs_node{node}"
        # node 0 is the master host; the others run msrun as on another machine (see that script)
        launcher = ["msrun"] if node == 0 else [sys.executable, str(REPO / "tests/dist/workers/msrun_other_host.py")]
        cmd = [*launcher, f"--worker_num={nodes * workers_per_node}", f"--local_worker_num={workers_per_node}",
               "--master_addr=127.0.0.1", f"--master_port={port}", f"--node_rank={node}", f"--log_dir={log_dir}",
               "--join=True", str(_resolve(script)), "--out", str(out_dir), *args]
        procs.append((log_dir, subprocess.Popen(cmd, cwd=str(out_dir), env=_msrun_env(), stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, text=True, start_new_session=True)))
    failures = []
    for log_dir, proc in procs:
        try:
            stdout, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for _, p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            raise AssertionError(f"msrun nodes of {script} timed out after {timeout}s\n{_log_tails(log_dir)}")
        if proc.returncode != 0:
            failures.append(f"node log {log_dir} exit {proc.returncode}\n{stdout[-2000:]}\n{_log_tails(log_dir)}")
    if failures:
        raise AssertionError("\n".join(failures))


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
    script = _resolve(script)
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
    proc = subprocess.Popen(
        cmd, cwd=str(out_dir), env=_msrun_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
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


def worker_args():
    """The worker side of ``run_msrun(script, n, out, ["--cases", json])``: (out folder, list of
    case dicts) from the command line of a worker script."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", required=True)
    args = parser.parse_args()
    return args.out, json.loads(args.cases)
