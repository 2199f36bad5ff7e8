"""Small Keras models built for tests (the zoo's are in autotune.zoo)."""


def bn_cnn(side: int = 16):  # type: ignore[no-untyped-def]
    """Convolution, batch norm, ReLU, three times: as in ResNet, each ReLU output can be made
    again from its convolution's output by the batch norm's application and the ReLU."""
    import keras
    from keras import layers

    from autotune.zoo import ZooModel

    keras.utils.set_random_seed(3)
    x = inp = keras.Input((side, side, 3))
    for filters in (8, 8, 16):
        x = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(filters, 3, padding="same")(x)))
    out = layers.Dense(10)(layers.GlobalAveragePooling2D()(x))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return ZooModel(keras.Model(inp, out), loss, keras.optimizers.SGD(0.01, momentum=0.9))


def residual_bn_cnn(side: int = 16):  # type: ignore[no-untyped-def]
    """A stem and two residual blocks of convolution, batch norm and ReLU, as in ResNet: the
    gradient of a block's output is held for its shortcut while the block's batch norms make
    their input gradients, so those can be made again from it late in the backward pass."""
    import keras
    from keras import layers

    from autotune.zoo import ZooModel

    def unit(x, relu: bool = True):  # type: ignore[no-untyped-def]
        x = layers.BatchNormalization()(layers.Conv2D(8, 3, padding="same")(x))
        return layers.ReLU()(x) if relu else x

    keras.utils.set_random_seed(3)
    x = inp = keras.Input((side, side, 3))
    x = unit(x)
    for _ in range(2):
        x = layers.ReLU()(layers.Add()([unit(unit(x), relu=False), x]))
    out = layers.Dense(10)(layers.GlobalAveragePooling2D()(x))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return ZooModel(keras.Model(inp, out), loss, keras.optimizers.SGD(0.01, momentum=0.9))


def captured_residual_bn_cnn(batch: int = 8):  # type: ignore[no-untyped-def]
    """`residual_bn_cnn` and its captured training step."""
    from autotune.api import capture

    built = residual_bn_cnn()
    return built, capture(built.model, loss=built.loss, optimizer=built.optimizer, batch_size=batch)


def gelu_block(tokens: int = 64):  # type: ignore[no-untyped-def]
    """A transformer's feed-forward block with exact GELU and AdamW: Grappler regroups GELU's
    backward products, differently once a plan swaps their inputs in."""
    import keras
    from keras import layers

    from autotune.zoo import ZooModel

    keras.utils.set_random_seed(0)
    x = inp = keras.Input((tokens, 128))
    h = layers.Dense(512, activation="gelu")(layers.LayerNormalization()(x))
    x = x + layers.Dense(128)(h)
    out = layers.Dense(10)(layers.GlobalAveragePooling1D()(x))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return ZooModel(keras.Model(inp, out), loss, keras.optimizers.AdamW(1e-3))


def dropout_mlp(tokens: int = 16):  # type: ignore[no-untyped-def]
    """A residual MLP block with two dropouts and AdamW: each dropout makes its random numbers
    and mask from its seed generator's state (ready when the step starts)."""
    import keras
    from keras import layers

    from autotune.zoo import ZooModel

    keras.utils.set_random_seed(0)
    x = inp = keras.Input((tokens, 32))
    h = layers.Dropout(0.1)(layers.Dense(128, activation="relu")(x))
    x = x + layers.Dropout(0.1)(layers.Dense(32)(h))
    out = layers.Dense(10)(layers.GlobalAveragePooling1D()(x))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return ZooModel(keras.Model(inp, out), loss, keras.optimizers.AdamW(1e-3))


def recurrence(steps: int = 200, width: int = 512):  # type: ignore[no-untyped-def]
    """A recurrence h = tanh(h @ w + x) written as a `tf.while_loop` of `steps` steps in a
    Keras layer, with SGD: the gradient's lists hold each step's state once, pushed twice."""
    import keras
    import tensorflow as tf

    from autotune.zoo import ZooModel

    class Recurrence(keras.layers.Layer):  # type: ignore[misc]
        def build(self, input_shape):  # type: ignore[no-untyped-def]
            init = keras.initializers.RandomNormal(stddev=0.05, seed=1)
            self.w = self.add_weight(shape=(width, width), initializer=init)

        def call(self, x):  # type: ignore[no-untyped-def]
            def body(i, h):  # type: ignore[no-untyped-def]
                return i + 1, tf.tanh(tf.matmul(h, self.w) + x)

            return tf.while_loop(lambda i, h: i < steps, body, (0, x))[1]

    keras.utils.set_random_seed(3)
    inp = keras.Input((width,))
    out = keras.layers.Dense(10)(Recurrence()(inp))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return ZooModel(keras.Model(inp, out), loss, keras.optimizers.SGD(0.01))


def branch(copies: int = 8, width: int = 512):  # type: ignore[no-untyped-def]
    """A `tf.cond` in a Keras layer whose branch taken (always, by the data) makes a large
    temporary (its input tiled `copies` times) and keeps its tanh for the gradient; the other
    branch passes its input on. SGD."""
    import keras
    import tensorflow as tf

    from autotune.zoo import ZooModel

    class Branch(keras.layers.Layer):  # type: ignore[misc]
        def call(self, h):  # type: ignore[no-untyped-def]
            def wide():  # type: ignore[no-untyped-def]
                t = tf.tanh(tf.tile(h[None], [copies, 1, 1]))
                return tf.reduce_mean(t, axis=0)

            return tf.cond(tf.reduce_sum(h) > -1e30, wide, lambda: h)

    keras.utils.set_random_seed(3)
    inp = keras.Input((width,))
    out = keras.layers.Dense(10)(Branch()(keras.layers.Dense(width)(inp)))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return ZooModel(keras.Model(inp, out), loss, keras.optimizers.SGD(0.01))
