"""For developers: the run-time half of ``tools/dev/architecture_census.py``.

Runs in a process whose ``PYTHONPATH`` starts with the tree being measured, so that it imports that
tree's ``mindone_zero`` (it reports which file it imported; the census checks it). Two modes:

* ``--mode local --out FILE`` (one plain process): figure 6, the class-level attributes of
  ``Parameter``, ``Tensor`` and ``nn.Cell`` that differ after a ``with sharded_init():`` block that
  built a small network; and the private names of MindSpore's classes (``dir()`` of the classes and
  instances the package touches), for figure 9's static count.
* ``--mode trace --out DIR`` (under ``msrun`` with 2 workers: ZeRO shards only under
  ``DATA_PARALLEL``, and a group of 1 gathers nothing): figures 1 and 8. Builds the demo LM
  (``tools/lm_model.py`` of the tree, the ``model:`` section of its ``configs/train_lm.yaml``, ``LMLoss``
  around it) in GRAPH_MODE and traces (``sys.settrace``), on rank 0,
  ``prepare_train_network(loss, nn.AdamWeightDecay(...), zero_stage=3)``, then, on a fresh network,
  ``prepare_network(loss, zero_stage=3)`` (the public entry of ``shard_network``). Rank 1 builds
  alike, untraced. Writes ``trace_0.json``.

The definitions:

* A *user object* is a Cell or Parameter of the network passed in, as it was before the call.
* A *walk* is the start of a traversal of a Cell that covers the network: the user's top Cell, a Cell
  whose subtree holds it (the train wrapper), or the top's replacement (a Cell built during the call
  that stands for the network in the returned Cell; decided at the end). A traversal is a call of
  ``cells_and_names``, ``parameters_and_names``, ``get_parameters``, ``trainable_params``,
  ``untrainable_params``, ``parameters_dict`` or ``apply`` on such a Cell, not inside another of
  these calls; or the start of a manual recursion: ``cells()``, ``name_cells()`` or an iteration of
  the top's ``_cells`` (``items``/``values``/``keys``/``iter``), not inside a traversal, nor inside a
  recursion that a calling package function started over a Cell holding this one. A walk belongs to
  the innermost package function on the stack (a comprehension belongs to its function).
* A *change* of an object: an attribute set or deleted through ``Cell.__setattr__``/``__delattr__`` or
  ``Parameter``'s (properties included); a change of its ``__dict__`` (keys, the identity of each value,
  and one level into ``_cells`` and ``_params``; other dicts and lists it holds are compared when
  something else changed too), however made (``object.__setattr__``, a write into ``_cells``); its
  class; a Parameter's shape; a call of ``set_data``/``set_dtype``/``init_data``/``assign_value`` on a
  Parameter (one change: what MindSpore sets inside it is part of it). Changes are looked for at every
  package call and return, and belong to the package function that ran meanwhile (the MindSpore
  functions it called included). ``_func_graph_flags``, which ``Cell.get_flags`` creates when it is
  only read, is not a change.
* A *mutating pass* is one call of a package function that walked (itself or in the package calls
  it made) and changed a user object: each change belongs to the innermost such call on the stack.
  Its *steps* are the package calls it made directly (or itself) under which its changes were made.
  Changes with no such call on the stack are listed apart. *Passes over attached Cells* are counted
  alike for the changes (attribute sets only) of Cells and Parameters that are not user objects but
  were in the network (under the top Cell) when changed: Cells an earlier step attached.
* *Following the network* (figure 8): the package calls whose arguments (one level into tuples and
  lists) hold a user Cell (or the top's replacement), in call order, once per function (its first
  call) and once per call; their files, the distinct files, and the re-entries (a file entered again
  after the sequence had moved to another file). An *upward call* is a package call from a module of
  a lower layer into one of a higher layer (``LAYERS``; the nearest package frames), anywhere in the
  trace.
"""
import argparse
import gc
import inspect
import json
import os
import sys
import time
from collections import Counter, OrderedDict
from itertools import chain
from operator import attrgetter
from pathlib import Path

# traversals that cover the receiver's whole subtree (nn.Cell's methods)
FULL_WALKS = frozenset({"cells_and_names", "parameters_and_names", "get_parameters", "trainable_params",
                        "untrainable_params", "parameters_dict", "apply"})
