"""Read the public signatures of MindOne's release wheels into tests/unit/mindone_signatures.json.

Usage:
    python tools/dev/mindone_signatures.py ROOT [--out tests/unit/mindone_signatures.json]

ROOT holds one folder per release, named by its version, with the release wheel's ``mindone``
package unpacked in it (a wheel is a zip file): ``ROOT/0.2.0/mindone/trainers/zero.py`` and so on.
The sources are parsed with ``ast``, never imported, so neither MindOne nor its
dependencies need to be installed, and only facts are written, no code: for each callable, its
parameters in order, each one's kind, and the source text of its default where it has one.

Per release, the JSON holds:

* ``mindone.trainers.zero``: ``prepare_train_network``, ``prepare_network``, ``prepare_ema``,
  ``ZeroHelper`` (its ``__init__``) and the offline combine (``transform_checkpoints`` in 0.2.0,
  ``convert_checkpoints`` after), whichever of them the release defines;
* ``mindone.trainers.train_step``: ``TrainOneStepWrapper``; ``mindone.trainers.ema``: ``EMA``;
* ``mindone.models.modules.parallel``: its ``__all__``, ``PARALLEL_MODULES`` (key source text to
  class name) and the constructor of every class named in either, found through the package's
  ``from .module import ...`` lines and, for a class without ``__init__``, its bases.

tests/unit/test_mindone_signatures.py checks our names against the file; the tests do not run
this script. Run it again when a MindOne release is added, and commit the JSON it writes.
"""
import argparse
import ast
import json
import sys
from pathlib import Path

ZERO_CALLABLES = ("prepare_train_network", "prepare_network", "prepare_ema", "ZeroHelper", "convert_checkpoints",
                  "transform_checkpoints")
CLASSES = {"mindone.trainers.train_step": "TrainOneStepWrapper", "mindone.trainers.ema": "EMA"}
PARALLEL = "mindone.models.modules.parallel"
_KINDS = (("posonlyargs", "positional_only"), ("args", "positional_or_keyword"), ("kwonlyargs", "keyword_only"))


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _top(tree: ast.Module, name: str):
    """The module-level ``def`` or ``class`` named ``name``, or None."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return node
    return None


def parameters(func: ast.FunctionDef, drop_self: bool = False) -> list:
    """``[{"name", "kind", "default"?}]`` of ``func`` in order (``default``: the source text)."""
    args = func.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out = []
    by_name = dict(zip((a.arg for a in positional), defaults))
    for field, kind in _KINDS:
        for a in getattr(args, field):
            default = by_name.get(a.arg) if field != "kwonlyargs" else args.kw_defaults[args.kwonlyargs.index(a)]
            entry = {"name": a.arg, "kind": kind}
            if default is not None:
                entry["default"] = ast.unparse(default)
            out.append(entry)
        if field == "args" and args.vararg is not None:
            out.append({"name": args.vararg.arg, "kind": "var_positional"})
    if args.kwarg is not None:
        out.append({"name": args.kwarg.arg, "kind": "var_keyword"})
    return out[1:] if drop_self else out


def constructor(trees: dict, module: str, name: str) -> list:
    """The parameters of class ``name``'s ``__init__`` (without ``self``), following its bases
    by name through ``trees`` (module name -> ast) from ``module``."""
    cls = _top(trees[module], name)
    if not isinstance(cls, ast.ClassDef):
        raise SystemExit(f"{module} defines no class {name}")
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            return parameters(node, drop_self=True)
    for base in cls.bases:
        if isinstance(base, ast.Name) and _top(trees[module], base.id) is not None:
            return constructor(trees, module, base.id)
    raise SystemExit(f"{module}.{name} has no __init__ of its own or in a base class of its module")


def _assigned(tree: ast.Module, name: str):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
    return None


def parallel_facts(package: Path) -> dict:
    init = _parse(package / "__init__.py")
    trees, home = {}, {}
    for node in init.body:  # from .conv import Conv1d, ...
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            trees[node.module] = _parse(package / f"{node.module}.py")
            home.update({alias.name: node.module for alias in node.names})
    names = ast.literal_eval(_assigned(init, "__all__"))
    mapping = _assigned(init, "PARALLEL_MODULES")
    modules = {ast.unparse(k): ast.unparse(v) for k, v in zip(mapping.keys, mapping.values)}
    classes = {}
    for name in sorted(set(names) | set(modules.values())):
        classes[name] = constructor(trees, home[name], name)
    return {"__all__": names, "PARALLEL_MODULES": modules, "classes": classes}


def release_facts(root: Path) -> dict:
    """The facts of one release whose ``mindone`` package is under ``root``."""
    trainers = root / "mindone" / "trainers"
    zero = _parse(trainers / "zero.py")
    facts = {"mindone.trainers.zero": {}}
    for name in ZERO_CALLABLES:
        node = _top(zero, name)
        if isinstance(node, ast.FunctionDef):
            facts["mindone.trainers.zero"][name] = parameters(node)
        elif isinstance(node, ast.ClassDef):
            facts["mindone.trainers.zero"][name] = constructor({"zero": zero}, "zero", name)
    for module, name in CLASSES.items():
        tree = _parse(trainers / f"{module.rsplit('.', 1)[1]}.py")
        facts[module] = {name: constructor({module: tree}, module, name)}
    facts[PARALLEL] = parallel_facts(root / "mindone" / "models" / "modules" / "parallel")
    return facts


def _dumps(value, indent: int = 0) -> str:
    """JSON with one line per parameter (a dict of plain values), so that diffs read per parameter."""
    pad = " " * (indent + 1)
    if isinstance(value, dict) and any(isinstance(v, (dict, list)) for v in value.values()):
        items = [f"{pad}{json.dumps(k)}: {_dumps(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        return "[\n" + ",\n".join(pad + _dumps(v, indent + 1) for v in value) + "\n" + " " * indent + "]"
    return json.dumps(value)


def _version_key(name: str):
    return tuple(int(p) if p.isdigit() else p for p in name.split("."))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="folder of release folders (ROOT/<version>/mindone/...)")
    parser.add_argument("--out", type=Path, default=Path("tests/unit/mindone_signatures.json"))
    args = parser.parse_args(argv)
    releases = sorted((p for p in args.root.iterdir() if (p / "mindone" / "trainers" / "zero.py").is_file()),
                      key=lambda p: _version_key(p.name))
    if not releases:
        raise SystemExit(f"no <version>/mindone/trainers/zero.py under {args.root}")
    data = {
        "about": "Public signatures of MindOne's releases (facts, no code), written by "
                 "tools/dev/mindone_signatures.py; read by tests/unit/test_mindone_signatures.py.",
        "releases": {p.name: release_facts(p) for p in releases},
    }
    args.out.write_text(_dumps(data) + "\n", encoding="utf-8")
    print(f"{args.out}: {', '.join(p.name for p in releases)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
