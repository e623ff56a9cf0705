"""tools/dev/launch.py without MindSpore: a fake ``msrun`` first on PATH stands for the real one, so
that the launcher's own work is checked in seconds: the command line, the error with the log
tails, and the kill of the whole process group at the time limit."""
import json
import os
import signal
import sys
import threading
import time

import pytest

from tools.dev.launch import REPO, MsrunError, msrun_command, msrun_env, run_msrun

FAKE_MSRUN = """#!{python}
import json, os, subprocess, sys, time
args = sys.argv[1:]
log_dir = next(a.split("=", 1)[1] for a in args if a.startswith("--log_dir="))
os.makedirs(log_dir, exist_ok=True)
with open(os.path.join(log_dir, "worker_0.log"), "w") as f:
    f.write("[WARNING] ME(1): noise\\nTraceback: boom\\n")
with open("argv.json", "w") as f:
    json.dump(args, f)
with open("env.json", "w") as f:
    json.dump(dict(os.environ), f)
mode = os.environ["FAKE_MSRUN"]
if mode == "hang":  # a worker that outlives its launcher unless the whole group is killed
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open("child.pid", "w").write(str(child.pid))
    time.sleep(600)
if mode == "fail":  # msrun's line on a crashed worker, then more output than the error's tail holds
    print("[ERROR] ME(7:1,MainProcess):0 [_api.py:365] Worker process 4242 exit with exception. Error code: -11.")
    print("\\n".join(f"rank 0: line {{i}}" for i in range(1000)))
print("msrun says bye")
sys.exit(3 if mode == "fail" else 0)
"""