# one level, the start of a manual recursion
CHILD_LISTS = frozenset({"cells", "name_cells"})
DATA_METHODS = frozenset({"set_data", "set_dtype", "init_data", "assign_value", "_update_tensor_data"})
COMPREHENSIONS = frozenset({"<genexpr>", "<listcomp>", "<setcomp>", "<dictcomp>"})
# attributes MindSpore sets on a Cell when it is only read (Cell.get_flags creates its flags dict)
LAZY_CACHES = frozenset({"_func_graph_flags"})
_SHAPE = attrgetter("shape")
LAYERS = {"core": 0, "zero3": 1, "offload": 1, "train": 2, "checkpoint": 3, "memory": 3, "cli": 4}
PACKAGES = ("mindone_zero", "parallel_modules")
CO_GENERATOR = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def layer_of(relfile: str):
    """The layer of a package file (``mindone_zero/<package>/...``; DESIGN.md section 2), or None."""
    parts = relfile.split("/")
    return LAYERS.get(parts[1]) if parts[0] == "mindone_zero" and len(parts) > 2 else None


def reentries(sequence):
    """(distinct files, {file: times entered again after the sequence had left it})."""
    seen, again, previous = set(), Counter(), None
    for item in sequence:
        if item != previous and item in seen:
            again[item] += 1
        seen.add(item)
        previous = item
    return len(seen), dict(again)


# ----------------------------------------------------------------------------- object states
def _content(value):
    """The keys and value identities a dict or list holds."""
    if isinstance(value, dict):
        return tuple(dict.keys(value)), tuple(map(id, dict.values(value)))
    return tuple(map(id, value))


def _detail(obj, is_param: bool) -> dict:
    """One object's state: its type, a Parameter's shape, each attribute's value identity (and, for a
    dict or list, the keys and identities it holds)."""
    return {"__class__": id(type(obj)), "shape": tuple(obj.shape) if is_param else None,
            **{k: (id(v), _content(v)) if isinstance(v, (dict, list)) else id(v) for k, v in dict.items(vars(obj))}}


class Watch:
    """The states of the user objects, and what changed since the last look. The look that finds
    nothing is one pass over the identities of every value of their ``__dict__``, ``_cells`` and
    ``_params`` (in C); what changed is then found object by object."""

    def __init__(self, objects):
        self.objects = list(objects)  # [(object, is_param)]
        self.params = [o for o, is_param in self.objects if is_param]
        self.details = [_detail(o, p) for o, p in self.objects]
        self._refresh()

    def _refresh(self):
        self.dicts = []
        for obj, _ in self.objects:
            d = vars(obj)
            self.dicts.append(d)
            self.dicts.extend(d[k] for k in ("_cells", "_params") if isinstance(d.get(k), dict))
        self.quick = self._quick()

    def _quick(self):
        return (tuple(type(o) for o, _ in self.objects), tuple(map(len, self.dicts)),
                tuple(map(id, chain.from_iterable(map(dict.values, self.dicts)))),
                tuple(map(_SHAPE, self.params)))

    def absorb(self, obj):
        """Take ``obj``'s present state as seen."""
        for i, (o, is_param) in enumerate(self.objects):
            if o is obj:
                self.details[i] = _detail(o, is_param)
        self._refresh()

    def changes(self):
        """[(object, what changed: an attribute, ``__class__`` or ``shape``)] since the last call."""
        if self._quick() == self.quick:
            return []
        found = []
        for i, (obj, is_param) in enumerate(self.objects):
            old, new = self.details[i], _detail(obj, is_param)
            if old != new:
                found += [(obj, k) for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)]
                self.details[i] = new
        self._refresh()
        return found


def _telling(name: str):
    """``OrderedDict.<name>`` that first tells the tracer the dict is iterated."""
    method = getattr(OrderedDict, name)

    def told(self, *args):
        if _WatchedCells.tracer is not None:
            _WatchedCells.tracer.on_cells_iteration()
        return method(self, *args)

    return told


