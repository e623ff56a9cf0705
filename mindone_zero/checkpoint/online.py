"""Online combine: the full (unpadded) parameters of a ZeRO train network, gathered from the
ranks, in memory or streamed to an inference checkpoint one tensor at a time. Collective over the
world.

[Note: streamed export]
``save_full_checkpoint`` never holds the model on one rank. Every rank builds the same export plan
([Note: export order] in export.py) from the layout alone, then walks the plan's order: each
tensor is gathered (a collective over the optimizer parallel group where the tensor is split),
global rank 0 casts it, writes it and drops it before the next gather; the other ranks drop it at
once. So rank 0 holds about one full tensor (its padded gather, the unpadded slice and the cast
copy) and the others only the gather. When rank 0's writing fails half-way it still takes part in
the remaining gathers, so no rank is left waiting in a collective; then the ranks agree (one
all-reduce) and every rank raises.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from ..core.comm import eager_mode
from .export import (cast_tensor, check_copy_files_from, check_dtype, check_export_path, check_export_target,
                     check_max_shard_size, export_names, plan_export, write_export)
from ..train.inventory import Held
from .layout import Layout, build_layout, world_and_rank
from .naming import check_dir
from .readers import CKPT_DTYPES
from .agreement import agree, attempt
from .resume import _check_train_net

__all__ = ["gather_full_params", "save_full_checkpoint"]


def gather_full_params(train_net, rank0_only: bool = False, include_ema: bool = False, *, names=None,
                       trainable_only: bool = False) -> Dict[str, np.ndarray]:
    """Full, unpadded tensors of ``train_net``'s network (and EMA) on every rank, or on rank 0 only.

    Collective over the world (every rank must call it, with the same arguments): sharded tensors
    (network parameters at stage 3, frozen ones included, EMA weights at stages >= 1) are
    all-gathered over the optimizer parallel group one at a time, eagerly (PYNATIVE for the call, the
    previous mode restored). Whole tensors are copied. Peak extra memory on a rank is the returned
    dict plus one padded tensor: ask for some parameters only (``names``, ``trainable_only``) to hold
    an adapter, not the model. A ``save_pretrained(state_dict=...)`` that wants MindSpore tensors
    gets ``{name: mindspore.Tensor(value) for name, value in full.items()}``.

    Args:
        train_net (TrainOneStepWrapper): from ``prepare_train_network``.
        rank0_only (bool): other ranks take part in the gathers but return ``{}``.
        include_ema (bool): add the EMA weights under their names ``ema.<param name>``.
        names (Iterable[str]): only these (network parameter names, ``ema.<param name>`` for EMA
            weights); None (default): every one.
        trainable_only (bool): only the network's trainable parameters (``requires_grad``), and
            the EMA weights with ``include_ema``.

    Returns:
        dict: parameter name -> numpy array, in the network's order, then the EMA's.

    Raises:
        TypeError: ``train_net`` is not a TrainOneStepWrapper, ``names`` is a str or holds a
            non-str, ``trainable_only`` is not a bool.
        ValueError: ``include_ema`` is True but ``train_net`` has no EMA; ``names`` holds a name
            that ``train_net`` does not have (or that ``trainable_only`` leaves out).

    Examples:
        >>> from mindspore import nn
        >>> from mindone_zero import EMA, gather_full_params, prepare_train_network
        >>> dense = nn.Dense(4, 2)
        >>> net = nn.WithLossCell(dense, nn.MSELoss())
        >>> optimizer = nn.AdamWeightDecay(net.trainable_params())
        >>> train_net = prepare_train_network(net, optimizer, ema=EMA(dense))
        >>> full = gather_full_params(train_net, include_ema=True)
        >>> sorted(full), full["weight"].shape
        (['bias', 'ema.bias', 'ema.weight', 'weight'], (2, 4))

        At stage 3, on every rank (tests/dist/test_checkpoint_resume.py runs this call):

        >>> full = gather_full_params(train_net, rank0_only=True)  # {} on others

        A LoRA adapter only, handed to ``mindone.peft``'s ``save_pretrained`` on rank 0 (its
        names without the loss Cell's ``net.``; tests/dist/test_gathered.py runs these calls):

        >>> full = gather_full_params(train_net, rank0_only=True, trainable_only=True)
        >>> adapter = {k[len("net."):]: ms.Tensor(v) for k, v in full.items()}
        >>> peft_model.save_pretrained("adapter", state_dict=adapter,
        ...                            is_main_process=rank == 0)
    """
    caller = "gather_full_params"
    _check_train_net(train_net, caller)
    _check_include_ema(train_net, include_ema, caller)
    layout = build_layout(train_net, caller)
    items = _selected(_full_items(train_net, layout, include_ema), names, trainable_only, caller)
    keep = not rank0_only or layout.rank == 0
    out = {}
    with eager_mode():
        for it in items:
            value = _full_value(train_net, layout, it)
            if keep:
                out[it.param.name] = value
    return out


def _check_include_ema(train_net, include_ema: bool, caller: str) -> None:
    if include_ema and train_net.ema is None:
        raise ValueError(f"For '{caller}', the argument 'include_ema' is True, but 'train_net' has no EMA.")


def _full_items(train_net, layout, include_ema: bool) -> List:
    """The network's ``Held`` items, then (``include_ema``) the EMA weights'."""
    items = layout.items["network"]
    if include_ema:  # the EMA weights, not a scratch swap cache the EMA may keep beside them
        weights = {id(e) for e in train_net.ema.ema_weight}
        items = items + [it for it in layout.items["ema"] if id(it.param) in weights]
    return items


def _selected(items: List, names, trainable_only: bool, caller: str) -> List:
    """The ``items`` that ``names`` and ``trainable_only`` ask for (checked first: nothing is gathered
    when one is wrong)."""
    if not isinstance(trainable_only, bool):
        raise TypeError(f"For '{caller}', the argument 'trainable_only' must be a bool, but got {trainable_only!r}.")
    if trainable_only:
        items = [it for it in items if it.kind != "params" or it.param.requires_grad]
    if names is None:
        return items
    names = names if isinstance(names, str) else list(names)
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"For '{caller}', the argument 'names' must be an iterable of str (parameter names), but got "
                        f"{names!r}.")
    wanted = set(names)
    unknown = sorted(wanted - {it.param.name for it in items})
    if unknown:
        raise ValueError(f"For '{caller}', the argument 'names' holds names that 'train_net' does not have"
                         f"{' among its trainable parameters' if trainable_only else ''}: {unknown[:5]}.")
    return [it for it in items if it.param.name in wanted]


def _is_gathered(layout, it) -> bool:
    """Whether ``it`` is split over the optimizer parallel group, so that its full value is a collective."""
    return bool(it.held.split) and layout.op_size > 1


def _full_value(train_net, layout, it) -> np.ndarray:
    """The full, unpadded value of one ``Held`` item, as a new numpy array. Collective over the
    optimizer parallel group when ``_is_gathered``; call it in eager mode."""
    if _is_gathered(layout, it):
        return train_net.grad_sync.op_comm.all_gather(it.param).asnumpy()[:it.held.shape[0]]
    return it.param.asnumpy()


def save_full_checkpoint(train_net, path, include_ema: bool = False, *, dtype=None, max_shard_size=None,
                         strip_prefix=None, add_prefix=None, copy_files_from=None) -> str:
    """Write the full network (and EMA) as an inference checkpoint, streamed one tensor at a time.

    Collective: every rank must call it, with the same arguments; it returns when the export
    exists. Each tensor is gathered on every rank and written by global rank 0 before the next
    one is gathered ([Note: streamed export]): rank 0 holds about one full tensor at a time, never
    the model. The names are the network's (EMA weights: ``ema.<param name>``), so
    ``mindspore.load_checkpoint`` / ``load_param_into_net`` load the file into the unsharded
    network; with ``dtype=None`` it holds the same bytes as ``mindspore.save_checkpoint`` of the
    gathered tensors would (safetensors files declare ``{"format": "pt"}``, which ``transformers``
    and ``mindone.transformers`` read: [Note: safetensors metadata] in writers.py). Every file is
    written atomically; arguments are checked, and the ranks agree on them, before any gather or
    file.

    A model loaded from a Hugging Face folder is handed back as one: ``max_shard_size`` writes the
    sharded layout, ``strip_prefix`` takes off the loss Cell's prefix ([Note: export names] in
    export.py) and ``copy_files_from`` copies the folder's config and tokenizer files ([Note:
    companion files] in hf_folder.py), so that ``transformers``' ``from_pretrained`` loads the
    export.

    Args:
        train_net (TrainOneStepWrapper): from ``prepare_train_network``.
        path (str): a file ending with ``.ckpt`` or ``.safetensors``; with ``max_shard_size``, a
            folder (no such extension) that does not exist or is empty ([Note: export folder] in
            export.py: a non-empty folder is never replaced). Parent folders are created.
        include_ema (bool): also store the EMA weights (``ema.<param name>``).
        dtype: None (each tensor as held), ``"fp32"``, ``"fp16"``, ``"bf16"`` (or
            ``mindspore.float32`` / ``float16`` / ``bfloat16``): floating tensors are written in
            that dtype (numpy's rounding); other tensors unchanged.
        max_shard_size (int or str): bytes (``5000000000``, ``"5GB"``, ``"500MB"``, ``"2GiB"``);
            set, ``path`` becomes a folder in the Hugging Face sharded layout
            (``model-0000k-of-0000n.safetensors`` and ``model.safetensors.index.json``,
            [Note: sharded layout] in hf_index.py). None: one file.
        strip_prefix (str): taken off the front of every parameter name that has it (e.g.
            ``"net."``, which a loss Cell holding the network as ``net`` adds); None keeps the names.
        add_prefix (str): then put in front of every parameter name. EMA weights keep ``ema.`` in
            front of their mapped name.
        copy_files_from (str): with ``max_shard_size``, a folder (the one the model was loaded from)
            whose non-weight files at its top (``config.json``, ``generation_config.json``, the
            tokenizer's files) are copied as they are into the export; weight files and indexes are
            never copied. The names copied are logged (INFO) on rank 0. None copies nothing.

    Returns:
        str: ``path``.

    Raises:
        TypeError: ``train_net`` is not a TrainOneStepWrapper; ``path`` is not a path.
        ValueError: ``path`` has another extension (or, sharded, any of these extensions, or is a
            file or a non-empty folder); ``dtype`` or ``max_shard_size`` is not one of the values
            above; ``include_ema`` without an EMA; prefixes that give two tensors one name;
            ``copy_files_from`` without ``max_shard_size`` or not an existing folder. Raised on
            every rank when any rank finds it.
        RuntimeError / OSError: writing failed (raised on rank 0, reported on the others).

    Examples:
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from mindone_zero import prepare_train_network, save_full_checkpoint
        >>> net = nn.WithLossCell(nn.Dense(4, 2), nn.MSELoss())
        >>> optimizer = nn.AdamWeightDecay(net.trainable_params())
        >>> train_net = prepare_train_network(net, optimizer)
        >>> save_full_checkpoint(train_net, "model.safetensors", dtype="bf16")
        'model.safetensors'
        >>> sorted(ms.load_checkpoint("model.safetensors", format="safetensors"))
        ['bias', 'weight']

        A Hugging Face folder from a stage-3 job, on every rank (tests/dist/test_export_job.py runs
        these calls):

        >>> save_full_checkpoint(train_net, "export", max_shard_size="5GB",
        ...                      strip_prefix="net.", copy_files_from="llama-7b")
    """
    caller = "save_full_checkpoint"
    _check_train_net(train_net, caller)
    checked, error = attempt(lambda: _check_save_args(train_net, path, include_ema, dtype, max_shard_size,
                                                      (strip_prefix, add_prefix), copy_files_from, caller))
    agree(train_net, error, caller)
    path, target, layout, items = checked.path, checked.target, checked.layout, checked.items
    entries = [(name, it.held.shape, _numpy_dtype(it.param)) for name, it in items.items()]
    plan = plan_export(entries, checked.fmt, target, checked.max_size)
    pending = list(reversed(plan.order))  # popped in order: the gathers every rank makes

    def gather(name):
        if name != pending[-1]:  # out of the plan's order, the ranks would meet in different collectives
            raise RuntimeError(f"For '{caller}', the writer asked for {name!r} where the plan has {pending[-1]!r}.")
        pending.pop()
        return _full_value(train_net, layout, items[name])

    error = None
    with eager_mode():
        if layout.rank == 0:
            _, error = attempt(lambda: write_export(path, plan, lambda name: cast_tensor(gather(name), target),
                                                    copy_files=checked.copies))
        while pending:  # every gather this rank has not made yet; on rank 0 only after a failure
            name = pending[-1]
            if _is_gathered(layout, items[name]):
                gather(name)
            else:
                pending.pop()
    agree(train_net, error, caller)
    return path


@dataclass(frozen=True)
class _SaveArgs:
    """``save_full_checkpoint``'s arguments, checked."""

    path: str
    fmt: str
    target: Optional[np.dtype]  # floating tensors' exported dtype; None: as held
    max_size: Optional[int]  # bytes per file of the sharded layout; None: one file
    layout: Layout
    items: Dict[str, Held]  # exported name -> what is gathered, in the network's order, then the EMA's
    copies: List[str]  # files copied into the folder (global rank 0 only)


def _check_save_args(train_net, path, include_ema, dtype, max_shard_size, prefixes, copy_files_from,
                     caller) -> _SaveArgs:
    """``save_full_checkpoint``'s arguments, checked; the file system is looked at on global rank 0
    only, the rank that writes."""
    path = check_dir(path, caller, "path")
    target = check_dtype(dtype, caller)
    max_size = check_max_shard_size(max_shard_size, caller)
    fmt = check_export_path(path, max_size is not None, caller)
    _check_include_ema(train_net, include_ema, caller)
    layout = build_layout(train_net, caller)
    held = _full_items(train_net, layout, include_ema)
    items = dict(zip(export_names([it.param.name for it in held], *prefixes, caller), held))
    writer = world_and_rank()[1] == 0
    copies = check_copy_files_from(copy_files_from, max_size is not None, caller, look=writer)
    if writer:
        check_export_target(path, max_size is not None, caller)
    return _SaveArgs(path, fmt, target, max_size, layout, items, copies)


def _numpy_dtype(param) -> np.dtype:
    """The numpy dtype ``param.asnumpy()`` returns (bfloat16: the one importing mindspore registers)."""
    return np.dtype(CKPT_DTYPES[str(param.dtype)])
