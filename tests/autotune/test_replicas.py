"""Steps under tf.distribute: each replica's share of the step is tuned for its own device, and
the tuned step trains bitwise like the original, in the emulated and the GPU form."""

import json
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tf

#: the model, optimizer and distributed step both scripts below train (each sets `strategy`)
BUILD = """
def build():
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((32, 32, 3)), keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10),
        ])
        opt = keras.optimizers.Adam(1e-3)
        opt.build(model.trainable_variables)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            losses = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            loss = tf.reduce_mean(losses)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def step(x, y):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)

    return model.weights + opt.variables, step
"""

#: a custom training loop as TensorFlow's guide writes it (`strategy.run` in a tf.function),
#: two replicas on CPU:0 and CPU:1, CPU:2 as the host of the GPU form: three logical CPUs,
#: so in a process of its own
MIRRORED = (
    """
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
import keras
import autotune
from autotune.run.gating import check_gating, executed_partitions
from autotune.run.verify import rewrite_captured

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

"""
    + BUILD
    + """
def fresh():
    keras.backend.clear_session()
    return build()

rng = np.random.default_rng(0)
x = rng.normal(size=(128, 32, 32, 3)).astype("float32")
y = rng.integers(0, 10, 128).astype("int32")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(128)
dx, dy = next(iter(strategy.experimental_distribute_dataset(data)))
va, sa = fresh()
for _ in range(2):
    sa(dx, dy)
vb, sb = fresh()
tuned = autotune.fit(
    sb, dx, dy, strategy=strategy, gpu_memory="8MiB", trials=5, safety_ratio=1.0, out=sys.argv[1]
)
dev = rewrite_captured(tuned.captured, tuned.plan, tuned.device, mode="device",
                       compute_device="/device:CPU:0", host_device="/device:CPU:2")
inputs = tuned.captured.distributed.components((dx, dy))
parts = executed_partitions(dev, *inputs)  # step 1
report = check_gating(dev, parts, inputs)  # step 2, profiled
same = all(np.array_equal(np.asarray(u), np.asarray(v)) for u, v in zip(va, vb))
ran = sorted({n.device[-5:] for pg in parts for n in pg.node if n.name in set(dev.swap_ops)})
print(json.dumps({
    "baseline": tuned.baseline.peak_bytes, "peak": tuned.predicted_peak_bytes,
    "swaps": len(tuned.plan.swaps), "union_swaps": len(dev.plan.swaps), "same": same,
    "devices": ran, "gated": report.gated, "swap_ins": len(dev.triggers),
    "leaks": list(report.leaks),
}))
"""
)


