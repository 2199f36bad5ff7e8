"""The search space: the ranges of the swap parameters on one graph, how a trial draws them,
and the fixed parameter sets the search starts from or compares with."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from simulator.derive import (
    LEAST_MEMORY,
    RECOMPUTE_MAX_OPS,
    RECOMPUTE_MODES,
    TRIGGER_STRATEGIES,
    PlanParams,
)
from simulator.engine import Engine
from simulator.errors import UserError

__all__ = [
    "LEAST_MEMORY_ORDERED",
    "RECOMPUTE_CHOICES",
    "RECOMPUTE_ONLY",
    "Space",
    "check_recompute",
]

#: The plan that saves the most memory, with order edges and backward tensors swapped too: ours'
#: second warm start.
LEAST_MEMORY_ORDERED = replace(LEAST_MEMORY, serialize=True, backward_swaps=True)
#: The recompute-only baseline, checkpointing as `tf.recompute_grad` does: no swapping, every
#: chain of up to RECOMPUTE_MAX_OPS pure ops recomputed, convolutions too whatever they cost
#: (with a time model to weigh them by; else cheap chains only).
RECOMPUTE_ONLY = PlanParams(
    n_tensors=0, recompute="cheap", recompute_ops=RECOMPUTE_MAX_OPS, recompute_heavy=1e6
)
#: The range of the share of the budget prefetched swap-ins may fill (of the live bytes: the
#: allocator's peak is higher by its fragmentation)
PREFETCH_SHARES = (0.7, 1.0)
#: The last warm start lets the forward pass run this share of the levels ahead of the link
SYNC_LAG_SHARE = 64
#: The shares of the transfer time a chain through convolutions or matrix products may cost
#: (`PlanParams.recompute_heavy`; 0: never), searched with cheap recomputes and a time model
RECOMPUTE_HEAVY = (0.0, 0.25, 1.0)
#: What a run lets the search do with recomputes: search whether (the default), or fix a mode.
RECOMPUTE_CHOICES = ("search", *RECOMPUTE_MODES)


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
    #: the budget recompute plans are guarded at (`PlanParams.recompute_limit`; 0: never)
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
        """The parameters a trial proposes; `lb` and `ub` are sampled alike and sorted; no
        swapped tensor (`n_tensors` 0) only when recomputes may free memory instead."""
        n = trial.suggest_int("n_tensors", self._fewest(), self.candidates)
        lb = trial.suggest_int("lb", 1, self.levels, log=True)
        ub = trial.suggest_int("ub", 1, self.levels, log=True)
        return PlanParams(
            n_tensors=-1 if n == self.candidates else n,
            lb=min(lb, ub),
            ub=max(lb, ub),
            threshold=trial.suggest_int("threshold", 1, self.levels, log=True),
            groupby=trial.suggest_int("groupby", 0, self.levels),
            trigger=trial.suggest_categorical("trigger", list(TRIGGER_STRATEGIES)),
            **self._suggest_sync(trial),
            serialize=trial.suggest_categorical("serialize", [False, True]),
            **self._suggest_prefetch(trial),
            **self._suggest_recompute(trial),
            **self._suggest_backward(trial, n),
        )

    def _suggest_backward(self, trial: Any, n: int) -> dict[str, Any]:
        """Backward swaps only with every forward candidate, and then only of the tensors
        live where the plan without them passes the budget (`PlanParams.backward_limit`)."""
        if n < self.candidates or not trial.suggest_categorical("backward_swaps", [False, True]):
            return {}
        return {"backward_swaps": True, "backward_limit": self.limit_bytes}

    def _suggest_sync(self, trial: Any) -> dict[str, Any]:
        """`sync_out` and, with it, its lag in levels (log-sampled; 1 stands for 0, the
        readers' own wait, which is what a lag of one level nearly is)."""
        if not trial.suggest_categorical("sync_out", [False, True]):
            return {"sync_out": False}
        lag = trial.suggest_int("sync_lag", 1, self.levels, log=True)
        return {"sync_out": True, "sync_lag": lag if lag > 1 else 0}

    def _suggest_prefetch(self, trial: Any) -> dict[str, Any]:
        """`prefetch_bytes` and, with `sync_out` (drawn before), `postpone_waits`: the later
        frees may fragment the heap more than the live bytes it plans with can show."""
        if not self.budget_bytes or not trial.suggest_categorical("prefetch", [False, True]):
            return {}
        share = trial.suggest_float("prefetch_share", PREFETCH_SHARES[0], PREFETCH_SHARES[1])
        out: dict[str, Any] = {"prefetch_bytes": int(self.budget_bytes * share)}
        if trial.params.get("sync_out"):
            out["postpone_waits"] = trial.suggest_categorical("postpone_waits", [False, True])
        return out

    def _fewest(self) -> int:
        return 1 if self.recompute == "none" else 0

    def _suggest_recompute(self, trial: Any) -> dict[str, Any]:
        if self.recompute == "none":
            return {}
        mode = self.recompute
        if mode == "search":
            mode = trial.suggest_categorical("recompute", list(RECOMPUTE_MODES))
        ops = trial.suggest_int("recompute_ops", 1, RECOMPUTE_MAX_OPS)
        limit = self.limit_bytes if mode == "cheap" else 0
        out = {"recompute": mode, "recompute_ops": ops, "recompute_limit": limit}
        if mode == "cheap" and self.budget_bytes:
            out["recompute_heavy"] = trial.suggest_categorical("recompute_heavy", RECOMPUTE_HEAVY)
        return out

    def of_params(self, p: PlanParams) -> dict[str, Any]:
        """Trial parameters that give `p` (sizes clamped to this graph's ranges)."""
        fewest = self._fewest()
        n = self.candidates if p.n_tensors == -1 else min(max(p.n_tensors, fewest), self.candidates)
        return {
            "n_tensors": n,
            "lb": min(p.lb, self.levels),
            "ub": min(p.ub, self.levels),
            "threshold": min(p.threshold, self.levels),
            "groupby": min(p.groupby, self.levels),
            "trigger": p.trigger,
            "sync_out": p.sync_out,
            **({"sync_lag": min(max(p.sync_lag, 1), self.levels)} if p.sync_out else {}),
            "serialize": p.serialize,
            "recompute": p.recompute if self.recompute == "search" else self.recompute,
            "recompute_ops": min(p.recompute_ops, RECOMPUTE_MAX_OPS),
            **self._heavy_params(p),
            **self._prefetch_params(p),
            **({"backward_swaps": p.backward_swaps} if n == self.candidates else {}),
        }

    def _heavy_params(self, p: PlanParams) -> dict[str, Any]:
        """`recompute_heavy` as the nearest searched share, where the search draws it."""
        mode = p.recompute if self.recompute == "search" else self.recompute
        if not self.budget_bytes or mode != "cheap":
            return {}
        return {"recompute_heavy": min(RECOMPUTE_HEAVY, key=lambda x: abs(x - p.recompute_heavy))}

    def _prefetch_params(self, p: PlanParams) -> dict[str, Any]:
        if not self.budget_bytes:
            return {}
        if not p.prefetch_bytes:
            return {"prefetch": False}
        low, high = PREFETCH_SHARES
        share = min(max(p.prefetch_bytes / self.budget_bytes, low), high)
        postpone = {"postpone_waits": p.postpone_waits} if p.sync_out else {}
        return {"prefetch": True, "prefetch_share": share, **postpone}

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
        """Trial parameters one step from `params` along one axis each: fewer or more swapped
        tensors (counted from `swapped`, the tensors its plan swapped, when given: `n_tensors`
        caps the swaps, and recomputes and the threshold leave fewer), a swap-in window,
        fusion distance, threshold and forward lag halved or doubled, a recompute chain one op
        shorter or longer, a prefetch share 0.05 apart, backward swaps on or off."""
        out: list[dict[str, Any]] = []

        def move(key: str, value: Any, low: Any, high: Any) -> None:
            value = min(max(value, low), high)
            if key in params and value != params[key]:
                out.append({**params, key: value})

        n, top = params.get("n_tensors", 0), self.candidates
        n = n if swapped is None else min(n, swapped)
        for factor in (0.8, 0.9, 0.97, 1.03):
            move("n_tensors", round(n * factor), self._fewest(), top)
        for key in ("ub", "threshold", "sync_lag"):
            x = params.get(key, 1)
            move(key, x * 2, 1, self.levels)
            move(key, x // 2, 1, self.levels)
        g = params.get("groupby", 0)
        for x in (g // 2, max(2 * g, 2)):
            move("groupby", x, 0, self.levels)
        ops = params.get("recompute_ops", 1)
        for x in (ops - 1, ops + 1):
            move("recompute_ops", x, 1, RECOMPUTE_MAX_OPS)
        share = params.get("prefetch_share", 0.0)
        for x in (round(share - 0.05, 4), round(share + 0.05, 4)):
            move("prefetch_share", x, *PREFETCH_SHARES)
        for key in ("backward_swaps", "postpone_waits"):
            if key in params:
                out.append({**params, key: not params[key]})
        if "recompute_heavy" in params:
            i = RECOMPUTE_HEAVY.index(params["recompute_heavy"])
            for j in (i - 1, i + 1):
                move(
                    "recompute_heavy",
                    RECOMPUTE_HEAVY[min(max(j, 0), len(RECOMPUTE_HEAVY) - 1)],
                    0.0,
                    1.0,
                )
        if params.get("ub", 1) < params.get("lb", 1):  # ub halved under lb: lb follows
            out = [{**q, "lb": min(q["lb"], q["ub"])} for q in out]
        return [self._with_backward(q) for q in out]

    def _with_backward(self, params: dict[str, Any]) -> dict[str, Any]:
        """`params` with `backward_swaps` where every candidate is swapped, and only there."""
        if params.get("n_tensors") != self.candidates:
            return {k: v for k, v in params.items() if k != "backward_swaps"}
        return {"backward_swaps": False, **params}

    def defaults(self) -> dict[str, Any]:
        """The original tool's defaults as trial parameters (ub=10000 reaches every level)."""
        return self.of_params(PlanParams())
