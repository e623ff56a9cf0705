"""Tiny networks for the ZeRO-3 network-side tests (shared by unit tests and msrun workers).

``Zero3TestNet`` holds every kind of parameter ``shard_network`` must handle, with dim 0 not
divisible by 2 or 4 on purpose: a Dense with 7 outputs, a Conv2d with 3 output channels, an
Embedding with 11 rows (also read by the top Cell for tied output logits), a LayerNorm, a bare
Parameter read in ``construct``, a Dense subclass with its own ``construct`` (calling
``super().construct``, a helper method and a name-mangled private parameter), a mint Linear,
nesting in SequentialCell and CellList, a 0-d parameter, an opted-out parameter, a
non-trainable parameter, and a Cell type a user override maps (``Shift`` -> ``ShiftZero3``).
"""
import zlib

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, mint, nn, ops
from mindspore.communication import GlobalComm, get_group_size, get_rank
from mindspore.context import ParallelMode
from mindspore.parallel._utils import _get_parallel_mode

from parallel_modules import ZeroParamWrapper

VOCAB, EMB, HID, SEQ, IMG = 11, 6, 7, 3, 4


class Scale(nn.Cell):
    """A bare Parameter read in construct."""

    def __init__(self, n):
        super().__init__()
        self.scale = Parameter(Tensor(np.ones(n, np.float32)), name="scale")

    def construct(self, x):
        return x * self.scale


class MyDense(nn.Dense):
    """A subclass of a wrapped layer with its own construct: super(), a helper, a private param."""

    def __init__(self, cin, cout):
        super().__init__(cin, cout)
        self.__gain = Parameter(Tensor(np.ones(cout, np.float32)), name="gain")

    def construct(self, x):
        return super().construct(x) * self.__gain + self._shift()

    def _shift(self):
        return self.bias.sum() * 0.1


class Shift(nn.Cell):
    """A Cell type the tests map to a user ZeRO-3 class through ``parallel_modules``."""

    def __init__(self, n):
        super().__init__()
        self.offset = Parameter(Tensor(np.zeros(n, np.float32)), name="offset")

    def construct(self, x):
        return x + self.offset


class ShiftZero3(nn.Cell):
    """User ZeRO-3 replacement for ``Shift``, written exactly in the style of MindOne's
    ``mindone.models.modules.parallel.Dense``: it keeps ``self.net``, builds
    ``ZeroParamWrapper(param, zero_stage, optimizer_parallel_group, cell_type)`` and cuts the
    parameter itself when the wrapper says ``need_rewrite`` (ours never does: it has cut it)."""

    def __init__(self, net, zero_stage=0, optimizer_parallel_group=GlobalComm.WORLD_COMM_GROUP, cell_type=None):
        super().__init__(auto_prefix=False)
        self.net = net
        self.set_param_wrapper(zero_stage, optimizer_parallel_group, cell_type)

    @property
    def offset(self):
        return self.net.offset

    def set_param_wrapper(self, zero_stage, optimizer_parallel_group, cell_type=None):
        self.param_wrapper_o = nn.Identity()
        if zero_stage == 3:
            is_parallel = _get_parallel_mode() == ParallelMode.DATA_PARALLEL
            op_group_size = get_group_size(optimizer_parallel_group) if is_parallel else 1
            op_rank_id = get_rank(optimizer_parallel_group) if is_parallel else 0
            self.param_wrapper_o = ZeroParamWrapper(self.net.offset, zero_stage, optimizer_parallel_group, cell_type)
            if self.param_wrapper_o.need_rewrite:
                self.net.offset.assign_value(
                    Tensor.from_numpy(
                        self.net.offset.numpy().reshape(op_group_size, -1, *self.net.offset.shape[1:])[op_rank_id]
                    )
                )

    def construct(self, x):
        return x + self.param_wrapper_o(self.net.offset)


