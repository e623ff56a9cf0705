"""Tiny networks shared by the tests: uneven shapes on purpose (DESIGN §7).

``TinyNet`` holds a Dense with 7 outputs, an Embedding with 11 rows, a LayerNorm, a Conv2d
and a 0-d parameter; ``LossNet`` wraps it with softmax cross-entropy times a ``factor`` input
that tests set to inf to inject an overflow.
"""
import numpy as np
import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

VOCAB, SEQ, EMB, CLASSES = 11, 5, 6, 7
GLOBAL_BATCH = 8


class TinyNet(nn.Cell):
    """``with_scalar=False`` drops the 0-d parameter: MindSpore's CPU AdamWeightDecay kernel
    rejects 0-d parameters, whatever the wrapper."""

    def __init__(self, with_scalar=True):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, EMB)
        self.norm = nn.LayerNorm((EMB,))
        self.conv = nn.Conv2d(1, 3, 3, pad_mode="same", has_bias=True)
        self.head = nn.Dense(3 * SEQ * EMB, CLASSES)
        self.with_scalar = with_scalar
        if with_scalar:
            self.temperature = Parameter(Tensor(1.0, ms.float32), name="temperature")

    def construct(self, ids):
        x = self.norm(self.embedding(ids))
        x = self.conv(x.reshape(x.shape[0], 1, SEQ, EMB))
        logits = self.head(x.reshape(x.shape[0], -1))
        if self.with_scalar:
            logits = logits * self.temperature
        return logits


class LossNet(nn.Cell):
    def __init__(self, net):
        super().__init__()
        self.net = net
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, ids, labels, factor):
        return self.ce(self.net(ids), labels) * factor


class SparseCELoss(nn.Cell):
    """``net``'s mean sparse cross-entropy on (inputs, labels); parameters named ``net.*``."""

    def __init__(self, net):
        super().__init__()
        self.net = net
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, inputs, labels):
        return self.ce(self.net(inputs), labels)


def init_weights(net, seed=0):
    """Deterministic weights by parameter order (the same on every rank and process)."""
    rng = np.random.default_rng(seed)
    for p in net.get_parameters():
        value = rng.standard_normal(p.shape).astype(np.float32) * 0.5
        if p.name.endswith("temperature"):
            value = np.array(1.0, np.float32)
        p.set_data(Tensor(value, p.dtype))
    return net


def global_batch(step, seed=1):
    """(ids, labels) of the global batch of ``step``."""
    rng = np.random.default_rng(seed * 1000 + step)
    ids = rng.integers(0, VOCAB, size=(GLOBAL_BATCH, SEQ)).astype(np.int32)
    labels = rng.integers(0, CLASSES, size=(GLOBAL_BATCH,)).astype(np.int32)
    return ids, labels


def micro_batch(step, rank, world, micro, accum):
    """This rank's ``micro``-th micro-batch of the global batch of ``step``."""
    ids, labels = global_batch(step)
    chunks = world * accum
    size = GLOBAL_BATCH // chunks
    k = rank * accum + micro
    return ids[k * size:(k + 1) * size], labels[k * size:(k + 1) * size]


def make_optimizer(params, name="adam", lr=0.01):
    if name == "adamw":
        return nn.AdamWeightDecay(params, learning_rate=lr, weight_decay=0.01)
    if name == "adam":
        return nn.Adam(params, learning_rate=lr, weight_decay=0.01)
    if name == "momentum":
        return nn.Momentum(params, learning_rate=lr, momentum=0.9)
    if name == "sgd":
        return nn.SGD(params, learning_rate=lr)
    raise ValueError(name)


class FactoredOptimizer(nn.Optimizer):
    """Keeps one row statistic per parameter (like Adafactor): states not shaped like the
    parameters, which ZeRO must refuse to shard."""

    def __init__(self, params, learning_rate=0.01):
        super().__init__(learning_rate, params)
        self.row_stats = ms.ParameterTuple([
            Parameter(Tensor(np.zeros(p.shape[:1] + (1,) * max(len(p.shape) - 1, 0), np.float32)), name="row." + p.name)
            for p in self._parameters
        ])

    def construct(self, gradients):
        lr = self.get_lr()
        for i in range(len(gradients)):
            ops.assign_sub(self._parameters[i], gradients[i] * lr)
        return True


def snapshot_params(net):
    """``{name: (shape, values)}`` of every Parameter of ``net``, copied."""
    return {p.name: (tuple(p.shape), p.asnumpy().copy()) for p in net.get_parameters()}


