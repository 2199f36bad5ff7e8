"""Everything that touches TensorFlow graphs: capture (TF → IR) and, later, applying swap plans.

TensorFlow is imported lazily inside the functions, so importing this package stays cheap.
"""

from rewriter.capture import Captured, CaptureError, capture_function, graph_from_concrete, to_specs
from rewriter.keras_step import input_specs, is_keras_model, training_step

__all__ = [
    "CaptureError",
    "Captured",
    "capture_function",
    "graph_from_concrete",
    "input_specs",
    "is_keras_model",
    "to_specs",
    "training_step",
]
