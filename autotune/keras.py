"""Train with swapping inside Keras' own `model.fit`: a callback that tunes (or loads) a plan
for the model's training step and makes the tuned step the one `fit` runs.

    cb = SwapCallback(gpu_memory="16GiB")
    model.fit(data, epochs=3, validation_data=val, callbacks=[cb])
    cb.save_plan("runs/x/plan.json")      # later, elsewhere: SwapCallback(plan="runs/x/plan.json")

At the first batch it captures Keras' training step (`model.train_step`, with the compiled
loss, optimizer and metrics' updates) at that batch's shapes, tunes it by simulation (or applies
`plan=`), rewrites it, and from then on `fit` runs the tuned step; a batch of another size (the
last, partial one) gets the plan derived there. If the budget fits without swapping, it says so
and hands `fit` its own step back. Validation, `evaluate` and `predict` are untouched.

Under a `tf.distribute` strategy (a model built in `strategy.scope()`), the step of every
replica is captured as Keras runs it, each replica's share is tuned for its own device (sizes
per replica, the host memory shared), and the gradients' reduction is left as it was.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import keras

from autotune.search.core import DEFAULT_SAFETY_RATIO
from autotune.search.tuning import DEFAULT_DEVICE, DEFAULT_TRIALS
from rewriter.replicas import Distributed
from simulator.errors import UserError

__all__ = ["SwapCallback"]


class SwapCallback(keras.callbacks.Callback):
    """Swap long-lived tensors of `model.fit`'s training step to host memory, by a plan tuned
    for `gpu_memory` on `device` (a preset) or loaded from `plan` (a plan file)."""

    def __init__(
        self,
        *,
        gpu_memory: int | str | None = None,
        device: str = DEFAULT_DEVICE,
        trials: int = DEFAULT_TRIALS,
        seed: int = 0,
        host_memory: int | str | None = None,
        plan: str | Path | None = None,
        out: str | Path | None = None,
        safety_ratio: float = DEFAULT_SAFETY_RATIO,
        verbose: int = 1,
    ) -> None:
        super().__init__()
        self.options: dict[str, Any] = {
            "gpu_memory": gpu_memory,
            "device": device,
            "trials": trials,
            "seed": seed,
            "host_memory": host_memory,
            "safety_ratio": safety_ratio,
            "out": out or self._scratch(),
        }
        self.plan_path = plan
        self.verbose = verbose
        self.tuned: Any = None  # the TuningResult, once tuned
        self._saved: Any = None
        self._steps: dict[int | tuple[int, ...], Any] = {}
        self._keras_function: Any = None
        self._step: Any = None
        self._template: Any = None
        self._distributed: Any = None  # the model's strategy, when it has several replicas
        self._data: Any = None  # the distributed batch being prepared for

    def _scratch(self) -> str:
        """A folder for the study when no `out` is given, removed with the callback (or at
        exit): nothing could resume a study kept under a random name."""
        path = tempfile.mkdtemp(prefix="autotune-keras-")
        weakref.finalize(self, shutil.rmtree, path, True)
        return path

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if getattr(self.model, "steps_per_execution", 1) not in (1, None):
            raise UserError(
                "SwapCallback runs one step per call: compile with steps_per_execution=1"
            )
        strategy = getattr(self.model, "distribute_strategy", None)
        if getattr(strategy, "num_replicas_in_sync", 1) > 1:
            self._distributed = Distributed(strategy, None)
        self._keras_function = self.model.train_function
        self.model.train_function = self._train_function

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._keras_function is not None:
            self.model.train_function = self._keras_function

    def save_plan(self, path: str | Path) -> Path:
        """Write the plan file of the tuned step (after the first batch of `fit`)."""
        if self.tuned is None:
            raise UserError("nothing tuned yet: save the plan after model.fit has run")
        return Path(self.tuned.save_plan(path))

    def _train_function(self, iterator: Any) -> Any:
        data = next(iterator)
        if self._distributed is not None:
            return self._train_replicas(data)
        tensors = self._tensors(data)
        batch = int(tensors[0].shape[0])
        step = self._steps.get(batch)
        if step is None:
            step = self._steps[batch] = self._prepare(tensors, batch)
        if step is _KERAS:
            # fits without swapping: this batch through the captured step, the rest as Keras does
            self.model.train_function = self._keras_function
            return self.tuned.step(*tensors)
        return step(*tensors)

    def _train_replicas(self, data: Any) -> Any:
        """One step on every replica: `data` is distributed (a share of the batch per replica),
        each replica's share of the step is tuned for its own device."""
        dist = self._distributed = Distributed.of(self._distributed.strategy, (data,))
        tensors, self._data = dist.components((data,)), data
        per = len(tensors) // len(dist.devices)
        shares = tuple(int(t.shape[0]) for t in tensors[::per])  # each replica's batch
        batch = shares[0]
        key = batch if len(set(shares)) == 1 else shares  # uneven: a last, partial batch
        step = self._steps.get(key)
        if step is None:
            prepared = self._prepare(tensors, batch) if key == batch else self._uneven(tensors)
            step = self._steps[key] = prepared
        if step is _KERAS:
            self.model.train_function = self._keras_function
            return self.tuned.step(*tensors)
        return step(data) if step is self.tuned else step(*tensors)

    def _uneven(self, tensors: list[Any]) -> Any:
        """The step at shares of different sizes (a last batch that does not split evenly):
        captured at their shapes, with the plan the tuned parameters give there."""
        from autotune.api import capture
        from autotune.planfile import load_plan
        from autotune.run.verify import plan_for, training_step

        if self._step is None or (self.tuned is None and self.plan_path is None):
            self._prepare(tensors, int(tensors[0].shape[0]))  # tunes at these shapes first
        if self.plan_path is not None and self._saved is None:
            self._saved = load_plan(self.plan_path)
        params = self.tuned.params if self.tuned is not None else self._saved.params
        captured = capture(self._step, *tensors, distributed=self._distributed)
        device = self.options["device"]
        return training_step(captured, plan_for(captured, params, device), device)

    def _replica_steps(self, data: Any) -> Any:
        """Keras' training step on every replica, its logs reduced as Keras reduces them."""
        from keras.src.backend.tensorflow.trainer import reduce_per_replica

        strategy = self._distributed.strategy
        outputs = strategy.run(self.model.train_step, args=(data,))
        return reduce_per_replica(outputs, strategy, reduction="auto")

    def _tensors(self, data: Any) -> list[Any]:
        """The batch's tensors (Nones, e.g. no sample weights, left out), remembering where."""
        import tensorflow as tf

        leaves = tf.nest.flatten(data)
        if self._template is None:
            self._template = (data, [leaf is None for leaf in leaves])
        return [leaf for leaf in leaves if leaf is not None]

    def _train_step(self, *tensors: Any) -> Any:
        """Keras' training step on the batch rebuilt from its tensors (traced by the capture)."""
        import tensorflow as tf

        structure, empty = self._template
        it = iter(tensors)
        leaves = [None if e else next(it) for e in empty]
        return self.model.train_step(tf.nest.pack_sequence_as(structure, leaves))

    def _prepare(self, tensors: list[Any], batch: int) -> Any:
        """The step to run at `batch`: tuned at the first batch, derived at later ones."""
        import tensorflow as tf

        if self._step is None:
            self._step = tf.function(self._train_step)
            if self._distributed is not None:
                self._step = self._distributed.flat(self._replica_steps)
        if self.plan_path is not None:
            return self._from_plan(tensors, batch)
        if self.tuned is not None:
            return self.tuned  # it derives and caches the plan at each batch itself
        return self._tune(tensors, batch)

    def _tune(self, tensors: list[Any], batch: int | str) -> Any:
        from autotune.search.tuning import fit
        from autotune.units import format_sized

        if self._distributed is None:
            self.tuned = fit(self._step, *tensors, progress=self.verbose > 0, **self.options)
        else:  # each replica's share of the step, tuned for its device
            self.tuned = fit(
                self._replica_steps, self._data, strategy=self._distributed.strategy,
                progress=self.verbose > 0, **self.options,
            )  # fmt: skip
        t = self.tuned
        if self._distributed is not None:
            batch = f"{batch} per replica ({len(self._distributed.devices)} replicas)"
        if t.fits_without_swapping:
            self._say(
                f"fits without swapping at batch {batch}: predicted peak "
                f"{format_sized(t.baseline.peak_bytes)} within {format_sized(t.budget.bytes)}; "
                "training untouched"
            )
            return _KERAS
        overhead = f", overhead {t.predicted_overhead:.3f}x" if t.predicted_overhead else ""
        made = f", {t.plan.recomputed_tensors} recomputed" if t.plan.recomputes else ""
        self._say(
            f"tuned at batch {batch}: {len(t.plan.swaps)} tensors swapped{made}, predicted peak "
            f"{format_sized(t.predicted_peak_bytes)} (no swap "
            f"{format_sized(t.baseline.peak_bytes)}){overhead}"
        )
        return t

    def _from_plan(self, tensors: list[Any], batch: int) -> Any:
        from autotune.api import capture
        from autotune.planfile import load_plan
        from autotune.run.verify import training_step

        if self._saved is None:
            self._saved = load_plan(self.plan_path)  # type: ignore[arg-type]
        captured = capture(self._step, *tensors, distributed=self._distributed)
        plan = self._saved.for_step(captured, batch)
        self._say(f"plan {self.plan_path} at batch {batch}: {len(plan.swaps)} tensors swapped")
        return training_step(captured, plan)

    def _say(self, line: str) -> None:
        if self.verbose:
            print(f"SwapCallback: {line}", flush=True)


#: Marks a batch size at which Keras' own step runs.
_KERAS = object()
