"""The search space: the ranges of the swap parameters on one graph, how a trial draws them,
and the fixed parameter sets the search starts from or compares with."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from simulator.engine import Engine
from simulator.errors import UserError
from simulator.params import (
    LEAST_MEMORY,
    PARAMS,
    RECOMPUTE_HEAVY,
    RECOMPUTE_MAX_OPS,
    RECOMPUTE_MODES,
    Draw,
    PlanParams,
)

__all__ = [
    "LEAST_MEMORY_ORDERED",
    "RECOMPUTE_CHOICES",
    "RECOMPUTE_ONLY",
    "Space",
    "check_recompute",
    "moved",
]

#: The plan that saves the most memory, with order edges and backward tensors swapped too: ours'
#: second warm start.
LEAST_MEMORY_ORDERED = replace(LEAST_MEMORY, serialize=True)
#: The recompute-only baseline, checkpointing as `tf.recompute_grad` does: no swapping, every
#: chain of up to RECOMPUTE_MAX_OPS pure ops recomputed, convolutions too whatever they cost
#: (with a time model to weigh them by; else cheap chains only).
RECOMPUTE_ONLY = PlanParams(
    n_tensors=0, recompute="cheap", recompute_ops=RECOMPUTE_MAX_OPS, recompute_heavy=1e6
)
#: The last warm start lets the forward pass run this share of the levels ahead of the link
SYNC_LAG_SHARE = 64
#: What a run lets the search do with recomputes: search whether (the default), or fix a mode.
RECOMPUTE_CHOICES = ("search", *RECOMPUTE_MODES)
#: The axes the pattern search steps along, in the order it queues their moves (it queues a
#: few at a time: `autotune.search.trials.REFINE_BATCH`): the swapped tensors first
MOVES = (
    "n_tensors",
    "ub",
    "threshold",
    "sync_lag",
    "groupby",
    "recompute_ops",
    "prefetch_bytes",
    "backward_swaps",
    "postpone_waits",
    "recompute_heavy",
)
#: The parameters the tuner draws, with how, in the order it draws them
_DRAWN = tuple((p, p.draw) for p in PARAMS if p.draw is not None)
_DRAWS = dict((p.name, d) for p, d in _DRAWN)


def _key_of(name: str, draw: Draw) -> str:
    """A parameter's name in a trial (a share of the budget is named after its gate)."""
    return f"{draw.gate}_share" if draw.kind == "share" else name


def _moves(draw: Draw, x: Any) -> list[Any]:
    """The values one pattern-search step from `x` (before clamping to the range)."""
    if draw.move == "scale":
        return [round(x * f) for f in (0.8, 0.9, 0.97, 1.03)]
    if draw.move in ("double", "halve"):
        up, down = max(2 * x, 2), x // 2
        return [up, down] if draw.move == "double" else [down, up]
    if draw.move == "one":
        return [x - 1, x + 1]
    if draw.move == "nudge":
        return [round(x - 0.05, 4), round(x + 0.05, 4)]
    i = draw.values.index(x)  # "next"
    return [draw.values[max(i - 1, 0)], draw.values[min(i + 1, len(draw.values) - 1)]]


def _sorted(params: dict[str, Any], moved: dict[str, Any]) -> dict[str, Any]:
    """`moved` (a move from `params`) with each parameter drawn under its lower end (unsorted,
    as `ub` under `lb`) taking that end along: `lb` follows `ub` down."""
    for param, draw in _DRAWN:
        name = param.name
        if draw.below and params.get(name, 1) < params.get(draw.below, 1):
            moved = {**moved, draw.below: min(moved[draw.below], moved[name])}
    return moved


def moved(base: dict[str, Any], params: dict[str, Any]) -> tuple[str, bool] | None:
    """The one axis trial parameters `params` moved along from `base`, and whether up (None
    if not one); parameters only one of them has (drawn under a condition) do not count."""
    keys = [k for k in base.keys() & params.keys() if base[k] != params[k]]
    return (keys[0], params[keys[0]] > base[keys[0]]) if len(keys) == 1 else None


def check_recompute(recompute: str) -> str:
    """`recompute` if it is one of RECOMPUTE_CHOICES, else a UserError."""
    if recompute not in RECOMPUTE_CHOICES:
        raise UserError(f"recompute must be one of {', '.join(RECOMPUTE_CHOICES)}")
    return recompute


