"""Hand-built and random graphs for simulator tests (no TensorFlow)."""

from __future__ import annotations

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
