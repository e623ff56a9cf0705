"""For benchmarking: code the benchmark scripts share.

What the benchmark scripts share: the benchmark's config, the config sections of the others,
their msrun jobs and the command line of a benchmark section.

* ``load_benchmark_config`` and the settings it expands to (``settings_of``, ``setting_name``,
  ``setting_label``): read by ``tools/bench/benchmark.py``, its worker ``tools/bench/benchmark_worker.py`` and
  ``tools/dev/profile_step.py``;
* ``load_section``: one section of a YAML file over defaults (``tools/bench/benchmark_peak.py``,
  ``tools/bench/benchmark_offload.py``);
* ``run_world`` (an msrun job of a tools worker with ``--config``) and ``run_setting`` (one job
  of the peak-memory worker ``tools/bench/benchmark_peak_worker.py``), both through ``tools/dev/launch.py``;
* ``run_section``: the command line of a section (``--config``, ``--out``; tables, results, page written).
"""
import argparse
import copy
import json
from pathlib import Path
from typing import List, Sequence, Tuple

import yaml

from mindone_zero.core.stage import STAGES
from tools.bench.report import add_docs_flag
from tools.dev.launch import log_tails, run_msrun
from tools.train_config import build_config

MB = 1e6


# ----------------------------------------------------------------------------- the benchmark's config
BENCH_DEFAULTS = {
    "world_sizes": [2, 4],
    "stages": [0, 1, 2, 3],
    "mode": "graph",
    "warmup_steps": 2,
    "timed_steps": 6,
    "global_batch_size": 16,
    "gradient_accumulation_steps": 2,
    "learning_rate": 1.0e-3,
    "clip_grad": True,
    "init_seed": 0,
    "timeout_s": 600,
    "param_bytes": 4,
    "grad_bytes": 4,
    "optimizer_bytes": 8,
    "stage3_keep": True,  # also time stage 3 with reshard_after_forward=False (2Φ) next to the default (3Φ)
    # also time stage 3 with these gather units (class names in tools/lm_model.py), "3 (units)"; []: not
    "stage3_units": [],
    # also time stage 0 of the demo LM with k extra 4-byte all-reduces per optimizer step for each k here,
    # "0 (+k idle collectives)": what synchronisation alone costs next to stage 0; [] to skip
    "idle_collectives": [],
    # bind each rank's threads to one core (rank mod cores), as each rank has a device of its own on a
    # cluster; False lets the ranks' threads share all cores, competing with each other
    "pin_ranks": False,
}
# The Dense stack (tools/bench/dense_model.py), issue 11's 4 x Dense(1024, 1024) with AdamWeightDecay.
DENSE_DEFAULTS = {"world_sizes": [2], "layers": 4, "width": 1024, "batch_per_rank": 32,
                  "gradient_accumulation_steps": 1,
                  # the "3 (units)" run's gather units for the Dense stack (tools/bench/dense_model.py, then mindspore.nn)
                  "stage3_units": ["Dense"]}


def _fail(key, what, value):
    raise ValueError(f"For 'load_benchmark_config', the argument '{key}' must be {what}, but got {value!r}.")


def load_benchmark_config(path: str) -> dict:
    """Sections ``model`` and ``data`` (as in ``configs/train_lm.yaml``), ``benchmark`` and
    ``dense`` (the Dense stack; ``DENSE_DEFAULTS`` when absent, ``world_sizes: []`` to skip it).

    Raises:
        ValueError: unknown key or bad value, naming it. OSError: unreadable file.
    """
    with open(path, encoding="utf-8") as f:
        loaded = yaml.safe_load(f) or {}
    if not isinstance(loaded, dict):
        _fail("config", "a mapping", loaded)
    loaded = dict(loaded)
    bench = copy.deepcopy(BENCH_DEFAULTS)
    for key, value in (loaded.pop("benchmark", None) or {}).items():
        if key not in bench:
            _fail(f"benchmark.{key}", f"one of {sorted(bench)}", key)
        bench[key] = value
    dense = dict(DENSE_DEFAULTS)
    for key, value in (loaded.pop("dense", None) or {}).items():
        if key not in dense:
            _fail(f"dense.{key}", f"one of {sorted(dense)}", key)
        dense[key] = value
    _check_dense(dense)
    if "train" in loaded:
        _fail("train", "absent (the benchmark has its own 'benchmark' section)", loaded["train"])
    cfg = build_config(loaded, {}, f"the file '{path}'")
    check_bench(bench)
    return {"model": cfg["model"], "data": cfg["data"], "benchmark": bench, "dense": dense}


