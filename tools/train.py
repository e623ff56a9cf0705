"""For users: the demo job (the README's first command).

Train the demo Transformer language model with ZeRO on a synthetic sequence-reversal task.

Under msrun (the README's first command)::

    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --log_dir=outputs/msrun_logs \\
        --join=True tools/train.py --config configs/train_lm.yaml

or directly, in which case it launches msrun itself with ``train.world_size`` workers::

    python tools/train.py --config configs/train_lm.yaml --zero_stage 2 --steps 50

Every key of the config is also a flag (``--zero_stage``, ``--gradient_accumulation_steps``,
``--ckpt_interval`` ...; see ``--help`` and ``tools/train_config.py``); ``--resume`` continues
from the latest complete checkpoint in ``<output_dir>/ckpt``.

What the job does: rank 0 logs each optimizer step (loss averaged over the global batch, step
time, samples/s, a progress bar); every rank logs its model-state bytes at the start
(``mindone_zero.memory.measure.measure_model_states``); per-rank checkpoints are saved every
``ckpt_interval`` steps and at the end; finally the last checkpoint is combined into one file,
loaded into an unsharded model in one process, and its evaluation loss is checked against the
distributed model's. Outputs (``history.jsonl``, ``summary.json``, checkpoints) go to
``train.output_dir``.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # MindSpore: errors only; must precede its import (an importer keeps its own)
    os.environ.setdefault("GLOG_v", "3")
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.dev.launch import msrun_command, msrun_env  # noqa: E402
from tools.train_config import add_override_flags, load_config, overrides_from_args  # noqa: E402

EVAL_STREAM = 10**9  # data "step" of the evaluation batch: never a training step
RTOL_COMBINED = 1e-5


def parse_args(argv):
    """(args, config) from the command line; exits with a usage error on a bad config."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, help="YAML config (sections model, data, train)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    add_override_flags(parser)
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, overrides_from_args(args))
    except (ValueError, OSError) as err:
        parser.error(str(err))
    return args, cfg


_LAUNCHED = "MINDONE_ZERO_TRAIN_LAUNCHED"


def under_msrun() -> bool:
    """Whether msrun started this process: a worker (MS_WORKER) or msrun's scheduler process
    (MS_SCHED), which runs this same script and must not launch msrun again."""
    return "MS_ROLE" in os.environ


