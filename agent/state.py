"""The documents the agent seals to disk, with strict plain-data round trips.

One sealed file per use case (``uc-<name>.sealed``) holds everything that must change
together, so one atomic write keeps it consistent: the permanent randomness, the open
periods, the accounting and the use case's outbox. A report is charged and enters the
outbox in the same write, so a crash can never leave a report sent but uncharged, or
charged twice. Other files: ``ledger.sealed`` (what left the device), ``agent.sealed`` (the
schedule), ``consent.sealed`` and ``manifest.sealed``.

The manifest makes the use-case files tamper-evident (docs/design.md, invariant 2). AES-GCM proves a
file was sealed under this device's key for this purpose, not that it is the *latest* one:
an older copy, or a deleted file that the agent would recreate with fresh randomness, pass
authentication. So every use-case file carries the device's random identity and a
generation number that grows by one on each write, and the manifest records, per use case,
the generation last written (and the lifetime ε charged by then). A step (a recording, a
collection cycle, an acknowledgement) writes each use-case file it changes with generation
``g + 1``, then the manifest once with the new generations; each is an atomic rename. A crash
in between leaves some files at ``g + 1`` and the manifest at ``g``: the loader accepts a file
exactly one step ahead and at once writes the manifest forward, so the next load demands
``g + 1``. Anything else (file missing while the manifest lists it, generation behind the
manifest, another device's identity) stops that use case and names the file.

What may be in a use-case file (docs/design.md, invariant 1):

* ``permanent`` - the mechanism's per-device state (``state.to_plain()``: α and memo bits,
  dBitFlip buckets and ``f_d``, RAPPOR cohort, memo key and ``B'`` per keyed hash), one per
  counter key, keyed by a keyed hash of the counter key;
* ``totals`` - a counter's running total per open period and key hash: the only raw value,
  deleted when its period closes;
* ``pending`` - privatized records per open period (a uniform reservoir of at most
  ``daily_limit`` records) and, for strings, the keyed hashes already recorded in the period;
* ``outbox`` - encoded reports waiting for the broker's acknowledgement or, with commit
  receipts, for the collector's receipt (a report sent and not yet answered carries the time
  of its last send and the number of sends; files written before receipts lack both, which
  reads as "not sent yet").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from agent.plain_copy import copy_plain
from protocol.plain import Plain, PlainDoc

__all__ = [
    "AGENT_VERSION",
    "CONSENT_VERSION",
    "DEVICE_ID_BYTES",
    "LEDGER_VERSION",
    "MANIFEST_VERSION",
    "USE_CASE_VERSION",
    "AgentDoc",
    "ConsentDoc",
    "LedgerDoc",
    "LedgerEntry",
    "LedgerNotice",
    "OutboxEntry",
    "PendingRecords",
    "UseCaseDoc",
    "ledger_from_v1",
]

USE_CASE_VERSION = 1
LEDGER_VERSION = 2
"""2: each entry names the broker that carried the report (``broker``); 1 had no such field
(:func:`ledger_from_v1` reads it)."""
AGENT_VERSION = 1
CONSENT_VERSION = 1
MANIFEST_VERSION = 1
DEVICE_ID_BYTES = 16


def _need(data: object, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping")
    if key not in data:
        raise ValueError(f"{where}: missing {key!r}")
    value = data[key]
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise ValueError(f"{where}.{key}: expected a number, got a boolean")
    if not isinstance(value, kind):
        raise ValueError(f"{where}.{key}: expected {kind}, got {type(value).__name__}")
    return value


def _optional(data: object, key: str, default: object) -> object:
    if not isinstance(data, dict):
        raise ValueError("expected a mapping")
    return data.get(key, default)


def _device(data: object, where: str) -> bytes | None:
    """The optional ``device`` field binding a file to its manifest (absent in older files)."""
    value = _optional(data, "device", None)
    if value is not None and (not isinstance(value, bytes) or len(value) != DEVICE_ID_BYTES):
        raise ValueError(f"{where}.device: expected {DEVICE_ID_BYTES} bytes")
    return value


def _integer(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: expected a non-negative integer")
    return value


def _number(value: object, where: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: expected a finite non-negative number")
    return value


@dataclass
class OutboxEntry:
    """One encoded report waiting for the broker.

    Attributes:
        report_id: the report's 16-byte random id (also inside ``payload``).
        period: the slot index it reports on.
        payload: the exact bytes to publish (a retry resends them unchanged).
        records: how many records it carries.
        epsilon: the ε charged for it.
        created: wall-clock time it was staged (local only; not in the payload).
        day: the accounting day it was charged on.
        epsilon_today: ε charged on that day, this report included.
        epsilon_total: lifetime ε charged, this report included.
        sent_at: wall-clock time of the last send the broker acknowledged (0: never sent);
            with receipts the report waits for its receipt from then on.
        attempts: sends the broker acknowledged so far.
        sent_records: the records the report was made of, in wire form, while the process that
            staged it holds it (None in an entry read from its file: they are in ``payload``,
            and are not sealed twice). The ledger's entry is made of them (agent.outbox).
    """

    report_id: bytes
    period: int
    payload: bytes
    records: int
    epsilon: float
    created: float
    day: int
    epsilon_today: float
    epsilon_total: float
    sent_at: float = 0.0
    attempts: int = 0
    sent_records: tuple[Plain, ...] | None = field(default=None, compare=False, repr=False)

    def __deepcopy__(self, memo: dict[int, Any]) -> OutboxEntry:
        # Every field is an immutable scalar, or records that are never changed once privatized.
        return OutboxEntry(**self.__dict__)

    def to_plain(self) -> PlainDoc:
        """Plain data."""
        return {
            "sent_at": self.sent_at,
            "attempts": self.attempts,
            "id": self.report_id,
            "period": self.period,
            "payload": self.payload,
            "records": self.records,
            "epsilon": self.epsilon,
            "created": self.created,
            "day": self.day,
            "epsilon_today": self.epsilon_today,
            "epsilon_total": self.epsilon_total,
        }

    @classmethod
    def from_plain(cls, data: object, where: str) -> OutboxEntry:
        """Restore from :meth:`to_plain` (ValueError on anything malformed)."""
        report_id = _need(data, "id", bytes, where)
        if len(report_id) != 16:
            raise ValueError(f"{where}.id: expected 16 bytes")
        return cls(
            report_id=report_id,
            period=int(_number(_need(data, "period", int, where), f"{where}.period")),
            payload=_need(data, "payload", bytes, where),
            records=int(_number(_need(data, "records", int, where), f"{where}.records")),
            epsilon=float(_number(_need(data, "epsilon", float, where), f"{where}.epsilon")),
            created=float(_need(data, "created", float, where)),
            day=int(_number(_need(data, "day", int, where), f"{where}.day")),
            epsilon_today=float(_number(_need(data, "epsilon_today", float, where), f"{where}.epsilon_today")),
            epsilon_total=float(_number(_need(data, "epsilon_total", float, where), f"{where}.epsilon_total")),
            # Absent in files written before commit receipts: the report was never sent.
            sent_at=float(_number(_optional(data, "sent_at", 0.0), f"{where}.sent_at")),
            attempts=int(_integer(_optional(data, "attempts", 0), f"{where}.attempts")),
        )


@dataclass
class PendingRecords:
    """Privatized records of one open period: a uniform reservoir (Algorithm R).

    Attributes:
        records: at most ``daily_limit`` privatized records in wire form.
        offered: how many records were offered to the reservoir this period.
        seen: keyed hashes of the strings already recorded this period (strings only).
        definition: the hash of the use-case definition the records were made under (None in
            a file of the previous release: the use case's definition then).
        cost: the ε one of the records costs (None in such a file: the use case's cost then).
    """

    records: list[Plain] = field(default_factory=list)
    offered: int = 0
    seen: list[bytes] = field(default_factory=list)
    definition: bytes | None = None
    cost: float | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> PendingRecords:
        return PendingRecords(**{**self.__dict__, "records": copy_plain(self.records), "seen": list(self.seen)})

    def to_plain(self) -> PlainDoc:
        """Plain data."""
        out: PlainDoc = {"records": list(self.records), "offered": self.offered, "seen": list(self.seen)}
        if self.definition is not None:
            out["definition"] = self.definition
        if self.cost is not None:
            out["cost"] = self.cost
        return out

    @classmethod
    def from_plain(cls, data: object, where: str) -> PendingRecords:
        """Restore from :meth:`to_plain`."""
        records = _need(data, "records", list, where)
        offered = _need(data, "offered", int, where)
        seen = _need(data, "seen", list, where)
        if offered < len(records):
            raise ValueError(f"{where}: more records than were offered")
        if not all(isinstance(s, bytes) and len(s) == 32 for s in seen):
            raise ValueError(f"{where}.seen: expected 32-byte keyed hashes")
        # Absent in files of the previous release (new fields last, with defaults).
        definition = _optional(data, "definition", None)
        if definition is not None and (not isinstance(definition, bytes) or len(definition) != 16):
            raise ValueError(f"{where}.definition: expected 16 bytes")
        cost = _optional(data, "cost", None)
        return cls(
            records=list(records),
            offered=offered,
            seen=list(seen),
            definition=definition,
            cost=None if cost is None else float(_number(cost, f"{where}.cost")),
        )


@dataclass
class UseCaseDoc:
    """Everything the agent keeps about one use case (sealed as ``usecase:<name>``).

    Attributes:
        fingerprint: digest of the mechanism parameters the permanent state was drawn for.
        hash_key: 32-byte secret key of the keyed hashes (counter keys, strings seen).
        permanent: key hash -> the mechanism's plain per-device state.
        totals: period -> key hash -> running total (counters only; erased at close).
        pending: period -> privatized records (events and strings).
        last_closed: the latest period closed (reported or dropped); -1 before any.
        budget: the accounting (``Budget.to_plain``).
        outbox: reports waiting for acknowledgement, oldest first.
        dropped_reports: reports dropped from the outbox (overflow or age).
        unsent_records: records not sent because of the daily limit or the ε cap.
        device: the identity of the device whose manifest this file belongs to (None in a
            file written before manifests existed).
        generation: the file's write counter, checked against the manifest (0 in such a file).
        definition: the hash of the use-case definition the state was last written under
            (``protocol.registry.UseCase.definition``); None in a file of the previous release.
        period: the period (``"6h"``, ``"1d"``) of that definition; None in such a file.
        memo_generation: how many times the registry changed the mechanism under a drawn memo,
            each time starting a new one (``docs/privacy-accounting.md``); 0 at first.
    """

    fingerprint: bytes
    hash_key: bytes
    permanent: dict[bytes, Plain] = field(default_factory=dict)
    totals: dict[int, dict[bytes, int | float]] = field(default_factory=dict)
    pending: dict[int, PendingRecords] = field(default_factory=dict)
    last_closed: int = -1
    budget: PlainDoc = field(default_factory=dict)
    outbox: list[OutboxEntry] = field(default_factory=list)
    dropped_reports: int = 0
    unsent_records: int = 0
    device: bytes | None = None
    generation: int = 0
    definition: bytes | None = None
    period: str | None = None
    memo_generation: int = 0

    def __deepcopy__(self, memo: dict[int, Any]) -> UseCaseDoc:
        # copy.deepcopy field by field: a step copies several per report, the generic way cost the most
        plain = {name: copy_plain(getattr(self, name)) for name in ("permanent", "totals", "budget")}
        pending = {p: r.__deepcopy__(memo) for p, r in self.pending.items()}
        outbox = [e.__deepcopy__(memo) for e in self.outbox]
        return UseCaseDoc(**{**self.__dict__, **plain, "pending": pending, "outbox": outbox})

    def to_plain(self) -> PlainDoc:
        """Plain data."""
        out: PlainDoc = {
            "fingerprint": self.fingerprint,
            "hash_key": self.hash_key,
            "permanent": dict(self.permanent),
            "totals": {p: dict(t) for p, t in self.totals.items()},
            "pending": {p: r.to_plain() for p, r in self.pending.items()},
            "last_closed": self.last_closed,
            "budget": dict(self.budget),
            "outbox": [e.to_plain() for e in self.outbox],
            "dropped_reports": self.dropped_reports,
            "unsent_records": self.unsent_records,
            "device": self.device,
            "generation": self.generation,
        }
        if self.definition is not None:
            out["definition"] = self.definition
        if self.period is not None:
            out["period"] = self.period
        if self.memo_generation:
            out["memo_generation"] = self.memo_generation
        return out

    @classmethod
    def from_plain(cls, data: object) -> UseCaseDoc:
        """Restore from :meth:`to_plain`.

        Raises:
            ValueError: naming the malformed part.
        """
        w = "usecase"
        permanent = _need(data, "permanent", dict, w)
        if not all(isinstance(k, bytes) and len(k) == 32 for k in permanent):
            raise ValueError(f"{w}.permanent: keys are 32-byte keyed hashes")
        totals_raw = _need(data, "totals", dict, w)
        totals: dict[int, dict[bytes, int | float]] = {}
        for p, t in totals_raw.items():
            if not isinstance(p, int) or not isinstance(t, dict):
                raise ValueError(f"{w}.totals: expected period -> table")
            entry: dict[bytes, int | float] = {}
            for k, v in t.items():
                if not isinstance(k, bytes) or len(k) != 32:
                    raise ValueError(f"{w}.totals[{p}]: keys are 32-byte keyed hashes")
                entry[k] = _number(v, f"{w}.totals[{p}]")
            totals[p] = entry
        pending_raw = _need(data, "pending", dict, w)
        pending: dict[int, PendingRecords] = {}
        for p, r in pending_raw.items():
            if not isinstance(p, int):
                raise ValueError(f"{w}.pending: periods are integers")
            pending[p] = PendingRecords.from_plain(r, f"{w}.pending[{p}]")
        hash_key = _need(data, "hash_key", bytes, w)
        if len(hash_key) != 32:
            raise ValueError(f"{w}.hash_key: expected 32 bytes")
        # Files written before manifests existed have neither field (schema evolution: new fields
        # last, with defaults); the manifest check treats them as generation 0 of no device.
        device: bytes | None = None
        generation = 0
        assert isinstance(data, dict)
        if "device" in data or "generation" in data:
            device = _need(data, "device", bytes, w)
            if len(device) != DEVICE_ID_BYTES:
                raise ValueError(f"{w}.device: expected {DEVICE_ID_BYTES} bytes")
            generation = int(_number(_need(data, "generation", int, w), f"{w}.generation"))
        # Absent in files of the previous release: the definition is then the registry's.
        definition = data.get("definition")
        if definition is not None and (not isinstance(definition, bytes) or len(definition) != 16):
            raise ValueError(f"{w}.definition: expected 16 bytes")
        period = data.get("period")
        if period is not None and period not in ("6h", "1d"):
            raise ValueError(f"{w}.period: expected '6h' or '1d'")
        return cls(
            fingerprint=_need(data, "fingerprint", bytes, w),
            hash_key=hash_key,
            permanent=dict(permanent),
            totals=totals,
            pending=pending,
            last_closed=_need(data, "last_closed", int, w),
            budget=dict(_need(data, "budget", dict, w)),
            outbox=[
                OutboxEntry.from_plain(e, f"{w}.outbox[{i}]") for i, e in enumerate(_need(data, "outbox", list, w))
            ],
            dropped_reports=_need(data, "dropped_reports", int, w),
            unsent_records=_need(data, "unsent_records", int, w),
            device=device,
            generation=generation,
            definition=definition,
            period=period,
            memo_generation=int(_integer(data.get("memo_generation", 0), f"{w}.memo_generation")),
        )


@dataclass
class LedgerEntry:
    """One report that left the device (acknowledged by the broker).

    Attributes:
        report_id: the report id.
        use_case: its use case.
        period: the slot it reported on.
        records: the privatized records exactly as sent (wire form).
        epsilon: ε charged for it.
        day: the UTC day number it was charged on.
        epsilon_today: ε charged on that day, this report included.
        epsilon_total: lifetime ε of the use case, this report included.
        sent: wall-clock time of the acknowledgement (local only).
        status: ``"sent"`` (the broker acknowledged it; with receipts, the collector has not
            answered yet), ``"counted"`` (the collector committed it), ``"refused: <reason>"``
            (the collector rejected it for good) or ``"refused by the broker: <reason>"`` (the
            broker refused its last send; it waits in the outbox to be tried again,
            agent.outbox). Entries written before receipts read "sent".
        broker: the broker (``host:port``) whose connection acknowledged the report's last
            send or brought its receipt; "" when not known (an entry of a ledger of version 1,
            or an in-memory broker without a name).
    """

    report_id: bytes
    use_case: str
    period: int
    records: list[Plain]
    epsilon: float
    day: int
    epsilon_today: float
    epsilon_total: float
    sent: float
    status: str = "sent"
    broker: str = ""

    def __copy__(self) -> LedgerEntry:
        return LedgerEntry(**self.__dict__)  # copy.copy's shallow copy, without its reduce protocol

    def to_plain(self) -> PlainDoc:
        """Plain data."""
        return {
            "status": self.status,
            "broker": self.broker,
            "id": self.report_id,
            "use_case": self.use_case,
            "period": self.period,
            "records": self.records,
            "epsilon": self.epsilon,
            "day": self.day,
            "epsilon_today": self.epsilon_today,
            "epsilon_total": self.epsilon_total,
            "sent": self.sent,
        }

    @classmethod
    def from_plain(cls, data: object, where: str) -> LedgerEntry:
        """Restore from :meth:`to_plain`."""
        return cls(
            report_id=_need(data, "id", bytes, where),
            use_case=_need(data, "use_case", str, where),
            period=_need(data, "period", int, where),
            records=list(_need(data, "records", list, where)),
            epsilon=float(_need(data, "epsilon", float, where)),
            day=_need(data, "day", int, where),
            epsilon_today=float(_need(data, "epsilon_today", float, where)),
            epsilon_total=float(_need(data, "epsilon_total", float, where)),
            sent=float(_need(data, "sent", float, where)),
            status=_status(_optional(data, "status", "sent"), f"{where}.status"),
            broker=_need(data, "broker", str, where),
        )


def _status(value: object, where: str) -> str:
    if not isinstance(value, str) or not (
        value in ("sent", "counted") or value.startswith(("refused: ", "refused by the broker: "))
    ):
        raise ValueError(f"{where}: expected 'sent', 'counted', 'refused: <reason>' or 'refused by the broker: ...'")
    return value


@dataclass
class LedgerNotice:
    """Something the agent did to a use case's state that the user should be able to see: a
    registry change started a new definition or a new memo, or removed a use case and wiped
    its state. Nothing of it leaves the device.

    Attributes:
        at: wall-clock time (local only).
        use_case: the use case's name.
        text: what happened, in a sentence.
    """

    at: float
    use_case: str
    text: str

    def to_plain(self) -> PlainDoc:
        """Plain data."""
        return {"at": self.at, "use_case": self.use_case, "text": self.text}

    @classmethod
    def from_plain(cls, data: object, where: str) -> LedgerNotice:
        """Restore from :meth:`to_plain`."""
        return cls(
            at=float(_need(data, "at", (int, float), where)),
            use_case=_need(data, "use_case", str, where),
            text=_need(data, "text", str, where),
        )


@dataclass
class LedgerDoc:
    """The transparency ledger (sealed as ``ledger``): the reports that left the device, and
    notices of what registry changes did to the state (absent in files of the previous release).

    ``device`` is the identity of the manifest the ledger was written under (None in a file of
    the previous release, bound at the next load): a ledger left behind when the manifest is
    deleted shows that the directory is not a new device's (docs/state-integrity.md).
    """

    entries: list[LedgerEntry] = field(default_factory=list)
    notices: list[LedgerNotice] = field(default_factory=list)
    device: bytes | None = None

    def to_plain(self) -> PlainDoc:
        """Plain data."""
        out: PlainDoc = {"entries": [e.to_plain() for e in self.entries]}
        if self.notices:
            out["notices"] = [n.to_plain() for n in self.notices]
        if self.device is not None:
            out["device"] = self.device
        return out

    @classmethod
    def from_plain(cls, data: object) -> LedgerDoc:
        """Restore from :meth:`to_plain`."""
        raw = _need(data, "entries", list, "ledger")
        notices = _optional(data, "notices", [])
        if not isinstance(notices, list):
            raise ValueError("ledger.notices: expected a list")
        return cls(
            [LedgerEntry.from_plain(e, f"ledger.entries[{i}]") for i, e in enumerate(raw)],
            [LedgerNotice.from_plain(n, f"ledger.notices[{i}]") for i, n in enumerate(notices)],
            device=_device(data, "ledger"),
        )

    def epsilon_by_use_case(self) -> dict[str, float]:
        """Per use case, the highest lifetime ε an entry records (what status never shows less of)."""
        out: dict[str, float] = {}
        for e in self.entries:
            out[e.use_case] = max(out.get(e.use_case, 0.0), e.epsilon_total)
        return out


def ledger_from_v1(data: object) -> LedgerDoc:
    """A ledger of version 1 (before brokers were recorded): each entry's broker is unknown ("").

    Raises:
        ValueError: the document is not a ledger of version 1 (one that names brokers is not).
    """
    raw = _need(data, "entries", list, "ledger")
    entries: list[Plain] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or "broker" in entry:
            raise ValueError(f"ledger.entries[{i}]: not an entry of a version 1 ledger")
        entries.append({**entry, "broker": ""})
    assert isinstance(data, dict)  # _need checked it
    return LedgerDoc.from_plain({**data, "entries": entries})


@dataclass
class AgentDoc:
    """Schedule bookkeeping (sealed as ``agent``).

    Attributes:
        next_cycle: wall-clock time the next collection cycle is due.
        cycles: collection cycles completed.
        last_cycle: wall-clock time of the last completed cycle (0 before any).
        device: the identity of the manifest it was written under (None in older files).
    """

    next_cycle: float = 0.0
    cycles: int = 0
    last_cycle: float = 0.0
    device: bytes | None = None

    def to_plain(self) -> PlainDoc:
        """Plain data."""
        out: PlainDoc = {"next_cycle": self.next_cycle, "cycles": self.cycles, "last_cycle": self.last_cycle}
        if self.device is not None:
            out["device"] = self.device
        return out

    @classmethod
    def from_plain(cls, data: object) -> AgentDoc:
        """Restore from :meth:`to_plain`."""
        return cls(
            next_cycle=float(_need(data, "next_cycle", float, "agent")),
            cycles=_need(data, "cycles", int, "agent"),
            last_cycle=float(_need(data, "last_cycle", float, "agent")),
            device=_device(data, "agent"),
        )


@dataclass(frozen=True)
class ConsentDoc:
    """The user's opt-in (sealed as ``consent``).

    Attributes:
        granted_at: wall-clock time consent was granted.
        device: the identity of the manifest the grant belongs to (None until the first load
            after the grant, and in files of the previous release, which that load binds).
    """

    granted_at: float
    device: bytes | None = None

    def to_plain(self) -> PlainDoc:
        """Plain data."""
        out: PlainDoc = {"granted_at": self.granted_at}
        if self.device is not None:
            out["device"] = self.device
        return out

    @classmethod
    def from_plain(cls, data: object) -> ConsentDoc:
        """Restore from :meth:`to_plain`."""
        return cls(granted_at=float(_need(data, "granted_at", float, "consent")), device=_device(data, "consent"))