def _check_dense(dense: dict) -> None:
    sizes = dense["world_sizes"]
    if not isinstance(sizes, list) or any(not isinstance(n, int) or n < 1 for n in sizes):
        _fail("dense.world_sizes", "a list of integers >= 1", sizes)
    for key in ("layers", "width", "batch_per_rank", "gradient_accumulation_steps"):
        if not isinstance(dense[key], int) or isinstance(dense[key], bool) or dense[key] < 1:
            _fail(f"dense.{key}", "an integer >= 1", dense[key])
    _check_names("dense.stage3_units", dense["stage3_units"])


def _check_names(key: str, names) -> None:
    if not isinstance(names, list) or any(not isinstance(n, str) or not n.isidentifier() for n in names):
        _fail(key, "a list of Cell class names", names)


def check_bench(bench: dict) -> None:
    """Raises ValueError naming the key of ``bench`` (the ``benchmark`` section) that is bad."""
    sizes, stages = bench["world_sizes"], bench["stages"]
    if not isinstance(sizes, list) or not sizes or any(not isinstance(n, int) or n < 1 for n in sizes):
        _fail("benchmark.world_sizes", "a non-empty list of integers >= 1", sizes)
    if not isinstance(stages, list) or 0 not in stages or any(s not in STAGES for s in stages):
        _fail("benchmark.stages", f"a list of stages from {list(STAGES)} including 0 (the baseline)", stages)
    if bench["mode"] not in ("graph", "pynative"):
        _fail("benchmark.mode", "'graph' or 'pynative'", bench["mode"])
    for key in ("stage3_keep", "pin_ranks"):
        if not isinstance(bench[key], bool):
            _fail(f"benchmark.{key}", "a bool", bench[key])
    _check_names("benchmark.stage3_units", bench["stage3_units"])
    for key in ("timed_steps", "global_batch_size", "gradient_accumulation_steps", "timeout_s"):
        if not isinstance(bench[key], int) or bench[key] < 1:
            _fail(f"benchmark.{key}", "an integer >= 1", bench[key])
    idle, per_step = bench["idle_collectives"], 2 * bench["gradient_accumulation_steps"]
    if not isinstance(idle, list) or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 or k % per_step
                                         for k in idle):
        _fail("benchmark.idle_collectives", f"a list of positive multiples of 2 x gradient_accumulation_steps "
              f"({per_step}: as many in forward as in backward at every micro-step)", idle)
    for n in sizes:
        if bench["global_batch_size"] % (n * bench["gradient_accumulation_steps"]):
            _fail("benchmark.global_batch_size", f"a multiple of N x accumulation for N={n}",
                  bench["global_batch_size"])


def settings_of(bench: dict, idle: bool = True) -> List[Tuple[int, bool, bool, int]]:
    """``(zero_stage, reshard_after_forward, gather units, idle collectives)`` of every run: each
    stage of ``bench["stages"]`` with the default (True, no units, 0), then stage 3 keeping its
    gathered weights when ``stage3_keep`` is set, then stage 3 with gather units when
    ``stage3_units`` names some (both ways when ``stage3_keep`` is set too), then, when ``idle``
    (the demo LM), stage 0 with each count of ``idle_collectives``."""
    settings = [(stage, True, False, 0) for stage in bench["stages"]]
    if 3 in bench["stages"]:
        if bench["stage3_keep"]:
            settings.append((3, False, False, 0))
        if bench.get("stage3_units"):
            settings.append((3, True, True, 0))
            if bench["stage3_keep"]:
                settings.append((3, False, True, 0))
    if idle:
        settings += [(0, True, False, k) for k in bench.get("idle_collectives") or []]
    return settings


def setting_name(stage: int, reshard: bool, units: bool = False, idle: int = 0) -> str:
    """File stem of a setting: ``stage3``; at stage 3 keeping gathered weights ``stage3_keep``, with
    gather units ``stage3_units``; with idle collectives ``stage0_idle8``."""
    return (f"stage{stage}" + ("_keep" if stage == 3 and not reshard else "") + ("_units" if units else "")
            + (f"_idle{idle}" if idle else ""))


def setting_label(stage: int, reshard: bool, units: bool = False, idle: int = 0) -> str:
    """Row label of a setting: ``3``, ``3 (keep)``, ``3 (units)``, ``3 (units, keep)``, ``0 (+8 idle collectives)``."""
    marks = (["units"] if units else []) + (["keep"] if stage == 3 and not reshard else [])
    marks += [f"+{idle} idle collectives"] if idle else []
    return str(stage) + (f" ({', '.join(marks)})" if marks else "")


