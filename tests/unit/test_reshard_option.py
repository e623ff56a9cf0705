"""reshard_after_forward: a value that is not a bool raises before anything is modified.

In ParallelMode.DATA_PARALLEL (a group of one rank, the ``data_parallel`` fixture), where stage 3
shards the network and writes the split info: outside it nothing would be modified anyway."""
import pytest
import mindspore as ms

from models import LossNet, TinyNet, assert_params_untouched, init_weights, make_optimizer, snapshot_params
from mindone_zero import prepare_network, prepare_train_network
from parallel_modules import shard_network

ms.set_device("CPU")
pytestmark = pytest.mark.usefixtures("data_parallel")

BAD = [
    (2, ValueError, "must be a bool, but got 2; an int (re-gather from a smaller group) is not supported: ZeRO++'s "
                    "hpZ is zeropp={'hpz_group': <group name>}."),
    (0, ValueError, "must be a bool, but got 0;"),
    ("yes", TypeError, "must be a bool, but got 'yes'."),
    (None, TypeError, "must be a bool, but got None."),
]


def _assert_untouched(net, before):
    assert_params_untouched(net, before)
    assert not any(c._has_config_recompute for _, c in net.cells_and_names())


@pytest.mark.parametrize("value,error,text", BAD)
def test_prepare_train_network_rejects(value, error, text, tmp_path):
    net = LossNet(init_weights(TinyNet()))
    before = snapshot_params(net)
    with pytest.raises(error) as info:
        prepare_train_network(net, make_optimizer(net.trainable_params()), zero_stage=3, reshard_after_forward=value,
                              params_split_info=str(tmp_path / "info"))
    assert str(info.value).startswith("For 'prepare_train_network', the argument 'reshard_after_forward' " + text[:17])
    assert text in str(info.value)
    _assert_untouched(net, before)
    assert not (tmp_path / "info").exists()


@pytest.mark.parametrize("value,error,text", BAD)
@pytest.mark.parametrize("entry,where", [(lambda n, v: prepare_network(n, 3, reshard_after_forward=v), "prepare_network"),
                                         (lambda n, v: shard_network(n, reshard_after_forward=v), "shard_network")])
def test_prepare_network_and_shard_network_reject(entry, where, value, error, text):
    net = LossNet(init_weights(TinyNet()))
    before = snapshot_params(net)
    with pytest.raises(error) as info:
        entry(net, value)
    assert str(info.value).startswith(f"For '{where}', the argument 'reshard_after_forward' must be a bool")
    assert text in str(info.value)
    _assert_untouched(net, before)


def test_checked_at_every_stage():
    """Below stage 3 the option changes nothing, but a wrong value is still an error."""
    net = LossNet(init_weights(TinyNet()))
    with pytest.raises(ValueError, match="'reshard_after_forward' must be a bool, but got 1;"):
        prepare_network(net, 0, reshard_after_forward=1)
    assert prepare_network(net, 0, reshard_after_forward=False) is net
