"""For developers: what the test suite really guards, measured with deliberate bugs.

    python tools/dev/seeded_faults.py                      # every fault, a table on stdout
    python tools/dev/seeded_faults.py --list               # the faults, their files and tests
    python tools/dev/seeded_faults.py --only ema_every_micro_step --out outputs/seeded_faults.md

Each fault (``FAULTS``) is one realistic bug written as data: a text edit of one library file (an
anchor that must occur there exactly once, and its replacement), the tests that should catch it (a
few pytest node ids, so that the whole run stays affordable) and a line saying what the bug is. The
tool copies the checkout (its tracked files and the untracked ones git does not ignore) into a
temporary folder, and for each fault in turn: applies the edit there, runs the fault's tests there
(``pytest -n 0``), and puts the file back. The checkout itself is never edited. The tests of the copy
import the copy: ``tests/conftest.py`` puts the copy first on ``sys.path`` and the msrun launcher
(``tools/dev/launch.py``) puts it first on a job's ``PYTHONPATH``; the tool checks both before the
first fault, and clears ``MS_COMPILER_CACHE_*`` so that no cached graph of the unfaulted code is
loaded. A fault is *caught* when its tests fail (pytest exits 1), *missed* when they pass.

A run of tests under ``tests/dist`` launches msrun jobs: the tool takes the machine's lock
(``flock /tmp/mz_dist.lock``, as the developers' guide asks of every msrun run) around each such
pytest run, and waits for it when another job holds it; run under ``flock /tmp/mz_dist.lock`` itself,
it sees that its caller holds the lock and runs everything under it. Faults run one after the other,
never side by side. ``--baseline`` first runs every selected test on the copy without any fault, so that a
test that fails anyway is not counted as a catch.

Prints a Markdown table (fault, file, the tests run, caught or missed, the tests that failed, and
seconds), and with ``--out`` writes it to a page stamped with the command, date, commit and machine,
as the benchmarks stamp theirs (``tools/bench/report.py``). Exits 1 if any fault is missed, its
anchor no longer occurs exactly once, or its tests cannot run; 0 when every fault is caught.
``tests/unit/tools/test_seeded_faults.py`` checks every anchor against the current sources, so that
the list cannot rot unnoticed.
"""
import argparse
import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.bench.report import stamp, stamp_fields, write_atomic  # noqa: E402

LOCK = "/tmp/mz_dist.lock"
DIST = "tests/dist/"
# a cached graph of the unfaulted code would hide a fault ([Note: compile cache] in tools/compile_cache.py)
SCRUBBED_ENV = ("MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH")


@dataclass(frozen=True)
class Fault:
    """One deliberate bug: replace ``anchor`` (which must occur exactly once in ``file``) with
    ``replacement``, then run ``tests`` (pytest node ids), which must fail.

    Attributes:
        name: a short identifier (``--only``).
        file: the library file, relative to the repository.
        anchor: the text the bug changes; it occurs exactly once in ``file``.
        replacement: what the bug puts in its place.
        tests: pytest node ids (``path::test[param]``) or paths, relative to the repository.
        bug: one line: what is wrong.
    """

    name: str
    file: str
    anchor: str
    replacement: str
    tests: Tuple[str, ...]
    bug: str

    @property
    def dist(self) -> bool:
        """Whether its tests launch msrun jobs (they run under the machine's lock)."""
        return any(t.startswith(DIST) for t in self.tests)

    def apply(self, text: str) -> str:
        """``text`` (the file's content) with the bug in it.

        Raises:
            ValueError: the anchor does not occur exactly once in ``text``.
        """
        count = text.count(self.anchor)
        if count != 1:
            raise ValueError(f"For fault {self.name!r}, the anchor must occur exactly once in {self.file}, but it "
                             f"occurs {count} times: the code changed, so the fault needs a new anchor.")
        return text.replace(self.anchor, self.replacement)


_ZERO3_N2 = "tests/dist/test_zero3_network.py::"
_ELIF_STAGE_BELOW_3 = (
    "    elif not policy.shards_params:  # full on every rank; in the network's order ([Note: delayed initialisation])\n"
    "        for _, param in network.parameters_and_names():\n"
    "            materialize(param)\n"
    "            mark_shard_flag(param, False)  # at stage 3 the pass that shards marks them\n")
_COMM_N4 = "tests/dist/test_comm.py::test_collective_matches_numpy"

