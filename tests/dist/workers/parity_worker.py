"""msrun worker: train TinyNet with prepare_train_network for each case, write per-rank results.

Usage (under msrun): parity_worker.py --out DIR --cases JSON
Each case: {"name", "mode": "graph"|"pynative", "stage", "accum", "clip", "steps", "optimizer",
            "overflow_step" (optional: rank 1 injects inf into its loss at that step),
            "dynamic_scale" (optional)}.
Writes DIR/{name}_rank{r}.npz (losses, overflow, scales, params) and DIR/{name}_rank{r}.json,
and DIR/groups_rank{r}.json (``create_groups``).
A case with a ``kind`` runs in the module of that kind and writes its own files: ``graph``
(comm_graph.py), ``gathered`` (gathered_cases.py), ``memory``, ``offload`` and ``mixed_precision``
(memory_cases.py, offload_cases.py, mixed_precision_cases.py: jobs of their own before issue 59).
"""
import json
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn
from mindspore.communication import create_group

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from msrun_harness import worker_args  # noqa: E402
from models import FactoredOptimizer, LossNet, TinyNet, init_weights, make_optimizer, micro_batch  # noqa: E402
from comm_graph import run_graph_case  # noqa: E402
from gathered_cases import run_gathered_case  # noqa: E402
from memory_cases import run_memory_case  # noqa: E402
from mixed_precision_cases import run_mixed_precision_case  # noqa: E402
from offload_cases import run_offload_case  # noqa: E402
from lora_models import build_own_lora, build_peft_lora, frozen_report, mindone_peft_missing  # noqa: E402

from mindone_zero import ZeroHelper, create_hybrid_groups, prepare_network, prepare_train_network  # noqa: E402
from mindone_zero.core.comm import GroupComm, group_members, init_data_parallel, world_group  # noqa: E402
from mindone_zero.core.groups import created_groups  # noqa: E402
from mindone_zero.memory.measure import measure_model_states  # noqa: E402
from mindone_zero.train.optimizer_states import find_optimizer_states  # noqa: E402
from mindone_zero.zero3.shard import recomputed_cells  # noqa: E402

CLIP_NORM = 2.0


class CallCounter:
    """Counts the GroupComm collective calls a PYNATIVE step makes (Python runs every call)."""

    METHODS = ("all_reduce", "all_reduce_mean", "reduce_scatter", "all_gather", "broadcast")

    def __init__(self, train):
        self.counts = {}
        seen = set()
        for _, cell in train.cells_and_names():
            if isinstance(cell, GroupComm) and id(cell) not in seen:
                seen.add(id(cell))
                for name in self.METHODS:
                    object.__setattr__(cell, name, self._wrap(cell, name, getattr(cell, name)))

    def _wrap(self, cell, name, method):
        kind = "all_reduce" if name == "all_reduce_mean" else name

        def counted(*args, **kwargs):
            key = f"{kind}@{cell.group}"
            self.counts[key] = self.counts.get(key, 0) + 1
            return method(*args, **kwargs)

        return counted


def offload_argument(where, out):
    """``optimizer_offload`` for a case's ``offload``: None, "host", or "file" (40-byte chunks: ten
    floats, so that every tensor is updated in several chunks)."""
    if where == "file":
        return {"device": "nvme", "path": os.path.join(out, "offload_states"), "chunk_size": 40}
    return where == "host"


LORA_NETS = {"lora": build_own_lora, "lora_peft": build_peft_lora}  # tests/dist/test_lora.py


def _network(case):
    kind = case.get("net", "full")
    if kind in LORA_NETS:
        return LORA_NETS[kind]()
    net = init_weights(TinyNet(with_scalar=kind != "noscalar"))
    if kind == "fp16":
        net.head.to_float(ms.float16)
    return net


