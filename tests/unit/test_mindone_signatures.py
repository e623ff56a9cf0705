"""Every MindOne release's public names and parameters are accepted by ours (issue 48).

``mindone_signatures.json`` holds the public signatures of MindOne 0.2.0, 0.3.0, 0.4.0 and 0.5.0,
read from the release wheels by ``tools/dev/mindone_signatures.py`` (facts only: names, order,
kinds and the defaults' source text; no code). Per release, for ``mindone.trainers.zero``'s
entry points, ``TrainOneStepWrapper``, ``EMA`` and ``mindone.models.modules.parallel`` (its
``__all__`` and ``PARALLEL_MODULES``' classes):

* the name exists in ``mindone_zero`` or ``parallel_modules``;
* every parameter is accepted by name, and each of MindOne's positional parameters keeps its
  position (``ALIASES``: 0.2.0's ``op_group`` sits where ours is ``optimizer_parallel_group``; its own
  name is accepted as a keyword);
* nothing more is required than MindOne requires, so a call that binds there binds here;
* a parameter with a default has one here, equal to MindOne's, except ``DIFFERENT_DEFAULTS``, each
  with its reason and a row in the migration page's table of differences;
* ``PARALLEL_MODULES`` maps each of MindOne's keys to our class of the same name.

The checks return a list of problems, so ``test_the_checks_catch_*`` shows each can fail.
"""
import ast
import inspect
import json
from pathlib import Path

import pytest
from mindspore import mint, nn

import mindone_zero
import parallel_modules

HERE = Path(__file__).resolve().parent
DATA = json.loads((HERE / "mindone_signatures.json").read_text(encoding="utf-8"))["releases"]
MIGRATION_PAGE = HERE.parents[1] / "docs" / "guides" / "coming-from-mindone.md"
PARALLEL = "mindone.models.modules.parallel"
OURS = {"mindone.trainers.zero": mindone_zero, "mindone.trainers.train_step": mindone_zero,
        "mindone.trainers.ema": mindone_zero, PARALLEL: parallel_modules}
ALIASES = {"op_group": "optimizer_parallel_group"}  # MindOne 0.2.0's name -> ours (both accepted)
_CELLS_0_2 = ("Conv1d", "Conv2d", "Conv3d", "Dense")  # 0.2.0's, whose group is op_group
_CELLS = _CELLS_0_2 + ("Mint_Conv2d", "Mint_Conv3d", "Linear")

# (callable, parameter) -> (the phrase of its row in coming-from-mindone.md's table, the reason).
DIFFERENT_DEFAULTS = {
    **{(name, "comm_fusion"): ("`comm_fusion=None`", "the same text, another meaning: None buckets collectives by "
                               "25 MiB here (one launch for many small tensors); in MindOne it turns fusion off")
       for name in ("prepare_train_network", "ZeroHelper")},
    **{(cell, group): ("`GlobalComm.WORLD_COMM_GROUP`", "None here means the world group, the group MindOne's "
                       "default names, so the meaning is the same")
       for cells, group in ((_CELLS, "optimizer_parallel_group"), (_CELLS_0_2, "op_group")) for cell in cells},
}


def _cases():
    for release, modules in DATA.items():
        for module, facts in modules.items():
            named = facts["classes"] if module == PARALLEL else facts
            for name, params in named.items():
                yield pytest.param(module, name, params, id=f"{release}-{name}")


def _ours(module, name):
    return getattr(OURS[module], name, None)


def _literal(text):
    try:
        return ast.literal_eval(text)
    except ValueError:
        return text  # an expression such as GlobalComm.WORLD_COMM_GROUP


