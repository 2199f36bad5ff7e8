"""Train a compiled Keras model with swapping, inside Keras' own model.fit.

    python examples/keras_fit.py

SwapCallback tunes a swap plan for the training step at the first batch (by simulation, for a
16 GiB V100 preset's allocator scaled down to the memory given here), and fit then runs the
tuned step; the last, smaller batch of each epoch gets its own plan. Afterwards the tuned step
and the original run once more on this machine (a GPU, or the emulated device on a CPU) and
their measured peaks are printed next to the predicted ones.
"""

import autotune

autotune.prepare_measurement()  # on a CPU, TensorFlow's allocator then reports its peak

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402

from autotune.keras import SwapCallback  # noqa: E402
from autotune.units import format_sized  # noqa: E402


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    inp = keras.Input((32, 32, 3))
    x = inp
    for filters in (32, 32, 64, 64):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
        x = layers.ReLU()(layers.BatchNormalization()(x))
    x = layers.Dropout(0.2)(layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inp, layers.Dense(10)(x))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss, metrics=["accuracy"])
    return model


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=300)
    model = build()
    swap = SwapCallback(gpu_memory="96MiB", trials=20, safety_ratio=1.0)
    history = model.fit(x, y, batch_size=64, epochs=2, validation_split=0.2, callbacks=[swap])
    print("history:", {k: [round(v, 4) for v in vs] for k, vs in history.history.items()})
    tuned = swap.tuned
    print(f"swapped: {len(tuned.plan.swaps)} tensors at batch {tuned.batch_size}")
    v = tuned.verify(steps=3)
    for label, run, predicted in (
        ("tuned", v.tuned, v.predicted_peak_bytes),
        ("original", v.baseline, v.baseline_predicted_peak_bytes),
    ):
        measured = format_sized(run.peak_bytes) if run.peak_bytes else run.error
        print(f"{label:<9} predicted peak {format_sized(predicted)}, measured {measured} "
              f"on {v.place}")  # fmt: skip


if __name__ == "__main__":
    main()
