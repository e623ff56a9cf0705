"""The training cases that one msrun job per world size runs (tests/dist/workers/parity_worker.py).

Every test of training behaviour reads these jobs' files (tests/dist/conftest.py runs each job
once per session), so that N=2 and N=4 each cost one msrun start-up.
"""
STEPS = 10
STAGES = (0, 1, 2, 3)
MODES = ("graph", "pynative")
# (accumulation, clip, optimizer): clipping is checked with Momentum because Adam's update is
# nearly invariant to a gradient scale, so a wrong clip factor would go unseen.
CONFIGS = {"a1": (1, False, "adam"), "a2clip": (2, True, "momentum")}
EXTRA = {"a1clip": (1, True, "momentum")}  # GRAPH_MODE only, to keep the job short
OVERFLOW_STEP = 3
# Optimizer states are found generically; these are the optimizers the issue names (Adam runs
# in every case above).
OPTIMIZERS = ("adamw", "sgd", "momentum")
# Fusion buckets small enough that TinyNet's gradients need several, large enough to merge some.
FUSION_BUCKET = 400
FUSION = {kind: {"openstate": True, "bucket_size": FUSION_BUCKET} for kind in ("allreduce", "reduce_scatter", "allgather")}
# comm_fusion=None (every case that names no fusion) buckets by 25 MiB, TinyNet in one bucket per
# kind; {} sends one collective per tensor. Issue 11: both give the same bits.
UNFUSED = {}
# issue 10: stage 3 frees gathered parameters after forward by default (reshard_after_forward=True);
# these cases keep them (False). FP16 cases compute TinyNet's head in float16 (to_float) and are
# compared with stage 0 on the same network, step by step (the reference computes in float32).
KEEP_CONFIGS = ("a1", "a2clip")
FP16_STEPS = 4
# TinyNet's shapes do not divide by 2 or 4 on purpose, so every case shards with the padded rule
# (pad_uneven_params=True): that is the layout whose arithmetic these tests check. MindOne's rule (the
# default: only a dim 0 that divides is split) runs in the "mindone_rule" cases here, and in
# test_model_train.py and test_mindone_dropin.py.
PAD = True
# issue 23: stage 3 with gather units, re-gathered in backward without recomputing the units' code
# ([Note: reshard after forward]): nested units (TinyNet, and its Dense head inside it) on the
# network without the bare scalar; with it (0-d, never split, so ``logits * self.temperature`` reads
# no gathered tensor); and the float16 head as a unit.
UNITS = ["TinyNet", "Dense"]


def _case(name, stage, mode="graph", accum=1, clip=False, optimizer="adam", steps=STEPS, pad=PAD, **extra):
    return dict(name=name, mode=mode, stage=stage, accum=accum, clip=clip, optimizer=optimizer, steps=steps, pad=pad,
                **extra)


def _fp16_cases(stage, mode):
    """Accumulation and clipping with a float16-compute layer: stage 0, and stage 3 both ways."""
    if stage not in (0, 3):
        return []
    options = {"": True, "_keep": False} if stage == 3 else {"": True}
    return [_case(f"s{stage}_{mode}_fp16{suffix}", stage, mode, 2, True, "momentum", steps=FP16_STEPS, net="fp16",
                  reshard=reshard) for suffix, reshard in options.items()]


