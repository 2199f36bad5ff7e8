"""Sizes as people write them (16GiB, 512MiB, 1.5GB, bytes) and as the tool prints them."""

from __future__ import annotations

import re

from simulator.errors import UserError

__all__ = ["byte_unit", "format_bytes", "format_sized", "parse_size"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes in `text` ("16GiB", "512MiB", "1.5GB", "1048576"); ValueError if unparseable."""
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise UserError(
            f"cannot read size {text!r}: use a number with B, KiB, MiB, GiB, KB, MB or GB"
        )
    value = int(round(float(m.group(1)) * _UNITS[unit]))
    if value <= 0:
        raise UserError(f"size {text!r} must be positive")
    return value


def format_bytes(nbytes: int) -> str:
    """`nbytes` in the largest binary unit that keeps the number at least 1, e.g. '1.25 GiB'."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_sized(nbytes: int) -> str:
    """`nbytes` for a person and exactly, e.g. '1.25 GiB (1342177280 B)' ('931 B' once)."""
    shown = format_bytes(nbytes)
    return shown if shown == f"{nbytes} B" else f"{shown} ({nbytes} B)"


def byte_unit(largest: float) -> tuple[float, str]:
    """The unit to plot bytes in so that `largest` reads as a number of at least 1 where it
    can: GiB, MiB or KiB (a 15 MB peak as 15 MiB, not 0.015 GiB)."""
    for shift, name in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if largest >= 1 << shift:
            return float(1 << shift), name
    return 1.0, "B"
