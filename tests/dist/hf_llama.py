"""A tiny Llama in MindSpore with Hugging Face's parameter names and arithmetic, and the Hugging Face
folder it is loaded from: the export tests' hand-back case (tests/dist/test_export_job.py, worker
tests/dist/workers/export_worker.py).

``TinyLlama`` computes what ``transformers``' ``LlamaForCausalLM`` computes for ``CONFIG`` (RMSNorm,
rotary embeddings with ``rotate_half``, grouped-query attention with a causal mask, the SiLU-gated
MLP, an untied head), so that its export, loaded by ``from_pretrained``, gives the same logits.
Its ops all have CPU kernels in MindSpore 2.10. ``write_hf_folder`` writes the folder
``save_pretrained`` would (the ``safetensors`` package's own writer, the index, ``config.json``,
``generation_config.json`` and tokenizer files) without needing ``torch``. Shapes on purpose: at N=2
every matrix's dim 0 divides; at N=4 the vocabulary's 42 rows do not, so they stay whole.
"""
import json
import os

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 42, "hidden_size": 16,
    "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
    "bos_token_id": 1, "eos_token_id": 2,
}
COMPANIONS = {
    "config.json": json.dumps(CONFIG, indent=2),
    "generation_config.json": json.dumps({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}),
    "tokenizer_config.json": json.dumps({"model_max_length": 64, "tokenizer_class": "PreTrainedTokenizerFast"}),
    "special_tokens_map.json": json.dumps({"bos_token": "<s>", "eos_token": "</s>"}),
}
SEQ = 6


def hf_shapes(config=CONFIG):
    """{name: shape} of ``LlamaForCausalLM``'s state dict for ``config``, written out from the config."""
    h, v, m = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * h // config["num_attention_heads"]
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                       p + "mlp.gate_proj.weight": (m, h), p + "mlp.up_proj.weight": (m, h),
                       p + "mlp.down_proj.weight": (h, m), p + "input_layernorm.weight": (h,),
                       p + "post_attention_layernorm.weight": (h,)})
    return shapes


def hf_weights(seed=5):
    """Deterministic float32 weights by name (norm weights near 1)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in sorted(hf_shapes().items()):
        value = rng.standard_normal(shape).astype(np.float32) * 0.2
        out[name] = value + 1.0 if name.endswith("norm.weight") else value
    return out


def write_hf_folder(folder, weights, max_shard_size=2048):
    """The folder ``save_pretrained(max_shard_size=...)`` writes, with the ``safetensors`` package."""
    from safetensors.numpy import save_file

    os.makedirs(folder, exist_ok=True)
    groups, current, used = [], [], 0
    for name in weights:
        if current and used + weights[name].nbytes > max_shard_size:
            groups.append(current)
            current, used = [], 0
        current.append(name)
        used += weights[name].nbytes
    groups.append(current)
    weight_map = {}
    for k, names in enumerate(groups):
        file_name = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: weights[n] for n in names}, os.path.join(folder, file_name), metadata={"format": "pt"})
        weight_map.update({n: file_name for n in names})
    index = {"metadata": {"total_size": sum(v.nbytes for v in weights.values())}, "weight_map": weight_map}
    for name, text in dict(COMPANIONS, **{"model.safetensors.index.json": json.dumps(index)}).items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    return folder


def input_ids(batch=2, seed=9):
    return np.random.default_rng(seed).integers(0, CONFIG["vocab_size"], size=(batch, SEQ)).astype(np.int32)


class _Embedding(nn.Cell):
    def __init__(self, rows, cols):
        super().__init__()
        self.weight = Parameter(Tensor(np.zeros((rows, cols), np.float32)), name="weight")

    def construct(self, ids):
        return ops.gather(self.weight, ids, 0)


class RMSNorm(nn.Cell):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = Parameter(Tensor(np.ones(size, np.float32)), name="weight")
        self.eps = eps

    def construct(self, x):
        return x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + self.eps) * self.weight


def _rotary(config, seq):
    dim = config["hidden_size"] // config["num_attention_heads"]
    inv = 1.0 / (config["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    freqs = np.outer(np.arange(seq, dtype=np.float32), inv)
    emb = np.concatenate([freqs, freqs], -1)
    return Tensor(np.cos(emb), ms.float32), Tensor(np.sin(emb), ms.float32)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return ops.concat((-x[..., half:], x[..., :half]), -1)


class Attention(nn.Cell):
    def __init__(self, config):
        super().__init__()
        h = config["hidden_size"]
        self.heads, self.kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        self.dim = h // self.heads
        self.q_proj = nn.Dense(h, h, has_bias=False)
        self.k_proj = nn.Dense(h, self.kv_heads * self.dim, has_bias=False)
        self.v_proj = nn.Dense(h, self.kv_heads * self.dim, has_bias=False)
        self.o_proj = nn.Dense(h, h, has_bias=False)
        self.cos, self.sin = _rotary(config, SEQ)
        self.mask = Tensor(np.triu(np.full((SEQ, SEQ), -1e9, np.float32), 1))

    def _heads(self, x, n):
        b, t, _ = x.shape
        return x.reshape(b, t, n, self.dim).transpose(0, 2, 1, 3)

    def construct(self, x):
        b, t, _ = x.shape
        q = self._heads(self.q_proj(x), self.heads)
        k = self._heads(self.k_proj(x), self.kv_heads)
        v = self._heads(self.v_proj(x), self.kv_heads)
        q = q * self.cos + _rotate_half(q) * self.sin
        k = k * self.cos + _rotate_half(k) * self.sin
        repeat = self.heads // self.kv_heads
        k = ops.repeat_interleave(k, repeat, 1)
        v = ops.repeat_interleave(v, repeat, 1)
        scores = ops.matmul(q, k.transpose(0, 1, 3, 2)) / float(np.sqrt(self.dim)) + self.mask
        out = ops.matmul(ops.softmax(scores, -1), v)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, t, -1))


class MLP(nn.Cell):
    def __init__(self, config):
        super().__init__()
        h, m = config["hidden_size"], config["intermediate_size"]
        self.gate_proj = nn.Dense(h, m, has_bias=False)
        self.up_proj = nn.Dense(h, m, has_bias=False)
        self.down_proj = nn.Dense(m, h, has_bias=False)

    def construct(self, x):
        return self.down_proj(ops.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Cell):
    def __init__(self, config):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config["hidden_size"], config["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(config["hidden_size"], config["rms_norm_eps"])

    def construct(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Cell):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = _Embedding(config["vocab_size"], config["hidden_size"])
        self.layers = nn.CellList([DecoderLayer(config) for _ in range(config["num_hidden_layers"])])
        self.norm = RMSNorm(config["hidden_size"], config["rms_norm_eps"])

    def construct(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class TinyLlama(nn.Cell):
    """``LlamaForCausalLM`` of ``CONFIG``: ids (batch, SEQ) -> logits (batch, SEQ, vocab)."""

    def __init__(self, config=CONFIG):
        super().__init__()
        self.model = LlamaModel(config)
        self.lm_head = nn.Dense(config["hidden_size"], config["vocab_size"], has_bias=False)

    def construct(self, ids):
        return self.lm_head(self.model(ids))


class CausalLMLoss(nn.Cell):
    """Next-token cross-entropy of ``net`` (parameters named ``net.*``, as a loss Cell makes them)."""

    def __init__(self, net):
        super().__init__()
        self.net = net
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, ids):
        logits = self.net(ids)[:, :-1]
        return self.ce(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
