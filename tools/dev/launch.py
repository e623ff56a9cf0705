"""For developers: test and tool infrastructure (the tests, the benchmarks and the demo job use it).

Launch ``msrun`` jobs on this machine: the one launcher of the tools and the tests.

    from tools.dev.launch import run_msrun
    run_msrun("tools/bench/benchmark_peak_worker.py", 4, "outputs/peak", ["--case", "{...}"], timeout=600)

Every job gets a free port, the repository first on ``PYTHONPATH`` and a log folder of its own
(msrun writes each worker's output to ``worker_<rank>.log`` there). A job with a time limit runs
in its own process group, which is killed whole when the limit passes: msrun's workers and
scheduler die with it. A failed job raises ``MsrunError`` with msrun's lines on the processes that
ended with an error (``exit_lines``), the tail of msrun's output and of every worker's log, without
MindSpore's WARNING and INFO lines.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
# msrun as it behaves on a machine that is not the master host (see that script)
OTHER_HOST = REPO / "tools" / "dev" / "msrun_other_host.py"
OUTPUT_TAIL = 3000  # characters of msrun's own output in an error


class MsrunError(RuntimeError):
    """An msrun job exited with a non-zero code or ran past its time limit.

    ``result`` is the ``subprocess.CompletedProcess`` of the job (of the first failed node for
    ``run_msrun_nodes``), ``returncode`` None when it timed out.
    """

    def __init__(self, message: str, result: subprocess.CompletedProcess):
        super().__init__(message)
        self.result = result


def free_port() -> int:
    """A TCP port that is free on loopback right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# [Note: blocking launches]
# The jobs launched here run their ranks on this machine's few cores (N=2 and N=4 on 2 cores).
# MindSpore's asynchronous PYNATIVE pipeline (2.10) hands each op to threads that wait for work,
# and with more busy threads than cores every op then costs the waits of the scheduler: on the N=2
# parity job, a PYNATIVE case at stage 0 took 5.0 s and at stage 3 13.5 s with asynchronous
# launches, 1.2 s and 2.3 s with blocking ones; GRAPH_MODE cases took the same time either way
# (2.0 and 2.9 s). So ops launch blocking (``MS_DEV_LAUNCH_BLOCKING=1``, what
# ``mindspore.runtime.launch_blocking()`` sets) unless the caller's environment sets that variable.
# The same kernels run in the same order, so the numbers are the same.
#
# [Note: retry interval]
# Every rank registers with msrun's scheduler, and later leaves it, through messages retried at
# a random interval between MS_RETRY_INTERVAL_LOWER and MS_RETRY_INTERVAL_UPPER seconds (3 and 5 by
# default, the heartbeat's interval too). On loopback an answer takes milliseconds, so the jobs
# here use 1 and 2 s: a two-rank job that only calls init() took 16.0 s from launch to exit
# with the defaults and 10.0 s with these.
#
# [Note: node time-out]
# msrun's scheduler declares a rank dead when it has had no heartbeat from it for MS_NODE_TIMEOUT
# seconds (30 by default), measured on the wall clock (``time()``), and then fails the whole job. On
# this machine, a virtual machine, every process can stall at once: a CI run failed that way, with
# every rank of a four-rank job declared dead in one pass and no error in the worker logs it showed
# (it cut msrun's exit lines, which would have told a killed worker apart: ``exit_lines``). Stopping
# a four-rank job's processes for 40 s (SIGSTOP, then SIGCONT) gives the same failure at 30 s and
# none at 120 s. A dead worker does not need the heartbeat to be found: msrun polls its workers' exit
# codes every second and kills the rest. Only the scheduler's own exit waits for the time-out, so a
# job whose worker fails ends about 90 s later than with the default. Jobs here use 120 s, unless
# the caller's environment sets the variable (tests/dist/test_checkpoint_fault.py keeps 30 s).
JOB_ENV = {"MS_DEV_LAUNCH_BLOCKING": "1", "MS_RETRY_INTERVAL_LOWER": "1", "MS_RETRY_INTERVAL_UPPER": "2",
           "MS_NODE_TIMEOUT": "120"}

