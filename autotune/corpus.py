"""Models nobody wrote for the tool, written the way their authors write them: the corpus.

keras.applications models as Keras ships them, and transformers, a 2D U-Net and recurrent
models in plain Keras after their papers (ViT-B/16, BERT-base, the Transformer-base
encoder-decoder, Ronneberger's U-Net with batch norm, an LSTM classifier and a GRU
encoder-decoder), each with the optimizer people train it with. Rules and defaults of the
tool are checked on them (`autotune.benchmarks.corpus`); they are zoo entries too. Sizes are
arguments, so that tests and the exactness check build them small.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = [
    "adamw",
    "application",
    "bert",
    "encoder_decoder",
    "gru_seq2seq",
    "lstm_classifier",
    "rmsprop",
    "sgd_nesterov",
    "unet2d",
    "vit",
]


def application(name: str, *, side: int = 224, classes: int = 1000) -> Any:
    """`keras.applications.NAME` with random weights, `side` x `side` RGB, logits."""
    import keras

    build = getattr(keras.applications, name)
    return build(
        weights=None, input_shape=(side, side, 3), classes=classes, classifier_activation=None
    )


def vit(
    *,
    side: int = 224,
    patch: int = 16,
    layers_: int = 12,
    width: int = 768,
    heads: int = 12,
    classes: int = 1000,
    dropout: float = 0.1,
) -> Any:
    """ViT (Dosovitskiy et al., 2021) at B/16 by default: patches by a strided convolution, a
    class token, learned positions, pre-norm blocks of multi-head attention and an MLP with
    exact GELU, the class token's logits."""
    import keras
    from keras import layers

    x = inputs = keras.Input((side, side, 3), name="image")
    x = layers.Conv2D(width, patch, strides=patch, name="patches")(x)
    x = layers.Reshape(((side // patch) ** 2, width))(x)
    x = layers.Dropout(dropout)(_vit_tokens_class()(name="tokens")(x))
    for i in range(layers_):
        h = layers.LayerNormalization(epsilon=1e-6, name=f"block{i}_ln1")(x)
        h = layers.MultiHeadAttention(heads, width // heads, name=f"block{i}_attention")(h, h)
        x = layers.Add()([x, layers.Dropout(dropout)(h)])
        h = layers.LayerNormalization(epsilon=1e-6, name=f"block{i}_ln2")(x)
        h = layers.Dense(4 * width, activation="gelu", name=f"block{i}_mlp_in")(h)
        h = layers.Dense(width, name=f"block{i}_mlp_out")(layers.Dropout(dropout)(h))
        x = layers.Add()([x, layers.Dropout(dropout)(h)])
    x = layers.LayerNormalization(epsilon=1e-6, name="final_ln")(x)
    return keras.Model(inputs, layers.Dense(classes)(x[:, 0]), name="vit")


@functools.cache
def _vit_tokens_class() -> Any:
    """The layer that puts a learned class token before the patches and adds positions."""
    import keras
    from keras import ops

    class ClassTokenAndPositions(keras.layers.Layer):
        def build(self, input_shape: Any) -> None:
            tokens, width = input_shape[1], input_shape[2]
            init = keras.initializers.RandomNormal(stddev=0.02)
            self.cls = self.add_weight((1, 1, width), "zeros", name="class_token")
            self.positions = self.add_weight((1, tokens + 1, width), init, name="positions")

        def call(self, x: Any) -> Any:
            cls = ops.broadcast_to(self.cls, (ops.shape(x)[0], 1, ops.shape(x)[2]))
            return ops.concatenate([cls, x], axis=1) + self.positions

    return ClassTokenAndPositions


@functools.cache
def _embedding_class() -> Any:
    """Token plus learned position embeddings (BERT's, without segments)."""
    import keras
    from keras import ops

    class TokenAndPosition(keras.layers.Layer):
        def __init__(self, vocab: int, width: int, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.tokens = keras.layers.Embedding(vocab, width)
            self.vocab, self.width = vocab, width

        def build(self, input_shape: Any) -> None:
            self.tokens.build(input_shape)
            init = keras.initializers.RandomNormal(stddev=0.02)
            self.positions = self.add_weight((input_shape[1], self.width), init, name="positions")

        def call(self, ids: Any) -> Any:
            return self.tokens(ids) + ops.expand_dims(self.positions, 0)

    return TokenAndPosition


def bert(
    *,
    seq: int = 512,
    vocab: int = 30522,
    layers_: int = 12,
    width: int = 768,
    heads: int = 12,
    dropout: float = 0.1,
) -> Any:
    """BERT-base (Devlin et al., 2019) pre-training as a masked language model over every
    position: token and position embeddings, post-norm blocks (attention, then an MLP with
    exact GELU, each added back and normalized), the MLM head (dense, GELU, norm, logits)."""
    import keras
    from keras import layers

    ids = keras.Input((seq,), dtype="int32", name="tokens")
    x = _embedding_class()(vocab, width, name="embeddings")(ids)
    x = layers.Dropout(dropout)(layers.LayerNormalization(epsilon=1e-12)(x))
    for i in range(layers_):
        h = layers.MultiHeadAttention(heads, width // heads, dropout=dropout)(x, x)
        x = layers.LayerNormalization(epsilon=1e-12)(x + layers.Dropout(dropout)(h))
        h = layers.Dense(4 * width, activation="gelu", name=f"layer{i}_intermediate")(x)
        h = layers.Dropout(dropout)(layers.Dense(width, name=f"layer{i}_output")(h))
        x = layers.LayerNormalization(epsilon=1e-12)(x + h)
    x = layers.Dense(width, activation="gelu", name="mlm_transform")(x)
    x = layers.LayerNormalization(epsilon=1e-12)(x)
    return keras.Model(ids, layers.Dense(vocab, name="mlm_logits")(x), name="bert")


def encoder_decoder(
    *,
    source: int = 256,
    target: int = 256,
    vocab: int = 32000,
    layers_: int = 6,
    width: int = 512,
    heads: int = 8,
    dropout: float = 0.1,
) -> Any:
    """The Transformer-base encoder-decoder (Vaswani et al., 2017) for translation: post-norm
    blocks, ReLU MLPs, causal self-attention and cross-attention in the decoder, logits over
    the target vocabulary. One input of `source + target` token ids (the tool sizes a step
    from its first input), split into the source and the shifted target."""
    import keras
    from keras import layers

    ids = keras.Input((source + target,), dtype="int32", name="tokens")
    embed = _embedding_class()
    src = layers.Dropout(dropout)(embed(vocab, width, name="source_embedding")(ids[:, :source]))
    tgt = layers.Dropout(dropout)(embed(vocab, width, name="target_embedding")(ids[:, source:]))

    def sublayer(x: Any, h: Any) -> Any:
        return layers.LayerNormalization(epsilon=1e-6)(x + layers.Dropout(dropout)(h))

    def mlp(x: Any) -> Any:
        return layers.Dense(width)(layers.Dense(4 * width, activation="relu")(x))

    for _ in range(layers_):
        src = sublayer(src, layers.MultiHeadAttention(heads, width // heads)(src, src))
        src = sublayer(src, mlp(src))
    for _ in range(layers_):
        attend = layers.MultiHeadAttention(heads, width // heads)
        tgt = sublayer(tgt, attend(tgt, tgt, use_causal_mask=True))
        tgt = sublayer(tgt, layers.MultiHeadAttention(heads, width // heads)(tgt, src))
        tgt = sublayer(tgt, mlp(tgt))
    return keras.Model(ids, layers.Dense(vocab)(tgt), name="encoder_decoder")


def unet2d(*, side: int = 256, filters: int = 64, depth: int = 5, classes: int = 2) -> Any:
    """Ronneberger et al.'s U-Net (2015) with batch norm, as commonly written in Keras: two
    3x3 convolutions a level (batch norm, ReLU), max pooling down, transposed convolutions
    up, skips concatenated, per-pixel logits."""
    import keras
    from keras import layers

    def block(x: Any, f: int) -> Any:
        for _ in range(2):
            x = layers.Conv2D(f, 3, padding="same", use_bias=False)(x)
            x = layers.Activation("relu")(layers.BatchNormalization()(x))
        return x

    x = inputs = keras.Input((side, side, 3), name="image")
    skips = []
    for level in range(depth - 1):
        x = block(x, filters * 2**level)
        skips.append(x)
        x = layers.MaxPooling2D()(x)
    x = block(x, filters * 2 ** (depth - 1))
    for level in reversed(range(depth - 1)):
        f = filters * 2**level
        x = layers.Conv2DTranspose(f, 2, strides=2, padding="same")(x)
        x = block(layers.Concatenate()([skips[level], x]), f)
    return keras.Model(inputs, layers.Conv2D(classes, 1)(x), name="unet2d")


def lstm_classifier(
    *,
    seq: int = 100,
    vocab: int = 20000,
    embed: int = 128,
    units: int = 512,
    layers_: int = 2,
    classes: int = 2,
    unroll: bool = True,
) -> Any:
    """A text classifier as the Keras examples write it: token embedding, stacked LSTMs (the
    last returns its final state), logits. Unrolled (`unroll=True`), each time step is its
    own ops; else each layer is a loop (`rewriter.loops`), as Keras runs it by default."""
    import keras
    from keras import layers

    ids = keras.Input((seq,), dtype="int32", name="tokens")
    x = layers.Embedding(vocab, embed)(ids)
    for i in range(layers_):
        x = layers.LSTM(units, return_sequences=i < layers_ - 1, unroll=unroll)(x)
    return keras.Model(ids, layers.Dense(classes)(x), name="lstm_classifier")


def gru_seq2seq(
    *,
    source: int = 50,
    target: int = 50,
    vocab: int = 8000,
    embed: int = 256,
    units: int = 512,
    unroll: bool = True,
) -> Any:
    """A GRU encoder-decoder for translation (Cho et al., 2014, as the Keras examples write
    it): the encoder's final state starts the decoder, which reads the shifted target, logits
    over the target vocabulary. One input of `source + target` token ids, split; unrolled or
    loops as `lstm_classifier`."""
    import keras
    from keras import layers

    ids = keras.Input((source + target,), dtype="int32", name="tokens")
    src = layers.Embedding(vocab, embed, name="source_embedding")(ids[:, :source])
    tgt = layers.Embedding(vocab, embed, name="target_embedding")(ids[:, source:])
    _, state = layers.GRU(units, return_state=True, unroll=unroll, name="encoder")(src)
    out = layers.GRU(units, return_sequences=True, unroll=unroll, name="decoder")(
        tgt, initial_state=state
    )
    return keras.Model(ids, layers.Dense(vocab)(out), name="gru_seq2seq")


def adamw(learning_rate: float = 1e-4, weight_decay: float = 0.05) -> Any:
    import keras

    return keras.optimizers.AdamW(learning_rate=learning_rate, weight_decay=weight_decay)


def rmsprop() -> Any:
    """RMSprop as the MobileNet and Inception papers trained (decay 0.9, momentum 0.9)."""
    import keras

    return keras.optimizers.RMSprop(learning_rate=0.045, rho=0.9, momentum=0.9, epsilon=1.0)


def sgd_nesterov() -> Any:
    import keras

    return keras.optimizers.SGD(learning_rate=0.1, momentum=0.9, nesterov=True)
