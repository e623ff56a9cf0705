"""Bad-input checks for the checkpoint tests, run inside checkpoint_worker.py (every rank).

Each check loads or saves something wrong and records ``"ExcType: message"`` (or None), whether
the train network's Parameters are unchanged, and the file listing of the folder involved before
and after. The test prepares the damaged checkpoints (``test_checkpoint_resume.py``) and passes
each check's checkpoint root.

A case is {"name": "errors...", "checks": {check: checkpoint root}}. Writes DIR/{name}_rank{r}.json.
"""
import json
import os

import numpy as np
from mindspore import nn

from mindone_zero.checkpoint import load_train_state, save_train_state
from models import SEQ, EMB, TinyNet

# check -> (stage of the train network built to load into, network variant, accumulation steps)
CHECKS = {
    "missing_file": (1, "tiny", 1),
    "json_group_size": (1, "tiny", 1),
    "names_differ": (1, "tiny", 1),
    "shapes_differ": (1, "tiny", 1),
    "truncated": (1, "tiny", 1),
    "truncated_meta_updated": (1, "tiny", 1),
    "corrupted": (1, "tiny", 1),
    "wrong_stage": (2, "tiny", 1),
    "other_names": (1, "noscalar", 1),
    "other_shapes": (1, "widehead", 1),
    "no_checkpoint": (1, "tiny", 1),
    "mid_accum_reshard": (2, "tiny", 2),
    "mid_accum_other_accum": (2, "tiny", 4),
    "save_exists": (1, "tiny", 1),
    "save_bad_format": (1, "tiny", 1),
    "save_bad_step": (1, "tiny", 1),
}
LOAD_STEP = {"no_checkpoint": None, "mid_accum_reshard": 2, "mid_accum_other_accum": 2}


def _net(variant):
    if variant == "noscalar":
        return TinyNet(with_scalar=False)
    net = TinyNet()
    if variant == "widehead":  # same names, another shape
        net.head = nn.Dense(3 * SEQ * EMB, 5)
    return net


def _listing(root):
    out = []
    for folder, _, files in os.walk(root):
        out += sorted(os.path.relpath(os.path.join(folder, f), root) for f in files)
    return sorted(out)


def _snapshot(train):
    return {p.name: p.asnumpy().copy() for p in train.get_parameters()}


def _attempt(fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - recorded for the test to judge
        return f"{type(err).__name__}: {err}"
    return None


def run_check(check, root, build):
    stage, variant, accum = CHECKS[check]
    train = build({"name": "errors_" + check, "stage": stage, "accum": accum, "mode": "pynative"}, _net(variant))
    before, files_before = _snapshot(train), _listing(root)
    if check == "save_exists":
        error = _attempt(lambda: save_train_state(train, root, 5))
    elif check == "save_bad_format":
        error = _attempt(lambda: save_train_state(train, root, 1, format="h5"))
    elif check == "save_bad_step":
        error = _attempt(lambda: save_train_state(train, root, -1))
    else:
        error = _attempt(lambda: load_train_state(train, root, LOAD_STEP.get(check, 5)))
    after = _snapshot(train)
    unchanged = sorted(before) == sorted(after) and all(np.array_equal(before[k], after[k]) for k in before)
    return {"error": error, "unchanged": unchanged, "files_before": files_before, "files_after": _listing(root)}


def run(case, out, rank, world, build):
    results = {check: run_check(check, root, build) for check, root in sorted(case["checks"].items())}
    with open(os.path.join(out, f"{case['name']}_rank{rank}.json"), "w") as f:
        json.dump(results, f, indent=1)
