"""The API functions that run, rewrite or tune a step: `measure`, `rewrite`, `verify`, `fit`,
and `use_two_cpus` for a dry run of the GPU form on two logical CPUs. Each takes a
tf.function step with example args, or a Keras model with `loss=`, `optimizer=` and
`batch_size=` (see `autotune.api.capture`), or a step captured already."""

from __future__ import annotations

from typing import Any

from autotune.api import capture
from autotune.run.measure import Measurement
from rewriter.capture import Captured
from simulator.errors import UserError

__all__ = ["calibrate", "fit", "measure", "rewrite", "use_two_cpus", "verify"]


def measure(
    step: Any, *example_args: Any, repeats: int = 3, warmup: int = 1, **options: Any
) -> Measurement:
    """Capture `step` (see `capture`) and measure its peak and resident bytes on the device,
    after `warmup` steps, as the median of `repeats` steps."""
    from autotune.run.measure import measure as _measure

    captured = capture(step, *example_args, **options)
    real = [a for a in example_args if not _is_spec(a)] if example_args else []
    args = real if len(real) == len(captured.specs) else []
    return _measure(captured, *args, repeats=repeats, warmup=warmup)


def _is_spec(arg: Any) -> bool:
    return type(arg).__name__ == "TensorSpec"


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Plan options out of `options` (which keeps the capture options)."""
    from autotune.api import PLAN_OPTIONS
    from simulator.derive import PlanParams

    plan_kw = {k: options.pop(k) for k in list(options) if k in PLAN_OPTIONS}
    return options, PlanParams(**plan_kw)


def rewrite(
    step: Any,
    *example_args: Any,
    mode: str | None = None,
    compute_device: str | None = None,
    host_device: str | None = None,
    plan: Any = None,
    device: str | None = None,
    **options: Any,
) -> Any:
    """The tuned step for the plan that `n_tensors=`, `lb=`, `ub=`, ... give, or for `plan=`
    (a plan file that `fit` wrote, e.g. runs/x/plan.json): callable like the original, with
    `.graph_def` and `.plan`. On a GPU if TensorFlow sees one (swap ops on the host device),
    else emulated. `mode="device"` with `compute_device="/device:CPU:0",
    host_device="/device:CPU:1"` builds the GPU form on two logical CPUs (`use_two_cpus`).
    Parameters give the plan `fit` derives from them for `device` (a preset; default fit's)."""
    from autotune.run.verify import rewrite_captured

    options, params = _split(options)
    captured = capture(step, *example_args, **options)
    given = {"mode": mode, "compute_device": compute_device, "host_device": host_device}
    return rewrite_captured(
        captured, _plan(plan, captured) or params, device, **{k: v for k, v in given.items() if v}
    )


def _plan(plan: Any, captured: Captured) -> Any:
    """The SwapPlan `plan=` names for `captured`: a plan file's path or a SavedPlan (checked
    against the step's graph and batch), a SwapPlan itself, or None."""
    from autotune.planfile import SavedPlan, load_plan
    from rewriter.inputs import batch_of
    from simulator import SwapPlan

    if plan is None or isinstance(plan, SwapPlan):
        return plan
    saved = plan if isinstance(plan, SavedPlan) else load_plan(plan)
    return saved.for_step(captured, batch_of(list(captured.specs)))


def verify(
    step: Any,
    *example_args: Any,
    steps: int = 3,
    dry_run: bool = False,
    device: str | None = None,
    **options: Any,
) -> Any:
    """Run the tuned step (plan options as for `rewrite`) and the original on the device and
    report measured peaks and times next to the simulator's prediction, and on a GPU whether
    each swap-in waited for its trigger. Without a GPU, `dry_run` checks that on two logical
    CPUs (call `use_two_cpus()` before TensorFlow starts). Parameters give the plan `fit`
    derives from them for `device` (a preset; default fit's)."""
    from autotune.run.verify import verify_captured

    options, params = _split(options)
    captured = capture(step, *example_args, **options)
    return verify_captured(captured, params, steps=steps, dry_run=dry_run, preset=device)


def use_two_cpus() -> None:
    """Split the CPU into two logical devices (CPU:0 computes, CPU:1 is the host) for a dry run
    of the GPU form of a tuned step; call before TensorFlow initializes its devices."""
    from autotune.run.verify import use_two_cpus as _use_two_cpus

    _use_two_cpus()


def fit(step_or_model: Any, *example_args: Any, **options: Any) -> Any:
    """Search the fastest swap plan that fits `gpu_memory=` on `device=` and return the tuned
    step (see `autotune.search.tuning.fit` for the keyword-only options)."""
    from autotune.search.tuning import fit as _fit

    return _fit(step_or_model, *example_args, **options)


def calibrate(
    step_or_model: Any,
    *example_args: Any,
    out: str | None = None,
    base: str | None = None,
    steps: int = 5,
    loss: Any = None,
    optimizer: Any = None,
    batch_size: int | None = None,
) -> Any:
    """Profile the step (a tf.function with example args, or a Keras model with `loss=`,
    `optimizer=`, `batch_size=`) on this device at its batch and at half of it, probe the host
    link, and return the `Calibration` (written to `out` when given). Pass it, or its file, as
    `device=` to `simulate` and `fit`. `base`: the preset whose compute properties and memory
    describe this GPU (found from the GPU's name where it names one)."""
    from autotune.calibration import resolve_device
    from autotune.run.calibrate import calibrate as _calibrate
    from autotune.search.steps import leading_dim, step_capturer

    at = step_capturer(step_or_model, example_args, loss, optimizer, batch_size, None)
    size = batch_size or leading_dim(example_args)
    if size is None:
        raise UserError("give batch_size=, or example args whose first dimension is the batch")
    name = getattr(step_or_model, "name", None) or getattr(step_or_model, "__name__", "step")
    cal = _calibrate(at, size, model=str(name), steps=steps, base=resolve_device(base))
    if out is not None:
        cal.save(out)
    return cal
