"""Parameters built without their data (MindSpore's delayed initialisation): reading them one at a
time, whole or as this rank's block, without ever keeping a full copy. Not collective.

[Note: delayed initialisation]
A network built under ``mindspore.nn.utils.no_init_parameters()`` holds Parameters with
``has_init`` True: a shape, a dtype and an initializer, no memory. MindSpore runs the initializer
when the Parameter is first used (``init_data``, called for every Parameter when a graph is
compiled). ZeRO materializes them itself, one at a time, so that no rank ever holds more than its
blocks plus one full tensor:

* a parameter ZeRO-3 splits: ``block_of`` runs the initializer into a numpy array of the full
  shape, cuts this rank's block (``split_array``), and the full array is dropped before the next
  parameter; a ``Zero`` initializer (the optimizer's moments, accumulation buffers) makes the
  block of zeros directly, with no full array at all;
* a parameter kept whole: left unmaterialized, MindSpore initializes it when the graph compiles.

Two MindSpore 2.10 behaviours need care:

* ``Parameter.clone`` (an optimizer's moments, ``ParameterTuple.clone``, MindOne's EMA) copies
  through ``__reduce_ex__``, which builds the copy from the source's ``init_mode`` Tensor outside any
  delayed-initialisation context: it runs the source's initializer (a full tensor per copy, and
  numpy draws; an optimizer built on the full network costs the model's size once more) and leaves
  that Tensor's ``init`` None. The source then fails to initialize (``TypeError: init_data must be
  set Tensor.init``), as in MindOne's order, optimizer first and ``prepare_train_network`` after.
  The Parameter's own ``init`` attribute still names the initializer: ``initializer_of`` reads it
  there, and ``restore_initializer`` puts it back where ``init_data`` looks for it. A Parameter
  built under ``sharded_init`` avoids all this: its class, a subclass of MindSpore's Parameter
  class, copies an unmaterialized instance (``clone``, ``copy.copy``, ``pickle``, ``deepcopy``)
  into an unmaterialized one of the same class, initializer and recorded random state. Every other
  Parameter copies as before: ``Parameter`` itself changes only while a ``sharded_init`` block is
  open, one class attribute replaced and acting only in the block's thread (``parameters_without_data``
  in core/ms_internals.py says why MindSpore leaves no other way). ``set_value`` makes a parameter
  a plain Parameter again.
* A random initializer (``Normal``, ``Uniform``, ``TruncatedNormal``, ``HeUniform``, ``HeNormal``,
  ``XavierUniform``, ``XavierNormal``, ``VarianceScaling``, ``Orthogonal``, ``Sparse``) draws its
  values from numpy's global random state when it runs, as ``init_data`` does. A ``sharded_init``
  Parameter runs it with the state recorded at its creation, so its values equal those of the
  network built eagerly with the same seed (``mindspore.set_seed`` / ``numpy.random.seed``;
  tests/unit/test_delayed_init.py checks each of these initializers). Any other Parameter built
  without data agrees only when materialized right after the build in the order its Parameters
  were created in, nothing having drawn from numpy in between. ``Zero``, ``One``, ``Constant``,
  ``Identity`` and ``Dirac`` draw nothing and always agree. A copy made by ``clone(init='same')``
  (an EMA's weights) does not run its own initializer: it takes its source's value
  (``bind_ema_to_zero``), as it would have eagerly.
"""
import contextlib
import logging
from typing import Optional

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor
from mindspore.common.initializer import (Constant, Dirac, HeNormal, HeUniform, Identity, Initializer, Normal, One,
                                          Orthogonal, TruncatedNormal, Uniform, XavierNormal, XavierUniform, Zero,
                                          initializer)

from .ms_internals import (forget_init_tensor, init_tensor, parameter_base_class, parameter_subclass,
                           parameters_without_data)
from .partition import ShardSpec, split_array

__all__ = ["sharded_init", "is_unmaterialized", "initializer_of", "restore_initializer", "host_value", "block_of",
           "set_value", "materialize", "draws_of"]

_logger = logging.getLogger(__name__)
# What an initializer takes from numpy's global random state when it runs (tests/unit/test_delayed_init.py).
_NO_DRAW = (Zero, One, Constant, Identity, Dirac)
_ONE_DRAW = (Normal, Uniform, TruncatedNormal, HeUniform, HeNormal, XavierUniform, XavierNormal, Orthogonal)
_STATE_ATTR = "_zero_random_state"  # on a Parameter's init Tensor: numpy's state when it was created
_warned = []


def draws_of(init: Initializer) -> Optional[int]:
    """How many numbers ``init`` draws from numpy's global random state: 0, 1, or None (unknown)."""
    if isinstance(init, _NO_DRAW):
        return 0
    return 1 if isinstance(init, _ONE_DRAW) else None


