"""For users: part of the demo job (``tools/train.py``); the tests and benchmarks use it too.

The demo job's model and data: a small pre-LN Transformer language model and a
deterministic sequence-reversal task.

The model is built from plain MindSpore Cells (``nn.Embedding``, ``nn.LayerNorm``, ``nn.Dense``
for the attention projections and the MLP) plus a bare ``Parameter`` for the learned positional
embedding, so that at ZeRO stage 3 it exercises both the ``parallel_modules`` wrappers and the
generic path. Its parameter count is ``tools.estimate_memory.transformer_lm_params`` of the same
``model:`` config section (pre-LN decoder, biases everywhere, untied output head).

Task: a sequence of ``num_digits`` random symbols, a separator, then the same symbols reversed.
The model reads the sequence left to right (causal mask) and is scored only on the reversed half,
which is fully determined by the first half; the loss starts at about ``log(vocab_size - 2)``
and falls as attention learns to look back at the mirrored position. Batches are a pure
function of ``(seed, step)``, so every rank and every resumed run sees the same data.
"""
import math
from typing import Tuple

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

__all__ = ["TransformerLM", "LMLoss", "build_lm", "reversal_batch", "init_lm_weights", "SEP", "FIRST_SYMBOL"]

SEP = 1  # separator token; 0 is unused padding, symbols are 2 .. vocab_size - 1
FIRST_SYMBOL = 2
_NEG_INF = -1e9


class Attention(nn.Cell):
    """Multi-head causal self-attention with ``nn.Dense`` q, k, v and output projections."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.q = nn.Dense(d_model, d_model)
        self.k = nn.Dense(d_model, d_model)
        self.v = nn.Dense(d_model, d_model)
        self.out = nn.Dense(d_model, d_model)
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def _heads(self, x, batch, length):
        return x.reshape(batch, length, self.n_heads, self.head_dim).transpose(0, 2, 1, 3)

    def construct(self, x, mask):
        batch, length, d_model = x.shape
        flat = x.reshape(batch * length, d_model)
        q = self._heads(self.q(flat), batch, length)
        k = self._heads(self.k(flat), batch, length)
        v = self._heads(self.v(flat), batch, length)
        scores = ops.matmul(q, k.transpose(0, 1, 3, 2)) * self.scale + mask
        context = ops.matmul(ops.softmax(scores, -1), v)
        context = context.transpose(0, 2, 1, 3).reshape(batch * length, d_model)
        return self.out(context).reshape(batch, length, d_model)


class Block(nn.Cell):
    """Pre-LN decoder block: ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int):
        super().__init__()
        self.ln1 = nn.LayerNorm((d_model,))
        self.attn = Attention(d_model, n_heads)
        self.ln2 = nn.LayerNorm((d_model,))
        self.fc1 = nn.Dense(d_model, d_ff)
        self.act = nn.GELU()
        self.fc2 = nn.Dense(d_ff, d_model)

    def construct(self, x, mask):
        x = x + self.attn(self.ln1(x), mask)
        batch, length, d_model = x.shape
        h = self.fc2(self.act(self.fc1(self.ln2(x).reshape(batch * length, d_model))))
        return x + h.reshape(batch, length, d_model)


class TransformerLM(nn.Cell):
    """Decoder-only Transformer LM; ``construct(ids)`` returns logits ``(batch, length, vocab)``.

    Args:
        vocab_size, d_model, n_layers, d_ff, max_len: sizes (``max_len`` bounds the input length).
        n_heads: attention heads; must divide ``d_model``.

    Raises:
        ValueError: if ``n_heads`` does not divide ``d_model``.
    """

    def __init__(self, vocab_size: int, d_model: int, n_layers: int, d_ff: int, max_len: int, n_heads: int = 2):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(
                f"For 'TransformerLM', the argument 'n_heads' must divide d_model={d_model}, but got {n_heads}."
            )
        self.tok_embedding = nn.Embedding(vocab_size, d_model)
        self.pos_embedding = Parameter(Tensor(np.zeros((max_len, d_model), np.float32)), name="pos_embedding")
        self.blocks = nn.CellList([Block(d_model, n_heads, d_ff) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm((d_model,))
        self.head = nn.Dense(d_model, vocab_size)
        causal = np.triu(np.full((max_len, max_len), _NEG_INF, np.float32), k=1)
        self.causal_mask = Tensor(causal)

    def construct(self, ids):
        batch, length = ids.shape
        x = self.tok_embedding(ids) + self.pos_embedding[:length]
        mask = self.causal_mask[:length, :length]
        for block in self.blocks:
            x = block(x, mask)
        d_model = x.shape[-1]
        logits = self.head(self.ln_f(x).reshape(batch * length, d_model))
        return logits.reshape(batch, length, -1)


class LMLoss(nn.Cell):
    """Mean cross-entropy of ``net``'s next-token predictions over positions where ``weights`` is 1."""

    def __init__(self, net: TransformerLM):
        super().__init__()
        self.net = net
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="none")

    def construct(self, ids, targets, weights):
        logits = self.net(ids)
        vocab = logits.shape[-1]
        per_token = self.ce(logits.reshape(-1, vocab), targets.reshape(-1))
        w = weights.reshape(-1)
        return (per_token * w).sum() / w.sum()


def build_lm(model_cfg: dict) -> TransformerLM:
    """A ``TransformerLM`` from a config's ``model:`` section (keys as in ``TransformerLM``)."""
    keys = ("vocab_size", "d_model", "n_layers", "d_ff", "max_len", "n_heads")
    return TransformerLM(**{k: int(model_cfg[k]) for k in keys if k in model_cfg})


def init_lm_weights(net: nn.Cell, seed: int) -> nn.Cell:
    """Deterministic initial weights by parameter order (identical on every rank and process).

    Dense and embedding weights ~ N(0, 0.02) scaled by ``1/sqrt(fan_in)``-like factors kept
    small for a stable start; biases and LayerNorm beta 0; LayerNorm gamma 1.
    """
    rng = np.random.default_rng(seed)
    for p in net.get_parameters():
        name = p.name
        if name.endswith(("gamma", ".bias", "beta")):
            value = np.ones(p.shape) if name.endswith("gamma") else np.zeros(p.shape)
        else:
            fan_in = p.shape[-1] if len(p.shape) > 1 else 1
            std = 0.02 if "embedding" in name else 1.0 / math.sqrt(fan_in)
            value = rng.standard_normal(p.shape) * std
        p.set_data(Tensor(value.astype(np.float32), p.dtype))
    return net


def reversal_batch(seed: int, step: int, batch: int, num_digits: int, vocab_size: int) -> Tuple[np.ndarray, ...]:
    """(ids, targets, weights) of one global batch, a pure function of its arguments.

    Sequence ``x_1 .. x_k SEP x_k .. x_1`` (``k = num_digits``); ``ids`` is it without its last
    token, ``targets`` without its first, both int32 ``(batch, 2k)``; ``weights`` (float32) is 1
    where the target is a reversed symbol, 0 on the first half (random, unpredictable).
    """
    rng = np.random.default_rng([seed, step])
    digits = rng.integers(FIRST_SYMBOL, vocab_size, size=(batch, num_digits))
    sep = np.full((batch, 1), SEP)
    seq = np.concatenate([digits, sep, digits[:, ::-1]], axis=1).astype(np.int32)
    weights = np.zeros((batch, 2 * num_digits), np.float32)
    weights[:, num_digits:] = 1.0
    return seq[:, :-1].copy(), seq[:, 1:].copy(), weights