# [Note: job environment]
# What a job compiles is decided by the job, not by the shell that launched it. A developer's own
# ``MS_COMPILER_CACHE_*`` would point every job at one cache, which loads the k-th graph blindly
# ([Note: compile cache] in tools/compile_cache.py), and ``MS_DEV_*`` / ``MS_JIT_*`` change how
# MindSpore compiles or runs (IR dumps, pass switches, launch modes); a test process that leaked them
# would hand them to every later job. So ``msrun_env`` drops them from the caller's environment,
# except ``MS_DEV_LAUNCH_BLOCKING`` ([Note: blocking launches]: the caller may choose). A job that
# needs one asks for it: ``extra`` of ``msrun_env``, ``env`` of ``run_msrun`` (the compile benchmark's
# cache and IR dumps), or the job sets it itself (tools/train.py's ``train.compile_cache``).
CALLER_DROPPED = ("MS_COMPILER_CACHE_", "MS_DEV_", "MS_JIT_")
CALLER_KEPT = ("MS_DEV_LAUNCH_BLOCKING",)


def msrun_env(extra: Optional[dict] = None) -> dict:
    """This process's environment without the variables of ``CALLER_DROPPED`` ([Note: job
    environment]), with the repository first on ``PYTHONPATH`` (so that a worker imports this
    checkout), ``GLOG_v=3`` (MindSpore: errors only) and ``JOB_ENV`` ([Note: blocking launches],
    [Note: retry interval], [Note: node time-out]) where the caller's environment does not set them,
    and ``extra``."""
    env = {k: v for k, v in os.environ.items() if k in CALLER_KEPT or not k.startswith(CALLER_DROPPED)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.setdefault("GLOG_v", "3")
    for name, value in JOB_ENV.items():
        env.setdefault(name, value)
    env.update(extra or {})
    return env


def resolve_script(script) -> Path:
    """``script`` as an absolute path; a relative one is relative to the repository."""
    script = Path(script)
    return script if script.is_absolute() else (REPO / script).resolve()


def msrun_command(script, worker_num: int, log_dir, args: Sequence[str] = (), msrun_args: Sequence[str] = (),
                  local_worker_num: Optional[int] = None, launcher: Sequence[str] = ("msrun",)) -> List[str]:
    """The command line of one msrun launch of ``script`` with ``args``: ``worker_num`` workers in
    all, ``local_worker_num`` (default all) on this machine, logs in ``log_dir``, a free port unless
    ``msrun_args`` names ``--master_port``, then ``msrun_args``; ``launcher`` replaces ``msrun``."""
    port = [] if any(a.startswith("--master_port") for a in msrun_args) else [f"--master_port={free_port()}"]
    return [*launcher, f"--worker_num={worker_num}", f"--local_worker_num={local_worker_num or worker_num}",
            *port, f"--log_dir={log_dir}", "--join=True", *msrun_args, str(resolve_script(script)), *args]


def log_tails(log_dir, lines: int = 60) -> str:
    """The last ``lines`` lines of every ``worker_*.log`` under ``log_dir`` that are not
    MindSpore's WARNING or INFO logging (those rarely explain a failure)."""
    chunks = []
    for log in sorted(Path(log_dir).glob("worker_*.log")):
        text = log.read_text(errors="replace").splitlines()
        useful = [t for t in text if not t.startswith(("[WARNING]", "[INFO]"))]
        chunks.append(f"----- {log} (last {lines} non-log lines) -----\n" + "\n".join(useful[-lines:]))
    return "\n".join(chunks) or f"(no worker logs in {log_dir})"


def _start(cmd: List[str], cwd: Path, env: Optional[dict]) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=str(cwd), env=msrun_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _kill_running(procs: List[subprocess.Popen]) -> set:
    """SIGKILL the process group of every job still running; returns their pids."""
    killed = set()
    for p in procs:
        if p.poll() is None:
            killed.add(p.pid)
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:  # the whole group ended meanwhile
                pass
    return killed


def _wait_all(procs: List[subprocess.Popen], cmds: List[List[str]], timeout: float) -> List:
    """Each job's ``CompletedProcess`` once all have ended; when ``timeout`` seconds pass first,
    every process group still running is killed and those jobs get ``returncode`` None. If the
    wait itself is interrupted (Ctrl-C, or pytest-timeout's limit on the calling test), the jobs
    are killed before the interruption goes on: an abandoned job would hold the cores (and
    its port) for the rest of the session."""
    deadline, killed, results = time.monotonic() + timeout, set(), []
    try:
        for proc, cmd in zip(procs, cmds):
            try:
                stdout, _ = proc.communicate(timeout=None if killed else max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                killed |= _kill_running(procs)
                stdout, _ = proc.communicate()
            results.append(subprocess.CompletedProcess(cmd, None if proc.pid in killed else proc.returncode, stdout,
                                                       ""))
    except BaseException:
        _kill_running(procs)
        raise
    return results


# msrun's own line on a process of the job that ended with an error (mindspore/parallel/cluster/
# process_entity/_api.py, 2.10): "Worker process 4242 exit with exception. Error code: -9."
_EXIT_LINE = re.compile(r"(?:Worker|Scheduler) process \d+ exit with exception\.(?: Error code: (-?\d+)\.)?")


def exit_lines(output: str) -> str:
    """msrun's lines in ``output`` on the job's processes that ended with an error, a negative code
    followed by the signal's name. They tell a crash (SIGSEGV, SIGABRT), a kill from outside
    (SIGKILL) and a Python exception (1) apart, and a long job's output pushes them out of its tail."""
    lines = []
    for match in _EXIT_LINE.finditer(output or ""):
        code = int(match.group(1) or 0)
        name = signal.Signals(-code).name if -code in signal.valid_signals() else None
        lines.append(match.group(0) + (f" ({name})" if name else ""))
    return "\n".join(lines)


def _failure(caller: str, job: str, result, timeout: float, log_dir) -> MsrunError:
    outcome = f"timed out after {timeout}s" if result.returncode is None else f"exited with {result.returncode}"
    exits = exit_lines(result.stdout)
    exits = f"msrun's exit lines:\n{exits}\n" if exits else ""
    return MsrunError(f"For '{caller}', the msrun job {job} {outcome}.\n{exits}{result.stdout[-OUTPUT_TAIL:]}\n"
                      f"{log_tails(log_dir)}", result)


def run_msrun(script, nproc: int, out_dir, args: Sequence[str] = (), timeout: float = 900,
              extra_msrun_args: Sequence[str] = (), check: bool = True, log_dir=None,
              caller: str = "run_msrun", env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """Run ``script`` (relative to the repository or absolute) under msrun with ``nproc`` workers
    on this machine, in ``out_dir`` (created): the script receives ``--out out_dir`` (absolute)
    followed by ``args``. Logs go to ``log_dir`` (default ``out_dir/msrun_logs``). The job's
    environment is ``msrun_env(env)``: ``env`` is what the job asks for beyond it ([Note: job environment]).

    Returns:
        The ``subprocess.CompletedProcess`` with msrun's exit code and output.
    Raises:
        MsrunError: the job ran past ``timeout`` seconds (its process group is killed), or, when
        ``check``, exited with a non-zero code; ``caller`` names the tool in the message.
    """
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = Path(log_dir).resolve() if log_dir is not None else out_dir / "msrun_logs"
    cmd = msrun_command(script, nproc, log_dir, ["--out", str(out_dir), *args], extra_msrun_args)
    result = _wait_all([_start(cmd, out_dir, env)], [cmd], timeout)[0]
    if result.returncode is None or (check and result.returncode != 0):
        raise _failure(caller, f"{resolve_script(script).name} (N={nproc})", result, timeout, log_dir)
    return result


def run_msrun_nodes(script, nodes: int, workers_per_node: int, out_dir, args: Sequence[str] = (),
                    timeout: float = 900, caller: str = "run_msrun_nodes",
                    env: Optional[dict] = None) -> List[subprocess.CompletedProcess]:
    """Run ``script`` as ``nodes`` msrun "machines" on loopback, each with its own ``--node_rank``
    and ``workers_per_node`` workers (ranks node * workers_per_node + i), as a multi-node launch
    would; node 0 is the master host. Arguments, environment and logs as ``run_msrun`` (logs in
    ``out_dir/msrun_logs_node<k>``).

    Returns:
        Each node's ``subprocess.CompletedProcess``.
    Raises:
        MsrunError: a node exited with a non-zero code, or the job ran past ``timeout`` seconds
        (every node's process group is killed).
    """
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    port, cmds, log_dirs = free_port(), [], []
    for node in range(nodes):
        log_dirs.append(out_dir / f"msrun_logs_node{node}")
        launcher = ("msrun",) if node == 0 else (sys.executable, str(OTHER_HOST))
        cmds.append(msrun_command(script, nodes * workers_per_node, log_dirs[-1], ["--out", str(out_dir), *args],
                                  ["--master_addr=127.0.0.1", f"--master_port={port}", f"--node_rank={node}"],
                                  local_worker_num=workers_per_node, launcher=launcher))
    results = _wait_all([_start(cmd, out_dir, env) for cmd in cmds], cmds, timeout)
    failures = [_failure(caller, f"{resolve_script(script).name} node {node} of {nodes}", result, timeout, log_dir)
                for node, (result, log_dir) in enumerate(zip(results, log_dirs)) if result.returncode != 0]
    if failures:
        raise MsrunError("\n".join(str(f) for f in failures), failures[0].result)
    return results