def changed_params(net, before) -> list:
    """The names, sorted, of the Parameters of ``net`` and ``before`` (``snapshot_params``) that are
    in one only, differ in shape or values, or carry a ZeRO shard spec: [] when a rejected call
    modified nothing. For workers that report what they found; tests use ``assert_params_untouched``."""
    after = snapshot_params(net)
    changed = set(before) ^ set(after)
    changed |= {name for name in set(before) & set(after)
                if after[name][0] != before[name][0] or not np.array_equal(after[name][1], before[name][1])}
    changed |= {p.name for p in net.get_parameters() if getattr(p, "zero_spec", None) is not None}
    return sorted(changed)


def assert_params_untouched(net, before):
    """Every Parameter of ``net`` has the names, shapes and values of ``before`` (``snapshot_params``)
    and no ZeRO shard spec: a rejected call modified nothing."""
    assert changed_params(net, before) == []


class GeluNet(nn.Cell):
    """A GELU MLP and a bare parameter (issue 24): its Adam updates expose a difference of rounding
    between two implementations within a few steps. The hidden width (38) divides by 2 and not by
    4; the output width (5) and the bare parameter's 3 rows divide by neither, so at N=2 some
    parameters are sharded by the default rule and some are not (or padded)."""

    IN, HIDDEN, OUT = 13, 38, 5

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(self.IN, self.HIDDEN)
        self.act = nn.GELU(approximate=False)
        self.norm = nn.LayerNorm((self.HIDDEN,))
        self.fc2 = nn.Dense(self.HIDDEN, self.OUT)
        self.offset = Parameter(Tensor(np.zeros((3, self.OUT), np.float32)), name="offset")

    def construct(self, x):
        y = self.fc2(self.norm(self.act(self.fc1(x))))
        return y + self.offset.sum(0)


class GeluLoss(nn.Cell):
    """Mean squared error of ``GeluNet`` times ``factor``."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, x, target, factor):
        return ((self.net(x) - target) ** 2).mean() * factor


def gelu_batch(step, rank, world, batch=4):
    """This rank's batch of ``step`` for ``GeluNet``: different data on every rank and step."""
    rng = np.random.default_rng(7000 + 100 * step + rank)
    x = rng.standard_normal((batch, GeluNet.IN)).astype(np.float32)
    return x, np.tanh(x[:, :GeluNet.OUT] * 2.0).astype(np.float32)


def adamw_groups(net, lr=3e-3):
    """AdamWeightDecay with weight decay on the weights only (MindOne's usual grouping)."""
    params = net.trainable_params()
    decay = [p.name.endswith("weight") for p in params]
    return nn.AdamWeightDecay([{"params": [p for p, d in zip(params, decay) if d], "weight_decay": 0.01},
                               {"params": [p for p, d in zip(params, decay) if not d]}], learning_rate=lr)


_script_ema_op = ops.MultitypeFuncGraph("script_ema_op")


@_script_ema_op.register("Tensor", "Tensor", "Tensor")
def _script_ema_step(decay, ema, weight):
    return ops.assign(ema, ema * decay + weight * (1.0 - decay))


class ScriptEMA(nn.Cell):
    """An EMA as training scripts write their own, with MindOne's interface (none of mindone_zero's
    code): a constant decay, an in-graph update through a HyperMap, a swap cache, and swaps through
    ``set_data`` of new tensors, as MindOne's own EMA swaps."""

    def __init__(self, network, ema_decay=0.8, updates=0):
        super().__init__()
        self.net_weight = ParameterTuple(network.trainable_params())
        self.ema_weight = self.net_weight.clone(prefix="ema")
        self.swap_cache = self.net_weight.clone(prefix="swap", init="zeros")
        self.decay = Tensor(ema_decay, ms.float32)
        self.updates = Parameter(Tensor(updates, ms.float32), name="updates", requires_grad=False)
        self.hyper_map = ops.HyperMap()

    def ema_update(self):
        updates = ops.assign_add(self.updates, Tensor(1.0, ms.float32))
        done = self.hyper_map(ops.partial(_script_ema_op, self.decay), self.ema_weight, self.net_weight)
        return ops.depend(updates, done)

    def swap_before_eval(self):
        for w, c, e in zip(self.net_weight, self.swap_cache, self.ema_weight):
            c.set_data(Tensor(w.asnumpy()))
            w.set_data(Tensor(e.asnumpy()))
        return True

    def swap_after_eval(self):
        for w, c in zip(self.net_weight, self.swap_cache):
            w.set_data(Tensor(c.asnumpy()))
        return True


class LiveArrays(np.ndarray):
    """A numpy view type that counts its instances alive (views and casts of one included): tag an
    array with ``a.view(LiveArrays)``, read ``LiveArrays.live`` (the streamed export's tests)."""

    live = 0

    def __array_finalize__(self, obj):
        LiveArrays.live += 1

    def __del__(self):
        LiveArrays.live -= 1