class _WatchedCells(OrderedDict):
    """The top Cell's ``_cells``, which tells the tracer when it is iterated (a manual recursion)."""

    tracer = None
    items, values, keys, __iter__ = (_telling(name) for name in ("items", "values", "keys", "__iter__"))


def subtree(cell):
    """(ids of the Cells, {id: Parameter}) under ``cell``, read without calling its methods."""
    cells, params, todo = set(), {}, [cell]
    while todo:
        c = todo.pop()
        if id(c) in cells:
            continue
        cells.add(id(c))
        d = vars(c)
        params.update((id(p), p) for p in dict.values(d.get("_params", {})) if p is not None)
        todo.extend(x for x in dict.values(d.get("_cells", {})) if x is not None)
    return cells, params


class Node:
    """One call of a package function (a generator's resumptions share one)."""

    __slots__ = ("where", "parent", "walks", "mutations")

    def __init__(self, where, parent):
        self.where, self.parent = where, parent
        self.walks = []  # [order, method, receiver kind, receiver (manual walks and undecided ones)]
        self.mutations = {}  # (object label, change, "user"/"attached") -> the function that made it


class Tracer:
    """``sys.settrace`` callback recording walks, mutations and the calls that follow the network."""

    def __init__(self, tree: Path, top, cell_py: str, alive_cells):
        from mindspore import nn

        self.nn, self.cell_py, self.top, self.alive = nn, cell_py, top, alive_cells
        self.roots = tuple(str((tree / p).resolve()) + os.sep for p in PACKAGES)
        self.tree = str(tree.resolve()) + os.sep
        self.cells = {id(c): (name or "<top>", c) for name, c in top.cells_and_names()}
        self.params = {id(p): (p.name, p) for _, p in top.parameters_and_names()}
        self.labels = {**{k: f"Cell {v[0]}" for k, v in self.cells.items()},
                       **{k: f"Parameter {v[0]}" for k, v in self.params.items()}}
        self.watch = Watch([(c, False) for _, c in self.cells.values()] + [(p, True) for _, p in self.params.values()])
        self.reachable, self.reach_dirty = {}, True  # id -> object, for the attached objects
        self.attached_labels = {}
        self.where_of, self.stack, self.nodes, self.generators = {}, [], [], {}
        self.walk_depth, self.walk_frames, self.walk_count, self.data_depth = 0, set(), 0, 0
        self.followed, self.upward = [], Counter()
        self.internal = False

    # -------------------------------------------------------------- where things happen
    def _where(self, code):
        """"file:qualname" of a package function, "" of a comprehension in one, None elsewhere."""
        where = self.where_of.get(code, 0)
        if where == 0:
            name, where = code.co_filename, None
            if name.startswith(self.roots):
                where = "" if code.co_name in COMPREHENSIONS else f"{name[len(self.tree):]}:{code.co_qualname}"
            self.where_of[code] = where
        return where

    def _kind(self, cell):
        """How a walk's receiver covers the network: 'top', 'around top', 'new' (built during the
        call: decided at the end) or None."""
        if cell is self.top:
            return "top"
        if not isinstance(cell, self.nn.Cell):
            return None
        if id(self.top) in subtree(cell)[0]:
            return "around top"
        return "new" if id(cell) not in self.alive else None

    def _record_walk(self, method, receiver, manual):
        kind = self._kind(receiver)
        if kind is None or not self.stack:
            return
        if manual and any(r is not None and (r is receiver or id(receiver) in subtree(r)[0])
                          for n in self.stack[:-1] for _, _, _, r in n.walks):
            return  # inside a recursion an enclosing call started
        self.walk_count += 1
        self.stack[-1].walks.append((self.walk_count, method, kind, receiver if manual or kind == "new" else None))

    def _mutated(self, label, change, origin):
        if self.stack and change not in LAZY_CACHES:
            self.stack[-1].mutations.setdefault((label, change, origin), self.stack[-1].where)

    def _diff(self):
        """Give every change of a user object since the last look to the package call that ran meanwhile."""
        for obj, change in self.watch.changes():
            self._mutated(self.labels[id(obj)], change, "user")
            if change in ("_cells", "_params"):
                self.reach_dirty = True

    def _attached(self, obj):
        """Whether ``obj`` (not a user object) is in the network now: under the top Cell."""
        if self.reach_dirty:
            cells, params = subtree(self.top)
            self.reachable = {**params, **{i: None for i in cells}}
            self.reach_dirty = False
        return id(obj) in self.reachable

    # -------------------------------------------------------------- hooks
    def on_setattr(self, obj, name, value):
        if self.internal or self.data_depth:
            return
        if id(obj) in self.labels:
            self._mutated(self.labels[id(obj)], name, "user")
        elif self._attached(obj):
            label = self.attached_labels.setdefault(id(obj), f"{type(obj).__name__} #{len(self.attached_labels)}")
            self._mutated(label, name, "attached")
        if isinstance(value, self.nn.Cell):
            self.reach_dirty = True

    def on_cells_iteration(self):
        if not self.internal and self.walk_depth == 0:
            self.internal = True
            try:
                self._record_walk("_cells", self.top, True)
            finally:
                self.internal = False

    # -------------------------------------------------------------- the trace functions
    def __call__(self, frame, event, arg):
        """The global trace function: 'call' events (a generator's resumptions included)."""
        if self.internal:
            return None
        self.internal = True
        try:
            return self._call(frame)
        finally:
            self.internal = False

    def _local(self, frame, event, arg):
        """The local trace function of the frames followed: their 'return' events."""
        if event == "return" and not self.internal:
            self.internal = True
            try:
                self._return(frame)
            finally:
                self.internal = False
        return self._local

    def _call(self, frame):
        code = frame.f_code
        where = self._where(code)
        if where is None:
            return self._foreign_call(frame, code)
        if not where:
            return None  # a comprehension belongs to its function
        self._diff()
        node = self.generators.get(frame) if code.co_flags & CO_GENERATOR else None
        if node is None:
            node = Node(where, self.stack[-1] if self.stack else None)
            self.nodes.append(node)
            if code.co_flags & CO_GENERATOR:
                self.generators[frame] = node
            self._follow(frame, node)
        self.stack.append(node)
        frame.f_trace_lines = False
        return self._local

    def _foreign_call(self, frame, code):
        """A MindSpore call: a traversal (a walk when it starts one), or a data method of a user
        Parameter (one change, ``set_data``; what it sets inside is part of it)."""
        name = code.co_name
        if name in DATA_METHODS:
            obj = frame.f_locals.get("self")
            if obj is None or id(obj) not in self.params or self.params[id(obj)][1] is not obj:
                return None
            if self.data_depth == 0:
                self._diff()
                self._mutated(self.labels[id(obj)], name, "user")
            self.data_depth += 1
        elif code.co_filename == self.cell_py and (name in FULL_WALKS or name in CHILD_LISTS):
            self.walk_depth += 1
            if self.walk_depth == 1 and frame not in self.walk_frames:
                if code.co_flags & CO_GENERATOR:
                    self.walk_frames.add(frame)
                self._record_walk(name, frame.f_locals.get("self"), name in CHILD_LISTS)
        else:
            return None
        frame.f_trace_lines = False
        return self._local

    def _return(self, frame):
        if self._where(frame.f_code) is None:  # a traversal or a data method ends
            if frame.f_code.co_name in DATA_METHODS:
                self.data_depth -= 1
                if not self.data_depth:  # what it changed is the data method's change
                    self.watch.absorb(frame.f_locals.get("self"))
            else:
                self.walk_depth = max(self.walk_depth - 1, 0)
            return
        self._diff()
        if self.stack:
            self.stack.pop()

    def _follow(self, frame, node):
        """Figure 8: does this call take the network? Is it an upward call?"""
        caller = node.parent
        if caller is not None:
            low, high = layer_of(caller.where.split(":")[0]), layer_of(node.where.split(":")[0])
            if low is not None and high is not None and low < high:
                self.upward[f"{caller.where} -> {node.where}"] += 1
        values = []
        for value in frame.f_locals.values():
            values.extend(value if isinstance(value, (tuple, list)) else (value,))
        if any(id(v) in self.cells and self.cells[id(v)][1] is v for v in values):
            self.followed.append((node.where, None, node))
        else:
            new = tuple(v for v in values if isinstance(v, self.nn.Cell) and id(v) not in self.alive)
            if new:
                self.followed.append((node.where, new, node))

    # -------------------------------------------------------------- results
    def result(self, root):
        """The JSON-able record of the trace; ``root`` stands for the network after the call (the
        top's replacement when the top was replaced)."""
        def counts(walk):
            kind, receiver = walk[2], walk[3]
            return kind != "new" or (root is not self.top and (receiver is root or id(root) in subtree(receiver)[0]))

        for node in self.nodes:
            node.walks = [w for w in node.walks if counts(w)]
        walks = sorted((w[0], n, w[1], w[2]) for n in self.nodes for w in n.walks)
        passes = {origin: self._passes(origin) for origin in ("user", "attached")}
        kept = [(w, n) for w, new, n in self.followed
                if new is None or (root is not self.top and any(o is root for o in new))]
        calls = [w for w, _ in kept]
        firsts = {}
        for where, node in kept:
            firsts.setdefault(where, node)  # each function's first call, in call order
        return {
            "walks": len(walks),
            "walk_list": [{"by": n.where, "method": m, "receiver": k, "under": self._under(n)} for _, n, m, k in walks],
            "mutating_passes": len(passes["user"][0]), "passes": passes["user"][0],
            "mutations_outside_walks": passes["user"][1],
            "attached_passes": passes["attached"][0], "attached_outside_walks": passes["attached"][1],
            "follow": {"functions": _follow_figures(list(dict.fromkeys(calls))), "calls": _follow_figures(calls),
                       "tangled": {"functions": _tangled(list(firsts.items()), self.nodes),
                                   "calls": _tangled(kept, self.nodes)}},
            "upward_calls": dict(self.upward), "package_calls": len(self.nodes),
        }

    def _passes(self, origin):
        """([pass], [mutation outside any walk]) of the mutations of ``origin`` objects: each
        mutation belongs to the innermost call on the stack that walked (itself or below it)."""
        walked = Counter()  # id(node) -> walks in its call
        for node in reversed(self.nodes):  # a callee comes after its caller
            walked[id(node)] += len(node.walks)
            if walked[id(node)] and node.parent is not None:
                walked[id(node.parent)] += walked[id(node)]
        owners, steps = {}, {}
        for node in self.nodes:
            owner, step = node, node
            while owner is not None and not walked[id(owner)]:
                step, owner = owner, owner.parent
            for (label, change, kind), where in node.mutations.items():
                if kind == origin:
                    owners.setdefault(owner, {}).setdefault((label, change), where)
                    steps.setdefault(owner, {})[step.where] = None
        passes = [{"function": n.where, "under": self._under(n), "walks": walked[id(n)],
                   "objects": len({label for label, _ in muts}),
                   "changes": dict(Counter(change for _, change in muts).most_common()),
                   "steps": list(steps[n]), "via": sorted(set(muts.values()) - {n.where})}
                  for n, muts in owners.items() if n is not None]
        outside = sorted({f"{where}: {label} {change}" for (label, change), where in owners.get(None, {}).items()})
        return passes, outside

    def _under(self, node):
        """The entry's direct callee that ``node`` runs under (the entry itself for the entry)."""
        chain = []
        while node is not None:
            chain.append(node)
            node = node.parent
        return chain[-2].where if len(chain) > 1 else chain[-1].where


