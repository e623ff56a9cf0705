"""The train step's loss scale argument (``scale_sense``): its check, and the Parameter that holds it.

``TrainOneStepWrapper`` takes a positive number, a one-element Tensor, or a loss-scale update Cell
such as ``nn.DynamicLossScaleUpdateCell`` (MindSpore's ``TrainOneStepWithLossScaleCell`` contract);
``set_sense_scale`` sets a new value later.
"""
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

__all__ = ["check_scale_sense", "positive_scale", "scale_sense_parameter"]


def check_scale_sense(scale_sense) -> None:
    """Raise unless ``scale_sense`` is a positive number, a one-element Tensor or a loss-scale Cell."""
    if isinstance(scale_sense, nn.Cell):
        if not hasattr(scale_sense, "get_loss_scale"):
            raise TypeError(
                f"For 'TrainOneStepWrapper', the argument 'scale_sense' must be a float, a Tensor or a loss-scale "
                f"update Cell such as nn.DynamicLossScaleUpdateCell, but got {type(scale_sense).__name__}."
            )
    elif isinstance(scale_sense, Tensor):
        if scale_sense.size != 1:
            raise ValueError(
                f"For 'TrainOneStepWrapper', the argument 'scale_sense' must hold one value, but got shape "
                f"{tuple(scale_sense.shape)}."
            )
    elif not (isinstance(scale_sense, (int, float)) and not isinstance(scale_sense, bool) and scale_sense > 0):
        raise ValueError(
            f"For 'TrainOneStepWrapper', the argument 'scale_sense' must be a positive float, a Tensor or a "
            f"loss-scale update Cell, but got {scale_sense!r}."
        )


def positive_scale(sens) -> float:
    """``set_sense_scale``'s argument as a float; raises TypeError unless it is a positive number or a
    one-element Tensor."""
    value = sens.asnumpy().reshape(-1) if isinstance(sens, Tensor) else None
    if value is not None and value.size == 1:
        sens = float(value[0])
    if isinstance(sens, bool) or not isinstance(sens, (int, float)) or not sens > 0:
        raise TypeError(
            f"For 'set_sense_scale', the argument 'sens' must be a positive float or a one-element Tensor, "
            f"but got {sens!r}."
        )
    return float(sens)


def scale_sense_parameter(scale_sense):
    """(Parameter holding the loss scale, update Cell or None) from a checked float, Tensor or Cell."""
    if isinstance(scale_sense, nn.Cell):
        return Parameter(Tensor(scale_sense.get_loss_scale(), ms.float32), name="scale_sense"), scale_sense
    if isinstance(scale_sense, Tensor):
        return Parameter(ops.cast(scale_sense.reshape(()), ms.float32), name="scale_sense"), None
    return Parameter(Tensor(float(scale_sense), ms.float32), name="scale_sense"), None
