"""For developers: the figures of issue 47's Goals, counted by one command on any checkout.

    flock /tmp/mz_dist.lock python tools/dev/architecture_census.py                 # this checkout
    git worktree add /tmp/before 60feb2e
    flock /tmp/mz_dist.lock python tools/dev/architecture_census.py --tree /tmp/before --json before.json
    python tools/dev/architecture_census.py --no-trace       # without the msrun trace (figures 1 and 8)

Prints, for the package tree at ``--tree`` (the root of a checkout of this repository; default this
one), a table of figure, value and definition, then the lists behind each value; ``--json`` writes
all of it. The figures that need the package running are counted in other processes that import
the tree's ``mindone_zero`` (``PYTHONPATH`` starts with the tree, as ``tools/dev/launch.py`` does for
msrun jobs; the worker checks which file it imported): figure 6 and MindSpore's private names in
one plain process, figures 1 and 8 in an msrun job of 2 workers (ZeRO-3 shards only under
``DATA_PARALLEL``, and a group of 1 gathers nothing, so a group of 2 is the smallest honest one;
building is not collective, and rank 1 builds alike, untraced). This process never imports the
package. The trace takes about 20 s of one core (2026-12-04, the demo LM); msrun's start and exit a
minute or more.

The definitions (one line each in the table; ``architecture_census_worker.py`` says more of 1 and 8):

1. Passes that modify the user's network, traced (``sys.settrace``) on the demo LM (``tools/lm_model.py``
   of the tree, its ``configs/train_lm.yaml`` model, ``LMLoss`` around it, ``nn.AdamWeightDecay``,
   GRAPH_MODE, 2 ranks) in ``prepare_train_network(loss, optimizer, zero_stage=3)``, and in
   ``prepare_network(loss, zero_stage=3)`` (the public entry of ``shard_network``) on a fresh one. A
   *walk* is the start of a traversal of a Cell covering the network (the top, a Cell around it, or
   the top's replacement): ``cells_and_names``, ``parameters_and_names``, ``get_parameters``,
   ``trainable_params``, ``untrainable_params``, ``parameters_dict``, ``apply``, or a manual recursion
   (``cells()``, ``name_cells()``, iterating the top's ``_cells``), not nested in another. A *mutating
   pass* is one call of a package function that walked (itself or in its callees) and changed a Cell
   or Parameter that was in the user's network before the call (attribute set or deleted, properties
   included; ``__dict__`` changed, also by ``object.__setattr__`` or in ``_cells``/``_params``; class
   swapped; shape cut; ``set_data``): each change belongs to the innermost such call on the stack;
   the pass's *steps* are the calls it made (or itself) under which it made them. Also counted:
   passes that change Cells the build attached to the network earlier.
2. ``ContextVar``s: calls of ``ContextVar``/``contextvars.ContextVar`` in the package (AST).
3. ``helper.<attr>`` reads: attribute loads whose base is a name ``helper``/``zero_helper`` or an
   attribute ``<x>.helper``/``<x>.zero_helper``, in package modules other than ``train/zero_helper.py``
   (by name: a ZeroHelper held under another name is not seen); also ``getattr``/``hasattr`` calls on
   such a base.
4. Offload branches: ``if`` statements and conditional expressions inside ``TrainOneStepWrapper``,
   the package classes it derives from and those that derive from it, whose test reads a name or
   attribute containing ``offload``.
5. ``record_comm`` definitions (any ``def record_comm`` in the package, a Protocol's declaration
   included; the helpers ``record_gather``/``record_reduce_scatter`` are listed apart), and
   hand-written ``<plan>.add(...)``/``<plan>.add_quantized(...)`` calls (base a name or attribute
   ending in ``plan``).
6. Class-level patches alive after ``with sharded_init():`` (a small network built inside): the keys
   of ``vars(Parameter)``, ``vars(Tensor)``, ``vars(nn.Cell)`` added, removed or rebound.
7. The largest class in the package by lines (``end_lineno - lineno + 1``), and the next four.
8. Following the network (figure 1's trace of ``prepare_train_network``): the package calls whose
   arguments hold a Cell of the user's network (or the top's replacement); over the sequence of
   their files, in the order each function is first called, the distinct files and the re-entries (a
   file entered again after the sequence moved to another); per call too. Upward calls: package calls
   from a lower layer into a higher one (core < zero3, offload < train < checkpoint, memory < cli).
   8b. Tangled returns (issue 58's Goals): of those calls, each that enters a non-leaf file (one from
   which the trace calls into another package file outside ``core``) that the network had entered
   and left for a file other than its callers of then, while no frame of that file is on the call
   stack: data re-entering a module that was done with it. A caller resuming, a caller's loop that
   calls the file again, and a call into a leaf helper are not tangled. By first call of each
   function (as 8's headline), and per call.
9. MindSpore private API in the package (AST): imports from ``mindspore`` of a private module or
   name; attributes starting with one ``_`` that MindSpore's classes have (``dir()`` of nn.Cell,
   Parameter, Tensor, the optimizers, Primitive ...) and the package does not define itself, or
   reached from a name imported from ``mindspore``; string constants equal to such a name
   (``getattr(cell, "_recompute_cell")``).
10. Lines of ``mindone_zero/``: physical lines of its ``.py`` files (``wc -l``), and non-blank ones.
"""
import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.dev.launch import JOB_ENV, log_tails, msrun_command  # noqa: E402