def _follow_figures(wheres):
    """Figure 8 of a sequence of "file:function": files, re-entries, per file, and the sequence."""
    files = [w.split(":")[0] for w in wheres]
    distinct, again = reentries(files)
    return {"length": len(files), "files": distinct, "reentries": sum(again.values()),
            "per_file": dict(sorted(again.items(), key=lambda kv: (-kv[1], kv[0]))), "sequence": _runs(files),
            "order": list(wheres) if len(wheres) <= 200 else None}


def _file(node) -> str:
    return node.where.split(":")[0]


def _tangled(entries, nodes):
    """Tangled returns in ``entries`` ([("file:function", Node)] of calls that take the network, in call
    order): a call into a non-leaf file (one from which the trace calls into another package file
    outside ``core``, the bottom layer) that the network had entered and then left, with no frame of
    that file on the call stack, and that the network left for a file other than its callers of
    then. Not tangled: a caller resuming, a loop in a caller that calls the file again (only the
    file's callers were visited in between), and calls into leaf helpers, which do not take the
    network away from the file that called them. Returns the count and each one as "files visited in
    between -> function (called from caller)"."""
    nonleaf = {_file(n.parent) for n in nodes
               if n.parent is not None and _file(n.parent) != _file(n) and layer_of(_file(n)) != LAYERS["core"]}
    since, callers, previous, tangled = {}, {}, None, []  # since: file -> the files visited after it
    for where, node in entries:
        path, stack = _file(node), set()
        parent = node.parent
        while parent is not None:
            stack.add(_file(parent))
            parent = parent.parent
        if path not in nonleaf:
            continue  # a leaf helper: the network goes back to its caller
        if path != previous and path in since and path not in stack:
            away = [f for f in since[path] if f not in callers[path]]
            if away:
                caller = node.parent.where if node.parent is not None else "<entry>"
                tangled.append(f"{', '.join(away)} -> {where} (called from {caller})")
        for visited in since.values():
            if path not in visited:
                visited.append(path)
        since[path], callers[path] = [], stack
        previous = path
    return {"count": len(tangled), "list": tangled}


