"""tools/dev/architecture_census.py: its static counters on small synthetic sources, the pure parts of
its worker (what changed on an object, the re-entries of a file sequence), and its arguments. The
run-time trace (msrun) is not run here."""
import subprocess
import sys
from pathlib import Path

import pytest

from tools.dev import architecture_census as census
from tools.dev import architecture_census_worker as worker

ROOT = Path(__file__).resolve().parents[3]


def test_context_vars():
    sources = {"mindone_zero/core/a.py": "import contextvars\nA = contextvars.ContextVar('pad', default=None)\n",
               "mindone_zero/zero3/b.py": "from contextvars import ContextVar\n\n_B = ContextVar('zpp')\nc = dict()\n"}
    assert census.context_vars(sources) == ["mindone_zero/core/a.py:2 pad", "mindone_zero/zero3/b.py:3 zpp"]


def test_helper_reads_inside_and_outside_train():
    sources = {
        "mindone_zero/train/zero_helper.py": "def f(helper):\n    return helper.specs\n",  # its own file: not counted
        "mindone_zero/train/a.py": ("def f(helper, train, other):\n"
                                    "    n = helper.specs, train.zero_helper.params, other.specs\n"
                                    "    helper.policy.stage\n"  # one read: .stage is on the policy
                                    "    helper.op_size = 2\n"  # a store, not a read
                                    "    return getattr(helper, 'world_comm', None), hasattr(other, 'x')\n"),
        "mindone_zero/offload/b.py": "class H:\n    def g(self):\n        return self.zero_helper.opt_params\n",
    }
    reads = census.helper_reads(sources)
    assert (reads["total"], reads["outside_train"], reads["modules"], reads["attributes"]) == (4, 1, 2, 4)
    assert reads["per_module"] == {"mindone_zero/train/a.py": 3, "mindone_zero/offload/b.py": 1}
    assert reads["getattr"] == ["mindone_zero/train/a.py:5 getattr(helper, 'world_comm', None)"]


def test_offload_branches_in_the_train_step_family_only():
    source = (
        "class Base(Cell):\n"
        "    def a(self):\n"
        "        if self.offload:\n"  # 3: a base of the train step
        "            pass\n"
        "class TrainOneStepWrapper(Base):\n"
        "    def b(self, x):\n"
        "        y = 1 if self.zero_helper.host_offload is not None else 2\n"  # 7: a conditional expression
        "        if self.offload and x:\n"  # 8
        "            pass\n"
        "        elif x:\n"  # reads no offload attribute
        "            pass\n"
        "class Unrelated:\n"
        "    def c(self):\n"
        "        if self.offload:\n"  # not in the family
        "            pass\n"
    )
    sub = ("from .a import TrainOneStepWrapper\nclass HostStep(a.TrainOneStepWrapper):\n    def d(self, offload):\n"
           "        while True:\n            if offload:\n                break\n")
    found = census.offload_branches({"mindone_zero/train/a.py": source, "mindone_zero/train/b.py": sub})
    assert found == ["mindone_zero/train/a.py:3 Base", "mindone_zero/train/a.py:7 TrainOneStepWrapper",
                     "mindone_zero/train/a.py:8 TrainOneStepWrapper", "mindone_zero/train/b.py:5 HostStep"]


def test_comm_recording():
    source = (
        "class CommRecorder(Protocol):\n"
        "    def record_comm(self, plan, ctx):\n        ...\n"
        "class Gather:\n"
        "    def record_comm(self, plan, ctx):\n"
        "        plan.add('all_gather', 'g', 4, 2)\n"
        "        self.record_gather(plan)\n"
        "    def record_gather(self, comm_plan):\n"
        "        comm_plan.add_quantized('all_gather', 'g', 2, 8, 1)\n"
        "        seen.add(1)\n"  # a set, not a plan
    )
    found = census.comm_recording({"mindone_zero/zero3/a.py": source, "mindone_zero/core/b.py": "plan.add(1)\n"})
    assert found["record_comm"] == ["mindone_zero/zero3/a.py:2 CommRecorder.record_comm",
                                    "mindone_zero/zero3/a.py:5 Gather.record_comm"]
    assert found["helpers"] == ["mindone_zero/zero3/a.py:8 Gather.record_gather"]
    assert found["plan_adds"] == ["mindone_zero/core/b.py:1 plan.add", "mindone_zero/zero3/a.py:6 plan.add",
                                  "mindone_zero/zero3/a.py:9 comm_plan.add_quantized"]
    assert found["plan_add_files"] == 2