class Zero3TestNet(nn.Cell):
    """See the module docstring. Inputs: ids (B, SEQ) int32, img (B, 1, IMG, IMG) float32."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMB)
        self.conv = nn.Conv2d(1, 3, 3, has_bias=True)
        self.body = nn.SequentialCell([nn.Dense(EMB, HID), nn.LayerNorm((HID,)), Scale(HID)])
        self.blocks = nn.CellList([MyDense(HID, 5), mint.nn.Linear(5, EMB), Shift(EMB)])
        self.temperature = Parameter(Tensor(1.5, ms.float32), name="temperature")
        self.keep = Parameter(Tensor(np.zeros(EMB, np.float32)), name="keep")
        self.keep.parallel_optimizer = False
        self.frozen = Parameter(Tensor(np.ones(EMB, np.float32)), name="frozen", requires_grad=False)

    def construct(self, ids, img):
        h = self.embed(ids).mean(1)
        c = self.conv(img).mean(axis=(2, 3))
        h = h + c.sum(-1, keepdims=True)
        h = self.body(h)
        for i in range(len(self.blocks)):
            h = self.blocks[i](h)
        h = (h + self.keep) * self.frozen * self.temperature
        # Tied output layer: the top Cell reads the Embedding's table directly.
        return ops.matmul(h, self.embed.embedding_table.T)


class NormBlock(nn.Cell):
    """Generic path: a LayerNorm child and a bare Parameter read in construct."""

    def __init__(self, n):
        super().__init__()
        self.norm = nn.LayerNorm((n,))
        self.gain = Parameter(Tensor(np.ones(n, np.float32)), name="gain")

    def construct(self, x):
        return self.norm(x) * self.gain


class Head(nn.Cell):
    """Recomputed as a whole (``recompute()`` on the parent): its Dense child is replaced, its own
    construct is rewritten; the Dense bias is opted out (``parallel_optimizer = False``)."""

    def __init__(self, cin, cout):
        super().__init__()
        self.out = nn.Dense(cin, cout)
        self.out.bias.parallel_optimizer = False
        self.shift = Parameter(Tensor(np.zeros(cout, np.float32)), name="shift")

    def construct(self, x):
        return ops.tanh(self.out(x)) + self.shift


class RecomputeNet(nn.Cell):
    """Cells marked with ``recompute()`` before sharding, each kind once: replaced layers (Embedding,
    Conv2d, Dense), a generic Cell holding a LayerNorm, a LayerNorm itself marked with
    ``use_reentrant=False, early_stop=False``, and a parent whose child layer is replaced; the top
    Cell's own parameter ``out_scale`` is not recomputed. Inputs as ``Zero3TestNet``."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMB)
        self.conv = nn.Conv2d(1, 3, 3, has_bias=True)
        self.proj = nn.Dense(EMB, HID, activation="relu")
        self.block = NormBlock(HID)
        self.norm = nn.LayerNorm((HID,))
        self.head = Head(HID, VOCAB)
        self.out_scale = Parameter(Tensor(np.ones(VOCAB, np.float32)), name="out_scale")

    def construct(self, ids, img):
        h = self.embed(ids).mean(1) + self.conv(img).mean(axis=(2, 3)).sum(-1, keepdims=True)
        return self.head(self.norm(self.block(self.proj(h)))) * self.out_scale


def build_recompute(fp16: bool = False) -> RecomputeNet:
    """A ``RecomputeNet`` with deterministic weights and its recompute marks (``fp16`` is unused)."""
    net = RecomputeNet()
    init_params(net)
    for cell in (net.embed, net.conv, net.proj, net.block, net.head):
        cell.recompute()
    # early_stop=True (the default) on this LayerNorm fails inside MindSpore 2.10 itself, sharded or
    # not ("Stack input_args_info_stack_ is empty" in recompute's unpack hook).
    net.norm.recompute(use_reentrant=False, early_stop=False)
    return net


class Zero3LossNet(nn.Cell):
    """(mean squared error of ``Zero3TestNet``'s logits against targets, the logits)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, ids, img, target):
        out = self.net(ids, img)
        return ((out.astype(ms.float32) - target) ** 2).mean(), out


def init_params(net: nn.Cell) -> None:
    """Deterministic values per parameter name, the same in every process."""
    for _, p in net.parameters_and_names():
        rng = np.random.RandomState(zlib.crc32(p.name.encode()))
        value = rng.uniform(-0.5, 0.5, size=p.shape).astype(np.float32)
        if p.name.endswith(("gain", "scale", "frozen", "gamma")):
            value = value + 1.0
        if p.name == "temperature":
            value = np.array(1.5, np.float32)
        p.set_data(Tensor(value, p.dtype))


def make_batch(seed: int, rank: int, batch: int = 2):
    """(ids, img, target) of one rank, reproducible anywhere from (seed, rank)."""
    rng = np.random.RandomState(seed * 1000 + rank)
    ids = rng.randint(0, VOCAB, size=(batch, SEQ)).astype(np.int32)
    img = rng.normal(size=(batch, 1, IMG, IMG)).astype(np.float32)
    target = rng.normal(size=(batch, VOCAB)).astype(np.float32)
    return Tensor(ids), Tensor(img), Tensor(target)


def build(fp16: bool = False) -> Zero3TestNet:
    """A fresh ``Zero3TestNet`` with deterministic weights; ``fp16`` casts ``body`` and ``blocks``."""
    net = Zero3TestNet()
    init_params(net)
    if fp16:
        net.body.to_float(ms.float16)
        net.blocks.to_float(ms.float16)
    return net