def _runs(sequence):
    """``sequence`` with consecutive repeats folded: ["a.py x3", "b.py", ...]."""
    out = []
    for item in sequence:
        if out and out[-1][0] == item:
            out[-1][1] += 1
        else:
            out.append([item, 1])
    return [f"{f} x{n}" if n > 1 else f for f, n in out]


# ----------------------------------------------------------------------------- hooks on the classes
def install_hooks(tracer):
    """Report attribute sets on Cells and Parameters to ``tracer`` (in this process, until the
    returned function is called)."""
    from mindspore import Parameter, nn

    cell_set, cell_del, param_set = nn.Cell.__setattr__, nn.Cell.__delattr__, Parameter.__setattr__

    def set_cell(self, name, value):
        tracer.on_setattr(self, name, value)
        cell_set(self, name, value)

    def del_cell(self, name):
        tracer.on_setattr(self, name, None)
        cell_del(self, name)

    def set_param(self, name, value):
        tracer.on_setattr(self, name, value)
        param_set(self, name, value)

    nn.Cell.__setattr__, nn.Cell.__delattr__, Parameter.__setattr__ = set_cell, del_cell, set_param
    _WatchedCells.tracer = tracer

    def uninstall():
        _WatchedCells.tracer = None
        nn.Cell.__setattr__, nn.Cell.__delattr__ = cell_set, cell_del
        del Parameter.__setattr__  # the inherited one again

    return uninstall