FAULTS: Tuple[Fault, ...] = (
    Fault(
        "grad_mean_divided_twice", "mindone_zero/train/fusion.py",
        "            if mean:\n"
        "                blocks = divide(blocks, self.comm.size)  # [Note: Div on CPU] in core/comm.py\n",
        "            if mean:\n"
        "                blocks = divide(divide(blocks, self.comm.size), self.comm.size)\n",
        ("tests/unit/test_packing.py::test_results_of_several_buckets_and_of_tensors_sent_alone_come_back_in_order",
         "tests/unit/test_fusion.py::test_a_factor_on_the_buckets_gives_every_tensor_its_own_bits_and_the_check_reads"
         "_the_buffers"),
        "stages 1-2: the reduce-scattered gradient mean is divided by the group size twice"),
    Fault(
        "validation_after_first_modification", "mindone_zero/train/prepare.py",
        "    states = _check_shardable_optimizer(optimizer) if policy.shards_optimizer else None\n"
        "    if policy.shards_params and not sharded:\n"
        "        network = shard_with_options(network, optimizer_parallel_group, options)\n"
        + _ELIF_STAGE_BELOW_3,
        "    if policy.shards_params and not sharded:\n"
        "        network = shard_with_options(network, optimizer_parallel_group, options)\n"
        + _ELIF_STAGE_BELOW_3
        + "    states = _check_shardable_optimizer(optimizer) if policy.shards_optimizer else None\n",
        ("tests/unit/test_prepare_errors.py::test_an_optimizer_zero_cannot_shard_raises_before_stage_3_cuts_anything",),
        "prepare_train_network checks that the optimizer's states can be sharded only after stage 3 has cut the "
        "network"),
    Fault(
        "padding_dropped_from_one_split", "mindone_zero/zero3/gather_group.py",
        "                grad = pad_dim0(grad, g.pads[0])\n"
        "                grad = g.reduce_padded(",
        "                grad = g.reduce_padded(",
        (_ZERO3_N2 + "test_grads_are_reduce_scattered_means[graph_fp32-2]",
         _ZERO3_N2 + "test_grads_are_reduce_scattered_means[pynative_fp32-2]",
         _ZERO3_N2 + "test_params_hold_padded_one_over_n[graph_fp32-2]"),
        "stage 3: a gradient is reduce-scattered without its padding rows, so the last rank's block is cut short "
        "and the others' shifted"),
    Fault(
        "stage3_grad_mean_divided_twice", "mindone_zero/zero3/gather_group.py",
        "        g.divides_grads = False\n",
        "        g.divides_grads = True\n",
        ("tests/dist/test_zero_parity.py::test_parity_with_single_process[N2-s3_graph_a1]",
         "tests/dist/test_zero_parity.py::test_parity_with_single_process[N2-s3_pynative_a2clip]",
         "tests/dist/test_zero_parity.py::test_parity_with_single_process[N2-s3_graph_mindone_rule]"),
        "stage 3: the gather groups keep dividing by the group size after the train step took the division over"),
    Fault(
        "reduce_scatter_summed_over_the_world", "mindone_zero/core/comm.py",
        '        prims["_scatter_sums"] = tuple(summed("reduce_scatter", 1, i) for i in (0, 2))\n',
        '        prims["_scatter_sums"] = tuple(_tagged(ops.AllReduce(ops.ReduceOp.SUM), "reduce_scatter", 1, 1, i)\n'
        "                                       for i in (0, 2))\n",
        (_COMM_N4 + "[N4-GRAPH-sub-float32-reduce_scatter]",
         _COMM_N4 + "[N4-PYNATIVE-sub-float32-reduce_scatter]"),
        "on CPU a sub-group's emulated reduce-scatter sums over the world (its AllReduce built without the group)"),
    Fault(
        "ema_every_micro_step", "mindone_zero/train/train_step.py",
        '        """A micro-step that ends no optimizer step: ``overflow``, after the counter ``step``."""\n'
        "        return ops.depend(overflow, step)\n",
        '        """A micro-step that ends no optimizer step: ``overflow``, after the counter ``step``."""\n'
        "        if self.ema is not None:\n"
        "            step = ops.depend(step, self.ema.ema_update())\n"
        "        return ops.depend(overflow, step)\n",
        ("tests/unit/test_offload.py::test_ema_overflow_and_pynative_follow_the_device_run",),
        "with gradient accumulation the EMA is updated at every micro-step, not once per optimizer step"),
    Fault(
        "checkpoint_written_in_place", "mindone_zero/checkpoint/atomic.py",
        "        tmp_path = os.path.join(tmp_dir, os.path.basename(path))\n",
        "        tmp_path = path\n",
        ("tests/unit/test_checkpoint_io.py::test_interrupted_save_keeps_previous_file",),
        "a checkpoint file is written under its final name, not a temporary one: a crash leaves it half written"),
    Fault(
        "frozen_parameter_given_a_state", "mindone_zero/train/ema.py",
        "        weights = network.trainable_params() if trainable_only else network.get_parameters()\n",
        "        weights = network.get_parameters()\n",
        ("tests/unit/test_mindone_compat.py::test_a_frozen_parameter_gets_no_ema_weight",),
        "EMA ignores trainable_only: every frozen parameter gets a state of its own (an EMA weight, whole on "
        "every rank)"),
    Fault(
        "comm_plan_entry_off_by_one", "mindone_zero/train/comm_accounting.py",
        "    times = 1 if record.kind == \"all_gather\" else ctx.reductions\n"
        "    for _ in range(times):\n",
        "    times = 1 if record.kind == \"all_gather\" else ctx.reductions\n"
        "    for _ in range(1, times):\n",
        ("tests/unit/test_comm_plan.py::test_buckets_record_each_call_of_one_optimizer_step",),
        "the comm plan counts each bucket's collectives one call short per optimizer step"),
    Fault(
        "offload_skips_the_last_chunk", "mindone_zero/offload/host_step.py",
        "            for start in range(0, flat_w.size, self.chunk):\n"
        "                stop = min(start + self.chunk, flat_w.size)\n",
        "            for start in range(0, flat_w.size - self.chunk + 1, self.chunk):\n"
        "                stop = start + self.chunk\n",
        ("tests/unit/test_offload.py::test_host_update_equals_device_optimizer[adam]",),
        "offload: the host step updates whole chunks only, so a tensor's last partial chunk never moves"),
    Fault(
        "stage1_shards_gradients", "mindone_zero/core/stage.py",
        '        """Gradients are reduced to shards every micro-step (stages 2-3)."""\n'
        "        return self.stage >= 2\n",
        '        """Gradients are reduced to shards every micro-step (stages 2-3)."""\n'
        "        return self.stage >= 1\n",
        ("tests/unit/test_memory.py",),
        "stage 1 behaves as stage 2: gradients reduce-scattered every micro-step and held 1/N"),
    Fault(
        "latest_checkpoint_is_incomplete", "mindone_zero/checkpoint/naming.py",
        "    return os.path.isfile(os.path.join(step_dir, META))\n",
        "    return os.path.isdir(step_dir)\n",
        ("tests/unit/test_checkpoint_api.py::test_latest_checkpoint_skips_incomplete_folders",),
        "a step folder counts as a complete checkpoint before its meta.json is written"),
    Fault(
        "combine_drops_the_first_rows", "mindone_zero/core/partition.py",
        "    return np.concatenate([np.asarray(b) for b in blocks], axis=0)[:full_d0]\n",
        "    return np.concatenate([np.asarray(b) for b in blocks], axis=0)[-full_d0:]\n",
        ("tests/unit/test_checkpoint_io.py::test_convert_round_trip_is_exact",),
        "merging shards drops the padding from the head instead of the tail (the combine, resharding)"),
    Fault(
        "clip_norm_of_the_local_shard", "mindone_zero/train/grad_sync.py",
        "        if self.is_parallel and self.is_zero:\n"
        "            local_split = self.op_comm.all_reduce(local_split)\n",
        "",
        ("tests/dist/test_device_check.py::test_device_check_passes_under_msrun_n2",),
        "stages 1-3: each rank clips by the norm of its own gradient shards, not of the full gradient"),
)


