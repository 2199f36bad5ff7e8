"""The papers' models in plain Keras: the 3D U-Net the TFLMS papers trained, and GPT-2 small.

`isensee2017` follows `isensee2017_model` of IBM's fork of ellisdg/3DUnetCNN (the model of
`brats/train_isensee2017.py`, which the ISMM 2019 paper ran); `gpt2` follows GPT-2 (Radford et
al., 2019) at its 124M size. Both take their sizes as arguments, so tests build them small.
"""

from __future__ import annotations

import functools
from typing import Any

from simulator.errors import UserError

__all__ = ["gpt2", "gpt2_optimizer", "isensee2017", "isensee2017_optimizer", "weighted_dice_loss"]


def isensee2017(
    *,
    cube: int,
    channels: int = 4,
    labels: int = 3,
    base_filters: int = 16,
    depth: int = 5,
    dropout: float = 0.3,
    segmentation_levels: int = 3,
) -> Any:
    """Isensee et al.'s BraTS 2017 3D U-Net: per level a convolution (strided below the top)
    and a residual context module (convolution, SpatialDropout3D, convolution, added back);
    up the decoder an upsampling module (UpSampling3D, convolution), a concatenation with the
    level's output and a localization module (3x3x3, then 1x1x1 convolution); deep
    supervision sums the segmentations of the `segmentation_levels` finest levels, each
    upsampled, under a sigmoid. Every convolution is followed by instance normalization and
    LeakyReLU (0.3), as in the fork.

    Differs from the fork in layout only where Keras 3 on TensorFlow needs it: channels last
    (the fork is channels first, which TensorFlow's CPU convolutions do not run), and instance
    normalization as `GroupNormalization(groups=-1)`, which divides by sqrt(var + 1e-3) where
    keras-contrib's divides by std + 1e-3 (same weights, same tensor sizes).
    """
    import keras
    from keras import layers

    if cube % 2 ** (depth - 1):
        raise UserError(f"cube size {cube} must be divisible by {2 ** (depth - 1)}")

    def conv(x: Any, filters: int, kernel: int = 3, strides: int = 1) -> Any:
        x = layers.Conv3D(filters, kernel, strides=strides, padding="same")(x)
        x = layers.GroupNormalization(groups=-1, epsilon=1e-3)(x)
        return layers.LeakyReLU(negative_slope=0.3)(x)

    segmentation_levels = min(segmentation_levels, depth - 1)  # the decoder's levels at most
    x = inputs = keras.Input((cube, cube, cube, channels), name="volume")
    filters = [base_filters * 2**level for level in range(depth)]
    outputs = []
    for level, f in enumerate(filters):
        entry = conv(x, f, strides=1 if level == 0 else 2)
        context = layers.SpatialDropout3D(dropout)(conv(entry, f))
        x = layers.Add()([entry, conv(context, f)])
        outputs.append(x)
    segmentations: list[Any] = []
    for level in range(depth - 2, -1, -1):
        up = conv(layers.UpSampling3D(2)(x), filters[level])
        x = layers.Concatenate()([outputs[level], up])
        x = conv(conv(x, filters[level]), filters[level], kernel=1)
        if level < segmentation_levels:
            segmentations.insert(0, conv(x, labels, kernel=1))
    out = None
    for level in reversed(range(segmentation_levels)):
        out = segmentations[level] if out is None else layers.Add()([out, segmentations[level]])
        if level > 0:
            out = layers.UpSampling3D(2)(out)
    out = layers.Activation("sigmoid")(out)
    return keras.Model(inputs, out, name=f"unet3d_isensee2017_{cube}")


def weighted_dice_loss(y_true: Any, y_pred: Any) -> Any:
    """The fork's weighted dice coefficient loss: minus the mean over samples and labels of
    each label's soft dice over the volume (smoothed by 1e-5), channels last."""
    from keras import ops

    axes = (1, 2, 3)
    smooth = 1e-5
    overlap = ops.sum(y_true * y_pred, axis=axes) + smooth / 2
    total = ops.sum(y_true, axis=axes) + ops.sum(y_pred, axis=axes) + smooth
    return -ops.mean(2.0 * overlap / total)


def isensee2017_optimizer() -> Any:
    """Adam at 5e-4, the fork's initial learning rate."""
    import keras

    return keras.optimizers.Adam(learning_rate=5e-4)


def gpt2(
    *,
    layers_: int = 12,
    heads: int = 12,
    width: int = 768,
    vocab: int = 50257,
    context: int = 1024,
    dropout: float = 0.1,
) -> Any:
    """GPT-2: learned token and position embeddings, `layers_` pre-layer-norm blocks (causal
    multi-head attention, a 4x MLP with tanh GELU, dropout on each residual branch), a final
    layer norm, and logits from the token embedding (tied). At the defaults, GPT-2 small:
    124,439,808 parameters."""
    import keras
    from keras import layers

    embedding = _tied_embedding_class()(vocab, width, context, name="embedding")
    tokens = keras.Input((context,), dtype="int32", name="tokens")
    x = layers.Dropout(dropout)(embedding(tokens))
    for i in range(layers_):
        h = layers.LayerNormalization(epsilon=1e-5, name=f"block{i}_ln1")(x)
        h = layers.MultiHeadAttention(
            heads, width // heads, dropout=dropout, name=f"block{i}_attention"
        )(h, h, use_causal_mask=True)
        x = layers.Add()([x, layers.Dropout(dropout)(h)])
        h = layers.LayerNormalization(epsilon=1e-5, name=f"block{i}_ln2")(x)
        h = layers.Dense(4 * width, activation=_gelu, name=f"block{i}_mlp_in")(h)
        h = layers.Dense(width, name=f"block{i}_mlp_out")(h)
        x = layers.Add()([x, layers.Dropout(dropout)(h)])
    x = layers.LayerNormalization(epsilon=1e-5, name="final_ln")(x)
    return keras.Model(tokens, embedding(x, reverse=True), name="gpt2")


def _gelu(x: Any) -> Any:
    import keras

    return keras.activations.gelu(x, approximate=True)


def gpt2_optimizer() -> Any:
    """AdamW (learning rate 6e-4, weight decay 0.1, betas 0.9 and 0.95), as GPT-2 is
    commonly reproduced."""
    import keras

    return keras.optimizers.AdamW(learning_rate=6e-4, weight_decay=0.1, beta_1=0.9, beta_2=0.95)


@functools.cache
def _tied_embedding_class() -> Any:
    """GPT-2's tied embedding layer, defined once Keras is imported (this module is not)."""
    import keras
    from keras import ops

    class TiedEmbedding(keras.layers.Layer):
        """Token plus position embedding; called with `reverse=True`, the logits of the
        token embedding's transpose (GPT-2's tied output layer)."""

        def __init__(self, vocab: int, width: int, context: int, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.vocab, self.width, self.context = vocab, width, context

        def build(self, input_shape: Any) -> None:
            init = keras.initializers.RandomNormal(stddev=0.02)
            self.tokens = self.add_weight((self.vocab, self.width), init, name="tokens")
            init = keras.initializers.RandomNormal(stddev=0.01)
            self.positions = self.add_weight((self.context, self.width), init, name="positions")

        def call(self, inputs: Any, reverse: bool = False) -> Any:
            if reverse:
                return ops.matmul(inputs, ops.transpose(ops.cast(self.tokens, inputs.dtype)))
            x = ops.take(self.tokens, inputs, axis=0)
            return x + self.positions[: ops.shape(inputs)[1]]

    return TiedEmbedding
