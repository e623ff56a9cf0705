"""The export tests' network and cases, shared by the msrun worker (workers/export_worker.py) and
the test (test_export_job.py).

``ExportNet``'s shapes on purpose: the Embedding's 10 rows divide by 2 but not by 4, ``fc1``'s 8
rows by both, ``fc2``'s 7 by neither, the LayerNorm's 6 by 2 only; a 0-d float and a non-trainable
int32 Parameter (exported unchanged in every dtype). So MindOne's split rule (the default) shards
some tensors at N=2 and fewer at N=4, and the padded rule shards every tensor with dim 0.
"""
import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from models import SparseCELoss as ExportLoss  # noqa: F401 - the loss Cell of the export tests

DTYPES = (None, "fp32", "fp16", "bf16")
LAYOUTS = ("ckpt", "safetensors", "sharded")
MAX_SHARD_SIZE = 256  # bytes: fc1's fp32 weight takes 192, so most files hold one or two tensors


class ExportNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(10, 6)
        self.norm = nn.LayerNorm((6,))
        self.fc1 = nn.Dense(6, 8)
        self.fc2 = nn.Dense(8, 7)
        self.scale = Parameter(Tensor(1.5, ms.float32), name="scale")
        self.steps = Parameter(Tensor(np.arange(5, dtype=np.int32) * 7 - 3), name="steps", requires_grad=False)

    def construct(self, ids):
        x = self.norm(self.embedding(ids)).mean(1)
        return self.fc2(ops.relu(self.fc1(x))) * self.scale


def init_export_net(net, seed=3):
    """Deterministic float weights (the int Parameter keeps its values)."""
    rng = np.random.default_rng(seed)
    for p in net.get_parameters():
        if p.dtype == ms.float32:
            p.set_data(Tensor(rng.standard_normal(p.shape).astype(np.float32), ms.float32))
    return net


def exports(i):
    """(name, layout, dtype, include_ema) of case ``i``'s exports: every layout once, the dtypes
    rotating with ``i`` so that every (layout, dtype) pair appears among 4 cases; one more sharded
    export without the EMA."""
    out = []
    for k, layout in enumerate(LAYOUTS):
        dtype = DTYPES[(i + k) % 4]
        out.append((f"{layout}_{dtype}", layout, dtype, True))
    dtype = DTYPES[(i + 3) % 4]
    out.append((f"sharded_{dtype}_noema", "sharded", dtype, False))
    return out


def cases():
    """One case per (stage, split rule), numbered for ``exports``."""
    return [dict(name=f"s{stage}_{'pad' if pad else 'mr'}", stage=stage, pad=pad, i=2 * stage + pad)
            for stage in range(4) for pad in (False, True)]


def export_path(root, case_name, export_name, layout):
    """Where an export of a case goes: a file, or a folder for the sharded layout."""
    base = f"{root}/{case_name}/{export_name}"
    return base if layout == "sharded" else f"{base}.{layout}"