def traced(tree: Path, top, call):
    """Run ``call()`` under a ``Tracer`` of ``top``; returns (its result, the tracer)."""
    from mindspore import nn

    alive = {id(o): o for o in gc.get_objects() if issubclass(type(o), nn.Cell)}  # (weak proxies: no isinstance)
    cells = top._cells
    object.__setattr__(top, "_cells", _WatchedCells(cells))
    tracer = Tracer(tree, top, inspect.getsourcefile(nn.Cell), alive)
    uninstall = install_hooks(tracer)
    sys.settrace(tracer)
    try:
        result = call()
    finally:
        sys.settrace(None)
        uninstall()
        object.__setattr__(top, "_cells", OrderedDict(dict.items(top._cells)))
    return result, tracer


def replaced_root(returned, top):
    """The Cell that stands for the network in ``returned``: ``top`` if it is still there, else the
    smallest Cell under ``returned`` that holds every Parameter ``top`` held (its replacement)."""
    top_params = set(subtree(top)[1])
    best = None
    for _, cell in returned.cells_and_names():
        if cell is top:
            return top
        if top_params <= set(subtree(cell)[1]):
            best = cell
    return best if best is not None else returned


# ----------------------------------------------------------------------------- the modes
ENTRIES = ("prepare_train_network", "prepare_network")