@pytest.fixture
def fake_msrun(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "msrun").write_text(FAKE_MSRUN.format(python=sys.executable))
    (bin_dir / "msrun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return lambda mode: monkeypatch.setenv("FAKE_MSRUN", mode)


def test_the_script_gets_out_then_its_args_and_msrun_a_free_port(fake_msrun, tmp_path):
    fake_msrun("ok")
    out = tmp_path / "out"
    result = run_msrun("tools/train.py", 2, out, ["--x", "1"], timeout=60)
    assert result.returncode == 0 and "msrun says bye" in result.stdout
    argv = json.loads((out / "argv.json").read_text())  # the job runs in out_dir
    assert argv[:2] == ["--worker_num=2", "--local_worker_num=2"] and argv[2].startswith("--master_port=")
    assert argv[3:] == [f"--log_dir={out / 'msrun_logs'}", "--join=True", str(REPO / "tools" / "train.py"), "--out",
                        str(out), "--x", "1"]


def test_a_failed_job_raises_with_the_log_tails_without_mindspore_logging(fake_msrun, tmp_path):
    fake_msrun("fail")
    with pytest.raises(MsrunError, match=r"For 'my_tool', the msrun job train.py \(N=2\) exited with 3") as err:
        run_msrun("tools/train.py", 2, tmp_path, timeout=60, caller="my_tool")
    assert "Traceback: boom" in str(err.value) and "noise" not in str(err.value)
    assert "msrun says bye" in str(err.value) and err.value.result.returncode == 3
    # msrun's exit line, out of the tail, comes first with its signal's name
    assert "line 100\n" not in str(err.value)
    exit_line = "Worker process 4242 exit with exception. Error code: -11. (SIGSEGV)"
    assert f"msrun's exit lines:\n{exit_line}\n" in str(err.value)
    assert run_msrun("tools/train.py", 2, tmp_path, timeout=60, check=False).returncode == 3


def test_at_the_time_limit_the_whole_process_group_is_killed(fake_msrun, tmp_path):
    fake_msrun("hang")
    start = time.monotonic()
    # 2 s is ample for the fake msrun (no MindSpore) to start its worker: the limit only has to pass
    with pytest.raises(MsrunError, match="timed out after 2s") as err:
        run_msrun("tools/train.py", 1, tmp_path, timeout=2, check=False)
    assert time.monotonic() - start < 60 and err.value.result.returncode is None
    _assert_dies(tmp_path, "the time limit")


def test_an_interrupted_wait_kills_the_whole_process_group(fake_msrun, tmp_path):
    # pytest-timeout's limit on the calling test, or Ctrl-C, arrives as an exception in the wait
    fake_msrun("hang")
    interrupt = threading.Thread(target=_interrupt_once_the_worker_runs, args=(tmp_path,), daemon=True)

    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt("interrupted")

    previous = signal.signal(signal.SIGUSR1, raise_interrupt)
    try:
        interrupt.start()
        with pytest.raises(KeyboardInterrupt):
            run_msrun("tools/train.py", 1, tmp_path, timeout=120, check=False)
    finally:
        interrupt.join()
        signal.signal(signal.SIGUSR1, previous)
    _assert_dies(tmp_path, "the interrupted wait")


def _interrupt_once_the_worker_runs(tmp_path) -> None:
    """SIGUSR1 to the main thread as soon as the fake msrun has started its worker (at most 60 s on)."""
    deadline = time.monotonic() + 60
    while not (tmp_path / "child.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # child.pid is written before it is closed: let the write land
    signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)


def _assert_dies(tmp_path, when: str) -> None:
    """The fake msrun's worker (its pid in child.pid) is gone within 10 s."""
    child = int((tmp_path / "child.pid").read_text())
    for _ in range(100):
        if _dead(child):
            return
        time.sleep(0.1)
    pytest.fail(f"the worker {child} outlived {when}")


def _dead(pid: int) -> bool:
    """Gone, or a zombie (killed, not yet reaped by whoever inherited it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_given_master_port_is_kept():
    cmd = msrun_command("tools/train.py", 4, "logs", ["--a"], ["--master_port=8118", "--node_rank=1"],
                        local_worker_num=2)
    assert cmd[:3] == ["msrun", "--worker_num=4", "--local_worker_num=2"]
    assert [a for a in cmd if a.startswith("--master_port")] == ["--master_port=8118"]
    assert cmd[-2:] == [str(REPO / "tools" / "train.py"), "--a"]


def test_jobs_launch_ops_blocking_and_retry_often_unless_the_caller_says_otherwise(monkeypatch):
    # [Note: blocking launches] and [Note: retry interval]: the defaults for jobs on this machine
    # and [Note: node time-out]
    names = ("MS_DEV_LAUNCH_BLOCKING", "MS_RETRY_INTERVAL_LOWER", "MS_RETRY_INTERVAL_UPPER", "MS_NODE_TIMEOUT")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    env = msrun_env()
    assert tuple(env[name] for name in names) == ("1", "1", "2", "120")
    monkeypatch.setenv("MS_DEV_LAUNCH_BLOCKING", "0")
    monkeypatch.setenv("MS_NODE_TIMEOUT", "30")
    assert (msrun_env()["MS_DEV_LAUNCH_BLOCKING"], msrun_env()["MS_NODE_TIMEOUT"]) == ("0", "30")
    assert msrun_env({"MS_DEV_LAUNCH_BLOCKING": "1"})["MS_DEV_LAUNCH_BLOCKING"] == "1"


def test_the_callers_compile_settings_stay_out_of_a_job_unless_it_asks(fake_msrun, tmp_path, monkeypatch):
    """[Note: job environment]: a developer's MS_COMPILER_CACHE_*, MS_DEV_* and MS_JIT_* do not reach the
    job (MS_DEV_LAUNCH_BLOCKING does: [Note: blocking launches]); what the job asks for (``env``) does."""
    fake_msrun("ok")
    mine = {"MS_COMPILER_CACHE_ENABLE": "1", "MS_COMPILER_CACHE_PATH": "/shared/cache",
            "MS_DEV_DUMP_IR_PASSES": "graph_build", "MS_JIT_MODULES": "mine", "MS_DEV_LAUNCH_BLOCKING": "0",
            "MS_RETRY_INTERVAL_LOWER": "3"}
    for name, value in mine.items():
        monkeypatch.setenv(name, value)

    def job_env(out, **kwargs):
        run_msrun("tools/train.py", 1, out, timeout=60, **kwargs)
        env = json.loads((out / "env.json").read_text())
        return {k: env[k] for k in sorted(env) if k.startswith(("MS_COMPILER_CACHE_", "MS_DEV_", "MS_JIT_", "MS_RETRY"))}

    kept = {"MS_DEV_LAUNCH_BLOCKING": "0", "MS_RETRY_INTERVAL_LOWER": "3", "MS_RETRY_INTERVAL_UPPER": "2"}
    assert job_env(tmp_path / "plain") == kept
    asked = {"MS_COMPILER_CACHE_ENABLE": "1", "MS_COMPILER_CACHE_PATH": str(tmp_path / "cache"),
             "MS_DEV_DUMP_IR_PASSES": "hwopt_common_final_graph"}
    assert job_env(tmp_path / "asked", env=asked) == dict(kept, **asked)
    assert msrun_env()["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