# ----------------------------------------------------------------------------- the scratch copy


def checkout_files(repo: Path = REPO) -> List[str]:
    """The checkout's files as the tests see them: tracked, and untracked ones git does not ignore."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout.decode()
    return sorted({f for f in out.split("\0") if f and (repo / f).is_file()})


def make_scratch(repo: Path = REPO, root: Optional[str] = None) -> Path:
    """A temporary copy of the checkout (``checkout_files``), outside it; returns its folder."""
    scratch = Path(tempfile.mkdtemp(prefix="mz_seeded_faults_", dir=root))
    for name in checkout_files(repo):
        dest = scratch / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, dest)
    return scratch


def run_env() -> Dict[str, str]:
    """The environment of a test run: no byte-code written (a restored file must not meet the
    faulted one's cache), no compile cache."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV and not k.startswith("PYTEST_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


_WHERE = ("import importlib.util, sys\n"
          "def where(name):\n"
          "    spec = importlib.util.find_spec(name)\n"
          "    return spec.origin if spec is not None else 'nowhere'\n")
_FIND = (_WHERE + "sys.path.insert(0, '.')  # as tests/conftest.py does\n"
         "from tools.dev import launch\n"
         "print(where('mindone_zero'), where('parallel_modules'))\n"
         "print(launch.REPO, launch.msrun_env()['PYTHONPATH'].split(':')[0])")


def check_imports(scratch: Path) -> None:
    """Raise RuntimeError unless a process started in ``scratch`` as the tests start (the checkout
    first on ``sys.path``) finds the library's packages in ``scratch``, the msrun launcher there puts
    ``scratch`` first on a job's ``PYTHONPATH``, and a process started elsewhere with that
    ``PYTHONPATH`` (an msrun worker) finds the library in ``scratch`` too. (``find_spec`` answers as
    an import would, editable installs included, without importing MindSpore.)"""
    env = run_env()
    lines = subprocess.run([sys.executable, "-c", _FIND], cwd=scratch, env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    worker = dict(env, PYTHONPATH=lines[3])
    lines += subprocess.run([sys.executable, "-c", _WHERE + "print(where('mindone_zero'))"], cwd="/", env=worker,
                            capture_output=True, text=True, check=True).stdout.split()
    real = scratch.resolve()
    outside = [line for line in lines if not Path(line).resolve().is_relative_to(real)]
    if len(lines) != 5 or outside:
        raise RuntimeError(f"For 'seeded_faults', the copy {scratch} must import itself, but got {outside or lines}.")


@contextlib.contextmanager
def fault_applied(scratch: Path, fault: Fault):
    """``fault`` applied to its file in ``scratch`` for the block; the file is put back after."""
    path = scratch / fault.file
    original = path.read_text()
    path.write_text(fault.apply(original))
    try:
        yield
    finally:
        path.write_text(original)


def _parent(pid: int) -> int:
    """The parent of process ``pid`` (0 when unknown)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def held_by_an_ancestor(lock: str = LOCK) -> bool:
    """Whether a process this one descends from holds the ``flock`` of ``lock`` (this tool run as
    ``flock LOCK python tools/dev/seeded_faults.py``), read from ``/proc/locks``."""
    try:
        st = os.stat(lock)
        locks = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return False
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders = {int(p[4]) for p in (line.split() for line in locks)
               if len(p) > 5 and p[1] == "FLOCK" and p[5] == where}  # waiters' lines have "->" in p[1]
    pid = os.getpid()
    while pid > 1:
        if pid in holders:
            return True
        pid = _parent(pid)
    return False


@contextlib.contextmanager
def machine_lock(needed: bool, lock: str = LOCK):
    """The machine-wide msrun lock (``flock LOCK``) for the block when ``needed``, unless a process
    this one descends from holds it already (taking it again would wait for ever)."""
    if not needed or held_by_an_ancestor(lock):
        yield
        return
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"  waiting for {lock} ...", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------- running the tests

_SUMMARY = re.compile(r"^(FAILED|ERROR) (\S+)")


@dataclass
class Outcome:
    """What one pytest run of a fault's tests gave."""

    fault: Fault
    status: str  # "caught", "missed", "error" (the tests could not run), "stale" (the anchor moved)
    failed: List[str] = field(default_factory=list)
    seconds: float = 0.0
    detail: str = ""


def run_tests(scratch: Path, tests: Sequence[str], dist: bool, timeout: float,
              tag: str) -> Tuple[int, List[str], str, float]:
    """(pytest's exit code, the tests that failed or errored, the output's tail, seconds it ran) of
    ``tests`` run in ``scratch``, one process (``-n 0``), under the machine's lock when ``dist`` (the
    wait for it not counted). Exit code -1: timed out."""
    basetemp = scratch / ".seeded_faults_tmp"
    basetemp.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "pytest", *tests, "-q", "-n", "0", "-p", "no:cacheprovider", "-rfE",
           "--basetemp", str(basetemp / tag)]
    with machine_lock(dist):
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=scratch, env=run_env(), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            out = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
            return -1, [], out[-3000:], time.monotonic() - start
        seconds = time.monotonic() - start
    failed = []
    for line in proc.stdout.splitlines():
        m = _SUMMARY.match(line)
        if m and m.group(2) not in failed:
            failed.append(m.group(2))
    return proc.returncode, failed, (proc.stdout + proc.stderr)[-3000:], seconds


def run_fault(scratch: Path, fault: Fault, timeout: float) -> Outcome:
    """Apply ``fault`` in ``scratch``, run its tests, put the file back."""
    try:
        with fault_applied(scratch, fault):
            code, failed, tail, seconds = run_tests(scratch, fault.tests, fault.dist, timeout, fault.name)
    except ValueError as err:
        return Outcome(fault, "stale", detail=str(err))
    if code == 1 and failed:
        return Outcome(fault, "caught", failed, seconds)
    if code == 0:
        return Outcome(fault, "missed", [], seconds)
    why = "timed out" if code == -1 else f"pytest exited {code}"
    return Outcome(fault, "error", failed, seconds, f"{why}:\n{tail}")


def run_baseline(scratch: Path, faults: Sequence[Fault], timeout: float) -> Tuple[bool, str]:
    """Run every test of ``faults`` once on the unfaulted copy: (whether all passed, the output's tail)."""
    tests = list(dict.fromkeys(t for f in faults for t in f.tests))
    code, failed, tail, _ = run_tests(scratch, tests, any(f.dist for f in faults), timeout, "baseline")
    return code == 0, (f"failed: {failed}\n{tail}" if code else "")


# ----------------------------------------------------------------------------- the table


def _short(node: str) -> str:
    """A node id without its folder: ``test_x.py::test_y[p]``."""
    return node.rsplit("/", 1)[-1]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(outcomes: Sequence[Outcome]) -> str:
    """The Markdown table of ``outcomes``: fault, file, tests run, result, tests that failed, and the
    seconds the tests ran (a wait for the machine's lock not counted)."""
    rows = ["| fault | file | tests run | result | failed tests | s |", "|---|---|---|---|---|---:|"]
    for o in outcomes:
        failed = o.failed[:3] + ([f"(+{len(o.failed) - 3} more)"] if len(o.failed) > 3 else [])
        rows.append(f"| `{o.fault.name}` | `{o.fault.file}` | {'<br>'.join(_cell(_short(t)) for t in o.fault.tests)} | "
                    f"{o.status} | {'<br>'.join(_cell(_short(t)) for t in failed)} | {o.seconds:.0f} |")
    return "\n".join(rows)


def bugs(faults: Sequence[Fault]) -> str:
    """One line per fault: its name and what is wrong."""
    return "\n".join(f"- `{f.name}`: {f.bug}." for f in faults)


def page(fields: dict, outcomes: Sequence[Outcome], seconds: float) -> str:
    """The stamped Markdown page of a run."""
    caught = sum(o.status == "caught" for o in outcomes)
    return "\n\n".join([
        "# Seeded faults", stamp(fields),
        f"{caught} of {len(outcomes)} faults caught. The tests ran {sum(o.seconds for o in outcomes):.0f} s; the "
        f"whole run took {seconds:.0f} s of wall time (the copy, waits for the machine's lock included).",
        table(outcomes), "The faults:", bugs([o.fault for o in outcomes])]) + "\n"


def select(names: Optional[Sequence[str]]) -> List[Fault]:
    """The faults named (all of them for None), in ``FAULTS``' order.

    Raises:
        SystemExit: a name that is no fault's.
    """
    if not names:
        return list(FAULTS)
    known = {f.name for f in FAULTS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"seeded_faults: no fault named {unknown}; --list shows them.")
    return [f for f in FAULTS if f.name in names]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--list", action="store_true", help="list the faults and exit")
    parser.add_argument("--only", action="append", metavar="NAME", help="run this fault (repeatable)")
    parser.add_argument("--out", type=Path, help="write the stamped Markdown table to this file")
    parser.add_argument("--baseline", action="store_true", help="first run the selected tests without any fault")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per pytest run (default 1800)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy (its path is printed)")
    args = parser.parse_args(argv)
    faults = select(args.only)
    if args.list:
        for f in faults:
            print(f"{f.name}  ({f.file}{', msrun' if f.dist else ''})\n    {f.bug}\n    " + "\n    ".join(f.tests))
        return 0
    fields = stamp_fields()
    start = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed run still removes its copy
    scratch = make_scratch()
    print(f"scratch copy: {scratch}", flush=True)
    try:
        check_imports(scratch)
        if args.baseline:
            ok, tail = run_baseline(scratch, faults, args.timeout)
            print(f"baseline (no fault): {'passed' if ok else 'FAILED'}", flush=True)
            if not ok:
                print(tail)
                return 1
        outcomes = []
        for f in faults:
            print(f"{f.name} ...", flush=True)
            outcomes.append(run_fault(scratch, f, args.timeout))
            o = outcomes[-1]
            print(f"  {o.status} in {o.seconds:.0f} s" + (f": {', '.join(o.failed)}" if o.failed else ""), flush=True)
            if o.detail:
                print(o.detail, flush=True)
    finally:
        if args.keep:
            print(f"kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.monotonic() - start
    text = page(fields, outcomes, seconds)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.out, lambda tmp: Path(tmp).write_text(text))
    return 0 if all(o.status == "caught" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