def launch_msrun(argv, cfg) -> int:
    """Run this script under msrun with ``train.world_size`` workers (``tools/dev/launch.py`` picks
    the port and the environment); waits as long as the job runs and returns msrun's exit code."""
    if os.environ.get(_LAUNCHED):
        raise RuntimeError("For 'tools/train.py', msrun started this script without setting MS_ROLE; not relaunching.")
    world = cfg["train"]["world_size"]
    log_dir = Path(cfg["train"]["output_dir"]) / "msrun_logs"
    cmd = msrun_command(Path(__file__).resolve(), world, log_dir, argv, ["--tail_worker_log=0"])
    print("launching:", " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=msrun_env({_LAUNCHED: "1"}))


# ----------------------------------------------------------------------------- progress display
def format_bytes(n: int) -> str:
    """``n`` bytes with a binary unit: '512 B', '36.0 KiB', '1.50 MiB'."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if n < 10 * size else f"{n / size:.1f} {unit}"
    return f"{n} B"


def format_progress(done: int, total: int, loss: float, step_s: float, samples_per_s: float, eta_s, width=20) -> str:
    """One progress line: bar, step counter, loss, step time, throughput and ETA (None: unknown)."""
    filled = int(round(width * done / total)) if total else width
    bar = "#" * filled + "." * (width - filled)
    eta = "--:--" if eta_s is None else f"{int(eta_s) // 60:02d}:{int(eta_s) % 60:02d}"
    digits = len(str(total))
    return (f"[{bar}] {done:>{digits}}/{total} loss {loss:.4f} | {step_s * 1e3:7.1f} ms/step | "
            f"{samples_per_s:8.1f} samples/s | eta {eta}")


class History:
    """Rank 0's per-step record, ``history.jsonl``: one JSON line per optimizer step.

    On resume the lines after the resumed step are dropped, so the file is always the loss
    curve of the weights in the latest checkpoint line of descent.
    """

    def __init__(self, path: Path, keep_until: int, enabled: bool):
        self.path, self.enabled = path, enabled
        if not enabled:
            return
        kept = []
        if keep_until > 0 and path.exists():
            kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= keep_until]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in kept))

    def add(self, record: dict) -> None:
        """Append one step's record (rank 0 only)."""
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def losses(self):
        """The losses recorded so far, in step order ([] on other ranks)."""
        return [json.loads(line)["loss"] for line in self.path.read_text().splitlines()] if self.enabled else []


# ----------------------------------------------------------------------------- checkpoints
# Save, resume and combine each live in one function: they are the only places that know the
# checkpoint layout of mindone_zero.checkpoint.
def save_checkpoint(train_net, ckpt_dir: Path, step: int) -> str:
    """Save this rank's train state for ``step`` (collective: every rank calls it)."""
    from mindone_zero.checkpoint import save_train_state

    return save_train_state(train_net, str(ckpt_dir), step)


def existing_checkpoint(ckpt_dir: Path):
    """The latest complete checkpoint folder in ``ckpt_dir`` or None (not collective)."""
    from mindone_zero.checkpoint import latest_checkpoint

    return latest_checkpoint(str(ckpt_dir))


def check_fresh_run(cfg, resume: bool) -> None:
    """Refuse to start over on top of an earlier run's checkpoints (not collective).

    Raises:
        FileExistsError: ``resume`` is False, checkpoints are enabled and ``<output_dir>/ckpt``
            already holds a complete checkpoint.
    """
    ckpt_dir = Path(cfg["train"]["output_dir"]) / "ckpt"
    found = existing_checkpoint(ckpt_dir) if cfg["train"]["ckpt_interval"] and not resume else None
    if found is not None:
        raise FileExistsError(
            f"For 'tools/train.py', '{ckpt_dir}' holds checkpoints of an earlier run (latest: {found}); pass "
            f"--resume to continue it, or remove the folder or choose another --output_dir to start over."
        )


def resume_checkpoint(train_net, ckpt_dir: Path) -> int:
    """Load the latest complete checkpoint into ``train_net``; returns its step (collective)."""
    from mindone_zero.checkpoint import load_train_state

    if existing_checkpoint(ckpt_dir) is None:
        raise FileNotFoundError(
            f"For 'tools/train.py', '--resume' needs a checkpoint in '{ckpt_dir}', but none is complete."
        )
    return load_train_state(train_net, str(ckpt_dir))


def combine_checkpoint(step_dir: str) -> str:
    """Offline combine of one saved step's network into a single file of full tensors; returns its path.

    Not collective, no communication: reads the files ``save_train_state`` wrote
    ([Note: checkpoint layout] in ``mindone_zero/checkpoint/layout.py``). At stage 3 each rank saved its
    network shards (``network_rank{r}``); ``convert_checkpoints`` merges them with the step's
    split-info JSON into ``network_rankall_{N}`` next to them (MindOne's naming). At stages 0-2 the
    network was saved whole (``network``), and that file is returned.
    """
    from mindone_zero.checkpoint import convert_checkpoints
    from mindone_zero.checkpoint.naming import rank_pattern, split_info_pattern

    with open(os.path.join(step_dir, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    names = meta["files"]["network"]
    if len(names) == 1:
        return os.path.join(step_dir, names[0])
    src = os.path.join(step_dir, rank_pattern("network", meta["format"]))
    info = os.path.join(step_dir, split_info_pattern())
    return convert_checkpoints(src, info, meta["op_group_size"])


# ----------------------------------------------------------------------------- the job
class Job:
    """Everything one rank needs: networks, data slicing, the loss all-reduce, logging."""

    def __init__(self, cfg, rank: int, world: int):
        import mindspore as ms
        from mindspore import nn

        from mindone_zero import EMA, prepare_train_network
        from mindone_zero.core.comm import GroupComm
        from tools import lm_model
        from tools.lm_model import LMLoss, build_lm, init_lm_weights
        from tools.train_config import gather_units_of, per_rank_batch

        self.cfg, self.rank, self.world = cfg, rank, world
        train = cfg["train"]
        self.micro_batch_size = per_rank_batch(cfg, world)
        self.net = init_lm_weights(build_lm(cfg["model"]), train["init_seed"])
        self.loss_net = LMLoss(self.net)
        optimizer = _make_optimizer(self.net.trainable_params(), train)
        ema = EMA(self.net, ema_decay=train["ema_decay"]) if train["ema"] else None
        scale = train["loss_scale"]
        if train["dynamic_loss_scale"]:
            scale = nn.DynamicLossScaleUpdateCell(loss_scale_value=scale, scale_factor=2, scale_window=1000)
        self.out = Path(train["output_dir"])
        self.train_net = prepare_train_network(
            self.loss_net, optimizer, scale_sense=scale, ema=ema,
            gradient_accumulation_steps=train["gradient_accumulation_steps"], clip_grad=train["clip_grad"],
            clip_norm=train["clip_norm"], zero_stage=train["zero_stage"],
            reshard_after_forward=train["reshard_after_forward"],
            gather_units=gather_units_of(train["gather_units"], lm_model),
            pad_uneven_params=train["pad_uneven_params"], shard_ema=train["shard_ema"],
            params_split_info=str(self.out / "params_info"),
        )
        self.train_net.set_train(True)
        self.comm = GroupComm() if world > 1 else None
        self.ms = ms

    def log(self, *parts) -> None:
        """Print on rank 0 only."""
        if self.rank == 0:
            print(*parts, flush=True)

    def batch(self, step: int, micro: int):
        """This rank's ``micro``-th slice of the global batch of ``step`` (as Tensors)."""
        from tools.lm_model import reversal_batch

        data, model, train = self.cfg["data"], self.cfg["model"], self.cfg["train"]
        arrays = reversal_batch(data["seed"], step, train["global_batch_size"], data["num_digits"], model["vocab_size"])
        k = self.rank * train["gradient_accumulation_steps"] + micro
        lo, hi = k * self.micro_batch_size, (k + 1) * self.micro_batch_size
        return tuple(self.ms.Tensor(a[lo:hi]) for a in arrays)

    def world_mean(self, value: float) -> float:
        """Mean of a float over the ranks (collective)."""
        if self.comm is None:
            return value
        total = self.comm(self.ms.Tensor(value, self.ms.float32))
        return float(total.asnumpy()) / self.world

    def evaluate(self) -> float:
        """Loss of the (sharded) network on the fixed evaluation batch; every rank evaluates
        the whole batch and gets the same value (collective at stage 3)."""
        return evaluate_loss(self.loss_net, self.cfg)


def _make_optimizer(params, train):
    from mindspore import nn

    lr, wd = train["learning_rate"], train["weight_decay"]
    if train["optimizer"] == "adamw":
        return nn.AdamWeightDecay(params, learning_rate=lr, weight_decay=wd)
    if train["optimizer"] == "adam":
        return nn.Adam(params, learning_rate=lr, weight_decay=wd)
    if train["optimizer"] == "momentum":
        return nn.Momentum(params, learning_rate=lr, momentum=0.9, weight_decay=wd)
    return nn.SGD(params, learning_rate=lr, weight_decay=wd)


def evaluate_loss(loss_net, cfg) -> float:
    """Loss of ``loss_net`` on the evaluation batch of ``cfg`` (a pure function of the config)."""
    import mindspore as ms

    from tools.lm_model import reversal_batch

    data, model = cfg["data"], cfg["model"]
    arrays = reversal_batch(data["seed"], EVAL_STREAM, data["eval_batch_size"], data["num_digits"], model["vocab_size"])
    loss_net.set_train(False)
    loss = float(loss_net(*(ms.Tensor(a) for a in arrays)).asnumpy())
    loss_net.set_train(True)
    return loss


def report_memory(job) -> dict:
    """Log this rank's model-state bytes (every rank) and, on rank 0, the paper's estimate."""
    from mindone_zero.memory.estimate import estimate_model_states_memory
    from mindone_zero.memory.measure import KINDS, measure_model_states

    measured = measure_model_states(job.train_net)
    parts = ", ".join(f"{k} {format_bytes(measured[k])}" for k in KINDS if measured[k])
    print(f"rank {job.rank} model states: {parts}; total {format_bytes(measured['total'])} "
          f"({measured['total']} B)", flush=True)
    stage = job.train_net.zero_helper.zero_stage
    num_params = sum(_full_size(p) for p in job.net.trainable_params())
    estimate = estimate_model_states_memory(num_params, job.world, stage, param_bytes=4, grad_bytes=4,
                                            optimizer_bytes=8)
    job.log(f"ZeRO paper estimate, stage {stage}, N={job.world}, {num_params} parameters, fp32 Adam (4+4+8 B): "
            f"{format_bytes(estimate)} per rank (counts parameters, gradients and optimizer states; not the EMA, "
            f"the fp32 master shards of stages 1-2 or scalars; gradients are held only as accumulation buffers)")
    return dict(measured, num_params=num_params, estimate=estimate)


def _full_size(param) -> int:
    """Elements of ``param`` before ZeRO-3 sharding (its recorded full shape when sharded)."""
    from mindone_zero.core.partition import zero_spec_of

    spec = zero_spec_of(param)
    if spec is None:
        return int(param.size)
    n = 1
    for d in spec.shape:
        n *= int(d)
    return n


def train_steps(job, start: int, history: History):
    """Optimizer steps ``start .. steps - 1``; logs progress, saves checkpoints.

    Collective. Returns (losses, step times); the first step's time (compilation) is left out.
    """
    train = job.cfg["train"]
    steps, accum, interval = train["steps"], train["gradient_accumulation_steps"], train["ckpt_interval"]
    times, losses = [], []
    for step in range(start, steps):
        t0 = time.perf_counter()
        local, skipped = 0.0, False
        for micro in range(accum):
            loss, overflow, _ = job.train_net(*job.batch(step, micro))
            local += float(loss.asnumpy()) / accum
            skipped = skipped or bool(overflow.asnumpy())
        loss = job.world_mean(local)
        elapsed = time.perf_counter() - t0
        done = step + 1
        if step > start:  # the first step of a run includes graph compilation
            times.append(elapsed)
        eta = sorted(times)[len(times) // 2] * (steps - done) if times else None
        line = format_progress(done, steps, loss, elapsed, train["global_batch_size"] / elapsed, eta)
        job.log(line + (" (compiling)" if step == start else "") + (" (overflow: step skipped)" if skipped else ""))
        history.add({"step": done, "loss": loss, "step_time": elapsed, "overflow": skipped})
        losses.append(loss)
        if interval and (done % interval == 0 or done == steps):
            path = save_checkpoint(job.train_net, job.out / "ckpt", done)
            job.log(f"saved checkpoint of step {done}: {path}")
    return losses, times


def verify_combined(job, step_dir: str, eval_loss: float) -> float:
    """Rank 0: combine ``step_dir`` and evaluate the full model in this process, unsharded.

    Returns the combined model's evaluation loss; raises RuntimeError if it differs from
    ``eval_loss`` by more than ``RTOL_COMBINED`` (relative). Not collective.
    """
    import mindspore as ms

    from tools.lm_model import LMLoss, build_lm

    path = combine_checkpoint(step_dir)  # at stages 0-2 the network file is already whole
    fresh = LMLoss(build_lm(job.cfg["model"]))
    wanted = {p.name for p in fresh.trainable_params()}
    full = {k: v for k, v in ms.load_checkpoint(path).items() if k in wanted}
    missing = sorted(wanted - set(full))
    if missing:
        raise RuntimeError(f"For 'tools/train.py', the combined checkpoint '{path}' lacks {missing[:5]}.")
    ms.load_param_into_net(fresh, full, strict_load=True)
    combined = evaluate_loss(fresh, job.cfg)
    job.log(f"combined checkpoint {path}: evaluation loss {combined:.6f} (distributed: {eval_loss:.6f})")
    if abs(combined - eval_loss) > RTOL_COMBINED * max(abs(eval_loss), 1e-12):
        raise RuntimeError(
            f"For 'tools/train.py', the combined model's evaluation loss {combined!r} differs from the "
            f"distributed model's {eval_loss!r} (rtol {RTOL_COMBINED})."
        )
    return combined


def finish(job, losses, times, memory, last_ckpt) -> dict:
    """Final evaluation, combine-and-verify on rank 0, summary; collective (ends with a barrier
    that carries rank 0's verdict, so every rank fails together)."""
    eval_loss = job.evaluate()
    combined, error = None, None
    if job.rank == 0 and last_ckpt is not None:
        try:
            combined = verify_combined(job, last_ckpt, eval_loss)
        except Exception as err:  # reported on every rank below, re-raised here
            error = err
    failed = job.world_mean(1.0 if error is not None else 0.0) > 0
    if error is not None:
        raise error
    if failed:
        raise RuntimeError("For 'tools/train.py', rank 0 failed to verify the combined checkpoint.")
    summary = {"zero_stage": job.train_net.zero_helper.zero_stage, "world_size": job.world,
               "steps": job.cfg["train"]["steps"], "losses_this_run": losses, "eval_loss": eval_loss,
               "combined_eval_loss": combined, "checkpoint": last_ckpt,
               "median_step_time": sorted(times)[len(times) // 2] if times else None, "memory_rank0": memory}
    return summary


def run(args, cfg) -> dict:
    """The training job on this rank (under msrun). Collective throughout."""
    import mindspore as ms
    from mindone_zero.core.comm import init_data_parallel

    train = cfg["train"]
    rank, world = init_data_parallel(train["device"])
    ms.set_context(mode=ms.GRAPH_MODE if train["mode"] == "graph" else ms.PYNATIVE_MODE)
    check_fresh_run(cfg, args.resume)
    cache = None
    if train["compile_cache"]:  # before the first compile; [Note: compile cache] in tools/compile_cache.py
        from tools.compile_cache import enable_compile_cache

        cache = enable_compile_cache(train["compile_cache"], cfg, world)
    job = Job(cfg, rank, world)
    if cache is not None:
        job.log(f"compile cache: {cache}")
    if world != train["world_size"]:
        job.log(f"note: running on {world} ranks (msrun), not train.world_size={train['world_size']}")
    job.log(f"ZeRO stage {train['zero_stage']}, {world} ranks, global batch {train['global_batch_size']} "
            f"({job.micro_batch_size} per rank x {train['gradient_accumulation_steps']} micro-steps), "
            f"{train['steps']} steps, mode {train['mode']}")
    memory = report_memory(job)
    start = resume_checkpoint(job.train_net, job.out / "ckpt") if args.resume else 0
    if args.resume:
        job.log(f"resumed from step {start}")
    history = History(job.out / "history.jsonl", start, rank == 0)
    job.log(f"evaluation loss at step {start}: {job.evaluate():.4f}")
    losses, times = train_steps(job, start, history)
    last_ckpt = existing_checkpoint(job.out / "ckpt") if train["ckpt_interval"] else None
    summary = finish(job, losses, times, memory, last_ckpt)
    curve = history.losses()
    if rank == 0:
        summary["first_loss"], summary["last_loss"] = curve[0], curve[-1]
        job.log(f"loss {curve[0]:.4f} -> {curve[-1]:.4f} ({curve[-1] / curve[0]:.2%} of the first step); "
                f"evaluation loss {summary['eval_loss']:.4f}")
        (job.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv=None) -> int:
    """Entry point: under msrun, train on this rank; otherwise launch msrun. Returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args, cfg = parse_args(argv)
    if not under_msrun():
        try:
            check_fresh_run(cfg, args.resume)  # fail in seconds, not after msrun has started
        except FileExistsError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return launch_msrun(argv, cfg)
    run(args, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
