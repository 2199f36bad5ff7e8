"""The two devices of the rewriter's device mode (`rewriter.apply`): the compute device and
the host, as TensorFlow names them, checked against the devices it sees."""

from __future__ import annotations

from simulator.errors import UserError

__all__ = ["device_pair"]


def device_pair(compute: str | None, host: str) -> tuple[str, str]:
    """The compute and host devices of device mode, checked against the devices TensorFlow
    sees: both must exist and differ (a swap to the same device saves nothing)."""
    import tensorflow as tf

    visible = {_canonical(d.name) for d in tf.config.list_logical_devices()}
    if compute is None:
        gpus = [d for d in sorted(visible) if "GPU" in d]
        if not gpus:
            raise UserError(
                "device mode needs a compute device: no GPU is visible; for a dry run on two "
                "logical CPUs give compute_device='/device:CPU:0', host_device='/device:CPU:1'"
            )
        compute = gpus[0]
    compute, host = _canonical(compute), _canonical(host)
    for what, name in (("compute", compute), ("host", host)):
        if name not in visible:
            raise UserError(
                f"{what} device {name} is not visible to TensorFlow (it sees "
                f"{', '.join(sorted(visible))}); two logical CPUs must be configured before "
                "TensorFlow starts (autotune.use_two_cpus())"
            )
    if compute == host:
        raise UserError(f"compute and host device are both {compute}: nothing would be swapped")
    return compute, host


def _canonical(name: str) -> str:
    """A device name in one spelling: /device:GPU:0 for GPU:0, /GPU:0 or /device:GPU:0."""
    kind, _, index = name.rsplit("/", 1)[-1].removeprefix("device:").partition(":")
    return f"/device:{kind.upper()}:{index or 0}"
