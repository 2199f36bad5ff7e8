"""SwapCallback: Keras' own model.fit trains with the tuned step, exactly as without it."""

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.tf

keras = pytest.importorskip("keras")

from autotune.keras import SwapCallback  # noqa: E402


def _model(seed: int, strategy=None):  # type: ignore[no-untyped-def]
    """A small CNN with batch norm, dropout and an accuracy metric, compiled as users do
    (under `strategy`'s scope if given)."""
    keras.backend.clear_session()  # the same layer names each time: plans name tensors
    keras.utils.set_random_seed(seed)
    if strategy is None:
        return _built()
    with strategy.scope():
        return _built()


def _built():  # type: ignore[no-untyped-def]
    from keras import layers

    inp = keras.Input((16, 16, 3))
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(inp)
    x = layers.BatchNormalization()(x)
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = layers.Dropout(0.3)(x)
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    model = keras.Model(inp, layers.Dense(10)(layers.GlobalAveragePooling2D()(x)))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss, metrics=["accuracy"])
    return model


def _data():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(100, 16, 16, 3)).astype("float32")
    return x, rng.integers(0, 10, size=100)  # int64 labels, numpy's default


def _same(a, b) -> bool:  # type: ignore[no-untyped-def]
    pairs = zip(a.weights + a.optimizer.variables, b.weights + b.optimizer.variables, strict=True)
    return all(np.array_equal(np.asarray(u), np.asarray(v)) for u, v in pairs)


def _twins(cb: SwapCallback, data: str = "arrays"):  # type: ignore[no-untyped-def]
    """The same fit of two identical models, the second with `cb`; 100 samples in batches of
    32, so the last batch of each epoch has 4."""
    import tensorflow as tf

    x, y = _data()
    a, b = _model(1), _model(1)
    histories = []
    for model, callbacks in ((a, []), (b, [cb])):
        if data == "arrays":
            kw = {"batch_size": 32, "validation_data": (x[:20], y[:20])}
            h = model.fit(x, y, epochs=2, verbose=0, callbacks=callbacks, **kw)
        else:
            ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
            h = model.fit(ds, epochs=2, verbose=0, callbacks=callbacks, validation_data=ds.take(1))
        histories.append(h.history)
    return a, b, histories


@pytest.mark.parametrize("data", ["arrays", "tf.data"])
def test_fit_with_the_callback_trains_bitwise_like_fit_without_it(data: str) -> None:
    cb = SwapCallback(gpu_memory="2.5MiB", trials=5, safety_ratio=1.0, verbose=0)
    a, b, (ha, hb) = _twins(cb, data)
    assert cb.tuned is not None and cb.tuned.plan.swaps
    assert cb.tuned.predicted_peak_bytes <= cb.tuned.budget.bytes
    assert set(cb._steps) == {32, 4}  # the last, partial batch got its own plan
    assert ha == hb and set(ha) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert _same(a, b)
    x, y = _data()
    assert a.evaluate(x, y, verbose=0) == b.evaluate(x, y, verbose=0)
    assert np.array_equal(a.predict(x, verbose=0), b.predict(x, verbose=0))
    assert b.train_function is not cb._train_function  # Keras' own step is back after fit


def test_a_budget_that_fits_without_swapping_trains_untouched(capsys) -> None:  # type: ignore[no-untyped-def]
    cb = SwapCallback(gpu_memory="100MiB", trials=3)
    a, b, (ha, hb) = _twins(cb)
    assert "fits without swapping at batch 32" in capsys.readouterr().out
    assert not cb.tuned.plan.swaps and set(cb._steps) == {32}
    assert ha == hb and _same(a, b)


def test_a_saved_plan_trains_another_run_with_no_search(tmp_path: Path) -> None:
    cb = SwapCallback(gpu_memory="2.5MiB", trials=5, safety_ratio=1.0, verbose=0)
    _twins(cb)
    path = cb.save_plan(tmp_path / "plan.json")
    again = SwapCallback(plan=path, verbose=0)
    a, b, (ha, hb) = _twins(again)
    assert again.tuned is None  # nothing tuned: the plan was applied
    assert again._steps[32].plan.swaps == cb.tuned.plan.swaps
    assert ha == hb and _same(a, b)


