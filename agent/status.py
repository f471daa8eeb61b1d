"""The agent's status as typed values, and their JSON form.

:meth:`agent.core.Agent.status` builds an :class:`AgentStatus` once; the local API
(:mod:`agent.api`) turns it into JSON with :meth:`AgentStatus.to_json`, and ``ldp-agent
status`` (:mod:`agent.verbs`) reads that JSON back with :meth:`AgentStatus.from_json`, through
:mod:`protocol.schema` as the config files are read (docs/design.md, convention 21), to print
it. The JSON is what scripts read (``ldp-agent status --json``): its keys and their order
stay as they are. A use case's figures are in it only where they are known: none without
consent, only ``epsilon_total`` (what the manifest recorded) for a stopped use case.

This module imports nothing beyond the standard library and protocol.schema (itself standard
library only), so the CLI that talks to a running daemon stays light.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.plain import Json, JsonObject
from protocol.schema import SchemaError, decode

__all__ = ["AgentStatus", "UseCaseStatus"]


@dataclass(frozen=True, slots=True, kw_only=True)
class UseCaseStatus:
    """One use case: its definition, its state, and (where known) its spending and what waits.

    Attributes:
        use_case: the use case's name.
        definition: its reference (``name@hash``).
        mechanism: its mechanism's name.
        period: its period (``"6h"``, ``"1d"``).
        daily_limit: records sent per day at most.
        epsilon_per_record: ε one record costs.
        epsilon_cap: the lifetime ε cap.
        state: ``"active"``, ``"no consent"``, ``"stopped: lifetime ε cap reached"``,
            ``"stopped: <why>"`` or ``"expired on <date> (owner: <owner>): records refused"``.
        records_today: records charged today (None: not known, as for every figure below).
        epsilon_today: ε charged today.
        epsilon_total: lifetime ε charged (for a stopped use case, what the manifest recorded).
        pending_records: privatized records of open periods.
        open_counters: running counter totals of open periods.
        outbox: reports waiting.
        awaiting_receipt: of those, reports sent and waiting for their receipt.
        dropped_reports: reports dropped from the outbox (overflow or age).
        unsent_records: records not sent because of the daily limit or the ε cap.
        memo_generation: memos started anew by registry changes.
    """

    use_case: str
    definition: str
    mechanism: str
    period: str
    daily_limit: int
    epsilon_per_record: float
    epsilon_cap: float
    state: str
    records_today: int | None = None
    epsilon_today: float | None = None
    epsilon_total: float | None = None
    pending_records: int | None = None
    open_counters: int | None = None
    outbox: int | None = None
    awaiting_receipt: int | None = None
    dropped_reports: int | None = None
    unsent_records: int | None = None
    memo_generation: int | None = None

    def to_json(self) -> JsonObject:
        """The JSON object (the figures not known are left out)."""
        out: JsonObject = {
            "use_case": self.use_case,
            "definition": self.definition,
            "mechanism": self.mechanism,
            "period": self.period,
            "daily_limit": self.daily_limit,
            "epsilon_per_record": self.epsilon_per_record,
            "epsilon_cap": self.epsilon_cap,
            "state": self.state,
        }
        figures: JsonObject = {
            "records_today": self.records_today,
            "epsilon_today": self.epsilon_today,
            "epsilon_total": self.epsilon_total,
            "pending_records": self.pending_records,
            "open_counters": self.open_counters,
            "outbox": self.outbox,
            "awaiting_receipt": self.awaiting_receipt,
            "dropped_reports": self.dropped_reports,
            "unsent_records": self.unsent_records,
            "memo_generation": self.memo_generation,
        }
        out.update((key, value) for key, value in figures.items() if value is not None)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentStatus:
    """A snapshot of the agent for ``ldp-agent status``.

    Attributes:
        consent: whether the user opted in.
        consent_granted_at: when (None without consent).
        registry: the registry's hash (hex).
        registry_source: where the registry was loaded from.
        next_cycle: when the next collection cycle is due (None: not scheduled yet).
        last_cycle: when the last one ran (None before any).
        cycles: collection cycles completed.
        outbox: reports waiting.
        ledger: ``"ok"``, or why the ledger does not open.
        use_cases: every use case of the registry, in its order.
        pid: the process that answered.
        recording: ``"ok"``, or ``"paused since <time>: <why>..."`` while the state directory
            cannot be written (a full disk): values are refused and nothing is sent until it can
            (absent from the JSON of an agent of the previous release: read as ``"ok"``).
        brokers: the brokers in the order this device tries them, its primary first (empty when
            not known: the JSON of an agent of the previous release; then the JSON has neither
            key).
        broker_in_use: the broker of the open connection (None while none is open, and when the
            answer does not come from a running daemon).
    """

    consent: bool
    consent_granted_at: float | None
    registry: str
    registry_source: str
    next_cycle: float | None
    last_cycle: float | None
    cycles: int
    outbox: int
    ledger: str
    use_cases: tuple[UseCaseStatus, ...]
    pid: int
    recording: str = "ok"
    brokers: tuple[str, ...] = ()
    broker_in_use: str | None = None

    def to_json(self) -> JsonObject:
        """The JSON object the API answers and ``ldp-agent status --json`` prints."""
        out: JsonObject = {
            "consent": self.consent,
            "consent_granted_at": self.consent_granted_at,
            "registry": self.registry,
            "registry_source": self.registry_source,
            "next_cycle": self.next_cycle,
            "last_cycle": self.last_cycle,
            "cycles": self.cycles,
            "outbox": self.outbox,
            "ledger": self.ledger,
            "use_cases": [row.to_json() for row in self.use_cases],
            "pid": self.pid,
            "recording": self.recording,
        }
        out.update(self._brokers_json())
        return out

    def _brokers_json(self) -> JsonObject:
        # Only where known, like a use case's figures: the core alone knows no brokers.
        out: JsonObject = {}
        if self.brokers:
            out["brokers"] = list(self.brokers)
            out["broker_in_use"] = self.broker_in_use
        return out

    @classmethod
    def from_json(cls, data: Json) -> AgentStatus:
        """Read :meth:`to_json`'s object back (:mod:`protocol.schema`, the reader of the config
        files: every field's type checked, unknown keys refused).

        Raises:
            ValueError: naming the field that is missing or of the wrong type.
        """
        try:
            return decode(cls, data)
        except SchemaError as e:
            raise ValueError(f"status: {e.field!r}: {e.problem}") from None