@dataclass(frozen=True)
class Space:
    """The parameter ranges of one graph: its forward swap candidates (all of them, and only
    then, may bring the backward ones: `PlanParams.backward_swaps`) and its number of levels,
    and whether recomputes are searched ("search") or fixed ("none", "cheap")."""

    candidates: int
    levels: int
    recompute: str = "search"
    #: the budget prefetching keeps the live bytes under a share of (0: no prefetch searched)
    budget_bytes: int = 0
    #: the budget plans aim under (`PlanParams.limit`; 0: none)
    limit_bytes: int = 0

    def __post_init__(self) -> None:
        check_recompute(self.recompute)

    @classmethod
    def of(cls, engine: Engine, recompute: str = "search", budget_bytes: int = 0) -> Space:
        n = max(1, sum(not c.made_in_backward for c in engine.context.candidates))
        timed = engine.timeline is not None and engine.device is not None
        levels = max(2, engine.order.n_levels)
        return cls(n, levels, recompute, budget_bytes if timed else 0, budget_bytes)

    def suggest(self, trial: Any) -> PlanParams:
        """The parameters a trial proposes, drawn as `PARAMS` says, in its order."""
        drawn: dict[str, Any] = {}
        fields: dict[str, Any] = {}
        for param, draw in _DRAWN:
            if not self._holds(draw, drawn, trial.params):
                continue
            if draw.gate and not trial.suggest_categorical(draw.gate, [False, True]):
                continue
            value = self._draw(trial, param.name, draw)
            drawn[param.name] = value
            fields[param.name] = self._value(draw, value)
            if draw.below and value < drawn[draw.below]:
                fields[draw.below], fields[param.name] = value, drawn[draw.below]
        if self.recompute != "search":
            fields.setdefault("recompute", self.recompute)
        return PlanParams(**fields)

    def _draw(self, trial: Any, name: str, draw: Draw) -> Any:
        """One trial parameter drawn (for a "budget" draw: nothing, the budget is taken)."""
        if draw.kind == "budget":
            return self.limit_bytes
        if draw.kind == "choice":
            return trial.suggest_categorical(name, list(draw.values))
        low, high = self._range(draw)
        if draw.kind == "int":
            return trial.suggest_int(name, int(low), int(high), log=draw.log)
        return trial.suggest_float(_key_of(name, draw), low, high, log=draw.log)

    def _value(self, draw: Draw, drawn: Any) -> Any:
        """The plan's value for what a trial drew (its ends as they stand, a share in bytes)."""
        low, high = self._range(draw)
        if draw.top is not None and drawn == high:
            return draw.top
        if draw.bottom is not None and drawn == low:
            return draw.bottom
        if draw.kind == "share":
            return int(self.budget_bytes * drawn)
        return drawn

    def _range(self, draw: Draw) -> tuple[float, float]:
        ranges = {"levels": self.levels, "candidates": self.candidates, "fewest": self._fewest()}
        low, high = (ranges[x] if isinstance(x, str) else x for x in (draw.low, draw.high))
        return low, high

    def _holds(self, draw: Draw, params: dict[str, Any], trial: dict[str, Any]) -> bool:
        """Whether each of a draw's conditions holds, given what was drawn before it."""
        cheap = params.get("recompute", self.recompute) == "cheap"
        facts = {
            "timed": bool(self.budget_bytes),
            "searched": self.recompute == "search",
            "recomputes": self.recompute != "none",
            "every": params.get("n_tensors") == self.candidates,
            "cheap": cheap,
            "aims": cheap or bool(params.get("backward_swaps")),
        }
        return all(facts[c] if c in facts else bool(trial.get(c)) for c in draw.when)

    def _fewest(self) -> int:
        """The fewest tensors a trial swaps: none only where recomputes may free memory."""
        return 1 if self.recompute == "none" else 0

    def of_params(self, p: PlanParams) -> dict[str, Any]:
        """Trial parameters that give `p` (sizes clamped to this graph's ranges)."""
        out: dict[str, Any] = {}
        for param, draw in _DRAWN:
            if draw.kind == "budget" or not self._holds(draw, out, out):
                continue
            value = getattr(p, param.name)
            if draw.gate:
                out[draw.gate] = bool(value)
                if not value:
                    continue
            out[_key_of(param.name, draw)] = self._trial_value(draw, value)
        return out

    def _trial_value(self, draw: Draw, value: Any) -> Any:
        """What a trial draws to give the plan's `value` (nearest within the range)."""
        if draw.kind == "choice":
            if isinstance(value, float):
                return min(draw.values, key=lambda x: abs(x - value))
            return value
        low, high = self._range(draw)
        if draw.top is not None and value == draw.top:
            return high
        if draw.kind == "share":
            value = value / self.budget_bytes
        return min(max(value, low), high)

    def least_memory(self) -> dict[str, Any]:
        """The corner that saves the most memory: every candidate, synchronized swap-outs,
        swap-ins just before their readers, order edges; if anything fits, this usually does."""
        return self.of_params(LEAST_MEMORY_ORDERED)

    def starts(self) -> list[dict[str, Any]]:
        """A new study's first trials: the original defaults, the least-memory plan (backward
        tensors swapped too) and, when recomputes are searched, the least-memory plan with them
        and recompute only; with a time model, last, the least-memory plan without backward
        swaps (with recomputes unless the run forbids them) with its swap-ins as early as the
        budget leaves room for (its swap-outs waited for where their copies should end), that
        plan with the backward swaps the budget needs, and both again with the forward pass let
        run 1/SYNC_LAG_SHARE of the levels ahead of its swap-outs instead, and the two without
        backward swaps again with their waits left at the readers or the lag, and the two with
        backward swaps again recomputing through convolutions and matrix products wherever
        that costs less than the transfers it saves, by chains as long as the search allows
        (a batch norm, its activation and the next convolution are 7 ops), unless the run
        forbids recomputes."""
        out = [self.defaults(), self.least_memory()]
        if self.recompute == "search":
            cheap = replace(
                LEAST_MEMORY_ORDERED, recompute="cheap", recompute_ops=RECOMPUTE_MAX_OPS
            )
            out += [self.of_params(cheap), self.of_params(RECOMPUTE_ONLY)]
        if self.budget_bytes:
            mode = "none" if self.recompute == "none" else "cheap"
            early = replace(
                LEAST_MEMORY_ORDERED,
                recompute=mode,
                prefetch_bytes=self.budget_bytes,
                backward_swaps=False,
            )
            lagged = replace(early, sync_lag=max(2, self.levels // SYNC_LAG_SHARE))
            ahead = [replace(p, backward_swaps=b) for p in (early, lagged) for b in (False, True)]
            ahead += [replace(p, postpone_waits=False) for p in (early, lagged)]
            if mode == "cheap":
                ahead += [
                    replace(
                        p,
                        backward_swaps=True,
                        recompute_heavy=RECOMPUTE_HEAVY[-1],
                        recompute_ops=RECOMPUTE_MAX_OPS,
                    )
                    for p in (early, lagged)
                ]
            out += [self.of_params(p) for p in ahead]
        return out

    def neighbours(
        self, params: dict[str, Any], swapped: int | None = None
    ) -> list[dict[str, Any]]:
        """Trial parameters one step from `params` along one axis each (`Draw.move`), the axes
        in MOVES' order: fewer or more swapped tensors (counted from `swapped`, the tensors its
        plan swapped, when given: `n_tensors` caps the swaps, and recomputes and the threshold
        leave fewer), a swap-in window, threshold, forward lag and fusion distance halved or
        doubled, a recompute chain one op shorter or longer, a prefetch share 0.05 apart,
        backward swaps and postponed waits on or off, the next heavy-recompute share."""
        out: list[dict[str, Any]] = []
        for name in MOVES:
            draw = _DRAWS[name]
            key = _key_of(name, draw)
            if key not in params:
                continue
            if draw.move == "flip":
                out.append({**params, key: not params[key]})
                continue
            x = params[key] if name != "n_tensors" or swapped is None else min(params[key], swapped)
            low, high = self._range(draw)
            for value in _moves(draw, x):
                if draw.kind != "choice":
                    value = min(max(value, low), high)
                if value != params[key]:
                    out.append({**params, key: value})
        return [self._with_backward(_sorted(params, q)) for q in out]

    def beyond(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
        """The trial two moves past `b`, on from `a`, along the one axis `b` moved along from
        `a` (None if they differ otherwise, the axis is a flip, or the range ends at `b`): on
        past a move that paid (a pattern move), or past one that changed nothing, where a
        pattern search stepping one move at a time would never leave a plateau wider than its
        move (docs/method.md, "Search")."""
        move = moved(a, b) if a.keys() == b.keys() else None
        if move is None:
            return None
        key, up = move
        name = next((n for n in MOVES if _key_of(n, _DRAWS[n]) == key), None)
        if name is None or _DRAWS[name].move == "flip":
            return None
        draw, value = _DRAWS[name], b[key]
        low, high = self._range(draw)
        for _ in range(2):
            far = [v for v in _moves(draw, value) if (v > value if up else v < value)]
            if not far:
                break
            value = max(far) if up else min(far)
            if draw.kind != "choice":
                value = min(max(value, low), high)
        return None if value == b[key] else _sorted(b, {**b, key: value})

    def _with_backward(self, params: dict[str, Any]) -> dict[str, Any]:
        """`params` with `backward_swaps` where every candidate is swapped, and only there."""
        if params.get("n_tensors") != self.candidates:
            return {k: v for k, v in params.items() if k != "backward_swaps"}
        return {"backward_swaps": False, **params}

    def defaults(self) -> dict[str, Any]:
        """The original tool's defaults as trial parameters (ub=10000 reaches every level)."""
        return self.of_params(PlanParams())