@contextlib.contextmanager
def sharded_init():
    """Build a network without materializing its parameters, keeping the values an eager build gives.

    Within the block, a Parameter made from an initializer (``initializer(...)``, as MindSpore's
    layers make theirs) gets a shape, a dtype and its initializer, but no memory, as under
    ``mindspore.nn.utils.no_init_parameters()``. When the block ends, each such Parameter records
    numpy's random state as the eager build would have found it when creating it, and numpy's state
    is advanced as the eager build would have left it. ZeRO then runs each initializer with its own
    state, whenever it materializes the parameter (``prepare_network``, ``prepare_train_network``, one
    tensor at a time, only this rank's block kept at stage 3), so the values equal those of the
    network built eagerly with the same seed, whatever was built or drawn in between (an optimizer or
    EMA on the full network, as MindOne's scripts do). [Note: delayed initialisation].

    Not collective. Only Parameters made in the calling thread are affected; ``Parameter``'s class
    is as before once the block ends. Parameters made from a Tensor or a numpy array are
    materialized as usual.

    Examples:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from mindone_zero import prepare_train_network, sharded_init
        >>> ms.set_seed(0)
        >>> eager = nn.Dense(4, 2).weight.asnumpy()
        >>> ms.set_seed(0)
        >>> with sharded_init():
        ...     net = nn.Dense(4, 2)            # no parameter memory yet
        >>> net.weight.has_init
        True
        >>> loss_net = nn.WithLossCell(net, nn.MSELoss())
        >>> train_net = prepare_train_network(loss_net, nn.SGD(net.trainable_params()))
        >>> bool(np.array_equal(net.weight.asnumpy(), eager))   # eager values
        True

        At stage 3 on every rank, each rank materializes only its blocks
        (tests/dist/test_sharded_build.py runs these calls):

        >>> with sharded_init():
        ...     network = MyModel(config)
        >>> network = prepare_network(network, zero_stage=3)
    """
    created = []
    try:
        with parameters_without_data(created.append, _copying_class):
            yield
    finally:
        _replay(created)


def _reduce_ex(param, protocol):
    """``copy.copy``, ``Parameter.clone`` and ``pickle`` of a ``sharded_init`` Parameter: unmaterialized
    while it is ([Note: delayed initialisation])."""
    args = _copy_args(param)
    return (_unmaterialized_copy, args) if args is not None else Parameter.__reduce_ex__(param, protocol)


def _deepcopy(param, memo):
    """``copy.deepcopy`` of a ``sharded_init`` Parameter: as ``_reduce_ex``."""
    args = _copy_args(param)
    return _unmaterialized_copy(*args) if args is not None else Parameter.__deepcopy__(param, memo)


def _copy_args(param) -> Optional[tuple]:
    mode = init_tensor(param)
    state = getattr(mode, _STATE_ATTR, None) if mode is not None else None
    if state is None or not param.has_init:
        return None
    return (initializer_of(param), tuple(param.shape), param.dtype, state, param.name, param.requires_grad,
            param.layerwise_parallel)


_COPYING = {}  # MindSpore's Parameter class -> the subclass sharded_init's Parameters are made of


def _copying_class(base: type) -> type:
    """The class of the Parameters ``sharded_init`` makes, over MindSpore's ``base`` class."""
    cls = _COPYING.get(base)
    if cls is None:  # setdefault: threads that get here together all use the class stored first
        hooks = {"__reduce_ex__": _reduce_ex, "__deepcopy__": _deepcopy, "__module__": __name__,
                 "__qualname__": "Parameter"}
        cls = _COPYING.setdefault(base, parameter_subclass(base, hooks))
    return cls


def _unmaterialized_copy(init, shape, dtype, state, name, requires_grad, layerwise_parallel):
    """A new unmaterialized Parameter with ``init`` and the random state recorded for its source."""
    data = initializer(init, shape, dtype)
    setattr(data, _STATE_ATTR, state)
    return _copying_class(parameter_base_class())(data, name, requires_grad, layerwise_parallel)


def _replay(created) -> None:
    """Record, for each Parameter created in ``sharded_init`` (in order), numpy's state at its
    creation in an eager build, and advance numpy's state past its draws."""
    for data in created:
        setattr(data, _STATE_ATTR, np.random.get_state())
        draws = draws_of(data.init)
        if draws == 1:
            np.random.randint(low=1, high=(1 << 63), dtype=np.int64)  # the one draw these make (_numpy_seed)
        elif draws is None:  # unknown: run it (one full tensor, dropped at once)
            initializer(data.init, tuple(data.shape), data.dtype).init_data()