def test_largest_classes():
    source = "class Small:\n    x = 1\n\n\nclass Big:\n    a = 1\n\n    def f(self):\n        return 2\n"
    found = census.largest_classes({"mindone_zero/a.py": source}, top=5)
    assert [(c["class"], c["lines"], c["where"]) for c in found] == [("Big", 5, "mindone_zero/a.py:5"),
                                                                    ("Small", 2, "mindone_zero/a.py:1")]


def test_private_api():
    source = (
        "import mindspore as ms\n"
        "from mindspore.parallel._utils import _get_parallel_mode\n"  # a private module
        "from mindspore.common.recompute import _RecomputeCell, null_context_fn\n"  # one private name
        "import mindspore._c_expression\n"
        "from mindspore import nn\n"
        "def f(cell):\n"
        "    cell._cells['a'] = cell._params\n"  # _params: the package defines its own (b.py)
        "    getattr(cell, '_recompute_cell', None)\n"
        "    ms._private_thing\n"  # reached from a mindspore import
        "    cell._mine\n"  # not a MindSpore name
        "    return cell.__class__\n"
    )
    own = "class Holder:\n    def _params(self):\n        return 1\n"
    found = census.private_api({"mindone_zero/a.py": source, "mindone_zero/b.py": own},
                               ["_cells", "_params", "_recompute_cell", "_scope"])
    assert found["uses"] == [
        "mindone_zero/a.py:2 from mindspore.parallel._utils import _get_parallel_mode",
        "mindone_zero/a.py:3 from mindspore.common.recompute import _RecomputeCell",
        "mindone_zero/a.py:4 import mindspore._c_expression",
        "mindone_zero/a.py:7 ._cells",
        "mindone_zero/a.py:8 '_recompute_cell'",
        "mindone_zero/a.py:9 ._private_thing",
    ]
    assert (found["places"], found["files"], found["names"]) == (6, 1, 6)


def test_package_lines():
    assert census.package_lines({"a.py": "x = 1\n\n  \ny = 2\n", "b.py": "z"}) == {"physical": 5, "non_blank": 3}


def test_the_table_of_static_figures():
    sources = {"mindone_zero/train/a.py": "class TrainOneStepWrapper:\n    def f(self):\n        if self.offload:\n"
                                          "            return helper.specs\n"}
    figures = {"context_vars": census.context_vars(sources), "helper_reads": census.helper_reads(sources),
               "offload_branches": census.offload_branches(sources), "comm": census.comm_recording(sources),
               "largest_classes": census.largest_classes(sources), "lines": census.package_lines(sources)}
    values = census.static_values(figures)
    assert values == {"2": "0", "3": "1 (0 outside train/; 1 modules, 1 attributes; +0 getattr/hasattr)", "4": "1",
                      "5": "0 record_comm; 0 plan.add sites in 0 files",
                      "7": "TrainOneStepWrapper 4 lines (mindone_zero/train/a.py:1)", "10": "4 (4 non-blank)"}
    table = census.render_table({"tree": "/t", "commit": "abc", "values": values, "figures": figures})
    assert "| 4 | offload branches in the train step class | 1 | if / conditional" in table
    assert census.render_details({"figures": figures}).count("\n") > 10


class _Thing:
    pass


class _Other(_Thing):
    pass


