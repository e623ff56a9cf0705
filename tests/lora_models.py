"""A LoRA fine-tune with PEFT's structure, of the suite's own (issue 57), and the same model wrapped by
``mindone.peft`` where it imports.

``LoraLinear`` is written as PEFT's ``lora.Linear`` is (``mindone/peft/tuners/lora/layer.py``): a
``base_layer``, ``CellDict``s of adapters keyed by adapter name, reads through local variables
(``lora_A = self.lora_A[active_adapter]``) and of ``lora_A.weight.dtype`` only. ``LoraNet`` is a small
model whose base (an Embedding, two projections, a head) is frozen, with LoRA on the two projections
and a trainable LayerNorm (PEFT's ``modules_to_save``). Its inputs and outputs are ``TinyNet``'s
(tests/models.py), so ``LossNet`` and the parity jobs' batches serve both.
"""
import numpy as np
from mindspore import Tensor, mint, nn

from models import CLASSES, VOCAB

HID, RANK, ALPHA = 8, 4, 8
ADAPTER = "default"
TARGETS = ("q_proj", "v_proj")


class LoraLinear(nn.Cell):
    """LoRA around a Dense, in PEFT's structure and reading order."""

    def __init__(self, base_layer: nn.Dense, r: int = RANK, alpha: int = ALPHA, adapter: str = ADAPTER):
        super().__init__()
        self.base_layer = base_layer
        self.lora_A = nn.CellDict({adapter: mint.nn.Linear(base_layer.in_channels, r, bias=False)})
        self.lora_B = nn.CellDict({adapter: mint.nn.Linear(r, base_layer.out_channels, bias=False)})
        self.lora_dropout = nn.CellDict({adapter: nn.Identity()})
        self.scaling = {adapter: alpha / r}
        self.active_adapters = [adapter]

    def construct(self, x):
        result = self.base_layer(x)
        result_dtype = result.dtype
        for active_adapter in self.active_adapters:
            lora_A = self.lora_A[active_adapter]
            lora_B = self.lora_B[active_adapter]
            dropout = self.lora_dropout[active_adapter]
            scaling = self.scaling[active_adapter]
            x = x.astype(lora_A.weight.dtype)
            result = result + lora_B(lora_A(dropout(x))) * scaling
        return result.astype(result_dtype)


class LoraBase(nn.Cell):
    """The base model: ids (B, SEQ) -> logits (B, CLASSES)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HID)
        self.norm = nn.LayerNorm((HID,))
        self.q_proj = nn.Dense(HID, HID)
        self.v_proj = nn.Dense(HID, HID)
        self.head = nn.Dense(HID, CLASSES)

    def construct(self, ids):
        h = self.norm(self.embed(ids))
        h = mint.tanh(self.q_proj(h)) + self.v_proj(h)
        return self.head(h.mean(1))


def _init(net, seed=0):
    """Deterministic values by parameter order, LoRA's B non-zero so that every adapter trains from step 1."""
    rng = np.random.default_rng(seed)
    for p in net.get_parameters():
        p.set_data(Tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.5, p.dtype))
    return net


def _freeze_base(net, trainable=("lora_", "norm.")):
    for p in net.get_parameters():
        p.requires_grad = any(key in p.name for key in trainable)
    return net


def build_own_lora():
    """``LoraBase`` with the suite's ``LoraLinear`` on ``TARGETS``; base frozen but the LayerNorm."""
    net = LoraBase()
    for name in TARGETS:
        setattr(net, name, LoraLinear(getattr(net, name)))
    return _freeze_base(_init(net))


def mindone_peft_missing():
    """Why ``mindone.peft`` cannot be used here (None when it can)."""
    try:
        import mindone.peft  # noqa: F401
    except Exception as err:  # noqa: BLE001 - any import failure is a reason to skip
        return f"mindone.peft does not import here ({type(err).__name__}: {err})"
    return None


def build_peft_lora():
    """``LoraBase`` wrapped by ``mindone.peft.get_peft_model`` (LoRA on ``TARGETS``); returns the base
    model with PEFT's layers (``get_base_model()``: mindone.peft's ``PeftModel.construct`` does not
    compile in GRAPH_MODE), the LayerNorm made trainable too."""
    from mindone.peft import LoraConfig, get_peft_model

    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=list(TARGETS), lora_dropout=0.0)
    model = get_peft_model(LoraBase(), config).get_base_model()
    return _freeze_base(_init(model))


def frozen_report(net) -> dict:
    """{name: {split, shape (full), itemsize, held bytes, full bytes}} of ``net``'s frozen Parameters
    (after preparation)."""
    out = {}
    for p in net.get_parameters():
        if p.requires_grad:
            continue
        spec = getattr(p, "zero_spec", None)
        shape = tuple(spec.shape if spec is not None else p.shape)
        out[p.name] = {"split": bool(spec is not None and spec.split), "shape": list(shape), "itemsize": p.itemsize,
                       "held": int(p.nbytes), "full": int(np.prod(shape)) * p.itemsize}
    return out


__all__ = ["LoraLinear", "LoraBase", "build_own_lora", "build_peft_lora", "mindone_peft_missing", "frozen_report"]
