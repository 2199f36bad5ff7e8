"""The model zoo: each entry fixes model, loss and optimizer so that numbers are reproducible."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune import corpus, models
from simulator.errors import UserError

__all__ = ["ZOO", "ZooEntry", "ZooModel", "get_entry", "resolve_model"]


@dataclass(frozen=True)
class ZooModel:
    """A built model with the loss and optimizer its zoo entry fixes."""

    model: Any
    loss: Any
    optimizer: Any


@dataclass(frozen=True)
class ZooEntry:
    """A named model builder; `cube` is the edge length for volumetric models, else None,
    and a multiple of `cube_step` (its poolings halve it that many times over, in powers of
    two). Without `loss` and `optimizer` factories, the entry trains with sparse categorical
    cross-entropy on logits and SGD with momentum."""

    name: str
    description: str
    builder: Callable[..., Any]
    default_cube: int | None = None
    cube_step: int = 1
    loss: Callable[[], Any] | None = None
    optimizer: Callable[[], Any] | None = None

    def build(self, *, cube: int | None = None, seed: int = 0, **sizes: Any) -> ZooModel:
        """Build the model (weights from `seed`), its loss and a fresh optimizer; `sizes` go
        to the builder (tests build the papers' models small)."""
        if cube is not None and self.default_cube is None:
            raise UserError(f"model {self.name!r} has no cube size")
        import keras

        keras.utils.set_random_seed(seed)
        kwargs = {"cube": cube or self.default_cube} if self.default_cube else {}
        model = self.builder(**kwargs, **sizes)
        loss = (
            self.loss()
            if self.loss
            else keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
        optimizer = (
            self.optimizer()
            if self.optimizer
            else keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
        )
        return ZooModel(model, loss, optimizer)


def _tiny_cnn() -> Any:
    """Three stages of three convolutions each, halving the resolution: the first stage's large
    activations wait through the whole backward pass, as in real CNNs, so swapping matters."""
    import keras
    from keras import layers

    x = inp = keras.Input((32, 32, 3), name="image")
    for i, filters in enumerate((16, 32, 64)):
        if i:
            x = layers.MaxPooling2D()(x)
        for _ in range(3):
            x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, layers.Dense(10)(x), name="tiny_cnn")


def _unet3d(
    *, cube: int, filters: tuple[int, ...] = (16, 32, 64, 128), channels: int = 4, classes: int = 4
) -> Any:
    """A 3D U-Net: two 3x3x3 convolutions a level, max-pool down, transposed conv up, skips."""
    import keras
    from keras import layers

    if cube % 2 ** (len(filters) - 1):
        raise UserError(f"cube size {cube} must be divisible by {2 ** (len(filters) - 1)}")

    def block(x: Any, f: int) -> Any:
        x = layers.Conv3D(f, 3, padding="same", activation="relu")(x)
        return layers.Conv3D(f, 3, padding="same", activation="relu")(x)

    x = inp = keras.Input((cube, cube, cube, channels), name="volume")
    skips = []
    for f in filters[:-1]:
        x = block(x, f)
        skips.append(x)
        x = layers.MaxPooling3D(2)(x)
    x = block(x, filters[-1])
    for f, skip in zip(reversed(filters[:-1]), reversed(skips)):
        x = layers.Conv3DTranspose(f, 2, strides=2, padding="same")(x)
        x = block(layers.Concatenate()([x, skip]), f)
    return keras.Model(inp, layers.Conv3D(classes, 1)(x), name=f"unet3d_{cube}")


def _tiny_unet3d(*, cube: int) -> Any:
    return _unet3d(cube=cube, filters=(4, 8, 16), channels=1, classes=2)


def _tiny_transformer(seq: int = 32, vocab: int = 64, dim: int = 32, heads: int = 2) -> Any:
    import keras
    from keras import layers

    tokens = keras.Input((seq,), dtype="int32", name="tokens")
    x = layers.Embedding(vocab, dim)(tokens)
    attn = layers.MultiHeadAttention(heads, dim // heads)(x, x)
    x = layers.LayerNormalization()(x + attn)
    ff = layers.Dense(dim)(layers.Dense(dim * 4, activation="gelu")(x))
    x = layers.LayerNormalization()(x + ff)
    return keras.Model(tokens, layers.Dense(vocab)(x), name="tiny_transformer")


def _resnet50() -> Any:
    import keras

    return keras.applications.ResNet50(
        weights=None, input_shape=(224, 224, 3), classes=1000, classifier_activation=None
    )


def _app(name: str, side: int = 224) -> Callable[..., Any]:
    return functools.partial(corpus.application, name, side=side)


def _adam_beta98() -> Any:
    import keras

    return keras.optimizers.Adam(learning_rate=1e-4, beta_2=0.98, epsilon=1e-9)


def _adam(learning_rate: float = 1e-4) -> Any:
    import keras

    return keras.optimizers.Adam(learning_rate=learning_rate)


#: Models nobody wrote for the tool (`autotune.corpus`), each with its usual optimizer.
_CORPUS = (
    ZooEntry("resnet50v2", "keras.applications ResNet50V2, 224x224x3, SGD momentum", _app(
        "ResNet50V2")),
    ZooEntry("mobilenetv2", "keras.applications MobileNetV2, 224x224x3, RMSprop",
             _app("MobileNetV2"), optimizer=corpus.rmsprop),
    ZooEntry("efficientnetb0", "keras.applications EfficientNetB0, 224x224x3, AdamW",
             _app("EfficientNetB0"), optimizer=corpus.adamw),
    ZooEntry("densenet121", "keras.applications DenseNet121, 224x224x3, SGD Nesterov",
             _app("DenseNet121"), optimizer=corpus.sgd_nesterov),
    ZooEntry("convnext-tiny", "keras.applications ConvNeXtTiny, 224x224x3, AdamW",
             _app("ConvNeXtTiny"), optimizer=corpus.adamw),
    ZooEntry("inceptionv3", "keras.applications InceptionV3, 299x299x3, RMSprop",
             _app("InceptionV3", 299), optimizer=corpus.rmsprop),
    ZooEntry("vit-b16", "ViT-B/16 in plain Keras, 224x224x3, exact GELU, AdamW", corpus.vit,
             optimizer=corpus.adamw),
    ZooEntry("bert-base", "BERT-base masked LM in plain Keras, 512 tokens, AdamW", corpus.bert,
             optimizer=corpus.adamw),
    ZooEntry("transformer-base", "Transformer-base encoder-decoder, 256+256 tokens, Adam",
             corpus.encoder_decoder, optimizer=_adam_beta98),
    ZooEntry("unet2d", "2D U-Net with batch norm (64-1024 filters), 256x256x3, Adam",
             corpus.unet2d, optimizer=_adam),
    ZooEntry("lstm-classifier", "2-layer LSTM text classifier (512 units, unrolled), 100 "
             "tokens, Adam", corpus.lstm_classifier, optimizer=functools.partial(_adam, 1e-3)),
    ZooEntry("gru-seq2seq", "GRU encoder-decoder (512 units, unrolled), 50+50 tokens, Adam",
             corpus.gru_seq2seq, optimizer=functools.partial(_adam, 1e-3)),
    ZooEntry("lstm-classifier-loop", "lstm-classifier as Keras runs it by default (a loop "
             "per layer)", functools.partial(corpus.lstm_classifier, unroll=False),
             optimizer=functools.partial(_adam, 1e-3)),
    ZooEntry("gru-seq2seq-loop", "gru-seq2seq as Keras runs it by default (a loop per layer)",
             functools.partial(corpus.gru_seq2seq, unroll=False),
             optimizer=functools.partial(_adam, 1e-3)),
)  # fmt: skip

ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in (
        ZooEntry("resnet50", "Keras ResNet-50, 224x224x3, 1000 classes", _resnet50),
        ZooEntry(
            "unet3d",
            "3D U-Net (16-128 filters, 4 levels), cube^3 x 4, 4 classes",
            _unet3d,
            default_cube=64,
            cube_step=8,
        ),
        ZooEntry(
            "unet3d-isensee2017",
            "the TFLMS papers' 3D U-Net (Isensee 2017: depth 5, 16-256 filters, instance "
            "norm, deep supervision), cube^3 x 4, 3 labels, weighted dice, Adam; channels "
            "last, instance norm as GroupNormalization(groups=-1)",
            models.isensee2017,
            default_cube=128,
            cube_step=16,
            loss=lambda: models.weighted_dice_loss,
            optimizer=models.isensee2017_optimizer,
        ),
        ZooEntry(
            "gpt2-small",
            "GPT-2 124M (12 layers, 12 heads, width 768, 1024 tokens, tied embeddings), "
            "causal LM loss, AdamW",
            models.gpt2,
            optimizer=models.gpt2_optimizer,
        ),
        *_CORPUS,
        ZooEntry("tiny-cnn", "9 conv layers in 3 stages, 32x32x3, 10 classes (tests)", _tiny_cnn),
        ZooEntry(
            "tiny-unet3d",
            "3D U-Net (4-16 filters, 3 levels), cube^3 x 1 (tests)",
            _tiny_unet3d,
            default_cube=16,
            cube_step=4,
        ),
        ZooEntry(
            "tiny-transformer", "1 attention block, 32 tokens, vocab 64 (tests)", _tiny_transformer
        ),
    )
}


def get_entry(name: str) -> ZooEntry:
    """The zoo entry `name`; ValueError listing the zoo if there is none."""
    if name not in ZOO:
        raise UserError(f"unknown model {name!r}; the zoo has: {', '.join(ZOO)}")
    return ZOO[name]


def resolve_model(spec: str, *, cube: int | None = None, seed: int = 0) -> ZooModel:
    """A zoo model by name, or `path/to/file.py:function` from the user's own file: the function
    takes no arguments and returns a compiled keras.Model or a (model, loss, optimizer) tuple."""
    path, sep, func = spec.rpartition(":")
    if not sep or not path.endswith(".py"):
        return get_entry(spec).build(cube=cube, seed=seed)
    build = _load_function(path, func)
    result = _users(spec, build)
    if isinstance(result, ZooModel):
        return result
    if isinstance(result, tuple) and len(result) == 3:
        return ZooModel(*result)
    loss, optimizer = getattr(result, "loss", None), getattr(result, "optimizer", None)
    if loss is None or optimizer is None:
        raise UserError(
            f"{spec} must return a compiled keras.Model (with loss and optimizer) "
            "or a (model, loss, optimizer) tuple"
        )
    return ZooModel(result, loss, optimizer)


def _users(where: str, code: Callable[[], Any]) -> Any:
    """Run the user's own code; what it raises is the user's to fix, named as such."""
    try:
        return code()
    except Exception as err:
        first = str(err).splitlines()[0] if str(err) else ""
        raise UserError(f"{where}: your code raised {type(err).__name__}: {first}") from err


def _load_function(path: str, name: str) -> Callable[[], Any]:
    import importlib.util
    from pathlib import Path

    if not Path(path).is_file():
        raise UserError(f"model file {path!r} does not exist")
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if spec is None or spec.loader is None:
        raise UserError(f"cannot load {path!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    _users(path, lambda: spec.loader.exec_module(module))  # type: ignore[union-attr]
    fn = getattr(module, name, None)
    if not callable(fn):
        raise UserError(f"{path!r} has no function {name!r}")
    return fn