def run_case(case, out, rank, world, hybrid):
    ms.set_context(mode=ms.GRAPH_MODE if case["mode"] == "graph" else ms.PYNATIVE_MODE)
    groups = dict(optimizer_parallel_group=hybrid[0], dp_group=hybrid[1]) if case.get("hybrid") else {}
    if case.get("net") == "lora_peft" and mindone_peft_missing():  # the test skips, saying why
        with open(os.path.join(out, f"{case['name']}_rank{rank}.json"), "w") as f:
            json.dump({"skipped": mindone_peft_missing()}, f)
        return
    net = _network(case)
    loss_net = LossNet(net)
    units = tuple({"TinyNet": TinyNet, "Dense": nn.Dense}[name] for name in case.get("units", ())) or None
    if case.get("prepare_first"):
        loss_net = prepare_network(loss_net, case["stage"], groups.get("optimizer_parallel_group"),
                                   reshard_after_forward=case.get("reshard", True),
                                   pad_uneven_params=case.get("pad", True))
    opt = make_optimizer(net.trainable_params(), case.get("optimizer", "adam"))
    scale = nn.DynamicLossScaleUpdateCell(2.0 ** 10, 2, 1000) if case.get("dynamic_scale") else 1.0
    accum = case["accum"]
    train = prepare_train_network(
        loss_net, opt, scale_sense=scale, zero_stage=case["stage"], gradient_accumulation_steps=accum,
        clip_grad=case["clip"], clip_norm=CLIP_NORM, params_split_info=os.path.join(out, case["name"] + "_info"),
        comm_fusion=case.get("fusion"), optimizer_offload=offload_argument(case.get("offload"), out),
        reshard_after_forward=case.get("reshard", True), pad_uneven_params=case.get("pad", True), gather_units=units,
        **groups,
    )
    train.set_train(True)
    counter = CallCounter(train) if case.get("count_calls") else None
    losses, overflows, scales = [], [], []
    for step in range(case["steps"]):
        for micro in range(accum):
            ids, labels = micro_batch(step, rank, world, micro, accum)
            factor = np.inf if (step == case.get("overflow_step") and rank == 1) else 1.0
            loss, overflow, s = train(Tensor(ids), Tensor(labels), Tensor(factor, ms.float32))
            losses.append(float(loss.asnumpy()))
            overflows.append(bool(overflow.asnumpy()))
            scales.append(float(s.asnumpy()))
    params = {p.name: p.asnumpy() for p in net.trainable_params()}
    specs = {}
    for p in net.trainable_params():
        spec = getattr(p, "zero_spec", None)
        specs[p.name] = {"split": bool(spec.split), "shape": list(spec.shape), "group_size": spec.group_size,
                         "rank": spec.rank} if spec is not None else None
    layout, shards = train.zero_plan, train.optimizer_shards  # [Note: train records] in train/train_plan.py
    # Stage 0 shards nothing, so no states were looked for; find them the same way the build does.
    states = shards.opt_states or find_optimizer_states(train.optimizer, [s.shape for s in layout.specs])
    state_bytes = sum(v.nbytes for values in states.values() for v in values)
    master_bytes = sum(p.nbytes for p, q in zip(shards.opt_params, shards.params) if p is not q)
    np.savez(os.path.join(out, f"{case['name']}_rank{rank}.npz"), losses=np.array(losses),
             overflows=np.array(overflows), scales=np.array(scales), final_scale=float(train.scale_sense.asnumpy()),
             **{"param/" + k: v for k, v in params.items()})
    plan = train.comm_plan
    with open(os.path.join(out, f"{case['name']}_rank{rank}.json"), "w") as f:
        json.dump({"specs": specs, "state_bytes": int(state_bytes), "master_bytes": int(master_bytes),
                   "split": [bool(s.split) for s in layout.specs], "memory": measure_model_states(train),
                   "offload": train.zero_helper.host_offload.store.location if train.offload else None,
                   "plan": [list(e) for e in plan.entries], "recomputed": list(recomputed_cells(loss_net)),
                   "frozen": frozen_report(net), "summed_by": train.summed_by,
                   "calls_per_step": {k: v / case["steps"] for k, v in counter.counts.items()} if counter else None}, f)