# ----------------------------------------------------------------------------- sections of other scripts
def load_section(path: str, section: str, defaults: dict, caller: str) -> dict:
    """The ``section`` of a YAML file over ``defaults``; raises ValueError naming an unknown key."""
    with open(path, encoding="utf-8") as f:
        loaded = (yaml.safe_load(f) or {}).get(section) or {}
    cfg = dict(defaults)
    for key, value in loaded.items():
        if key not in cfg:
            raise ValueError(f"For '{caller}', the argument '{section}.{key}' must be one of "
                             f"{sorted(cfg)}, but got {key!r}.")
        cfg[key] = value
    return cfg


# ----------------------------------------------------------------------------- msrun jobs
def run_world(config_path: str, world: int, out: Path, timeout_s: int,
              worker: str = "tools/bench/benchmark_worker.py", worker_args: Sequence[str] = (),
              what: str = "benchmark") -> None:
    """One msrun job with ``world`` CPU workers running ``worker`` (a path from the repository root;
    by default every stage of the benchmark) with ``--config``, ``--out`` and ``worker_args``;
    results in ``out``.

    Raises:
        MsrunError (a RuntimeError): the job failed or timed out, with the tail of the worker logs;
        ``what`` names the tool.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*stage*_rank*.json"):
        stale.unlink()  # never report an earlier run's numbers
    run_msrun(worker, world, out, ["--config", str(Path(config_path).resolve()), *worker_args],
              timeout=timeout_s, caller=what)


def case_name(stage: int, reshard: bool, offload: str = "none") -> str:
    """File stem of a peak-memory setting: ``stage0``, ``stage3_keep``, ``stage3_free_offload_nvme``."""
    name = f"stage{stage}" + (("_free" if reshard else "_keep") if stage == 3 else "")
    return name if offload == "none" else f"{name}_offload_{offload}"


def run_setting(cfg: dict, stage: int, reshard: bool, out: Path, offload: str = "none", model=None) -> List[dict]:
    """One msrun job of ``tools/bench/benchmark_peak_worker.py`` for one setting (``offload``: "none",
    "cpu" or "nvme", with ``cfg["chunk_size"]``) at ``cfg["world_size"]`` ranks; returns every
    rank's result. ``model`` (a name and the worker's model keys, see that worker) replaces the
    config's Dense stack.

    Raises:
        RuntimeError: the job failed, timed out or left a rank without its result (with the tail
        of the worker logs).
    """
    name, world = case_name(stage, reshard, offload), cfg["world_size"]
    case = {k: cfg[k] for k in ("layers", "width", "micro_batch", "steps", "mode") if k in cfg}
    if model is not None:
        model = dict(model)
        name = f"{model.pop('name')}_{name}"
        case.update(model)
    case.update(name=name, stage=stage, reshard_after_forward=reshard, offload=offload,
                chunk_size=cfg.get("chunk_size", 0))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(f"{name}_rank*.json"):
        stale.unlink()  # never report an earlier run's numbers
    log_dir = out / "msrun_logs" / name
    run_msrun("tools/bench/benchmark_peak_worker.py", world, out, ["--case", json.dumps(case)],
              timeout=cfg["timeout_s"], log_dir=log_dir, caller="benchmark_peak")
    paths = [out / f"{name}_rank{r}.json" for r in range(world)]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        raise RuntimeError(f"For 'benchmark_peak', the msrun job {name} (N={world}) wrote no {missing}.\n"
                           + log_tails(log_dir))
    return [json.loads(p.read_text()) for p in paths]


# ----------------------------------------------------------------------------- command line of a section
def run_section(argv, doc: str, default_config: str, default_out: str, load, run, page) -> int:
    """The CLI of a benchmark section: ``--config`` read by ``load``, ``run(cfg, out)`` giving its
    raw results, whose tables (``page.body``) are written to ``<out>/<page.name>.md``, the results to
    ``.json``, and the stamped page with its figure and results to ``docs/benchmarks/`` (``--docs``,
    ``tools/bench/pages.py``); prints the tables; returns 0."""
    from tools.bench.pages import publish

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[1])
    parser.add_argument("--config", default=default_config)
    parser.add_argument("--out", default=default_out)
    add_docs_flag(parser, page.name)
    args = parser.parse_args(argv)
    try:
        cfg = load(args.config)
    except (ValueError, OSError) as err:
        parser.error(str(err))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = run(cfg, out)
    table = page.body(results)
    (out / f"{page.name}.md").write_text(table + "\n")
    (out / f"{page.name}.json").write_text(json.dumps(results, indent=1))
    print(table)
    if args.docs:
        print(f"page: {publish(page, results, out_dir=args.docs)}")
    return 0
