"""Device presets: memory, host link bandwidth, and the properties the per-op cost model needs.

Link figures are the measured per-direction bandwidths in docs/method.md (nominal beside
them); compute properties are the vendors' published SM counts, boost clocks and
memory bandwidths, which Grappler's analytical cost model takes as input.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from simulator.errors import UserError
from simulator.timing import Link

__all__ = ["PRESETS", "DevicePreset", "get_preset"]

GIB = 1 << 30
GB = 10**9


@dataclass(frozen=True)
class DevicePreset:
    """A GPU with its host link: what swapping and the time model need to know."""

    name: str
    memory_bytes: int
    d2h_bytes_per_s: float
    h2d_bytes_per_s: float
    sm_count: int
    clock_mhz: int
    memory_bandwidth_bytes_per_s: float
    description: str
    #: "GPU", or "CPU" for a calibrated CPU (then `sm_count` counts its cores)
    kind: str = "GPU"
    #: each direction's bandwidth while both copy at once, where measured (None: each
    #: direction keeps its own)
    duplex_bytes_per_s: float | None = None
    #: measured per-op times that replace Grappler's (`autotune.calibration.Calibration`)
    calibration: Any = field(default=None, compare=False, repr=False)

    @property
    def link(self) -> Link:
        return Link(self.d2h_bytes_per_s, self.h2d_bytes_per_s, self.duplex_bytes_per_s)

    def with_overrides(
        self, *, memory_bytes: int | None = None, link_bytes_per_s: float | None = None
    ) -> DevicePreset:
        """This preset with memory or link bandwidth given by hand: a bandwidth given is each
        direction's, alone and while the other copies too."""
        out = self if memory_bytes is None else replace(self, memory_bytes=memory_bytes)
        if link_bytes_per_s is not None:
            out = replace(
                out,
                d2h_bytes_per_s=link_bytes_per_s,
                h2d_bytes_per_s=link_bytes_per_s,
                duplex_bytes_per_s=None,
            )
        return out

    def sharing_link(self, replicas: int) -> DevicePreset:
        """This GPU when `replicas` GPUs of one machine share its host link (one PCIe switch):
        they swap at the same time, each at a `replicas`-th of the bandwidth."""
        if replicas == 1:
            return self
        return replace(
            self,
            name=f"{self.name} (link shared by {replicas})",
            d2h_bytes_per_s=self.d2h_bytes_per_s / replicas,
            h2d_bytes_per_s=self.h2d_bytes_per_s / replicas,
            duplex_bytes_per_s=self.duplex_bytes_per_s and self.duplex_bytes_per_s / replicas,
        )


_V100: dict[str, Any] = {
    "sm_count": 80,
    "clock_mhz": 1530,
    "memory_bandwidth_bytes_per_s": 900 * GB,
}

PRESETS: dict[str, DevicePreset] = {
    p.name: p
    for p in (
        DevicePreset(
            "v100-16gb-nvlink2",
            16 * GIB,
            68 * GB,
            68 * GB,
            **_V100,
            description="V100 16 GB on POWER9 with NVLink 2.0 (the papers' machine)",
        ),
        DevicePreset(
            "v100-16gb-pcie3",
            16 * GIB,
            12 * GB,
            12 * GB,
            **_V100,
            description="V100 16 GB on PCIe Gen3 x16",
        ),
        DevicePreset(
            "a100-40gb-pcie4",
            40 * GIB,
            25 * GB,
            25 * GB,
            108,
            1410,
            1555 * GB,
            description="A100 40 GB on PCIe Gen4 x16",
        ),
        DevicePreset(
            "h100-80gb-pcie5",
            80 * GIB,
            53 * GB,
            35 * GB,
            114,
            1755,
            2000 * GB,
            description="H100 80 GB PCIe on PCIe Gen5 x16",
        ),
        DevicePreset(
            "h200-141gb-pcie5",
            141 * GB,
            53 * GB,
            35 * GB,
            132,
            1980,
            4800 * GB,
            description="H200 141 GB on PCIe Gen5 x16 (link as H100)",
        ),
    )
}


def get_preset(name: str) -> DevicePreset:
    """The preset `name`; ValueError listing the presets if there is none."""
    if name not in PRESETS:
        raise UserError(f"unknown device preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]