WORKER = Path(__file__).resolve().with_name("architecture_census_worker.py")
PACKAGE = "mindone_zero"
HELPER_FILE = "mindone_zero/train/zero_helper.py"
HELPER_NAMES = ("helper", "zero_helper")
TRAIN_PREFIX = "mindone_zero/train/"
TRAIN_STEP = "TrainOneStepWrapper"
RECORD_HELPERS = ("record_gather", "record_reduce_scatter")
TRACE_TIMEOUT_S = 1200


# ----------------------------------------------------------------------------- sources
def package_sources(tree: Path) -> Dict[str, str]:
    """{"mindone_zero/...py": source} for every module of the package in ``tree``."""
    return {p.relative_to(tree).as_posix(): p.read_text() for p in sorted((tree / PACKAGE).rglob("*.py"))}


def _trees(sources: Dict[str, str]):
    for path, text in sources.items():
        yield path, ast.parse(text, path)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


# ----------------------------------------------------------------------------- 2. ContextVars
def context_vars(sources: Dict[str, str]) -> List[str]:
    """"file:line name" of every ``ContextVar(...)`` call."""
    found = []
    for path, tree in _trees(sources):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _called_name(node) == "ContextVar":
                name = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else "?"
                found.append(f"{path}:{node.lineno} {name}")
    return found


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


# ----------------------------------------------------------------------------- 3. helper reads
def _is_helper(node: ast.AST) -> bool:
    return ((isinstance(node, ast.Name) and node.id in HELPER_NAMES)
            or (isinstance(node, ast.Attribute) and node.attr in HELPER_NAMES))


def helper_reads(sources: Dict[str, str]) -> dict:
    """Reads of ``helper.<attr>`` outside ``train/zero_helper.py`` (figure 3)."""
    per_module, attributes, by_name = Counter(), Counter(), []
    for path, tree in _trees(sources):
        if path == HELPER_FILE:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and _is_helper(node.value):
                per_module[path] += 1
                attributes[node.attr] += 1
            elif (isinstance(node, ast.Call) and _called_name(node) in ("getattr", "hasattr") and node.args
                  and _is_helper(node.args[0])):
                by_name.append(f"{path}:{node.lineno} {ast.unparse(node)}")
    outside = sum(n for m, n in per_module.items() if not m.startswith(TRAIN_PREFIX))
    return {"total": sum(per_module.values()), "outside_train": outside, "modules": len(per_module),
            "attributes": len(attributes), "per_module": dict(per_module.most_common()),
            "per_attribute": dict(attributes.most_common()), "getattr": by_name}


