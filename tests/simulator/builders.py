"""Hand-built and random graphs for simulator tests (no TensorFlow)."""

from __future__ import annotations

from hypothesis import strategies as st

from simulator import Graph, Op, Tensor, TensorKind


def add(
    g: Graph,
    name: str,
    inputs: list[str],
    nbytes: int | list[int],
    *,
    type: str = "Op",
    kind: TensorKind = TensorKind.TRANSIENT,
    forwards: dict[int, int] | None = None,
    inplace: tuple[int, ...] = (),
    control: list[str] | None = None,
    assigns: str = "",
) -> list[str]:
    """Add op `name` reading tensors `inputs`, with one output per size in `nbytes`."""
    sizes = nbytes if isinstance(nbytes, list) else [nbytes]
    outs = [f"{name}:{i}" for i in range(len(sizes))]
    tensors = [Tensor(o, "float32", (s // 4,), s, name, kind) for o, s in zip(outs, sizes)]
    op = Op(
        name,
        type,
        list(inputs),
        list(outs),
        list(control or []),
        forwards=forwards or {},
        inplace=inplace,
        assigns=assigns,
    )
    g.add_op(op, tensors)
    return outs


def chain(n: int, nbytes: int = 1024) -> Graph:
    """x -> op1 -> ... -> opn, each output `nbytes`; the last output is the step's output."""
    g = Graph("chain")
    prev = add(g, "x", [], nbytes, type="Placeholder", kind=TensorKind.INPUT)
    for i in range(1, n + 1):
        prev = add(g, f"op{i}", prev, nbytes)
    g.mark_outputs(prev)
    return g


def diamond() -> Graph:
    """x -> a -> (b, c) -> d: b and c both read a."""
    g = Graph("diamond")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, 1024)
    b = add(g, "b", a, 2048)
    c = add(g, "c", a, 512)
    d = add(g, "d", b + c, 256)
    g.mark_outputs(d)
    return g


def training_chain(sizes: tuple[int, int, int] = (1024, 1024, 1024)) -> Graph:
    """Forward f1 -> f2 -> f3, backward b3 -> b2 (reads f2) -> b1 (reads f1), like a tape."""
    g = Graph("training_chain")
    x = add(g, "x", [], 1024, type="Placeholder", kind=TensorKind.INPUT)
    f1 = add(g, "f1", x, sizes[0])
    f2 = add(g, "f2", f1, sizes[1])
    f3 = add(g, "f3", f2, sizes[2])
    b3 = add(g, "gradient_tape/b3", f3, 1024)
    b2 = add(g, "gradient_tape/b2", b3 + f2, 1024)
    b1 = add(g, "gradient_tape/b1", b2 + f1, 1024)
    g.mark_outputs(b1)
    return g


def unet_skip() -> Graph:
    """An encoder activation e1 skips to the decoder (concat) and is read again in backward."""
    g = Graph("unet_skip")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    e1 = add(g, "e1", x, 8192)
    e2 = add(g, "e2", e1, 2048)
    d2 = add(g, "d2", e2, 2048)
    cat = add(g, "cat", d2 + e1, 10240)
    loss = add(g, "loss", cat, 256)
    g_cat = add(g, "gradient_tape/cat", loss + cat, 10240)
    g_e1 = add(g, "gradient_tape/e1_conv", g_cat + e1, 8192)
    g_d2 = add(g, "gradient_tape/d2", g_cat + e2, 2048)
    g_e2 = add(g, "gradient_tape/e2", g_d2 + g_e1, 2048)
    g.mark_outputs(g_e2)
    return g


def training_diamond() -> Graph:
    """x -> a -> (b, c) -> d, then backward: gd reads d, gb reads a and b, gc reads a and c."""
    g = Graph("training_diamond")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    a = add(g, "a", x, 4096)
    b = add(g, "b", a, 1024)
    c = add(g, "c", a, 1024)
    d = add(g, "d", b + c, 256)
    gd = add(g, "gradient_tape/d", d, 512)
    gb = add(g, "gradient_tape/b", gd + a + b, 512)
    gc = add(g, "gradient_tape/c", gb + a + c, 512)
    g.mark_outputs(gc)
    return g


@st.composite
def random_graphs(draw: st.DrawFn, max_bytes: int = 1 << 16) -> Graph:
    """A random DAG of up to 26 ops, each output of up to `max_bytes`."""
    g = Graph("random")
    tensors = add(g, "x", [], draw(st.integers(0, 5000)), type="Placeholder", kind=TensorKind.INPUT)
    for i in range(draw(st.integers(1, 25))):
        k = draw(st.integers(1, min(3, len(tensors))))
        ins = draw(st.lists(st.sampled_from(tensors), min_size=k, max_size=k, unique=True))
        sizes = draw(st.lists(st.integers(0, max_bytes), min_size=1, max_size=2))
        fwd = {0: 0} if draw(st.booleans()) and sizes[0] == 0 else {}
        inplace = (0,) if draw(st.booleans()) else ()
        tensors += add(g, f"op{i}", ins, sizes, forwards=fwd, inplace=inplace)
    g.mark_outputs(draw(st.lists(st.sampled_from(tensors), max_size=2, unique=True)))
    return g


def training_branches(big: int = 1 << 20) -> Graph:
    """A residual-like block: f forks into branches a and b; in the backward pass each branch's
    gradient makes two `big` tensors (like an unfused BatchNorm gradient) before the join."""
    g = Graph("training_branches")
    g.mark_outputs(_branches(g, big)[1])
    return g


def _branches(g: Graph, big: int) -> tuple[list[str], list[str]]:
    """`training_branches`' ops added to `g`: its forked tensor f and f's gradient."""
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    f = add(g, "f", x, 1024)
    a = add(g, "a", f, 1024)
    b = add(g, "b", f, 1024)
    j = add(g, "j", a + b, 256)
    gj = add(g, "gradient_tape/j", j, 1024)
    grads = []
    for br, fwd in (("a", a), ("b", b)):
        one = add(g, f"gradient_tape/{br}1", gj + fwd, big)
        two = add(g, f"gradient_tape/{br}2", one, big)
        grads += add(g, f"gradient_tape/{br}3", one + two, 1024)
    return f, add(g, "gradient_tape/f", grads, 1024)


def momentum_step() -> Graph:
    """SGD with momentum on one weight: `decay` (momentum x velocity) reads only a variable,
    so it is ready when the step starts, but only the update reads it, with the gradient."""
    g = Graph("momentum_step")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    velocity = add(g, "velocity", [], 4096, type="VarHandleOp", kind=TensorKind.VARIABLE)
    decay = add(g, "decay", velocity, 4096)
    a = add(g, "a", x, 8192)
    b = add(g, "b", a, 8192)
    grad = add(g, "grad", a + b, 4096)
    g.mark_outputs(add(g, "update", decay + grad, 4096))
    return g


def weight_decay_step(nbytes: int = 256 << 10, act: int = 64 << 10, logits: int = 8) -> Graph:
    """AdamW's weight decay on one weight of `nbytes` (activations of `act`, the loss's of
    `logits` times that): the forward pass reads `w` (`read`, a
    view) into `a`, and the backward pass reads that value again (`grad_x`). The decay reads
    `w` anew (`read2`), makes `(w * wd) * lr` (`wd_mul`, `decay`) and subtracts it from `w`
    (`decay_write`, after `a`, as TensorFlow's automatic control edges order it): it runs in
    the forward pass, while `grad_x` is still to read the old value. The gradient's update
    (`apply`) follows it."""
    g = Graph("weight_decay_step")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    w = add(g, "w", [], nbytes, type="VarHandleOp", kind=TensorKind.VARIABLE)
    read = add(g, "read", w, nbytes, type="ReadVariableOp", forwards={0: 0})
    a = add(g, "a", x + read, act)
    b = add(g, "b", a, act)
    c = add(g, "c", b, logits * act)
    read2 = add(g, "read2", w, nbytes, type="ReadVariableOp", forwards={0: 0}, control=["read"])
    wd = add(g, "wd", [], 4, type="Const", kind=TensorKind.CONSTANT)
    decay = add(g, "decay", add(g, "wd_mul", read2 + wd, nbytes, type="Mul"), nbytes, type="Mul")
    add(g, "decay_write", w + decay, [], type="AssignSubVariableOp", assigns="update",
        control=["read2", "a"])  # fmt: skip
    gb = add(g, "gradient_tape/gb", add(g, "gradient_tape/gc", c, logits * act) + b, act)
    grad_x = add(g, "gradient_tape/grad_x", gb + read, act)
    grad_w = add(g, "gradient_tape/grad_w", gb + a, nbytes)
    add(g, "apply", w + grad_w, [], type="AssignSubVariableOp", assigns="update",
        control=["decay_write"])  # fmt: skip
    g.mark_outputs(add(g, "done", grad_x, 256, control=["apply"]))
    return g


def read_twice() -> Graph:
    """f1 is read by b2 and again by b0, three backward ops later."""
    g = Graph("read_twice")
    x = add(g, "x", [], 1024, type="Placeholder", kind=TensorKind.INPUT)
    f1 = add(g, "f1", x, 1024)
    f2 = add(g, "f2", f1, 1024)
    b3 = add(g, "gradient_tape/b3", f2, 1024)
    b2 = add(g, "gradient_tape/b2", b3 + f1, 1024)
    b1 = add(g, "gradient_tape/b1", add(g, "gradient_tape/b1a", b2, 1024), 1024)
    g.mark_outputs(add(g, "gradient_tape/b0", b1 + f1, 1024))
    return g


def gradient_held_past_a_peak(big: int = 1 << 20) -> Graph:
    """training_branches, then a weight gradient `gw` (2 `big`, made by an op Grappler
    rewrote: no edge may move it) held by the optimizer's update across `u1`, which makes
    3 `big`: unswapped there, it holds a peak no order edge lowers."""
    g = Graph("gradient_held_past_a_peak")
    f, gf = _branches(g, big)
    gw = add(g, "gradient_tape/gw", gf + f, 2 * big)
    u = add(g, "gradient_tape/u1", gf, 3 * big)
    for i in range(2, 7):
        u = add(g, f"gradient_tape/u{i}", u, 1024)
    g.mark_outputs(add(g, "update", gw + u, 256))
    g.rewritten = frozenset({"gradient_tape/gw"})
    return g


def held_gradient() -> Graph:
    """training_chain whose b3 also makes a weight gradient `gw` that only the optimizer's
    `update`, after the whole backward pass (four levels later), reads."""
    g = Graph("held_gradient")
    x = add(g, "x", [], 1024, type="Placeholder", kind=TensorKind.INPUT)
    f1 = add(g, "f1", x, 1024)
    f2 = add(g, "f2", f1, 1024)
    f3 = add(g, "f3", f2, 1024)
    b3 = add(g, "gradient_tape/b3", f3, 1024)
    gw = add(g, "gradient_tape/gw", b3 + f2, 8192)
    b2 = add(g, "gradient_tape/b2", b3 + f2, 1024)
    b1 = add(g, "gradient_tape/b1", b2 + f1, 1024)
    b0 = add(g, "gradient_tape/b0", add(g, "gradient_tape/b1a", b1, 1024) + x, 4096)
    g.mark_outputs(add(g, "sgd/update", gw + b0, 256))
    return g


def unrolled_recurrence(steps: int = 4) -> Graph:
    """A layer makes x_0..x_n (held: a loss reads them all), and a recurrence reads them:
    p_t = x_t @ w and q_t = h_(t-1) @ u, h_t = p_t + q_t, as an unrolled RNN does."""
    g = Graph("unrolled_recurrence")
    x = add(g, "x", [], 256, type="Placeholder", kind=TensorKind.INPUT)
    w = add(g, "w", [], 256, type="VarHandleOp", kind=TensorKind.VARIABLE)
    u = add(g, "u", [], 256, type="VarHandleOp", kind=TensorKind.VARIABLE)
    xs = [add(g, f"x{t}", x, 1024) for t in range(steps)]
    h = add(g, "h0", x, 1024)
    for t in range(1, steps):
        p = add(g, f"p{t}", xs[t] + w, 4096, type="MatMul")
        q = add(g, f"q{t}", h + u, 4096, type="MatMul")
        h = add(g, f"h{t}", p + q, 1024)
    g.mark_outputs(add(g, "loss", h + [t for x_t in xs for t in x_t], 4))
    return g