def cases_for(world):
    """N=2 runs the whole matrix; N=4 (twice the processes on the same cores) runs each mode,
    accumulation and clipping at least once per stage, plus overflow, fusion and hybrid groups."""
    cases = []
    for stage in STAGES:
        for mode in MODES:
            configs = dict(CONFIGS, **(EXTRA if mode == "graph" else {}))
            for key, (accum, clip, opt) in configs.items():
                if world == 4 and (mode, key) not in (("graph", "a1"), ("pynative", "a2clip")):
                    continue
                # PYNATIVE runs Python for every call, so it counts the collectives actually made
                # (one per tensor there, the baseline of the fusion cases)
                counted = (mode, key) == ("pynative", "a1")
                unfused = {"fusion": UNFUSED} if counted else {}
                cases.append(_case(f"s{stage}_{mode}_{key}", stage, mode, accum, clip, opt, count_calls=counted,
                                   **unfused))
                if stage == 3 and key in KEEP_CONFIGS:
                    cases.append(_case(f"s3_{mode}_{key}_keep", 3, mode, accum, clip, opt, reshard=False,
                                       count_calls=counted, **unfused))
            cases += _fp16_cases(stage, mode)
        if stage == 2 and world == 2:  # optimizer states are found the same way at every stage and N
            for opt in OPTIMIZERS:
                cases.append(_case(f"s{stage}_graph_opt_{opt}", stage, optimizer=opt, steps=5,
                                   net="noscalar" if opt == "adamw" else "full"))
        cases.append(_case(f"s{stage}_graph_overflow", stage, steps=6, overflow_step=OVERFLOW_STEP, dynamic_scale=True))
        if stage > 0 and world == 2:  # MindOne's split rule: the LayerNorm (6,) is split, the rest stays whole
            cases.append(_case(f"s{stage}_graph_mindone_rule", stage, accum=2, clip=True, optimizer="momentum",
                               pad=False))
        # issue 11: s{stage}_graph_a1 with one collective per tensor, to be compared bit for bit
        cases.append(_case(f"s{stage}_graph_unfused", stage, fusion=UNFUSED))
        # issue 5: fusion (with clipping and accumulation; PYNATIVE counts the real calls)
        cases.append(_case(f"s{stage}_graph_fusion", stage, accum=2, clip=True, optimizer="momentum", fusion=FUSION))
        if world == 2:
            cases.append(_case(f"s{stage}_pynative_fusion", stage, "pynative", fusion=FUSION, steps=3,
                               count_calls=True))
            # issue 13: the optimizer step on the host (states in memory; in files at stages 1-3),
            # compared with s{stage}_graph_a2clip (the same run on the device) within 1e-6
            offloaded = {"offload": "host", "nvme": "file"} if stage > 0 else {"offload": "host"}
            for suffix, where in offloaded.items():
                cases.append(_case(f"s{stage}_graph_{suffix}", stage, accum=2, clip=True, optimizer="momentum",
                                   offload=where))
        if stage == 3 and world == 2:  # MindOne's order: shard first, then build the optimizer
            cases.append(_case("s3_graph_prepared_first", 3, accum=2, clip=True, optimizer="momentum",
                               prepare_first=True))
        if stage == 3:
            for mode in MODES:
                cases.append(_case(f"s3_{mode}_units", 3, mode, 2, True, "momentum", net="noscalar", units=UNITS))
            if world == 2:
                cases.append(_case("s3_graph_units_scalar", 3, accum=2, clip=True, optimizer="momentum",
                                   units=["TinyNet"]))
                cases.append(_case("s3_graph_fp16_units", 3, "graph", 2, True, "momentum", steps=FP16_STEPS,
                                   net="fp16", units=["Dense"]))
        if world == 4:  # hybrid: shards within {0,1},{2,3}, replicas across {0,2},{1,3}
            cases.append(_case(f"s{stage}_graph_hybrid", stage, accum=2, clip=True, optimizer="momentum", hybrid=True))
            cases.append(_case(f"s{stage}_graph_hybrid_fusion", stage, hybrid=True, fusion=FUSION, steps=5))
    return cases


CASES = {world: cases_for(world) for world in (2, 4)}

# Issue 47: the CommPlan against the collectives of the compiled graph (tests/dist/test_comm_graph.py,
# tests/dist/workers/comm_graph.py): built and compiled, one step of one micro-step (so one call is
# one optimizer step), TinyNet (padded rule) unless ``net`` names another network: ``fp16`` (its
# head computes in float16, coalesced), ``wide`` (a float16 Dense(768, 768) over 1 MiB, gathered per
# parameter, and a float32 head), ``lm`` (the demo LM, one block: [Note: dropped re-gathers]).
_QUANT = {"quantize_weights": True, "quantize_gradients": True}
GRAPH_CASES = {
    2: [dict(kind="graph", name=f"s{stage}", stage=stage, clip=True) for stage in STAGES] + [
        dict(kind="graph", name="s3_keep", stage=3, reshard=False),
        dict(kind="graph", name="s3_fp16", stage=3, net="fp16", clip=True),
        dict(kind="graph", name="s3_wide_fp16", stage=3, net="wide"),
        dict(kind="graph", name="s3_units", stage=3, net="noscalar", units=UNITS, clip=True),
        dict(kind="graph", name="s3_zeropp", stage=3, net="noscalar", zeropp=_QUANT),
        dict(kind="graph", name="s1_offload", stage=1, offload=True, clip=True, optimizer="momentum"),
        dict(kind="graph", name="s3_offload", stage=3, offload=True, optimizer="momentum"),
        dict(kind="graph", name="s3_lm", stage=3, net="lm", clip=True),
        dict(kind="graph", name="s3_lm_auto", stage=3, net="lm2", units="auto", clip=True),  # the default's units
        dict(kind="graph", name="s3_lora", stage=3, net="lora", clip=True),  # frozen: gathers, no reduce-scatter
    ],
    4: [dict(kind="graph", name="s3_hpz", stage=3, net="noscalar", zeropp=_QUANT, hpz=True),
        dict(kind="graph", name="s2_hybrid", stage=2, hybrid=True, clip=True),
        dict(kind="graph", name="s3_hybrid", stage=3, hybrid=True)],
}