def signature_problems(name, theirs, ours) -> list:
    """What a call written against MindOne's parameters ``theirs`` would meet in ``ours``."""
    params = inspect.signature(ours).parameters
    positional = [p.name for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    problems = []
    for index, p in enumerate(theirs):
        here = params.get(p["name"])
        if here is None or here.kind not in (here.POSITIONAL_OR_KEYWORD, here.KEYWORD_ONLY):
            problems.append(f"{name}: {p['name']!r} is not accepted by name")
            continue
        if p["kind"] in ("positional_only", "positional_or_keyword"):
            at = positional[index] if index < len(positional) else None
            if at not in (p["name"], ALIASES.get(p["name"])):
                problems.append(f"{name}: {p['name']!r} is positional argument {index} in MindOne, {at!r} here")
        if "default" in p and (name, p["name"]) not in DIFFERENT_DEFAULTS:
            if here.default is here.empty:
                problems.append(f"{name}: {p['name']!r} has a default in MindOne ({p['default']}), none here")
            elif _literal(p["default"]) != here.default or type(_literal(p["default"])) is not type(here.default):
                problems.append(f"{name}: {p['name']!r} defaults to {p['default']} in MindOne, {here.default!r} here")
    known = {p["name"] for p in theirs} | {ALIASES[n] for n in (p["name"] for p in theirs) if n in ALIASES}
    for p in params.values():
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in known:
            problems.append(f"{name}: {p.name!r} is required here, unknown to MindOne")
    return problems


@pytest.mark.parametrize("module, name, params", list(_cases()))
def test_each_callable_accepts_mindones_parameters(module, name, params):
    ours = _ours(module, name)
    assert ours is not None, f"{OURS[module].__name__} has no {name} ({module}.{name})"
    assert signature_problems(name, params, ours) == []


@pytest.mark.parametrize("release", sorted(DATA))
def test_every_public_name_of_the_parallel_package_exists(release):
    facts = DATA[release][PARALLEL]
    missing = [n for n in facts["__all__"] if not hasattr(parallel_modules, n)]
    assert not missing and set(facts["__all__"]) <= set(parallel_modules.__all__), missing


@pytest.mark.parametrize("release", sorted(DATA))
def test_parallel_modules_maps_mindones_keys_to_the_same_classes(release):
    for key, name in DATA[release][PARALLEL]["PARALLEL_MODULES"].items():
        original = eval(key, {"nn": nn, "mint": mint})  # "nn.Conv1d", "mint.nn.Conv2d": a name, read from MindOne
        assert parallel_modules.PARALLEL_MODULES.get(original) is getattr(parallel_modules, name), key


def test_the_releases_are_all_there():
    assert sorted(DATA) == ["0.2.0", "0.3.0", "0.4.0", "0.5.0"]
    combines = {r: [n for n in DATA[r]["mindone.trainers.zero"] if n.endswith("_checkpoints")] for r in DATA}
    assert combines == {"0.2.0": ["transform_checkpoints"], "0.3.0": ["convert_checkpoints"],
                        "0.4.0": ["convert_checkpoints"], "0.5.0": ["convert_checkpoints"]}


def test_each_deliberate_difference_is_used_and_in_the_migration_table():
    used = set()
    for modules in DATA.values():
        for module, facts in modules.items():
            for name, params in (facts["classes"] if module == PARALLEL else facts).items():
                used.update((name, p["name"]) for p in params if (name, p["name"]) in DIFFERENT_DEFAULTS)
    assert used == set(DIFFERENT_DEFAULTS), set(DIFFERENT_DEFAULTS) - used
    table = [line for line in MIGRATION_PAGE.read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    for phrase, _ in set(DIFFERENT_DEFAULTS.values()):
        assert any(phrase in row for row in table), f"no row of the migration page's tables names {phrase}"


# -- the checks can fail ------------------------------------------------------------------------

def _mindone(*names, **defaults):
    return ([{"name": n, "kind": "positional_or_keyword"} for n in names]
            + [{"name": n, "kind": "positional_or_keyword", "default": d} for n, d in defaults.items()])


def test_the_checks_catch_a_missing_renamed_or_moved_parameter():
    def ours(network, optimizer_parallel_group=None, zero_stage=0, *, extra):
        pass

    problems = signature_problems("f", _mindone("network", zero_stage="0", op_group="None", gone="1"), ours)
    assert problems == [
        "f: 'zero_stage' is positional argument 1 in MindOne, 'optimizer_parallel_group' here",
        "f: 'op_group' is not accepted by name",
        "f: 'gone' is not accepted by name",
        "f: 'extra' is required here, unknown to MindOne",
    ]


def test_the_checks_catch_another_default():
    def ours(network, zero_stage=1, clip_norm=1, optimizer_parallel_group=None, *, op_group=None):
        pass

    problems = signature_problems("f", _mindone("network", zero_stage="0", clip_norm="1.0", op_group="None"), ours)
    assert problems == ["f: 'zero_stage' defaults to 0 in MindOne, 1 here",
                        "f: 'clip_norm' defaults to 1.0 in MindOne, 1 here"]
