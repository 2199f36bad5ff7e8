"""The devices of the rewriter's device mode."""

import pytest
import tensorflow as tf

from rewriter.devices import device_pair


def test_device_mode_names_the_devices_it_needs() -> None:
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("a GPU is visible: it is the default compute device")
    with pytest.raises(ValueError, match="no GPU is visible"):
        device_pair(None, "/device:CPU:0")
    with pytest.raises(ValueError, match="CPU:7 is not visible"):
        device_pair("/device:CPU:0", "/CPU:7")
    with pytest.raises(ValueError, match="both /device:CPU:0"):
        device_pair("/cpu:0", "/device:CPU:0")
