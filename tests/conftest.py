"""Shared set-up: TensorFlow tests run quietly on the CPU, split into two logical devices so
that the GPU form of a tuned step (CPU:0 computes, CPU:1 is the host) runs in-process."""

import importlib.util
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

if importlib.util.find_spec("tensorflow") is not None:
    from autotune.run.verify import use_two_cpus

    use_two_cpus()
