"""Where a train step's kernel-graph nodes come from: each node's op and the part of the step it serves.

``breakdown(ir_text, emulation)`` reads one saved final kernel graph (``hwopt_common_final_graph*.ir``,
which ``tools/bench/benchmark_compile.py`` dumps in its graph-size job) and counts its nodes by
(op, part). ``benchmark_compile.py`` sums them over a step's kernel graphs into ``compile.json``
and renders them as its page's table "where the kernel-graph nodes come from".

The IR, as MindSpore 2.10 writes it: a node is a line ``  %12(name) = PrimFunc_MatMul(...)``,
followed by its Scope (``# Scope: (Default/network-MLPLM/...)``, ``Gradients/...`` for a node autodiff
made) and its source stack, outermost frame first: ``# In file <path>:<a>~<b>, ...def f(...):/``
opens a function, ``# In file <path>:<line>, ...`` is a statement in it. A backward node carries
the stack of its forward node ("Corresponding forward node candidate").

The op is the node's primitive, ``PrimFunc_`` dropped (``PrimFunc_Reshape`` -> ``Reshape``). The
part is found thus, first rule first:

1. a node whose stack passes through a line of ``GroupComm``'s CPU emulation branches
   (``emulation``: comm.py's path and those lines, ``benchmark_compile.emulation_lines``) is
   ``EMULATION``: it would not exist where the backend has the collective (Ascend);
2. else the innermost frame that ``SOURCES`` (the file -> part table) names gives the part: its
   first row that matches the frame's file, function and code. Helpers that several parts call
   (``core/comm.py`` outside the emulation, ``train/fusion.py``'s buckets, ``core/slicing.py``,
   ``core/graph_tuples.py``, MindSpore's ``ops``) are not named, so a node in them goes to the part
   of the caller that is: the gradient buckets' nodes are ``GRAD_SYNC``, the post-optimizer
   buckets' ``POST_GATHER``;
3. a node with a stack but no named frame is ``STEP`` (the train step's own glue);
4. a node with no stack (MindSpore gives none to most ``Load``, ``UpdateState``, ``MakeTuple``,
   ``Depend`` it adds) is placed by its scope (``SCOPES``);
5. else by its neighbours in the graph (``breakdown``), else ``UNTRACED``.

``MODEL`` and ``STAGE3`` are split into forward and backward: backward is a node autodiff made
(scope ``Gradients/``), one in a custom ``bprop``, or the recompute pass's copy of a forward node
(stage 3 recomputes its gathers in backward).
"""
import re
from collections import Counter
from typing import Iterable, Optional, Tuple

EMULATION = "CPU emulation of collectives"
MODEL_FWD, MODEL_BWD = "model, forward", "model, backward"
STAGE3_FWD, STAGE3_BWD = "stage-3 gathers, forward", "stage-3 gathers and reduce-scatters, backward"
GRAD_SYNC = "gradient sync"
SCALING = "loss scale, unscale, overflow, clip"
OPTIMIZER = "optimizer update"
POST_GATHER = "post-optimizer gather (stages 1-2)"
STEP = "train step's own"
UNTRACED = "no source, no known scope"
MODEL, STAGE3 = "model", "stage 3"  # split into forward and backward by the scope
PARTS = (MODEL_FWD, MODEL_BWD, STAGE3_FWD, STAGE3_BWD, GRAD_SYNC, SCALING, OPTIMIZER, POST_GATHER, STEP, EMULATION,
         UNTRACED)