def _demo_lm(tree: Path):
    """(LMLoss around the demo LM, the LM) of ``tree``'s tools/lm_model.py and configs/train_lm.yaml."""
    import yaml

    from tools.lm_model import LMLoss, build_lm

    with open(tree / "configs" / "train_lm.yaml") as f:
        net = build_lm(yaml.safe_load(f)["model"])
    return LMLoss(net), net


def _entry(name: str, tree: Path, out: Path, rank: int):
    """(the user's top Cell, a function that calls the entry point ``name`` on it) on a fresh demo LM."""
    from mindspore import nn

    from mindone_zero import prepare_network, prepare_train_network

    loss, net = _demo_lm(tree)
    if name == "prepare_network":
        return loss, lambda: prepare_network(loss, zero_stage=3)
    optimizer = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3)
    info = str(out / f"params_info_{rank}")
    return loss, lambda: prepare_train_network(loss, optimizer, zero_stage=3, params_split_info=info)


def _package_file():
    import mindone_zero

    return str(Path(mindone_zero.__file__).resolve())


def trace_mode(tree: Path, out: Path) -> None:
    """Figures 1 and 8, traced on rank 0 (under msrun, 2 workers; rank 1 builds the same, untraced)."""
    import mindspore as ms
    from mindspore.communication import get_rank, init

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank = get_rank()
    record = {"package": _package_file(), "rank": rank}
    for name in ENTRIES:
        top, call = _entry(name, tree, out, rank)
        if rank != 0:
            call()
            continue
        start = time.perf_counter()
        returned, tracer = traced(tree, top, call)
        seconds = round(time.perf_counter() - start, 1)
        record[name] = {"traced_s": seconds, **tracer.result(replaced_root(returned, top))}
    (out / f"trace_{rank}.json").write_text(json.dumps(record, indent=1))


def class_patches() -> list:
    """Figure 6: ``Parameter``, ``Tensor``, ``nn.Cell`` attributes that differ after ``sharded_init``."""
    from mindspore import Parameter, Tensor, nn

    from mindone_zero import sharded_init

    classes = {"Parameter": Parameter, "Tensor": Tensor, "nn.Cell": nn.Cell}
    before = {name: dict(vars(cls)) for name, cls in classes.items()}
    with sharded_init():
        nn.SequentialCell([nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 2)])
    found = []
    for name, cls in classes.items():
        after = dict(vars(cls))
        for key in sorted(before[name].keys() | after.keys()):
            if before[name].get(key, None) is not after.get(key, None):
                what = "added" if key not in before[name] else "removed" if key not in after else "replaced"
                found.append(f"{name}.{key} {what}")
    return found


def mindspore_private_names() -> list:
    """Names starting with one ``_`` that MindSpore's classes (and instances) the package touches have."""
    import numpy as np
    from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
    from mindspore.experimental import optim

    dense = nn.Dense(2, 2)
    objects = [nn.Cell, nn.Dense, nn.SequentialCell, nn.CellList, nn.CellDict, Parameter, Tensor, ParameterTuple,
               nn.Optimizer, optim.Optimizer, ops.Primitive, dense, dense.weight, Tensor(np.zeros(2, np.float32)),
               nn.AdamWeightDecay(dense.trainable_params()), optim.AdamW(dense.trainable_params()), ops.Add(),
               nn.SequentialCell([nn.ReLU()]), nn.CellList([nn.ReLU()])]
    return sorted({n for o in objects for n in dir(o) if n.startswith("_") and not n.startswith("__")})


def local_mode(out: Path) -> None:
    """Figure 6 and MindSpore's private names, in this one process."""
    record = {"package": _package_file(), "mindspore_private_names": mindspore_private_names(),
              "class_patches": class_patches()}
    out.write_text(json.dumps(record, indent=1))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="the run-time half of tools/dev/architecture_census.py")
    parser.add_argument("--mode", choices=("local", "trace"), required=True)
    parser.add_argument("--tree", required=True, help="the checkout measured (first on PYTHONPATH)")
    parser.add_argument("--out", required=True, help="a file (local) or a folder (trace)")
    args = parser.parse_args(argv)
    tree = Path(args.tree).resolve()
    if args.mode == "local":
        local_mode(Path(args.out))
    else:
        trace_mode(tree, Path(args.out))


if __name__ == "__main__":
    main()
