"""The state manifest's document: the device's identity and, per use case, the generation of
its file and the ε it had spent (docs/state-integrity.md, "The manifest"); a removed use case's
entry keeps what it must go on from if the registry adds it back
(docs/privacy-accounting.md, "Registry changes").

Sealed as ``manifest`` at :data:`agent.state.MANIFEST_VERSION`, with the same strict plain-data
round trips as the other documents of :mod:`agent.state`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from agent.state import DEVICE_ID_BYTES, LedgerDoc, _integer, _need, _number, _optional
from protocol.plain import PlainDoc

__all__ = ["ManifestDoc", "ManifestEntry", "with_ledger_flag"]


@dataclass(frozen=True)
class ManifestEntry:
    """What the manifest remembers of one use case's file.

    Attributes:
        generation: the generation of the file last written.
        epsilon_total: lifetime ε the use case had charged by then (shown even if it stops).
        removed: the registry no longer has the use case: its file was wiped, and this entry
            is what remains of it (a use case added back later goes on from here: its ε spent
            is never reset, ``docs/privacy-accounting.md``).
        budget: for a removed use case, its accounting when it was wiped (``Budget.to_plain``).
        memo: for a removed use case, whether it had drawn permanent randomness.
        memos: for a removed use case, how many memos its wiped state held (each charged when
            the use case comes back, ``docs/privacy-accounting.md``); None where that is not
            known (a manifest written before the count was kept, a state that did not open).
    """

    generation: int
    epsilon_total: float
    removed: bool = False
    budget: PlainDoc | None = None
    memo: bool = False
    memos: int | None = None

    def to_plain(self) -> PlainDoc:
        """Plain data (the fields of a removed use case only when it is one)."""
        out: PlainDoc = {"generation": self.generation, "epsilon_total": self.epsilon_total}
        if self.removed:
            out.update(removed=True, budget=dict(self.budget or {}), memo=self.memo)
            if self.memos is not None:
                out["memos"] = self.memos
        return out


@dataclass(frozen=True)
class ManifestDoc:
    """The device's identity and the generation of every use-case file (sealed as ``manifest``).

    Attributes:
        device: 16 random bytes naming this state directory's device (never leaves it).
        entries: use-case name -> its entry.
        ledger: a ledger has been written under this manifest, so a missing ``ledger.sealed``
            was deleted (False in manifests of the previous release).
    """

    device: bytes
    entries: dict[str, ManifestEntry] = field(default_factory=dict)
    ledger: bool = False

    def with_entry(self, name: str, entry: ManifestEntry) -> ManifestDoc:
        """A copy with ``name``'s entry replaced."""
        return ManifestDoc(self.device, {**self.entries, name: entry}, self.ledger)

    def to_plain(self) -> PlainDoc:
        """Plain data."""
        out: PlainDoc = {
            "device": self.device,
            "entries": {n: e.to_plain() for n, e in self.entries.items()},
        }
        if self.ledger:
            out["ledger"] = True
        return out

    @classmethod
    def from_plain(cls, data: object) -> ManifestDoc:
        """Restore from :meth:`to_plain` (ValueError naming the malformed part)."""
        device = _need(data, "device", bytes, "manifest")
        if len(device) != DEVICE_ID_BYTES:
            raise ValueError(f"manifest.device: expected {DEVICE_ID_BYTES} bytes")
        entries: dict[str, ManifestEntry] = {}
        for name, raw in _need(data, "entries", dict, "manifest").items():
            where = f"manifest.entries[{name!r}]"
            if not isinstance(name, str):
                raise ValueError("manifest.entries: keys are use-case names")
            generation = _need(raw, "generation", int, where)
            spent = _need(raw, "epsilon_total", (int, float), where)
            removed = _optional(raw, "removed", False)
            budget = _optional(raw, "budget", None)
            if not isinstance(removed, bool) or (budget is not None and not isinstance(budget, dict)):
                raise ValueError(f"{where}: a removed use case's entry is malformed")
            entries[name] = ManifestEntry(
                generation=int(_number(generation, f"{where}.generation")),
                epsilon_total=float(_number(spent, f"{where}.epsilon_total")),
                removed=removed,
                budget=None if budget is None else dict(budget),
                memo=bool(_optional(raw, "memo", False)),
                memos=None if (m := _optional(raw, "memos", None)) is None else _integer(m, f"{where}.memos"),
            )
        ledger = _optional(data, "ledger", False)
        if not isinstance(ledger, bool):
            raise ValueError("manifest.ledger: expected a boolean")
        return cls(device=device, entries=entries, ledger=ledger)


def with_ledger_flag(manifest: ManifestDoc, ledger: LedgerDoc | None) -> ManifestDoc:
    """``manifest`` marked as having a ledger once ``ledger`` was written under it (it names the
    manifest's device), so that deleting the ledger is seen (docs/state-integrity.md)."""
    if not manifest.ledger and ledger is not None and ledger.device == manifest.device:
        return replace(manifest, ledger=True)
    return manifest