# ----------------------------------------------------------------------------- 4. offload branches
def _class_family(trees, root: str) -> Dict[str, ast.ClassDef]:
    """"file:Class" -> ClassDef of ``root``, the package classes it derives from, and those deriving from it."""
    classes = {}  # name -> [(path, ClassDef)]
    for path, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append((path, node))
    bases = {name: {ast.unparse(b).split(".")[-1] for _, c in defs for b in c.bases} for name, defs in classes.items()}
    up, todo = set(), [root]
    while todo:
        name = todo.pop()
        if name not in up:
            up.add(name)
            todo.extend(bases.get(name, ()))
    down, new = {root}, {root}
    while new:
        new = {name for name in classes if bases[name] & down} - down
        down |= new
    return {f"{path}:{name}": c for name in sorted((up | down) & classes.keys()) for path, c in classes[name]}


def _reads_offload(test: ast.AST) -> bool:
    for node in ast.walk(test):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        if "offload" in name.lower():
            return True
    return False


def offload_branches(sources: Dict[str, str], root: str = TRAIN_STEP) -> List[str]:
    """"file:line Class" of each ``if``/conditional expression on offload in ``root``'s family (figure 4)."""
    found = []
    for where, cls in _class_family(list(_trees(sources)), root).items():
        path, name = where.rsplit(":", 1)
        for node in ast.walk(cls):
            if isinstance(node, (ast.If, ast.IfExp)) and _reads_offload(node.test):
                found.append(f"{path}:{node.lineno} {name}")
    return sorted(found, key=lambda s: (s.split(":")[0], int(s.split(":")[1].split()[0])))