def is_unmaterialized(param) -> bool:
    """Whether ``param`` was built without data (its initializer has not run yet)."""
    return isinstance(param, Tensor) and bool(param.has_init)


def initializer_of(param) -> Optional[Initializer]:
    """The initializer an unmaterialized ``param`` will run, also when a ``clone`` cleared it from
    ``init_mode`` ([Note: delayed initialisation]); None for a Parameter that holds data."""
    if not is_unmaterialized(param):
        return None
    mode = init_tensor(param)
    init = getattr(mode, "init", None) if mode is not None else None
    if init is None:
        init = getattr(param, "init", None)
    if not isinstance(init, Initializer):
        raise ValueError(f"The parameter {param.name!r} was built without data and its initializer is lost "
                         f"(got {init!r}); build the network again, or give it data with set_data.")
    return init


def restore_initializer(param) -> None:
    """Put an unmaterialized ``param``'s initializer back where ``init_data`` reads it, so that
    MindSpore can initialize it when a graph compiles ([Note: delayed initialisation])."""
    init = initializer_of(param)
    mode = init_tensor(param)
    if init is not None and mode is not None and getattr(mode, "init", None) is None:
        mode.init = init


def _as_numpy(tensor: Tensor) -> np.ndarray:
    if tensor.dtype == ms.bfloat16:  # numpy has no bfloat16 arithmetic; float32 holds it exactly
        return tensor.astype(ms.float32).asnumpy()
    return tensor.asnumpy()


def host_value(param) -> np.ndarray:
    """``param``'s full value on the host (bfloat16 as float32). An unmaterialized parameter's
    initializer runs into a new array, which the caller owns; ``param`` itself stays as it is."""
    init = initializer_of(param)
    if init is None:
        return _as_numpy(param)
    state = getattr(init_tensor(param), _STATE_ATTR, None)
    if state is None:
        _warn_random(param, init)
        return _as_numpy(initializer(init, tuple(param.shape), param.dtype).init_data())
    outside = np.random.get_state()
    np.random.set_state(state)
    try:
        return _as_numpy(initializer(init, tuple(param.shape), param.dtype).init_data())
    finally:
        np.random.set_state(outside)


def _warn_random(param, init) -> None:
    """Once per process: a random initializer runs now, not where the eager build ran it."""
    if draws_of(init) == 0 or _warned:
        return
    _warned.append(param.name)
    if type(param) in _COPYING.values():  # made under sharded_init, its initializer replaced since
        how = ("was built under mindone_zero.sharded_init(), but its initializer was replaced afterwards "
               "(set_data(initializer(...)), as mindone.transformers' _init_weights does)")
    else:
        how = "was built under mindspore.nn.utils.no_init_parameters()"
    _logger.warning(
        "The parameter %r %s: its initializer (%s) draws its values now, not at build time, so they differ from "
        "an eager build's when anything drew random numbers in between (an optimizer or EMA built on the full "
        "network does). Load pretrained weights, or build the network under mindone_zero.sharded_init() without "
        "replacing initializers, to get the eager values ([Note: delayed initialisation] in "
        "mindone_zero/core/materialize.py).", param.name, how, type(init).__name__)


def block_of(param, spec: ShardSpec) -> np.ndarray:
    """This rank's block of ``param`` per ``spec`` ([Note: padding]), holding at most one full
    tensor meanwhile, none for a ``Zero`` initializer ([Note: delayed initialisation])."""
    if isinstance(initializer_of(param), Zero):
        dtype = np.float32 if param.dtype == ms.bfloat16 else ms.dtype_to_nptype(param.dtype)
        return np.zeros(spec.shard_shape, dtype)
    return split_array(host_value(param), spec.group_size, spec.rank)


def set_value(param: Parameter, value: np.ndarray, dtype=None) -> None:
    """Replace ``param``'s data with ``value`` (in ``dtype``, by default ``param``'s), dropping what
    delayed initialisation kept on it (a ``sharded_init`` Parameter becomes a plain one). An array
    that owns its memory in that dtype is handed over without a copy: a block of zeros (``block_of``
    of a ``Zero`` initializer) then takes no memory until it is first written."""
    dtype = dtype if dtype is not None else param.dtype
    owned = value.flags.owndata and value.flags.c_contiguous and dtype != ms.bfloat16
    if owned and value.dtype == np.dtype(ms.dtype_to_nptype(dtype)):
        param.set_data(Tensor.from_numpy(value))
    else:
        param.set_data(Tensor(value, dtype))
    forget_init_tensor(param)
    if type(param) in _COPYING.values():
        param.__class__ = type(param).__base__


def materialize(param) -> None:
    """Run an unmaterialized ``param``'s initializer into it now (nothing for one that holds data)."""
    if is_unmaterialized(param):
        set_value(param, host_value(param))
