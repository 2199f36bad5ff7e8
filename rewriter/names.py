"""The names the rewriter gives the ops it adds, and how to tell them apart.

A swap-in and a recompute's copies are named after the op whose output they stand in for, so
that they sort where it did: Grappler sorts the inputs of commutative ops by name (an AddN of a
batch norm's input gradients, say), and an AddN of three or more adds in that order, so a
reader only sums bitwise like the original if its new input takes the old one's place.
"""

from __future__ import annotations

import re

__all__ = [
    "copy_name",
    "is_host_copy",
    "is_swap_in",
    "is_swap_op",
    "is_swap_out",
    "on_device_name",
    "recompute_chain",
    "swap_in_name",
    "swap_out_name",
]

_SWAP_OUT = "swap_out/"
_SWAP_IN = re.compile(r"/swap_in_\d+_\d+(/fetch(/shape)?|/received)?$")
_RECEIVED = "/received"
_FETCH = ("/fetch", "/fetch/shape")
_RECOMPUTE = "recompute_"


def swap_out_name(tensor: str) -> str:
    """The swap-out of `tensor` (its only reader is a swap-in, so its name sorts nowhere)."""
    return _SWAP_OUT + tensor.replace(":", "_")


def swap_in_name(tensor: str, k: int) -> str:
    """Swap-in `k` of `tensor` ('op:port'); an emulated one adds `/fetch` and `/fetch/shape`."""
    op, _, port = tensor.rpartition(":")
    return f"{op}/swap_in_{port}_{k}"


def on_device_name(swap_in: str) -> str:
    """The compute device's receipt of device-mode swap-in `swap_in` (what its readers read)."""
    return f"{swap_in}{_RECEIVED}"


def copy_name(op: str, k: int) -> str:
    """The copy of `op` that recompute `k` of a plan adds."""
    return f"{op}/{_RECOMPUTE}{k}"


def is_swap_out(name: str) -> bool:
    """A swap-out (or a helper that graph partitioning names after one)."""
    return name.startswith(_SWAP_OUT)


def is_swap_op(name: str) -> bool:
    """A swap-out, a swap-in, or a part of an emulated swap-in."""
    return is_swap_out(name) or bool(_SWAP_IN.search(name))


def is_host_copy(name: str) -> bool:
    """Outputs of a rewritten graph's swap-outs (and emulated fetches) live on the host."""
    return is_swap_out(name) or (name.endswith(_FETCH) and is_swap_op(name))


def is_swap_in(name: str) -> bool:
    """The op that waits for a swap-in's trigger: not a part of an emulated one, nor a
    device-mode one's receipt on the compute device."""
    return is_swap_op(name) and not is_swap_out(name) and not name.endswith((*_FETCH, _RECEIVED))


def recompute_chain(name: str) -> str:
    """The `recompute_K` last part of a recompute copy's name ('' for any other op)."""
    last = name.rsplit("/", 1)[-1]
    return last if last.startswith(_RECOMPUTE) else ""
