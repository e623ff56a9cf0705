"""``optimizer_offload`` dicts that keep the states in host memory although they name a folder warn,
naming the ignored key and value (docs/guides/offload.md, "Host memory or files"); the others do not."""
import logging

import pytest

from mindone_zero.offload import OffloadConfig

LOGGER = "mindone_zero.offload.config"


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


@pytest.mark.parametrize("value,says", [
    ({"nvme_path": "/nvme"}, ["has no 'device', so it means 'cpu'", "'nvme_path' '/nvme' is ignored"]),
    ({"path": "/mnt/states", "chunk_size": 64}, ["has no 'device'", "'path' '/mnt/states' is ignored"]),
    ({"device": "cpu", "path": "/mnt/states"}, ["has 'device' 'cpu'", "'path' '/mnt/states' is ignored"]),
])
def test_a_folder_with_host_memory_warns_and_names_it(value, says, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    config = OffloadConfig.parse(value, "prepare_train_network")
    assert (config.device, config.path) == ("cpu", None)
    messages = _warnings(caplog)
    assert len(messages) == 1, messages
    for part in ["For 'prepare_train_network', the argument 'optimizer_offload'", "host memory",
                 "set \"device\": \"nvme\""] + says:
        assert part in messages[0], messages[0]


@pytest.mark.parametrize("value", [True, {}, {"device": "cpu"}, {"chunk_size": 64}, False, None])
def test_host_memory_without_a_folder_does_not_warn(value, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    OffloadConfig.parse(value)
    assert _warnings(caplog) == []


def test_files_with_a_folder_do_not_warn(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    for key in ("path", "nvme_path"):
        config = OffloadConfig.parse({"device": "nvme", key: str(tmp_path / key)})
        assert (config.device, config.path) == ("nvme", str(tmp_path / key))
    assert _warnings(caplog) == []