# The file -> part table: (path fragment, the functions of that file (None: any), a fragment of the
# statement's code (None: any), part). A frame matches a row when its file's path contains the
# fragment (a fragment "" matches the user's own code: a file outside MindSpore and mindone_zero), its
# function is one of the row's and its code holds the row's code. The code matters where a per-tensor
# map is called: MindSpore traces a ``hyper_map`` no deeper than its call.
SOURCES = (
    ("/mindone_zero/train/grad_sync.py", ("all_gather_params", "_write_full_tensor"), None, POST_GATHER),
    ("/mindone_zero/train/grad_sync.py", ("global_norm", "any_rank", "check"), None, SCALING),
    ("/mindone_zero/train/grad_sync.py", ("run_optimizer",), None, OPTIMIZER),
    ("/mindone_zero/train/grad_sync.py", None, None, GRAD_SYNC),  # reduce_grads, reduce_and_check, pads, casts
    ("/mindspore/nn/wrap/grad_reducer.py", None, None, GRAD_SYNC),  # nn.TrainOneStepCell's all-reduce
    ("/mindone_zero/core/scaling.py", None, None, SCALING),  # unscale (also in the buckets) and the finite check
    ("/mindone_zero/train/micro_step.py", ("construct",), None, MODEL),  # _ScaledLoss: the loss times the scale
    ("/mindone_zero/train/micro_step.py", None, None, SCALING),  # the scale, the unscale, the overflow agreement
    ("/mindone_zero/train/scale_sense.py", None, None, SCALING),
    ("/mindone_zero/train/train_step.py", ("_final_grads",), None, SCALING),  # the clip
    ("/mindspore/nn/optim/", None, None, OPTIMIZER),
    ("/mindspore/nn/wrap/loss_scale.py", None, None, SCALING),
    ("/mindone_zero/zero3/layers.py", None, None, MODEL),  # a ZeRO-3 layer's own compute (its gathers are deeper)
    ("/mindone_zero/zero3/", None, None, STAGE3),
    ("/mindspore/nn/layer/", None, None, MODEL),
    ("/mindspore/nn/loss/", None, None, MODEL),
    ("", None, None, MODEL),  # the user's model
)

# A node without a stack, by the innermost scope segment (``<attribute>-<Cell class>``) whose
# class or whole segment is named here; else a scope in ``network-`` is the model's.
SCOPES = (
    (("param_ag-BucketedComm",), POST_GATHER),
    (("grad_rs-BucketedComm", "grad_ar-BucketedComm", "dp_ar-BucketedComm"), GRAD_SYNC),
    (("ZeroParamWrapper", "GatherGroup", "_GroupWaiting", "ZeroUnitGather", "ZeroGatherGroup",
      "_HpzPrimary", "_HpzSecondary",
      "_UnitCasts", "_UnitSingle"), STAGE3),
    (("AdamWeightDecay", "Adam", "AdamW", "SGD", "Momentum", "Lamb", "Optimizer"), OPTIMIZER),
    (("DistributedGradReducer",), GRAD_SYNC),
)

# A node is backward work when autodiff made it (its scope), when it runs in a custom bprop, or when it
# is the recompute pass's copy of a forward node (stage 3 recomputes its gathers; the forward nodes of
# a recomputed Cell have a ``recompute_`` scope too, so the scope does not tell)
BACKWARD_SCOPE, BACKWARD_FUNCTION, RECOMPUTED_COPY = "Gradients/", "bprop", "duplicated: Bool(1)"
_NODE = re.compile(r"^  %\d+\(")  # benchmark_compile.NODE: a node line
_OP = re.compile(r"^  %\d+\(.*?\) = ([^\s(]+)")
_FRAME = re.compile(r"# In file (\S+?):(\d+)(~\d+)?,?.*?/(.*)/\s*$")
_DEF = re.compile(r"^\s*(?:async\s+)?def\s+(\w+)")
_NODE_ID = re.compile(r"^  %(\d+)\(")
_READS = re.compile(r"%(\d+)\b")
_SCOPE = re.compile(r"# Scope: \((.*)\)")
_LIBRARY = re.compile(r"/mindspore/|/mindone_zero/(?:core|train|zero3|offload|memory|checkpoint|cli)/")


def op_of(node_line: str) -> str:
    """The primitive of the node line ``node_line`` (``PrimFunc_`` dropped; a subgraph call is ``call``)."""
    found = _OP.match(node_line)
    if found is None:
        raise ValueError(f"For 'op_of', the argument 'node_line' must be an IR node line, but got {node_line!r}.")
    op = found.group(1)
    if op.startswith("@"):
        return "call"
    return op[len("PrimFunc_"):] if op.startswith("PrimFunc_") else op