def test_saving_before_training_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="after model.fit"):
        SwapCallback().save_plan(tmp_path / "plan.json")


def test_a_callback_without_out_leaves_no_folder_behind() -> None:
    import gc

    cb = SwapCallback(gpu_memory="2MiB")
    scratch = Path(cb.options["out"])
    assert scratch.is_dir() and scratch.name.startswith("autotune-keras-")
    del cb
    gc.collect()
    assert not scratch.exists()


def _mirrored_twins(cb: SwapCallback):  # type: ignore[no-untyped-def]
    """`_twins` under MirroredStrategy on the two logical CPUs (conftest), on 99 samples: each
    replica gets 16 of a batch of 32, and 2 and 1 of the last batch of 3."""
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    x, y = _data()
    models, histories = [], []
    for callbacks in ([], [cb]):
        model = _model(1, strategy)
        h = model.fit(x[:99], y[:99], batch_size=32, epochs=2, verbose=0, callbacks=callbacks)
        models.append(model)
        histories.append(h.history)
    return models, histories


def test_fit_on_two_replicas_with_the_callback_or_its_plan_trains_bitwise(tmp_path: Path) -> None:
    # it crashed in the step with "'PerReplica' object has no attribute 'shape'" (issue 38)
    cb = SwapCallback(gpu_memory="1.2MiB", trials=5, safety_ratio=1.0, verbose=0)
    (a, b), (ha, hb) = _mirrored_twins(cb)
    assert cb.tuned is not None and cb.tuned.plan.swaps
    assert cb.tuned.batch_size == 16  # each replica's share is tuned
    assert cb.tuned.predicted_peak_bytes <= cb.tuned.budget.bytes
    assert set(cb._steps) == {16, (2, 1)}  # the uneven last batch: the plan derived there
    step = cb.tuned.step
    devices = {op.device[-5:] for op in step.function.graph.get_operations() if "swap" in op.name}
    assert devices == {"CPU:0", "CPU:1"}  # each replica swaps its own tensors
    assert ha == hb and _same(a, b)
    with pytest.raises(ValueError, match="verify measures one device; this step runs on 2"):
        cb.tuned.verify()
    # the plan file trains another run with no search
    again = SwapCallback(plan=cb.save_plan(tmp_path / "plan.json"), verbose=0)
    (a, b), (ha, hb) = _mirrored_twins(again)
    assert again.tuned is None
    assert len(again._steps[16].plan.swaps) == 2 * len(cb.tuned.plan.swaps)  # both replicas'
    assert ha == hb and _same(a, b)


def test_the_callback_is_reachable_from_the_package() -> None:
    # `import autotune; autotune.keras.SwapCallback` raised AttributeError (issue 39)
    import subprocess
    import sys

    code = "import autotune; print(autotune.keras.SwapCallback.__name__)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.split()[-1] == "SwapCallback", run.stderr[-2000:]


def _recurrent(seed: int):  # type: ignore[no-untyped-def]
    """Two stacked Keras LSTMs (loops, as Keras runs them by default), compiled as users do."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    ids = keras.Input((12,), dtype="int32")
    x = keras.layers.LSTM(16, return_sequences=True)(keras.layers.Embedding(50, 8)(ids))
    model = keras.Model(ids, keras.layers.Dense(2)(keras.layers.LSTM(16)(x)))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss, metrics=["accuracy"])
    return model


def test_fit_of_a_recurrent_model_with_its_lists_swapped_trains_bitwise() -> None:
    import autotune

    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 50, size=(100, 12)).astype("int32"), rng.integers(0, 2, size=100)
    a, b = _recurrent(1), _recurrent(1)
    need = autotune.simulate(a, loss=a.loss, optimizer=a.optimizer, batch_size=32).peak_bytes
    cb = SwapCallback(gpu_memory=int(need * 0.93), trials=10, safety_ratio=1.0, verbose=0)
    ha = a.fit(x, y, batch_size=32, epochs=2, verbose=0).history
    hb = b.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[cb]).history
    assert cb.tuned is not None
    graph = cb.tuned.captured.graph
    assert any(graph.tensors[s.tensor].dtype == "variant" for s in cb.tuned.plan.swaps)
    assert ha == hb and _same(a, b)
