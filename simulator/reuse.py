"""Plan derivation's simulations kept for reuse (`Engine.simulate_bare`), bounded over all
engines of the process: a search builds engines at many sizes, each simulating hundreds of
plans, and ResNet-50's at batch 1147 takes about 0.8 MB per simulation."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

__all__ = ["BARE_MEMO", "keep"]

#: how many simulations are kept, over all engines (docs/method.md, "Constants")
BARE_MEMO = 64


#: the store (an engine's dict of simulations) of each kept simulation, least recently used
#: first; held here, a store outlives its engine only by simulations still among the last
_kept: OrderedDict[tuple[int, Any], dict[Any, Any]] = OrderedDict()


def keep(store: dict[Any, Any], key: Any) -> None:
    """Mark `store[key]` the most recently used; drop the least recently used beyond
    `BARE_MEMO`, from whichever engine's store keeps it."""
    mark = (id(store), key)
    _kept[mark] = store
    _kept.move_to_end(mark)
    while len(_kept) > BARE_MEMO:
        (_, old), holder = _kept.popitem(last=False)
        holder.pop(old, None)
