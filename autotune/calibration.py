"""A time model measured on the device that will train: per-op times from two profiled batches.

`autotune calibrate` runs a step at two batch sizes and records, for every op of its captured
graph, the seconds the op took at each and the elements it touched (its inputs' and outputs'),
together with the host link measured on the same machine. An op's time at any other size is
the line through its two points, in elements: `a + b x elements` (a kernel's launch and
bookkeeping, then its work; slopes below zero are noise and give the mean). The profiled ops
are brought to sum to the step's measured wall time (`autotune.run.calibrate`), as the time
model runs them one after another.

An op of the simulated graph that the profile lacks (another model, or a graph that differs)
takes the median per-element rate of the profiled ops of its type, and an op of a type never
profiled Grappler's analytical estimate; `CalibratedCosts.note` says how many of each.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, overload

from autotune.planfile import graph_positions, structure_digest
from simulator.devices import DevicePreset
from simulator.errors import UserError
from simulator.graph import Graph

__all__ = [
    "FORMAT",
    "Calibration",
    "CalibratedCosts",
    "OpPoints",
    "calibrated_device",
    "load_calibration",
    "op_elements",
    "resolve_device",
]

FORMAT = "autotune-calibration/1"


@dataclass(frozen=True)
class OpPoints:
    """One op's measured seconds at the two calibration sizes, and the elements it touched."""

    name: str
    type: str
    elements: tuple[int, int]
    seconds: tuple[float, float]
    #: on a CPU, whether its kernel took a column buffer at each size (TensorFlow switches a
    #: convolution gradient's algorithm by size: `rewriter.cpukernels`); None elsewhere
    scratch: tuple[bool, bool] | None = None
    #: on a CPU, the op timed alone at the two nearest sizes of its other algorithm
    #: (`autotune.run.kernelprobe`): (elements at each, seconds at each); None if not probed
    other: tuple[tuple[int, int], tuple[float, float]] | None = None

    def at(self, elements: int, *, switched: bool = False) -> float:
        """Seconds at `elements`, on the line through the two points (see the module); for a
        kernel that `switched` algorithm, through the other algorithm's points if probed."""
        if switched and self.other is not None:
            return _on_line(*self.other, elements)
        return _on_line(self.elements, self.seconds, elements)

    def rate(self) -> float:
        """Seconds per element at the larger size (0 for an op that touched none)."""
        e, s = self.elements[1], self.seconds[1]
        return s / e if e else 0.0


@dataclass(frozen=True)
class Calibration:
    """What `autotune calibrate` measured: the ops' points, the link, and where it ran."""

    device: str  # "GPU:0" or "CPU:0"
    device_name: str
    tensorflow: str
    model: str
    sizes: tuple[int, int]
    fingerprint: str
    structure: str
    ops: dict[str, OpPoints]  # by position in the captured graph's order ("7")
    d2h_bytes_per_s: float
    h2d_bytes_per_s: float
    duplex_bytes_per_s: float  # each way, with both directions copying at once
    step_seconds: tuple[float, float]  # measured wall time of a step at each size
    #: what Grappler's estimate needs for ops the profile lacks: "kind" ("GPU" or "CPU"),
    #: "sm_count" (cores on a CPU), "clock_mhz", "memory_bandwidth_bytes_per_s" (0: unknown)
    compute: dict[str, Any] = field(default_factory=dict)
    memory_bytes: int | None = None  # the device's memory, where known

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        body["ops"] = {k: asdict(v) for k, v in self.ops.items()}
        return {"format": FORMAT, **body}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        if data.get("format") != FORMAT:
            raise UserError(f"not a calibration profile (format {data.get('format')!r})")
        body = {k: v for k, v in data.items() if k != "format"}
        body["ops"] = {k: _points(v) for k, v in body["ops"].items()}
        for key in ("sizes", "step_seconds"):
            body[key] = tuple(body[key])
        return cls(**body)

    def save(self, path: str | Path) -> Path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return out

    def costs(
        self, graph: Graph, estimate: Callable[[], dict[str, float]] | None = None
    ) -> CalibratedCosts:
        """Seconds of each op of `graph`: from its own points where the profile has the op
        (by name, or by position when the graph differs from the calibrated one only in its
        names), else from its type's rate, else from `estimate()` (Grappler's; without it, 0)."""
        own = self._matched(graph)
        rates = self._type_rates()
        out: dict[str, float] = {}
        by_type, estimated, switched, unprobed = 0, [], 0, 0
        for name, op in graph.ops.items():
            elements = op_elements(graph, name)
            if name in own:
                moved = _switched(own[name], op.cpu_scratch)
                out[name] = own[name].at(elements, switched=moved)
                switched += moved
                unprobed += moved and own[name].other is None
            elif op.type in rates:
                out[name] = rates[op.type] * elements
                by_type += 1
            else:
                estimated.append(name)
        grappler = estimate() if estimated and estimate is not None else {}
        out.update({n: grappler.get(n, 0.0) for n in estimated})
        unpriced = 0 if estimate is not None else len(estimated)
        return CalibratedCosts(
            out, len(own), by_type, len(estimated) - unpriced, unpriced, switched, unprobed
        )

    def _matched(self, graph: Graph) -> dict[str, OpPoints]:
        """The profile's ops under `graph`'s names: by name, or by position where the graph
        has the calibrated structure."""
        if graph.fingerprint() == self.fingerprint:
            return {p.name: p for p in self.ops.values()}
        where = graph_positions(graph)
        if structure_digest(graph, where) == self.structure:
            names = {pos: name for name, pos in where.items()}
            return {names[pos]: p for pos, p in self.ops.items()}
        return {p.name: p for p in self.ops.values() if p.name in graph.ops
                and graph.ops[p.name].type == p.type}  # fmt: skip

    def _type_rates(self) -> dict[str, float]:
        by_type: dict[str, list[float]] = {}
        for p in self.ops.values():
            by_type.setdefault(p.type, []).append(p.rate())
        return {t: statistics.median(r) for t, r in by_type.items()}


