"""Host memory as a limit: where swapped tensors live and how much of it a plan may take.

On a GPU machine TensorFlow copies swapped tensors into its pinned host allocator
(`gpu_host_bfc`), which is capped by TF_GPU_HOST_MEM_LIMIT_IN_MB, 64 GiB by default
(tensorflow/core/common_runtime/gpu/gpu_process_state.cc), below what the machine may have.
"""

from __future__ import annotations

import math
import os

from simulator.errors import UserError

__all__ = [
    "PINNED_ENV",
    "default_host_memory",
    "free_ram_bytes",
    "pinned_cap_bytes",
    "pinned_hint",
]

PINNED_ENV = "TF_GPU_HOST_MEM_LIMIT_IN_MB"
#: TensorFlow's default cap of its pinned host allocator, in MiB (64 GiB).
PINNED_DEFAULT_MIB = 1 << 16


def pinned_cap_bytes() -> int:
    """The pinned host allocator's cap this process would get: the environment's, else 64 GiB."""
    text = os.environ.get(PINNED_ENV, "").strip()
    try:
        mib = int(text) if text else PINNED_DEFAULT_MIB
    except ValueError:
        raise UserError(f"{PINNED_ENV}={text!r} is not a whole number of MiB") from None
    return mib << 20


def free_ram_bytes() -> int | None:
    """Memory the machine can still give (MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def default_host_memory(gpu_visible: bool) -> int | None:
    """The host limit when none is given: on a GPU machine the smaller of free RAM and the
    pinned cap; for a device preset without its machine, no limit (the peak is reported)."""
    if not gpu_visible:
        return None
    free = free_ram_bytes()
    cap = pinned_cap_bytes()
    return cap if free is None else min(free, cap)


def pinned_hint(host_peak_bytes: int) -> str | None:
    """What to set when a plan keeps more on the host than the pinned allocator allows."""
    if host_peak_bytes <= pinned_cap_bytes():
        return None
    mib = math.ceil(host_peak_bytes / (1 << 20) * 1.05)
    return f"export {PINNED_ENV}={mib} before training (TensorFlow's pinned host memory cap)"