def _frames(trace: Iterable[str]) -> list:
    """(path, line, function, whether a statement line, code) of each ``# In file`` line of one node,
    outermost first. A function line (``<a>~<b>`` and a ``def``) names the function of the lines
    after it in the same file (None before the first); a range that is no ``def`` is a statement
    over several lines."""
    frames, function, where = [], None, None
    for line in trace:
        found = _FRAME.search(line)
        if found is None:
            continue
        path, number, is_range, text = found.group(1), int(found.group(2)), found.group(3), found.group(4)
        named = _DEF.match(text) if is_range else None
        if named:
            function, where = named.group(1), path
        frames.append((path, number, function if where == path else None, not is_range, text))
    return frames


def _source_part(path: str, function: Optional[str], text: str) -> Optional[str]:
    for fragment, functions, code, part in SOURCES:
        if fragment:
            if fragment not in path:
                continue
        elif _LIBRARY.search(path):
            continue
        if (functions is None or function in functions) and (code is None or code in text):
            return part
    return None


def _scope_part(scope: str) -> Optional[str]:
    segments = scope.split("/")
    for segment in reversed(segments):
        for cells, part in SCOPES:
            if segment in cells or segment.split("-", 1)[-1] in cells:
                return part
    return MODEL if any(s.startswith("network-") for s in segments) else None


def part_of(node: str, scope: str, trace: Iterable[str], emulation=None) -> Optional[str]:
    """The part of the step one node serves by rules 1-4 of the module docstring, from its ``node``
    line, its ``scope`` (the text inside ``# Scope: (...)``) and its ``trace`` lines (its ``# In file``
    lines, outermost first); None where they say nothing (``breakdown`` then asks the node's neighbours).
    ``emulation`` is (comm.py's path, the emulation lines) or None."""
    frames = _frames(trace)
    # statement lines only, as benchmark_compile.count_ir reads them, so that the two counts agree
    if emulation is not None and any(p == emulation[0] and n in emulation[1] and one for p, n, _, one, _ in frames):
        return EMULATION
    part = None
    for path, _, function, _, text in reversed(frames):
        part = _source_part(path, function, text)
        if part is not None:
            break
    if part is None:
        part = STEP if frames else _scope_part(scope)
    if part in (MODEL, STAGE3):
        backward = (scope.startswith(BACKWARD_SCOPE) or RECOMPUTED_COPY in node
                    or any(frame[2] == BACKWARD_FUNCTION for frame in frames))
        return {MODEL: (MODEL_FWD, MODEL_BWD), STAGE3: (STAGE3_FWD, STAGE3_BWD)}[part][backward]
    return part


def _nodes(ir_text: str):
    """(node line, scope, trace lines, the nodes it reads) of every node of ``ir_text``, the last as
    indices into this sequence (``%<n>`` names a node of the same subgraph)."""
    node, scope, trace, names = None, "", [], {}
    nodes = []

    def close():
        reads = [names[int(n)] for n in _READS.findall(node.split(" = ", 1)[-1]) if int(n) in names]
        names[int(_NODE_ID.match(node).group(1))] = len(nodes)
        nodes.append((node, scope, trace, reads))

    for line in ir_text.splitlines():
        if line.startswith("subgraph @"):
            names = {}
        if _NODE.match(line):
            if node is not None:
                close()
            node, scope, trace = line, "", []
        elif node is not None:
            if not line.startswith("      "):  # the node's indented block ended (Return, "}", a new graph)
                close()
                node = None
                continue
            found = _SCOPE.search(line)
            if found:
                scope = found.group(1)
            elif "# In file" in line:
                trace.append(line)
    if node is not None:
        close()
    return nodes