# ----------------------------------------------------------------------------- 5. comm accounting
def _is_plan(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lower().endswith("plan")


def comm_recording(sources: Dict[str, str]) -> dict:
    """``record_comm`` definitions, the record_* helpers, and hand-written plan additions (figure 5)."""
    defs, helpers, adds = [], [], []
    for path, tree in _trees(sources):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "record_comm":
                        defs.append(f"{path}:{item.lineno} {node.name}.record_comm")
                    elif isinstance(item, ast.FunctionDef) and item.name in RECORD_HELPERS:
                        helpers.append(f"{path}:{item.lineno} {node.name}.{item.name}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("add", "add_quantized") and _is_plan(node.func.value)):
                adds.append(f"{path}:{node.lineno} {ast.unparse(node.func)}")
    module_defs = [f"{path}:{node.lineno} record_comm" for path, tree in _trees(sources) for node in tree.body
                   if isinstance(node, ast.FunctionDef) and node.name == "record_comm"]
    return {"record_comm": sorted(defs + module_defs), "helpers": sorted(helpers), "plan_adds": sorted(adds),
            "plan_add_files": len({a.split(":")[0] for a in adds})}


# ----------------------------------------------------------------------------- 7. class sizes
def largest_classes(sources: Dict[str, str], top: int = 5) -> List[dict]:
    """The ``top`` largest classes by lines (``end_lineno - lineno + 1``)."""
    sizes = [{"class": node.name, "where": f"{path}:{node.lineno}", "lines": node.end_lineno - node.lineno + 1}
             for path, tree in _trees(sources) for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    return sorted(sizes, key=lambda c: (-c["lines"], c["where"]))[:top]


# ----------------------------------------------------------------------------- 9. MindSpore private API
def _own_names(trees) -> Set[str]:
    """Private names the package defines itself: functions, classes, class and module attributes."""
    names = set()
    for _, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                body = node.body if isinstance(node, ast.ClassDef) else []
                names.update(t.id for item in body if isinstance(item, (ast.Assign, ast.AnnAssign))
                             for t in (item.targets if isinstance(item, ast.Assign) else [item.target])
                             if isinstance(t, ast.Name))
        names.update(t.id for item in tree.body if isinstance(item, ast.Assign) for t in item.targets
                     if isinstance(t, ast.Name))
    return {n for n in names if _is_private(n)}


def _mindspore_aliases(tree: ast.AST) -> Set[str]:
    """The names a module binds by importing from ``mindspore``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "mindspore")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mindspore" and not node.level:
            names.update(a.asname or a.name for a in node.names)
    return names


def _root_name(node: ast.Attribute) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _private_imports(node: ast.AST) -> List[str]:
    if isinstance(node, ast.Import):
        return [f"import {a.name}" for a in node.names
                if a.name.split(".")[0] == "mindspore" and any(map(_is_private, a.name.split(".")))]
    if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "mindspore":
        private_module = any(map(_is_private, node.module.split(".")))
        return [f"from {node.module} import {a.name}" for a in node.names if private_module or _is_private(a.name)]
    return []


def private_api(sources: Dict[str, str], mindspore_names: Iterable[str]) -> dict:
    """Uses of MindSpore's private API (figure 9): [file:line what], per file, per name."""
    trees = list(_trees(sources))
    theirs = set(mindspore_names) - _own_names(trees)
    uses = []
    for path, tree in trees:
        aliases = _mindspore_aliases(tree)
        for node in ast.walk(tree):
            found = _private_imports(node)
            if (isinstance(node, ast.Attribute) and _is_private(node.attr)
                    and (node.attr in theirs or _root_name(node) in aliases)):
                found = [f".{node.attr}"]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in theirs:
                found = [repr(node.value)]
            uses.extend((path, node.lineno, what) for what in found)
    uses = [f"{path}:{line} {what}" for path, line, what in sorted(uses)]
    per_file = Counter(u.split(":")[0] for u in uses)
    per_name = Counter(u.split(" ", 1)[1].strip(".'") for u in uses)
    return {"places": len(uses), "files": len(per_file), "names": len(per_name),
            "per_file": dict(per_file.most_common()), "per_name": dict(per_name.most_common()), "uses": uses}


# ----------------------------------------------------------------------------- 10. lines
def package_lines(sources: Dict[str, str]) -> dict:
    """Physical lines (``wc -l``) and non-blank lines of the package's modules."""
    return {"physical": sum(text.count("\n") + (not text.endswith("\n") and bool(text)) for text in sources.values()),
            "non_blank": sum(1 for text in sources.values() for line in text.splitlines() if line.strip())}


# ----------------------------------------------------------------------------- the runs
def worker_env(tree: Path) -> dict:
    """This environment with ``tree`` first on ``PYTHONPATH`` (so the worker imports its package),
    MindSpore's logging at errors only and the launcher's job settings (tools/dev/launch.py)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")])
    env.setdefault("GLOG_v", "3")
    for name, value in JOB_ENV.items():
        env.setdefault(name, value)
    return env


def _checked(record: dict, tree: Path, what: str) -> dict:
    imported = Path(record["package"]).resolve()
    if (tree / PACKAGE) not in imported.parents:
        raise RuntimeError(f"For 'architecture_census', the {what} imported {imported}, not the package of {tree}.")
    return record


def run_local(tree: Path, work: Path) -> dict:
    """Figure 6 and MindSpore's private names, from one plain process importing ``tree``'s package."""
    out = work / "local.json"
    proc = subprocess.run([sys.executable, str(WORKER), "--mode", "local", "--tree", str(tree), "--out", str(out)],
                          cwd=str(work), env=worker_env(tree), capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"For 'architecture_census', the local probe exited with {proc.returncode}:\n"
                           f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return _checked(json.loads(out.read_text()), tree, "local probe")


def run_trace(tree: Path, work: Path) -> dict:
    """Figures 1 and 8: the msrun job (2 workers) tracing ``tree``'s package; rank 0's record."""
    log_dir = work / "msrun_logs"
    cmd = msrun_command(WORKER, 2, log_dir, ["--mode", "trace", "--tree", str(tree), "--out", str(work)])
    try:
        proc = subprocess.run(cmd, cwd=str(work), env=worker_env(tree), capture_output=True, text=True,
                              timeout=TRACE_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(f"For 'architecture_census', the trace ran past {TRACE_TIMEOUT_S}s.\n"
                           f"{log_tails(log_dir)}") from err
    if proc.returncode != 0:
        raise RuntimeError(f"For 'architecture_census', the trace exited with {proc.returncode}:\n"
                           f"{proc.stdout[-3000:]}\n{log_tails(log_dir)}")
    return _checked(json.loads((work / "trace_0.json").read_text()), tree, "trace")


def _git(tree: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def describe_tree(tree: Path) -> str:
    """The commit of ``tree`` ("+ changes" when its package differs from it), or its path."""
    commit = _git(tree, "rev-parse", "--short", "HEAD")
    if not commit:
        return str(tree)
    return commit + (" + changes" if _git(tree, "status", "--porcelain", "--", PACKAGE) else "")


# ----------------------------------------------------------------------------- the census
DEFINITIONS = {
    "1a": "calls of a package function that walked the network (itself or below) and changed a Cell/Parameter "
          "the user passed in (attribute, __dict__, _cells, class, shape, set_data); innermost such call owns a "
          "change; steps: the calls it made (or itself) under which it changed them",
    "1b": "as 1a, in prepare_network(loss, zero_stage=3) on a fresh demo LM (the public entry of shard_network)",
    "1c": "starts of a traversal covering the network (cells_and_names, parameters_and_names, get_parameters, "
          "trainable_params, apply, ...; or cells()/name_cells()/_cells recursion), not nested, call to return",
    "1d": "as 1a, for Cells the build attached to the network before the change (gather wrappers, layers)",
    "2": "calls of ContextVar / contextvars.ContextVar in mindone_zero/ (AST)",
    "3": "attribute loads on helper / zero_helper / <x>.helper / <x>.zero_helper outside train/zero_helper.py (AST); "
         "+ getattr/hasattr on them",
    "4": "if / conditional expressions whose test reads a name or attribute containing 'offload', in "
         "TrainOneStepWrapper, its package bases and subclasses (AST)",
    "5": "def record_comm in the package; calls <...plan>.add / .add_quantized (AST)",
    "6": "keys of vars(Parameter), vars(Tensor), vars(nn.Cell) added, removed or rebound after a "
         "'with sharded_init():' block that built a small network (run time)",
    "7": "class of mindone_zero/ with the most lines, end_lineno - lineno + 1 (AST)",
    "8": "package calls taking a Cell of the network (1a's trace), their files in first-call order of each "
         "function: distinct files, re-entries after leaving; per call; calls from a lower layer up",
    "8b": "of 8's calls, those into a non-leaf file (one that calls a package file outside core/) that the network "
          "had left for a file other than its callers, with no frame of the file on the stack; by first call, per call",
    "9": "imports of private mindspore modules/names; attributes _x that MindSpore's classes have and the package "
         "does not define (or on a mindspore import); string constants of such names (AST)",
    "10": "physical lines (wc -l) of mindone_zero/**/*.py; non-blank lines in brackets",
}
TITLES = {
    "1a": "passes that modify the user's network, prepare_train_network(zero_stage=3)",
    "1b": "passes that modify the user's network, prepare_network(zero_stage=3)",
    "1c": "whole-network walks, prepare_train_network call -> returned Cell",
    "1d": "passes that modify Cells the build attached, prepare_train_network",
    "2": "ContextVars",
    "3": "package reads of helper.<attr>",
    "4": "offload branches in the train step class",
    "5": "record_comm implementations; hand-written plan.add sites",
    "6": "class-level patches alive after sharded_init's block",
    "7": "the largest class",
    "8": "following network, prepare_train_network -> returned Cell",
    "8b": "tangled returns, prepare_train_network",
    "9": "MindSpore private API uses",
    "10": "lines of mindone_zero/",
}


def _short(where: str) -> str:
    """"mindone_zero/zero3/shard.py:_shard" -> "shard.py:_shard"."""
    path, _, name = where.partition(":")
    return f"{path.rsplit('/', 1)[-1]}:{name}" if name else path.rsplit("/", 1)[-1]


def _by_under(items: List[dict]) -> str:
    counts = Counter(_short(i["under"]).split(":", 1)[-1] for i in items)
    return ", ".join(f"{name} {n}" for name, n in counts.most_common())


def _steps(passes: List[dict]) -> int:
    return sum(len(p["steps"]) for p in passes)


def trace_values(trace: dict) -> Dict[str, str]:
    """The table's values of figures 1 and 8 from the worker's record."""
    train, shard = trace["prepare_train_network"], trace["prepare_network"]
    follow = train["follow"]
    return {
        "1a": f"{train['mutating_passes']} ({_by_under(train['passes'])}); {_steps(train['passes'])} steps",
        "1b": f"{shard['mutating_passes']} ({_by_under(shard['passes'])}); {_steps(shard['passes'])} steps"
              + (f"; +{len(shard['mutations_outside_walks'])} changes outside any walk"
                 if shard["mutations_outside_walks"] else ""),
        "1c": f"{train['walks']} ({_by_under(train['walk_list'])})",
        "1d": f"{len(train['attached_passes'])} ({_by_under(train['attached_passes'])}); "
              f"{_steps(train['attached_passes'])} steps",
        "8": f"{follow['functions']['files']} files, {follow['functions']['reentries']} re-entries; per call "
             f"{follow['calls']['length']} calls, {follow['calls']['reentries']} re-entries; "
             f"{sum(train['upward_calls'].values())} upward calls",
        "8b": f"{follow['tangled']['functions']['count']} (first calls); {follow['tangled']['calls']['count']} "
              f"per call",
    }


def static_values(figures: dict) -> Dict[str, str]:
    """The table's values of the AST figures (and of figure 6 when the local probe ran)."""
    reads, comm, biggest = figures["helper_reads"], figures["comm"], figures["largest_classes"][0]
    private, lines = figures.get("private_api"), figures["lines"]
    values = {
        "2": f"{len(figures['context_vars'])}" + (f" ({', '.join(v.split()[-1] for v in figures['context_vars'])})"
                                                  if figures["context_vars"] else ""),
        "3": f"{reads['total']} ({reads['outside_train']} outside train/; {reads['modules']} modules, "
             f"{reads['attributes']} attributes; +{len(reads['getattr'])} getattr/hasattr)",
        "4": str(len(figures["offload_branches"])),
        "5": f"{len(comm['record_comm'])} record_comm; {len(comm['plan_adds'])} plan.add sites in "
             f"{comm['plan_add_files']} files",
        "7": f"{biggest['class']} {biggest['lines']} lines ({biggest['where']})",
        "10": f"{lines['physical']} ({lines['non_blank']} non-blank)",
    }
    if "class_patches" in figures:
        values["6"] = str(len(figures["class_patches"]))
    if private is not None:
        values["9"] = f"{private['places']} places in {private['files']} files ({private['names']} names)"
    return values


def census(tree: Path, trace: bool = True, work: Optional[Path] = None) -> dict:
    """Every figure of ``tree``: {"tree", "commit", "values": {id: value}, "figures": {...}}."""
    sources = package_sources(tree)
    figures = {"context_vars": context_vars(sources), "helper_reads": helper_reads(sources),
               "offload_branches": offload_branches(sources), "comm": comm_recording(sources),
               "largest_classes": largest_classes(sources), "lines": package_lines(sources)}
    with tempfile.TemporaryDirectory(prefix="census_") as tmp:
        work = Path(work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        local = run_local(tree, work)
        figures["class_patches"] = local["class_patches"]
        figures["private_api"] = private_api(sources, local["mindspore_private_names"])
        if trace:
            figures["trace"] = run_trace(tree, work)
    values = static_values(figures)
    if trace:
        values.update(trace_values(figures["trace"]))
    return {"tree": str(tree), "commit": describe_tree(tree), "values": dict(sorted(values.items(), key=_order)),
            "figures": figures}


def _order(item):
    key = item[0]
    return int(key.rstrip("abcd")), key


# ----------------------------------------------------------------------------- output
def render_table(result: dict) -> str:
    """The figures as a Markdown table: figure, value, definition."""
    lines = [f"Architecture census of {result['tree']} ({result['commit']})", "",
             "| # | figure | value | definition |", "|---|---|---|---|"]
    for key, value in result["values"].items():
        lines.append(f"| {key} | {TITLES[key]} | {value} | {DEFINITIONS[key]} |")
    return "\n".join(lines)


def _listing(title: str, items: Iterable[str]) -> List[str]:
    return ["", title, *[f"   {item}" for item in items]]


def _counts(counter: dict, short: bool = False) -> str:
    return ", ".join(f"{_short(k) if short else k} {n}" for k, n in counter.items())


def render_details(result: dict) -> str:
    """The lists behind the values, figure by figure."""
    f = result["figures"]
    out = _trace_details(f["trace"]) if "trace" in f else []
    reads, comm = f["helper_reads"], f["comm"]
    out += _listing("2. ContextVars:", f["context_vars"])
    out += _listing("3. helper.<attr> reads per module:", [f"{m}: {n}" for m, n in reads["per_module"].items()]
                    + [f"attributes: {_counts(reads['per_attribute'])}", *reads["getattr"]])
    out += _listing("4. offload branches:", f["offload_branches"])
    out += _listing("5. record_comm:", comm["record_comm"] + [f"record_* helpers: {', '.join(comm['helpers'])}"])
    out += _listing("5. plan additions:", comm["plan_adds"])
    out += _listing("6. class-level patches after sharded_init:", f.get("class_patches", []))
    out += _listing("7. largest classes:", [f"{c['class']} {c['lines']} ({c['where']})" for c in f["largest_classes"]])
    if "private_api" in f:
        private = f["private_api"]
        out += _listing("9. MindSpore private API:", [f"per file: {_counts(private['per_file'], short=True)}",
                                                       f"per name: {_counts(private['per_name'])}", *private["uses"]])
    return "\n".join(out)


def _trace_details(trace: dict) -> List[str]:
    out = []
    for entry in ("prepare_train_network", "prepare_network"):
        t = trace[entry]
        out += _listing(f"1. {entry} (traced in {t['traced_s']} s, {t['package_calls']} package calls), "
                        f"mutating passes:", [_pass_line(p) for p in t["passes"]]
                        + [f"change outside any walk: {m}" for m in t["mutations_outside_walks"]])
        out += _listing(f"1. {entry}, passes over attached Cells:", [_pass_line(p) for p in t["attached_passes"]])
        out += _listing(f"1. {entry}, walks in call order:",
                        [f"{_short(w['by'])} {w['method']} ({w['receiver']})" for w in t["walk_list"]])
    train = trace["prepare_train_network"]
    for kind, how in (("functions", "first call of each function"), ("calls", "call")):
        fig = train["follow"][kind]
        out += _listing(f"8. following network, by {how}: {fig['length']} entries, {fig['files']} files, "
                        f"{fig['reentries']} re-entries", [f"per file: {_counts(fig['per_file'], short=True)}"])
    out += [f"   sequence: {' > '.join(_short(s) for s in train['follow']['functions']['sequence'])}",
            f"   upward calls: {_counts(train['upward_calls']) or 'none'}"]
    for kind in ("functions", "calls"):
        fig = train["follow"]["tangled"][kind]
        out += _listing(f"8b. tangled returns, by {'first call' if kind == 'functions' else 'call'}: {fig['count']}",
                        fig["list"][:40])
    return out


def _pass_line(p: dict) -> str:
    changes = ", ".join(f"{k} {n}" for k, n in list(p["changes"].items())[:6])
    via = f"; via {', '.join(_short(v) for v in p['via'])}" if p["via"] else ""
    steps = ", ".join(_short(step).split(":", 1)[-1] for step in p["steps"])
    return (f"{_short(p['function'])}: {p['objects']} objects, {p['walks']} walks below; steps {steps} "
            f"({changes}{via})")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", default=str(REPO), help="root of the checkout to measure (default: this one)")
    parser.add_argument("--json", default=None, help="also write the figures and their lists here")
    parser.add_argument("--no-trace", action="store_true", help="skip the msrun trace (figures 1 and 8)")
    parser.add_argument("--work", default=None, help="keep the runs' files (logs, worker output) in this folder")
    args = parser.parse_args(argv)
    tree = Path(args.tree).resolve()
    if not (tree / PACKAGE / "__init__.py").is_file():
        parser.error(f"the argument '--tree' must be the root of a checkout holding {PACKAGE}/, but got {args.tree!r}.")
    args.tree = tree
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = census(args.tree, trace=not args.no_trace, work=Path(args.work) if args.work else None)
    print(render_table(result))
    print(render_details(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
