"""msrun worker for tests/dist/test_export_job.py: ``save_full_checkpoint`` streamed exports, per rank.

Usage (under msrun): export_worker.py --out DIR --cases JSON (cases from export_cases.cases()).

For each case (a zero stage and a split rule) one train network of ``ExportNet`` is prepared in
PYNATIVE mode (no step is needed: the export reads the held tensors); its EMA weights are moved
off the network's (x * 0.5 + 0.25 on every block) so that a swap would show. Then:

* rank 0 writes ``DIR/{case}/full.npz``: ``gather_full_params(include_ema=True)``, the reference;
* every export of ``export_cases.exports(i)`` is written under ``DIR/{case}/`` with
  ``save_full_checkpoint``, with a spy on the gather of every tensor ([Note: streamed export] in
  online.py): each gathered array is tagged (a numpy subclass that counts its live instances,
  views and casts included), and at every gather the spy records how many tagged arrays from
  earlier gathers are still alive (must be 0: one gathered tensor at a time) and how many gathers
  there were.

Each export is then loaded back with ``load_full_checkpoint`` into a fresh train network of the
case; rank 0 writes what it holds, gathered, to ``DIR/{case}/reload_{export}.npz``.

The last case also runs the bad inputs (every rank must raise, none hang) and a write that fails
half-way on rank 0, then one good export to show the ranks are still in step. Each rank writes
``DIR/{case}_rank{r}.json``: {export name: "ok" or the error}, and the spy's counts.

The hand-back case ({"name": "hf", "src": a Hugging Face folder of hf_llama.TinyLlama}): the model
is built, prepared at stage 3 (GRAPH_MODE), loaded from the folder with ``load_full_checkpoint``
(``add_prefix="net."``), fine-tuned for ``HF_STEPS`` steps, and exported into ``DIR/hf/fp32`` and
``DIR/hf/bf16`` with ``strip_prefix="net."`` and ``copy_files_from`` the folder. Rank 0 writes
``DIR/hf/full.npz`` (the gathered network) and ``DIR/hf/logits.npy`` (the network's logits of
``hf_llama.input_ids()``); each rank writes ``DIR/hf_rank{r}.json`` (the load's missing and
unexpected names, the losses).
"""
import json
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))

from export_cases import ExportLoss, ExportNet, MAX_SHARD_SIZE, export_path, exports, init_export_net  # noqa: E402
from hf_llama import CausalLMLoss, TinyLlama, input_ids  # noqa: E402
from models import LiveArrays  # noqa: E402
from msrun_harness import worker_args  # noqa: E402
from mindone_zero import EMA, load_full_checkpoint, prepare_train_network  # noqa: E402
from mindone_zero.checkpoint import gather_full_params, online, save_full_checkpoint  # noqa: E402
from mindone_zero.core.comm import init_data_parallel  # noqa: E402

HF_STEPS = 3
HF_SHARD_SIZE = 1024  # bytes: the 16 x 42 embedding (2688) and head get files of their own


def install_spy():
    """Wrap ``online._full_value`` (the gather of one tensor); returns the counts it keeps."""
    real, counts = online._full_value, {"gathers": 0, "max_live_at_gather": 0}

    def spy(train_net, layout, it):
        counts["gathers"] += 1
        counts["max_live_at_gather"] = max(counts["max_live_at_gather"], LiveArrays.live)
        return real(train_net, layout, it).view(LiveArrays)

    online._full_value = spy
    return counts, lambda: setattr(online, "_full_value", real)


def build(case):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = init_export_net(ExportNet())
    opt = nn.Adam(net.trainable_params(), learning_rate=0.01)
    train = prepare_train_network(ExportLoss(net), opt, ema=EMA(net, ema_decay=0.9), zero_stage=case["stage"],
                                  pad_uneven_params=case["pad"],
                                  params_split_info=os.path.join(OUT, "build_info", case["name"]))
    for w in train.ema.ema_weight:
        w.set_data(w * 0.5 + 0.25)
    return train


def attempt(fn):
    try:
        fn()
        return "ok"
    except Exception as err:  # noqa: BLE001 - recorded for the test
        return f"{type(err).__name__}: {err}"


def run_exports(case, train, rank, report):
    folder = os.path.join(OUT, case["name"])
    for name, layout, dtype, include_ema in exports(case["i"]):
        counts, restore = install_spy()
        try:
            report[name] = attempt(lambda: save_full_checkpoint(
                train, export_path(OUT, case["name"], name, layout), include_ema=include_ema, dtype=dtype,
                max_shard_size=MAX_SHARD_SIZE if layout == "sharded" else None))
        finally:
            restore()
        report["spy"][name] = counts
        if report[name] == "ok":
            reload(case, name, export_path(OUT, case["name"], name, layout), rank, report)
    report["tmp_left"] = [f for f in os.listdir(folder) if f.startswith(".")] if rank == 0 else []