def test_the_gpu_form_of_a_step_on_two_replicas_trains_bitwise_with_swaps_gated_on_the_host(
    tmp_path: Path,
) -> None:
    run = subprocess.run(
        [sys.executable, "-c", MIRRORED, str(tmp_path)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["swaps"] > 0 and out["peak"] <= 8 * 2**20 < out["baseline"]
    assert out["union_swaps"] == 2 * out["swaps"]  # replica 1 swaps its own share alike
    assert out["same"]  # two steps, weights and optimizer slots bitwise
    assert out["devices"] == ["CPU:2"]  # every swap op ran on the host
    assert out["gated"] == out["swap_ins"] > 0 and out["leaks"] == []


#: Keras' own fit with SwapCallback on two replicas, then the GPU form of the step it tuned,
#: CPU:2 as the host
KERAS = """
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
import keras
from autotune.keras import SwapCallback
from autotune.run.gating import check_gating, executed_partitions
from autotune.run.verify import rewrite_captured
from rewriter.names import is_swap_op

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
keras.utils.set_random_seed(1)
with strategy.scope():
    inp = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inp)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    out = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inp, out)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss, metrics=["accuracy"])
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 16, 16, 3)).astype("float32")
y = rng.integers(0, 10, size=64)
cb = SwapCallback(gpu_memory="1.2MiB", trials=5, safety_ratio=1.0, verbose=0, out=sys.argv[1])
model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[cb])
tuned = cb.tuned
dev = rewrite_captured(tuned.captured, tuned.plan, tuned.device, mode="device",
                       compute_device="/device:CPU:0", host_device="/device:CPU:2")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
batch = next(iter(strategy.experimental_distribute_dataset(data)))
inputs = tuned.captured.distributed.components((batch,))
parts = executed_partitions(dev, *inputs)
report = check_gating(dev, parts, inputs)
ran = {n.name: n.device[-5:] for pg in parts for n in pg.node if n.name in set(dev.swap_ops)}
swapped = sorted({d for name, d in ran.items() if is_swap_op(name)})
made = sorted({(n.startswith("replica_1/"), d) for n, d in ran.items() if not is_swap_op(n)})
print(json.dumps({
    "swaps": len(tuned.plan.swaps), "union_swaps": len(dev.plan.swaps), "devices": swapped,
    "recomputes": made, "gated": report.gated, "swap_ins": len(dev.triggers),
    "leaks": list(report.leaks),
}))
"""


def test_the_gpu_form_of_the_callbacks_step_gates_each_replicas_swap_ins_on_the_host(
    tmp_path: Path,
) -> None:
    run = subprocess.run(
        [sys.executable, "-c", KERAS, str(tmp_path)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["swaps"] > 0 and out["union_swaps"] == 2 * out["swaps"]
    assert out["devices"] == ["CPU:2"]  # both replicas' swap ops ran on the host
    assert out["recomputes"] in ([], [[False, "CPU:0"], [True, "CPU:1"]])  # on their replica
    assert out["gated"] == out["swap_ins"] > 0 and out["leaks"] == []


#: one worker of a MultiWorkerMirroredStrategy cluster on this machine (loopback addresses):
#: argv index, ports, folder, steps; it trains `steps` steps with the tuned step (and, for at
#: most two steps, the same steps without the tool, to compare with)
WORKER = (
    """import json, os, sys, time
index, ports, out, steps = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3], int(sys.argv[4])
os.environ["TF_CONFIG"] = json.dumps({
    "cluster": {"worker": [f"localhost:{p}" for p in ports]},
    "task": {"type": "worker", "index": index},
})
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tensorflow as tf
import keras
import autotune

options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=60)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)

"""
    + BUILD
    + """
rng = np.random.default_rng(index)  # each worker its own share of the global batch
x = tf.constant(rng.normal(size=(64, 32, 32, 3)).astype("float32"))
y = tf.constant(rng.integers(0, 10, 64).astype("int32"))
dx = strategy.experimental_distribute_values_from_function(lambda ctx: x)
dy = strategy.experimental_distribute_values_from_function(lambda ctx: y)
va, sa = build()
for _ in range(min(steps, 2)):  # the run without the tool, to compare with
    sa(dx, dy)
vb, sb = build()
tuned = autotune.fit(
    sb, dx, dy, strategy=strategy, gpu_memory="8MiB", trials=5, safety_ratio=1.0,
    out=os.path.join(out, f"w{index}"),
)
tuned.save_plan(os.path.join(out, f"w{index}", "plan.json"))
for i in range(steps):
    tuned(dx, dy)
    print(f"trained {i + 1}", flush=True)
same = steps <= 2 and all(np.array_equal(np.asarray(u), np.asarray(v)) for u, v in zip(va, vb))
digest = float(sum(np.asarray(v, dtype=np.float64).sum() for v in vb))
print(json.dumps({"same": same, "swaps": len(tuned.plan.swaps), "digest": digest}), flush=True)
"""
)


def _cluster(tmp_path: Path, steps: int) -> list[subprocess.Popen[str]]:
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("localhost", 0))
            ports.append(str(s.getsockname()[1]))
    args = [",".join(ports), str(tmp_path), str(steps)]
    return [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(i), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(2)
    ]


def test_two_workers_each_tune_the_same_plan_and_train_bitwise(tmp_path: Path) -> None:
    outs = []
    for worker in _cluster(tmp_path, steps=2):
        out, err = worker.communicate(timeout=600)
        assert worker.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert all(o["same"] and o["swaps"] > 0 for o in outs)  # each as without the tool
    assert outs[0]["digest"] == outs[1]["digest"]  # the workers' weights agree
    plans = [json.loads((tmp_path / f"w{i}" / "plan.json").read_text()) for i in range(2)]
    assert plans[0]["swaps"] == plans[1]["swaps"]  # the same seed: the same plan


def test_a_killed_worker_fails_the_run_with_tensorflows_error_and_keeps_the_files(
    tmp_path: Path,
) -> None:
    from autotune.planfile import load_plan

    workers = _cluster(tmp_path, steps=100_000)
    try:
        assert workers[1].stdout is not None
        assert workers[1].stdout.readline().startswith("trained 1")
        workers[1].kill()
        _, err = workers[0].communicate(timeout=300)
    finally:
        for worker in workers:
            worker.kill()
    assert workers[0].returncode != 0
    assert "tensorflow.python.framework.errors_impl.UnavailableError" in err
    for i in range(2):
        assert load_plan(tmp_path / f"w{i}" / "plan.json").params is not None
        with sqlite3.connect(tmp_path / f"w{i}" / "study.db") as db:
            states = [s for (s,) in db.execute("select state from trials")]
        assert states == ["COMPLETE"] * 5
