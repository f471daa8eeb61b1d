"""What simulated devices held and did: the truth per definition and period, a worker's
result (merged across workers), and its progress snapshots."""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.interfaces import EstimateKind, HistogramMechanism, as_histogram
from protocol.registry import UseCase

__all__ = ["MAX_PROBLEMS", "Progress", "ShardResult", "Tally", "tally_kind"]

MAX_PROBLEMS = 20
"""Findings of the ε audit kept per run (the count of pairs checked is kept in full)."""


_HISTOGRAMS: dict[bytes, HistogramMechanism] = {}
"""Definition hash -> its mechanism as a histogram: ``as_histogram`` checks a runtime protocol,
which costs more than the rest of a tally, once per definition instead of once per value."""


def _histogram(use_case: UseCase) -> HistogramMechanism:
    found = _HISTOGRAMS.get(use_case.definition)
    if found is None:
        found = _HISTOGRAMS[use_case.definition] = as_histogram(use_case.mechanism)
    return found


def tally_kind(use_case: UseCase) -> str:
    """How a use case's truth is tallied: ``mean``, ``histogram`` or ``frequencies`` (by the mechanism's kind)."""
    kind = use_case.mechanism.kind
    if kind.scalar:
        return "mean"
    if kind is EstimateKind.HISTOGRAM:
        return "histogram"
    return "frequencies"


@dataclass
class Tally:
    """The truth of one (use case, period): what the reporting devices' values were.

    Attributes:
        n: values reported.
        total: their sum (means and proportions).
        buckets: values per bucket (histograms).
        counts: reports per distinct value (frequencies).
    """

    n: int = 0
    total: float = 0.0
    buckets: list[int] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, value: object, use_case: UseCase) -> None:
        """Count one reported value."""
        self.n += 1
        if kind == "mean":
            self.total += float(value)  # type: ignore[arg-type]
        elif kind == "histogram":
            histogram = _histogram(use_case)
            if not self.buckets:
                self.buckets = [0] * (len(histogram.bucket_edges) - 1)
            if not isinstance(value, int | float):
                raise TypeError(f"{use_case.name}: a histogram value is a number; got {value!r}")
            self.buckets[histogram.bucket_of(value)] += 1
        else:
            key = str(value)
            self.counts[key] = self.counts.get(key, 0) + 1

    def merge(self, other: Tally) -> Tally:
        """The tally of both (exact integer sums; float sums for means)."""
        if self.buckets and other.buckets:
            buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]
        else:
            buckets = list(self.buckets or other.buckets)
        counts = dict(self.counts)
        for k, v in other.counts.items():
            counts[k] = counts.get(k, 0) + v
        return Tally(n=self.n + other.n, total=self.total + other.total, buckets=buckets, counts=counts)


@dataclass
class ShardResult:
    """What one worker's devices did.

    Attributes:
        devices: how many devices it ran.
        truth: definition ref (``name@hex``) -> period -> the tally of the values its counted
            (with receipts) or acknowledged (without) reports carried.
        published: definition ref -> period -> [reports, records] acknowledged by the broker.
        unsent: use case -> values recorded but never reported (daily limit, ε cap, outbox drops).
        refused: use case -> values the agent refused (stopped use case, bad value).
        messages: reports acknowledged by the broker (resends not counted).
        retries: device publish attempts repeated after a connection failure, and reports sent
            again for want of a receipt.
        setup_seconds: time to create the agents.
        setup_cpu_seconds: CPU time that took (summed over workers).
        run_seconds: time to simulate and publish.
        outcomes: definition ref -> what the receipts said -> how many reports (``counted``,
            ``refused: <reason>``); empty without receipts.
        missing: reports still without a receipt when the run ended.
        counted_periods: definition ref -> period -> reports a receipt said were counted.
        epsilon_checked: (device, use case) pairs whose ε spent was audited at the end.
        epsilon_problems: what the audit found (ε spent that went down, or past a lifetime
            cap, in a device's ledger or status); at most :data:`MAX_PROBLEMS` kept.
    """

    devices: int = 0
    truth: dict[str, dict[int, Tally]] = field(default_factory=dict)
    published: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    unsent: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    messages: int = 0
    retries: int = 0
    setup_seconds: float = 0.0
    setup_cpu_seconds: float = 0.0
    run_seconds: float = 0.0
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)
    missing: int = 0
    counted_periods: dict[str, dict[int, int]] = field(default_factory=dict)
    epsilon_checked: int = 0
    epsilon_problems: list[str] = field(default_factory=list)

    @property
    def counted(self) -> int:
        """Reports a receipt said were counted."""
        return sum(o.get("counted", 0) for o in self.outcomes.values())

    def merge(self, other: ShardResult) -> ShardResult:
        """Both workers' results together."""
        out = ShardResult(
            devices=self.devices + other.devices,
            messages=self.messages + other.messages,
            retries=self.retries + other.retries,
            setup_seconds=max(self.setup_seconds, other.setup_seconds),
            setup_cpu_seconds=self.setup_cpu_seconds + other.setup_cpu_seconds,
            run_seconds=max(self.run_seconds, other.run_seconds),
            missing=self.missing + other.missing,
            epsilon_checked=self.epsilon_checked + other.epsilon_checked,
            epsilon_problems=(self.epsilon_problems + other.epsilon_problems)[:MAX_PROBLEMS],
        )
        for src in (self, other):
            for uc, periods in src.truth.items():
                dst = out.truth.setdefault(uc, {})
                for p, t in periods.items():
                    dst[p] = dst[p].merge(t) if p in dst else Tally().merge(t)
            for uc, pub in src.published.items():
                dst_pub = out.published.setdefault(uc, {})
                for p, (reports, records) in pub.items():
                    r0, n0 = dst_pub.get(p, [0, 0])
                    dst_pub[p] = [r0 + reports, n0 + records]
            for uc, n in src.unsent.items():
                out.unsent[uc] = out.unsent.get(uc, 0) + n
            for uc, n in src.refused.items():
                out.refused[uc] = out.refused.get(uc, 0) + n
            for ref, said in src.outcomes.items():
                mine = out.outcomes.setdefault(ref, {})
                for status, n in said.items():
                    mine[status] = mine.get(status, 0) + n
            for ref, counted in src.counted_periods.items():
                into = out.counted_periods.setdefault(ref, {})
                for period, n in counted.items():
                    into[period] = into.get(period, 0) + n
        return out


@dataclass(frozen=True, slots=True)
class Progress:
    """A progress snapshot of one worker.

    Attributes:
        worker: the worker's number.
        slot: slots completed (of ``plan.slots + 1``, the closing cycle included).
        devices_done: devices through their cycle in the current slot.
        messages: reports acknowledged so far.
    """

    worker: int
    slot: int
    devices_done: int
    messages: int