def write_json(path, value) -> None:
    with open(path, "w") as f:
        json.dump(value, f)


def _error_of(fn):
    try:
        fn()
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def create_groups(out, rank, world):
    """zero_all: every rank under another name; at N=4 the hybrid grid of ``create_hybrid_groups(2)``:
    shards {0,1}/{2,3}, replicas {0,2}/{1,3}. Returns its (shard, replica) names (None at N=2) and
    writes groups_rank{r}.json: {name: world ranks, as the backend reports them} of every group this
    rank uses, for the job-wide check that no name stands for two rank sets."""
    create_group("zero_all", list(range(world)))
    hybrid = create_hybrid_groups(2) if world == 4 else (None, None)
    names = [world_group(), "zero_all", *created_groups()]
    with open(os.path.join(out, f"groups_rank{rank}.json"), "w") as f:
        json.dump({name: group_members(name) for name in names}, f)
    return hybrid


def run_error_checks(out, rank, world, hybrid):
    """Build-time errors that need a distributed job; writes errors_rank{r}.json."""
    net = LossNet(init_weights(TinyNet()))

    def build(**kwargs):
        return prepare_train_network(net, make_optimizer(net.trainable_params()), zero_stage=1,
                                     params_split_info=os.path.join(out, "errors_info"), **kwargs)

    results = {
        "all_ranks_group_without_dp": _error_of(lambda: build(optimizer_parallel_group="zero_all")),
        "bad_fusion": _error_of(lambda: build(comm_fusion={"allreduce": {"bucket_size": -1}})),
        # padded rule: under MindOne's, nothing of TinyNet divides by 4 and any optimizer works unsharded
        "factored_stage1": _error_of(lambda: ZeroHelper(FactoredOptimizer(net.trainable_params()), zero_stage=1,
                                                         params_split_info=os.path.join(out, "errors_info"),
                                                         pad_uneven_params=True)),
        "factored_stage0": _error_of(lambda: ZeroHelper(FactoredOptimizer(net.trainable_params()), zero_stage=0)),
    }
    if world == 4:
        results["sub_group_without_dp"] = _error_of(lambda: build(optimizer_parallel_group=hybrid[0]))
        results["groups_do_not_tile"] = _error_of(lambda: build(optimizer_parallel_group=hybrid[0],
                                                                dp_group="zero_all"))
    with open(os.path.join(out, f"errors_rank{rank}.json"), "w") as f:
        json.dump(results, f)


def main():
    out, cases = worker_args()
    rank, world = init_data_parallel()
    hybrid = create_groups(out, rank, world)
    run_error_checks(out, rank, world, hybrid)
    keep_alive = []
    for case in cases:
        if case.get("kind") == "graph":  # tests/dist/test_comm_graph.py
            write_json(os.path.join(out, f"graph_{case['name']}_rank{rank}.json"),
                       run_graph_case(case, out, rank, world, hybrid, keep_alive))
        elif case.get("kind") == "gathered":  # tests/dist/test_gathered.py
            with open(os.path.join(out, f"{case['name']}_rank{rank}.json"), "w") as f:
                json.dump(run_gathered_case(case, out, rank, world), f)
        elif case.get("kind") == "memory":  # tests/dist/test_memory_measure.py
            run_memory_case(case, out, rank, world)
        elif case.get("kind") == "offload":  # tests/dist/test_offload_parity.py
            run_offload_case(case, out, rank, world, keep_alive)
        elif case.get("kind") == "mixed_precision":  # tests/dist/test_mixed_precision.py
            run_mixed_precision_case(case, out, rank, world, keep_alive)
        else:
            run_case(case, out, rank, world, hybrid)
        print(f"rank {rank}: case {case['name']} done", flush=True)


if __name__ == "__main__":
    main()
