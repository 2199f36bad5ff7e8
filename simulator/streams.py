"""The two copy streams of the time model: device→host (swap-outs) and host→device (swap-ins).

Each stream runs its transfers one after another in the order they were queued; a swap-in
starts no earlier than its tensor's swap-out has finished. Where the link gives each direction
its full bandwidth while the other copies too (`Link.both` unset), a transfer's end is known
when it is queued. Where it does not (`Link.both` below a direction's own rate: a PCIe root
complex or a host memory that cannot feed both directions at once), each stream runs at
`both` while the other is copying and at its own rate alone, so a transfer's end depends on
what the other stream is given later. The shared streams therefore advance a fluid model of
the two queues only as far as a wait needs: the time model queues every transfer at a time
no earlier than any wait it has resolved, so nothing queued later can change an end already
read.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["Link", "Streams", "streams_for"]

Key = tuple[str, int]  # (tensor, k): swap-in k of a tensor, or its swap-out as k = -1
Row = tuple[str, str, int, float, float]  # tensor, direction, bytes, begin, end


@dataclass(frozen=True)
class Link:
    """Host link bandwidth in bytes per second, per direction; `both`: each direction's
    bandwidth while the other copies too (None: each keeps its own)."""

    d2h: float
    h2d: float
    both: float | None = None

    @property
    def shared(self) -> bool:
        """Whether copying both ways at once slows either direction."""
        return self.both is not None and self.both < max(self.d2h, self.h2d)


class Streams:
    """The two streams when each direction keeps its bandwidth: ends known when queued."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.d2h_free = self.h2d_free = 0.0
        self.out_done: dict[str, float] = {}
        self.arrived: dict[Key, float] = {}
        self.rows: list[Row] = []

    def swap_out(self, tensor: str, nbytes: int, at: float) -> None:
        begin = max(at, self.d2h_free)
        self.d2h_free = self.out_done[tensor] = begin + nbytes / self.link.d2h
        self.arrived[(tensor, -1)] = self.d2h_free
        self.rows.append((tensor, "d2h", nbytes, begin, self.d2h_free))

    def swap_in(self, tensor: str, k: int, nbytes: int, at: float) -> None:
        begin = max(at, self.h2d_free, self.out_done[tensor])
        self.h2d_free = self.arrived[(tensor, k)] = begin + nbytes / self.link.h2d
        self.rows.append((tensor, "h2d", nbytes, begin, self.h2d_free))

    def arrival(self, key: Key) -> float:
        """When the copy `key` ends: a swap-in arrives, or a swap-out is on the host."""
        return self.arrived[key]

    def finish(self) -> None:
        """Run every queued transfer to its end (each end is known already)."""

    @property
    def transfers(self) -> list[Row]:
        """Every transfer, in the order it was queued."""
        return self.rows


class _Queued:
    """A transfer waiting or copying on a shared stream: `left` bytes at `since`, copied at
    `rate` from then on (updated only when the rate changes, so that an unshared transfer
    ends at exactly begin + bytes / rate)."""

    __slots__ = ("begin", "earliest", "key", "left", "rate", "row", "since")

    def __init__(self, key: Key, nbytes: int, earliest: float, row: int) -> None:
        self.key, self.left, self.earliest, self.row = key, float(nbytes), earliest, row
        self.begin: float | None = None
        self.since = self.rate = 0.0

    def run_at(self, rate: float, now: float) -> float:
        """Copy at `rate` from `now` on; when the transfer will end at that rate."""
        if self.begin is None:
            self.begin = self.since = now
        elif rate != self.rate:
            self.left -= self.rate * (now - self.since)
            self.since = now
        self.rate = rate
        return self.since + self.left / rate


class SharedStreams(Streams):
    """The two streams when copying both ways at once slows them (`Link.shared`)."""

    def __init__(self, link: Link) -> None:
        super().__init__(link)
        self.clock = 0.0
        self.queues: dict[str, deque[_Queued]] = {"d2h": deque(), "h2d": deque()}
        self.alone = {"d2h": link.d2h, "h2d": link.h2d}
        both = link.both if link.both is not None else max(link.d2h, link.h2d)
        self.together = {"d2h": min(link.d2h, both), "h2d": min(link.h2d, both)}

    def swap_out(self, tensor: str, nbytes: int, at: float) -> None:
        self._queue("d2h", (tensor, -1), nbytes, at)

    def swap_in(self, tensor: str, k: int, nbytes: int, at: float) -> None:
        self._queue("h2d", (tensor, k), nbytes, at)

    def _queue(self, direction: str, key: Key, nbytes: int, at: float) -> None:
        self.queues[direction].append(_Queued(key, nbytes, max(at, self.clock), len(self.rows)))
        self.rows.append((key[0], direction, nbytes, at, at))

    def arrival(self, key: Key) -> float:
        while key not in self.arrived:
            self._step()
        return self.arrived[key]

    def finish(self) -> None:
        while self.queues["d2h"] or self.queues["h2d"]:
            self._step()

    def _ready(self, direction: str, head: _Queued) -> float:
        """When the head of a stream may start copying (inf: its swap-out is still copying)."""
        if direction == "d2h":
            return head.earliest
        return max(head.earliest, self.out_done.get(head.key[0], float("inf")))

    def _step(self) -> None:
        """Advance the clock to the next start or end on either stream."""
        heads = {d: q[0] for d, q in self.queues.items() if q}
        if not heads:
            raise KeyError("a copy was waited for that was never queued")
        ready = {d: self._ready(d, h) for d, h in heads.items()}
        active = [d for d in heads if ready[d] <= self.clock]
        rates = self.together if len(active) == 2 else self.alone
        ends = {d: heads[d].run_at(rates[d], self.clock) for d in active}
        later = [r for d, r in ready.items() if d not in active and r != float("inf")]
        self.clock = min([*ends.values(), *later])
        for d in active:
            if ends[d] <= self.clock:
                self._done(d, heads[d], ends[d])

    def _done(self, direction: str, head: _Queued, end: float) -> None:
        self.queues[direction].popleft()
        tensor, k = head.key
        self.arrived[head.key] = end
        if k < 0:
            self.out_done[tensor] = end
        begin = head.begin if head.begin is not None else end
        self.rows[head.row] = (tensor, direction, self.rows[head.row][2], begin, end)


def streams_for(link: Link) -> Streams:
    """The streams the link gives: shared when copying both ways at once slows them."""
    return SharedStreams(link) if link.shared else Streams(link)