def reload(case, name, path, rank, report):
    """Load an export into a fresh train network of the case with ``load_full_checkpoint`` (each rank
    reads its blocks); rank 0 saves what the network then holds, gathered, as ``reload_{name}.npz``.
    The file's EMA tensors have no network parameter: they come back as unexpected."""
    fresh = build(case)
    missing, unexpected = load_full_checkpoint(fresh, path, strict=False)
    report["reload"][name] = {"missing": missing, "unexpected": sorted(unexpected)}
    full = gather_full_params(fresh)
    if rank == 0:
        np.savez(os.path.join(OUT, case["name"], f"reload_{name}.npz"), **full)


def run_errors(case, train, rank, world, report):
    """Bad inputs: the same on every rank, or on one rank only; a write failing half-way on rank 0."""
    folder = os.path.join(OUT, case["name"], "errors")
    os.makedirs(folder, exist_ok=True)
    busy = os.path.join(folder, "busy")
    if rank == 0:
        os.makedirs(busy, exist_ok=True)
        with open(os.path.join(busy, "keep.txt"), "w") as f:
            f.write("user data")
    bad = {
        "dtype_int7": dict(path=os.path.join(folder, "a.ckpt"), dtype="int7"),
        "dtype_on_rank1": dict(path=os.path.join(folder, "b.ckpt"), dtype="int7" if rank == 1 else "fp16"),
        "max_shard_size_bad": dict(path=os.path.join(folder, "c"), max_shard_size="5 parsecs"),
        "path_npz": dict(path=os.path.join(folder, "d.npz")),
        "sharded_path_ext": dict(path=os.path.join(folder, "e.safetensors"), max_shard_size=100),
        "sharded_folder_busy": dict(path=busy, max_shard_size=100),
    }
    for name, kwargs in bad.items():
        report["errors"][name] = attempt(lambda: save_full_checkpoint(train, include_ema=True, **kwargs))
    real, calls = online.cast_tensor, []

    def failing(value, target):  # rank 0 only: the disk fills up at the third tensor
        calls.append(1)
        if len(calls) == 3:
            raise OSError("No space left on device (injected)")
        return real(value, target)

    for name, path, size in (("fail_file", os.path.join(folder, "f.safetensors"), None),
                             ("fail_sharded", os.path.join(folder, "g"), 64)):
        calls.clear()
        online.cast_tensor = failing if rank == 0 else real
        try:
            report["errors"][name] = attempt(lambda: save_full_checkpoint(train, path, True, dtype="bf16",
                                                                          max_shard_size=size))
        finally:
            online.cast_tensor = real
    report["errors"]["after"] = attempt(lambda: save_full_checkpoint(train, os.path.join(folder, "after.ckpt"), True))
    report["errors_left"] = sorted(os.listdir(folder)) if rank == 0 else []


def run_hf(case, rank, world):
    """The hand-back: load from a Hugging Face folder, fine-tune at stage 3, export as one."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net = TinyLlama()
    train = prepare_train_network(CausalLMLoss(net), nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-2),
                                  zero_stage=3, params_split_info=os.path.join(OUT, "build_info", "hf"))
    missing, unexpected = load_full_checkpoint(train, case["src"], add_prefix="net.")
    losses = []
    for step in range(HF_STEPS):
        ids = input_ids(batch=2, seed=100 + step * world + rank)
        losses.append(float(train(ms.Tensor(ids))[0].asnumpy()))
    logits = train.network.net(ms.Tensor(input_ids())).asnumpy()  # stage 3: every rank gathers
    full = gather_full_params(train)
    folder = os.path.join(OUT, "hf")
    os.makedirs(folder, exist_ok=True)
    if rank == 0:
        np.savez(os.path.join(folder, "full.npz"), **full)
        np.save(os.path.join(folder, "logits.npy"), logits)
    for dtype in ("fp32", "bf16"):
        save_full_checkpoint(train, os.path.join(folder, dtype), dtype=dtype, max_shard_size=HF_SHARD_SIZE,
                             strip_prefix="net.", copy_files_from=case["src"])
    with open(os.path.join(OUT, f"hf_rank{rank}.json"), "w") as f:
        json.dump({"missing": missing, "unexpected": unexpected, "losses": losses}, f)


def main():
    global OUT
    OUT, cases = worker_args()
    rank, world = init_data_parallel()
    for case in [c for c in cases if c["name"] == "hf"]:
        run_hf(case, rank, world)
    cases = [c for c in cases if c["name"] != "hf"]
    for k, case in enumerate(cases):
        train = build(case)
        full = gather_full_params(train, include_ema=True)
        os.makedirs(os.path.join(OUT, case["name"]), exist_ok=True)
        if rank == 0:
            np.savez(os.path.join(OUT, case["name"], "full.npz"), **full)
        report = {"spy": {}, "errors": {}, "reload": {}}
        run_exports(case, train, rank, report)
        if k == len(cases) - 1:
            run_errors(case, train, rank, world, report)
        with open(os.path.join(OUT, f"{case['name']}_rank{rank}.json"), "w") as f:
            json.dump(report, f)
        print(f"rank {rank}: case {case['name']} done", flush=True)


OUT = None

if __name__ == "__main__":
    main()