def _on_line(points: tuple[int, int], seconds: tuple[float, float], elements: int) -> float:
    """Seconds at `elements` on the line through two (elements, seconds) points: the mean
    where the line falls or the points share their elements, never below the lesser point."""
    (e1, e2), (s1, s2) = points, seconds
    if e1 == e2:
        return (s1 + s2) / 2
    slope = (s2 - s1) / (e2 - e1)
    if slope < 0:
        return (s1 + s2) / 2
    return max(min(s1, s2), s1 + slope * (elements - e1))


def _points(v: dict[str, Any]) -> OpPoints:
    scratch = v.get("scratch")
    return OpPoints(
        v["name"],
        v["type"],
        (int(v["elements"][0]), int(v["elements"][1])),
        (float(v["seconds"][0]), float(v["seconds"][1])),
        (bool(scratch[0]), bool(scratch[1])) if scratch is not None else None,
        _other(v.get("other")),
    )


def _other(v: Any) -> tuple[tuple[int, int], tuple[float, float]] | None:
    if v is None:
        return None
    (e1, e2), (s1, s2) = v
    return (int(e1), int(e2)), (float(s1), float(s2))


@dataclass(frozen=True)
class CalibratedCosts:
    """Per-op seconds from a calibration, and how many ops each source priced."""

    seconds: dict[str, float]
    measured: int
    by_type: int
    estimated: int
    unpriced: int = 0
    #: ops whose CPU kernel takes another algorithm at this size than when calibrated: their
    #: line is the other algorithm's, timed alone when calibrated (`OpPoints.other`)
    switched: int = 0
    #: of those, the ops not timed under their other algorithm: their line extrapolates the
    #: calibrated one's
    switched_unprobed: int = 0

    @property
    def note(self) -> str:
        """One line: where the op times came from."""
        parts = [f"{self.measured} ops from their own calibration"]
        if self.by_type:
            parts.append(f"{self.by_type} from the rate of their op type")
        if self.estimated:
            parts.append(f"{self.estimated} from Grappler's estimate")
        if self.unpriced:
            parts.append(f"{self.unpriced} unpriced (the profile names no device to estimate)")
        if self.switched:
            parts.append(
                f"{self.switched} of them run another kernel at this size than when calibrated "
                "(TensorFlow picks it by size)"
            )
        if self.switched_unprobed:
            parts.append(
                f"{self.switched_unprobed} of those not timed under that kernel: "
                "calibrate nearer this size"
            )
        return ", ".join(parts)


def calibrated_device(cal: Calibration) -> DevicePreset:
    """The device a calibration measured, as a preset: its link, its op times, and its memory
    where the profile records it (0 where it does not: give the memory with the profile)."""
    memory = cal.memory_bytes or 0
    c = cal.compute
    digest = hashlib.sha256(json.dumps(cal.to_dict(), sort_keys=True).encode()).hexdigest()[:8]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", cal.device_name).strip("-").lower()
    return DevicePreset(
        f"calibrated-{slug}-{digest}",
        memory,
        cal.d2h_bytes_per_s,
        cal.h2d_bytes_per_s,
        sm_count=int(c.get("sm_count", 0)),
        clock_mhz=int(c.get("clock_mhz", 0)),
        memory_bandwidth_bytes_per_s=float(c.get("memory_bandwidth_bytes_per_s", 0)),
        description=f"{cal.device_name}, calibrated on {cal.model} at {cal.sizes}",
        kind=str(c.get("kind", "GPU")),
        duplex_bytes_per_s=cal.duplex_bytes_per_s,
        calibration=cal,
    )


@overload
def resolve_device(device: None) -> None: ...
@overload
def resolve_device(device: str | DevicePreset) -> DevicePreset: ...
def resolve_device(device: str | DevicePreset | None) -> DevicePreset | None:
    """A device: a preset's name, a calibration profile's path (`*.json`), or a preset."""
    if device is None or isinstance(device, DevicePreset):
        return device
    if device.endswith(".json"):
        return calibrated_device(load_calibration(device))
    from simulator.devices import get_preset

    return get_preset(device)


def _switched(points: OpPoints, cpu_scratch: int | None) -> bool:
    """Whether the op's CPU kernel takes another algorithm than at the larger calibrated size."""
    if points.scratch is None or cpu_scratch is None:
        return False
    return bool(cpu_scratch) != points.scratch[1]


def op_elements(graph: Graph, name: str) -> int:
    """The elements an op touches: those of its inputs and of its outputs."""
    op = graph.ops[name]
    total = 0
    for t in (*op.inputs, *op.outputs):
        n = 1
        for d in graph.tensors[t].shape:
            n *= d
        total += n
    return total


def load_calibration(path: str | Path) -> Calibration:
    """A profile that `autotune calibrate` wrote; a one-line error for anything else."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as err:
        raise UserError(f"cannot read calibration profile {p}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{p} is not a calibration profile: {err}") from None
    try:
        return Calibration.from_dict(data)
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, UserError):
            raise
        raise UserError(f"{p} is not a calibration profile ({err})") from None