def breakdown(ir_text: str, emulation=None) -> Counter:
    """Nodes of one saved kernel graph ``ir_text`` by (op, part): a ``Counter`` whose total is the
    graph's node count (``benchmark_compile.count_ir``'s). ``emulation``: see ``part_of``.

    A node that ``part_of`` cannot place takes a neighbour's part: an ``UpdateState`` that of the
    side effect it orders (its first input after the monad that has a part, as after an
    ``Assign``); any other node that of its first user that has one (MindSpore's recompute pass adds
    a ``MakeTuple`` and a ``Depend`` without a source before each recomputed node: they serve that
    node); else that of its first input that has one; else it is ``UNTRACED``."""
    nodes = _nodes(ir_text)
    ops = [op_of(node) for node, *_ in nodes]
    parts = [part_of(node, scope, trace, emulation) for node, scope, trace, _ in nodes]
    users = [[] for _ in nodes]
    for i, (_, _, _, reads) in enumerate(nodes):
        for j in reads:
            users[j].append(i)

    def first(candidates):
        return next((parts[j] for j in candidates if parts[j] is not None), None)

    for i, (_, _, _, reads) in enumerate(nodes):  # in order: an input comes before its user
        if parts[i] is None and ops[i] == "UpdateState":
            parts[i] = first(reads[1:])
    for i in reversed(range(len(nodes))):
        if parts[i] is None:
            parts[i] = first(users[i])
    for i, (_, _, _, reads) in enumerate(nodes):
        if parts[i] is None:
            parts[i] = first(reads) or UNTRACED
    return Counter(zip(ops, parts))


def as_rows(counts: Counter) -> list:
    """``counts`` as JSON-able ``[op, part, count]`` rows, in ``PARTS`` order, then most nodes first."""
    order = {part: i for i, part in enumerate(PARTS)}
    return [[op, part, n] for (op, part), n in sorted(counts.items(), key=lambda kv: (order[kv[0][1]], -kv[1],
                                                                                       kv[0][0]))]


def from_rows(rows: Iterable) -> Counter:
    """The ``Counter`` of ``as_rows``' rows."""
    return Counter({(op, part): n for op, part, n in rows})


def table(columns: Iterable[Tuple[str, Iterable]]) -> str:
    """A Markdown table of several steps' breakdowns, ``columns`` being (label, ``as_rows`` rows):
    one line per (part, op) with a subtotal line per part, in ``PARTS`` order, then the totals:
    all nodes, less the CPU emulation (the issue-58 measure), and less the emulation but its
    stand-in all-reduces (``benchmark_compile``'s "less the stand-in": where the backend has the
    collective, each emulation is one native node)."""
    columns = [(label, from_rows(rows)) for label, rows in columns]
    labels = [label for label, _ in columns]
    lines = ["| part | op | " + " | ".join(labels) + " |", "|---|---|" + "---:|" * len(labels)]
    for part in PARTS:
        ops = Counter()
        for _, counts in columns:
            ops.update({op: n for (op, p), n in counts.items() if p == part})
        if not ops:
            continue
        cells = [sum(n for (_, p), n in counts.items() if p == part) for _, counts in columns]
        lines.append(f"| **{part}** | **all** | " + " | ".join(f"**{n}**" for n in cells) + " |")
        for op, _ in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"| {part} | {op} | " + " | ".join(str(counts.get((op, part), 0)) for _, counts in columns)
                         + " |")
    totals = [sum(counts.values()) for _, counts in columns]
    emulated = [sum(n for (_, p), n in counts.items() if p == EMULATION) for _, counts in columns]
    lines.append("| **all parts** | **all** | " + " | ".join(f"**{n}**" for n in totals) + " |")
    stand_ins = [counts.get(("AllReduce", EMULATION), 0) for _, counts in columns]
    lines.append("| **less the CPU emulation** | **all** | "
                 + " | ".join(f"**{t - e}**" for t, e in zip(totals, emulated)) + " |")
    lines.append("| **less the CPU emulation, its all-reduces kept (one per native collective)** | **all** | "
                 + " | ".join(f"**{t - e + k}**" for t, e, k in zip(totals, emulated, stand_ins)) + " |")
    return "\n".join(lines)