def job_cases(world) -> list:
    """The cases of the N=``world`` parity job (tests/dist/conftest.py), in order: the training cases,
    test_comm_graph.py's compiled graphs, test_lora.py's fine-tunes, test_gathered.py's blocks, and the
    folded jobs of test_memory_measure.py, test_offload_parity.py and test_mixed_precision.py."""
    return (CASES[world] + GRAPH_CASES[world] + LORA_CASES[world] + GATHERED_CASES[world] + MEMORY_CASES[world]
            + OFFLOAD_CASES[world] + MIXED_PRECISION_CASES[world])


# Issue 57: a LoRA fine-tune at every stage, its base frozen (tests/lora_models.py): the suite's own LoRA layer
# with PEFT's structure, and mindone.peft's where it imports (otherwise its cases write why and the tests
# skip), compared with stage 0 of the same network at every step. GRAPH_MODE with accumulation and clipping
# (padded rule: the vocabulary and the classes do not divide); the own layer at stage 3 in PYNATIVE_MODE too.
LORA_STEPS = 5


def _lora_cases(world):
    cases = [_case(f"lora_s{stage}_graph", stage, accum=2, clip=True, optimizer="momentum", steps=LORA_STEPS,
                   net="lora") for stage in STAGES]
    if world == 2:
        cases.append(_case("lora_s3_pynative", 3, "pynative", 2, True, "momentum", steps=LORA_STEPS, net="lora"))
    cases += [_case(f"lora_peft_s{stage}_graph", stage, accum=2, clip=True, optimizer="momentum", steps=LORA_STEPS,
                    net="lora_peft") for stage in (0, 3)]
    return cases


LORA_CASES = {world: _lora_cases(world) for world in (2, 4)}
# gathered_parameters and gather_full_params of some parameters, on that model at stage 3 after two steps
# (tests/dist/test_gathered.py, tests/dist/workers/gathered_cases.py), in both modes.
GATHERED_CASES = {2: [dict(kind="gathered", name=f"gathered_{mode}", mode=mode) for mode in MODES], 4: []}

# Issue 59: N=2 jobs of their own before, folded into the parity job to save an msrun start-up each
# ([Note: test scheduling]): measure_model_states against hand-computed bytes at every stage, in both
# layouts (tests/dist/test_memory_measure.py, tests/dist/workers/memory_cases.py); optimizer offload
# against the device run, bit for bit, and resumed (tests/dist/test_offload_parity.py, offload_cases.py);
# where a float16 model's fp32 copies live (tests/dist/test_mixed_precision.py, mixed_precision_cases.py).
MEMORY_LAYOUTS = ("padded", "mindone")
MEMORY_CASES = {2: [dict(kind="memory", name=f"memory_s{stage}_{layout}", stage=stage, layout=layout)
                    for stage in STAGES for layout in MEMORY_LAYOUTS], 4: []}
OFFLOAD_STEPS = 12
OFFLOAD_STAGES = (1, 3)
OFFLOAD_CASES = {2: [dict(kind="offload", name=f"offload_s{s}_{w or 'device'}", stage=s, offload=w, steps=OFFLOAD_STEPS)
                     for s in OFFLOAD_STAGES for w in (None, "host", "file")] + [
    dict(kind="offload", name="offload_s3_file_resumed", stage=3, offload="file", steps=OFFLOAD_STEPS, resume_at=6),
    dict(kind="offload", name="offload_s1_host_resumed", stage=1, offload="host", steps=OFFLOAD_STEPS, resume_at=6)],
    4: []}
MIXED_PRECISION_CASES = {2: [dict(kind="mixed_precision", name="mixed_stage1", stage=1),
                             dict(kind="mixed_precision", name="mixed_stage2", stage=2),
                             dict(kind="mixed_precision", name="mixed_stage3", stage=3),
                             dict(kind="mixed_precision", name="mixed_stage3_offload", stage=3, offload=True)], 4: []}


def reference_spec_of(case):
    """The single-process reference a case is compared with (see tests/dist/zero_results.py)."""
    from zero_results import reference_spec

    skipped = (case["overflow_step"],) if "overflow_step" in case else ()
    net = case.get("net", "full")
    return reference_spec(case["steps"], case["clip"], case["optimizer"], skipped, "full" if net == "fp16" else net)


def world_cases(select):
    """(world, case) pairs of every job whose case satisfies ``select``."""
    return [(w, c) for w in (2, 4) for c in CASES[w] if select(c)]
