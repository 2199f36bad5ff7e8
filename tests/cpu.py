"""What the machine's CPU is, for the few tests whose figures were fitted on one kind of CPU."""

from __future__ import annotations

import functools


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The flags Linux reports for the first CPU (empty where it does not)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def cpu_vendor() -> str:
    """The vendor Linux reports for the first CPU ('GenuineIntel', 'AuthenticAMD', or '')."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