def test_watch_sees_every_kind_of_change():
    cell, param = _Thing(), _Thing()
    cell._cells, cell.flag = {"a": _Thing()}, 1
    param.shape = (4, 2)
    watch = worker.Watch([(cell, False), (param, True)])
    assert watch.changes() == []
    object.__setattr__(cell, "stamp", 1)
    assert watch.changes() == [(cell, "stamp")]
    cell._cells["a"] = _Thing()  # a child replaced in the dict
    cell.flag = 1  # the same value again: nothing changed
    assert watch.changes() == [(cell, "_cells")]
    object.__setattr__(cell, "__class__", _Other)
    param.shape = (2, 2)
    assert watch.changes() == [(cell, "__class__"), (param, "shape")]
    param.shape = (1, 2)
    watch.absorb(param)
    assert watch.changes() == []


def test_reentries_and_layers():
    assert worker.reentries(["a", "a", "b", "a", "c", "b", "b", "a"]) == (3, {"a": 2, "b": 1})
    assert worker.reentries([]) == (0, {})
    assert worker._runs(["a", "a", "b"]) == ["a x2", "b"]
    assert ([worker.layer_of(f"mindone_zero/{p}/x.py") for p in ("core", "zero3", "offload", "train", "cli")]
            == [0, 1, 1, 2, 4])
    assert worker.layer_of("mindone_zero/__init__.py") is None


def test_tangled_returns_count_a_module_reentered_after_it_was_done():
    def node(where, parent):
        return worker.Node(f"mindone_zero/{where}", parent)

    entry = node("train/p.py:entry", None)
    plan = node("zero3/u.py:plan", entry)
    helper = node("zero3/h.py:cut", plan)  # u.py calls h.py, outside core: u.py is not a leaf
    leaf = node("core/c.py:probe", helper)  # h.py calls only core: a leaf
    resume = node("zero3/u.py:plan_more", entry)  # u.py again, only its callees in between: not tangled
    apply = node("zero3/r.py:apply", entry)
    h_again = node("zero3/h.py:cut", apply)  # a leaf: never tangled
    inner = node("zero3/u.py:inner", apply)  # left for r.py, not on the stack: tangled
    back = node("zero3/r.py:more", apply)  # r.py is on the stack (apply): a caller resuming
    again = node("zero3/u.py:inner", back)  # a loop in r.py: only r.py, on the stack, in between
    nodes = [entry, plan, helper, leaf, resume, apply, h_again, inner, back, again]
    entries = [(n.where, n) for n in nodes]
    assert worker._tangled(entries, nodes) == {
        "count": 1, "list": ["mindone_zero/zero3/r.py -> mindone_zero/zero3/u.py:inner "
                             "(called from mindone_zero/zero3/r.py:apply)"]}
    assert worker._tangled(entries[:5], nodes) == {"count": 0, "list": []}


def test_a_tree_without_the_package_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        census.parse_args(["--tree", str(tmp_path)])
    assert "the argument '--tree' must be the root of a checkout holding mindone_zero/" in capsys.readouterr().err


def test_importing_the_tool_imports_neither_the_package_nor_mindspore():
    code = ("import sys; import tools.dev.architecture_census, tools.dev.architecture_census_worker; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mindone_zero', 'mindspore')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_top_cells_dict_tells_each_iteration(monkeypatch):
    told = []
    tracer = type("Tracer", (), {"on_cells_iteration": lambda self: told.append(1)})()
    monkeypatch.setattr(worker._WatchedCells, "tracer", tracer)
    cells = worker._WatchedCells({"a": 1, "b": 2})
    assert ((list(cells.items()), list(cells), list(cells.values()), list(cells.keys()))
            == ([("a", 1), ("b", 2)], ["a", "b"], [1, 2], ["a", "b"]))
    assert len(told) == 4
    cells["c"] = 3  # a write is no iteration
    assert len(told) == 4 and dict.keys(cells) == {"a", "b", "c"}
