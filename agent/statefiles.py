"""The agent's state directory on disk: each sealed file read, or written on its own.

:class:`StateFiles` is the directory's file I/O and nothing else. Every write seals one
document and atomically replaces one file (:mod:`agent.sealed`); no write touches another
file. Which files a step writes, and in which order, is decided by :mod:`agent.transaction`
(a step's use-case files, then the manifest) and, for the writes of a load, of a re-enrolment
and of consent, by :mod:`agent.loading`, :mod:`agent.re_enrolment` and :mod:`agent.core`.
What is loaded from the files lives apart, in :class:`agent.device_state.DeviceState`
(docs/state-integrity.md says what the files are and why they are written in that order).

Two facts about the disk are kept here, because every write updates them: :attr:`StateFiles.blocked`
(the last write failed, a full disk: the agent's back-pressure) and
:attr:`StateFiles.manifest_on_disk` (the manifest as last read or written).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from agent.errors import StateUnreadableError, StateWriteError
from agent.manifest import ManifestDoc
from agent.sealed import Sealer, fsync_directory
from agent.state import (
    AGENT_VERSION,
    CONSENT_VERSION,
    LEDGER_VERSION,
    MANIFEST_VERSION,
    USE_CASE_VERSION,
    AgentDoc,
    ConsentDoc,
    LedgerDoc,
    UseCaseDoc,
    ledger_from_v1,
)
from protocol.plain import PlainDoc

__all__ = ["CONSENT", "LEDGER", "MANIFEST", "SCHEDULE", "SUFFIX", "StateFiles"]

log = logging.getLogger("ldp_agent")

SUFFIX = ".sealed"
CONSENT = "consent" + SUFFIX
LEDGER = "ledger" + SUFFIX
MANIFEST = "manifest" + SUFFIX
SCHEDULE = "agent" + SUFFIX
_FILE_PREFIX = "uc-"


class _Document(Protocol):
    """A document of :mod:`agent.state` or :mod:`agent.manifest`: what is sealed is its plain form."""

    def to_plain(self) -> PlainDoc: ...


class StateFiles:
    """The sealed files of one state directory, each read and written on its own.

    Args:
        directory: where the sealed files live (created with mode 0700).
        sealer: encrypts and decrypts the files.
    """

    def __init__(self, directory: Path, sealer: Sealer) -> None:
        self._directory = directory
        self._sealer = sealer
        self._paths: dict[str, Path] = {}
        self._use_case_paths: dict[str, Path] = {}
        self._blocked: StateWriteError | None = None
        self._manifest_on_disk: ManifestDoc | None = None
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        # A crash between writing a temporary file and renaming it leaves it behind.
        for p in directory.glob(".*.tmp"):
            p.unlink(missing_ok=True)

    @property
    def directory(self) -> Path:
        """The state directory."""
        return self._directory

    @property
    def blocked(self) -> StateWriteError | None:
        """Why the last write failed (a full disk), or None once a write succeeds again."""
        return self._blocked

    @property
    def manifest_on_disk(self) -> ManifestDoc | None:
        """The manifest as last read or written (None before, or when it did not open)."""
        return self._manifest_on_disk

    def path(self, name: str) -> Path:
        """The path of the state file ``name``."""
        # Made once per name: every step writes the manifest and a few files by path.
        found = self._paths.get(name)
        if found is None:
            found = self._paths[name] = self._directory / name
        return found

    def use_case_path(self, name: str) -> Path:
        """The sealed file of use case ``name``."""
        found = self._use_case_paths.get(name)
        if found is None:
            found = self._use_case_paths[name] = self.path(f"{_FILE_PREFIX}{name}{SUFFIX}")
        return found

    def has(self, name: str) -> bool:
        """True if the state file ``name`` (``CONSENT``, ``LEDGER``, ...) exists."""
        return self.path(name).exists()

    def use_case_names(self) -> set[str]:
        """The use cases that have a file in the directory."""
        return {p.name[len(_FILE_PREFIX) : -len(SUFFIX)] for p in self._directory.glob(f"{_FILE_PREFIX}*{SUFFIX}")}

    # ------------------------------------------------------------------ reading

    def read_consent(self) -> ConsentDoc | None:
        """The consent record (None if there is none).

        Raises:
            StateUnreadableError, ValueError: it does not open or does not parse.
        """
        raw = self._sealer.read(self.path(CONSENT), "consent", CONSENT_VERSION)
        return None if raw is None else ConsentDoc.from_plain(raw)

    def read_ledger(self) -> LedgerDoc | None:
        """The ledger (None if there is none); a ledger of version 1 is read as version 2, its
        brokers unknown, and written as version 2 at the next change.

        Raises:
            StateUnreadableError, ValueError: it does not open or does not parse.
        """
        path = self.path(LEDGER)
        try:
            raw = self._sealer.read(path, "ledger", LEDGER_VERSION)
        except StateUnreadableError as newer:
            try:
                old = self._sealer.read(path, "ledger", LEDGER_VERSION - 1)
            except StateUnreadableError:
                raise newer from None
            return ledger_from_v1(old)
        return None if raw is None else LedgerDoc.from_plain(raw)

    def read_manifest(self) -> ManifestDoc | None:
        """The manifest (None if there is none), remembered as :attr:`manifest_on_disk`.

        Raises:
            StateUnreadableError, ValueError: it does not open or does not parse.
        """
        self._manifest_on_disk = None
        raw = self._sealer.read(self.path(MANIFEST), "manifest", MANIFEST_VERSION)
        if raw is not None:
            self._manifest_on_disk = ManifestDoc.from_plain(raw)
        return self._manifest_on_disk

    def read_use_case(self, name: str) -> UseCaseDoc | None:
        """The document of use case ``name`` (None if it has no file).

        Raises:
            StateUnreadableError, ValueError: it does not open or does not parse.
        """
        raw = self._sealer.read(self.use_case_path(name), f"usecase:{name}", USE_CASE_VERSION)
        return None if raw is None else UseCaseDoc.from_plain(raw)

    def read_use_case_doc(self, name: str) -> UseCaseDoc | None:
        """The document in use case ``name``'s file, or None if it is missing or does not open."""
        try:
            return self.read_use_case(name)
        except (StateUnreadableError, ValueError):
            return None

    def read_schedule(self) -> AgentDoc:
        """The schedule file as it is, whatever device it names (a fresh one if missing or unreadable)."""
        try:
            raw = self._sealer.read(self.path(SCHEDULE), "agent", AGENT_VERSION)
            return AgentDoc() if raw is None else AgentDoc.from_plain(raw)
        except (StateUnreadableError, ValueError) as e:
            log.warning("schedule state unreadable (%s); starting a new schedule", e)
            return AgentDoc()

    # ------------------------------------------------------------------ writing: one file each

    def _write(self, path: Path, purpose: str, version: int, doc: _Document, *, sync_directory: bool = True) -> None:
        """Seal and write one file, keeping :attr:`blocked` up to date (the agent's back-pressure)."""
        try:
            self._sealer.write(path, purpose, version, doc.to_plain(), sync_directory=sync_directory)
        except StateWriteError as e:
            self._blocked = e
            raise
        self._blocked = None

    def write_use_case(self, name: str, doc: UseCaseDoc, *, sync_directory: bool = True) -> None:
        """Seal and write use case ``name``'s file (its device and generation set by the caller).

        ``sync_directory=False``: the rename is made durable by the caller's :meth:`sync`, once
        for the step's files (:func:`agent.transaction.commit`)."""
        self._write(self.use_case_path(name), f"usecase:{name}", USE_CASE_VERSION, doc, sync_directory=sync_directory)

    def sync(self) -> None:
        """Make the renames of the files written with ``sync_directory=False`` durable (one fsync
        of the state directory).

        Raises:
            StateWriteError: the directory cannot be synced; :attr:`blocked` says so, as for a write.
        """
        try:
            self._sealer.sync(self.directory)
        except StateWriteError as e:
            self._blocked = e
            raise

    def write_manifest(self, manifest: ManifestDoc) -> None:
        """Seal and write the manifest, remembered as :attr:`manifest_on_disk`."""
        self._write(self.path(MANIFEST), "manifest", MANIFEST_VERSION, manifest)
        self._manifest_on_disk = manifest

    def write_ledger(self, ledger: LedgerDoc) -> None:
        """Seal and write the ledger as it is (the caller binds it to the manifest's device)."""
        self._write(self.path(LEDGER), "ledger", LEDGER_VERSION, ledger)

    def write_consent(self, consent: ConsentDoc) -> None:
        """Seal and write the consent record."""
        self._write(self.path(CONSENT), "consent", CONSENT_VERSION, consent)

    def write_schedule(self, doc: AgentDoc) -> None:
        """Seal and write the schedule bookkeeping as it is."""
        self._write(self.path(SCHEDULE), "agent", AGENT_VERSION, doc)

    def probe(self) -> bool:
        """After a failed write, write the manifest on disk again as it is: True once writes succeed."""
        if self._blocked is not None and self._manifest_on_disk is not None:
            try:
                self.write_manifest(self._manifest_on_disk)
            except StateWriteError:
                return False
        return self._blocked is None

    # ------------------------------------------------------------------ removing

    def unlink(self, paths: list[Path]) -> None:
        """Remove files (missing ones are fine), then fsync the directory once."""
        for path in paths:
            path.unlink(missing_ok=True)
        if paths:
            fsync_directory(self._directory)

    def remove_all(self) -> int:
        """Delete every state file: consent first, the manifest last. Returns how many were removed.

        Consent goes first: a crash half-way leaves an agent that is opted out. The manifest goes
        last, so a half-finished removal never leaves use-case files without their manifest.
        """
        removed = 0
        consent_path = self.path(CONSENT)
        if consent_path.exists():
            consent_path.unlink()
            removed += 1
            fsync_directory(self._directory)
        for p in sorted(self._directory.iterdir(), key=lambda p: (p.name == MANIFEST, p.name)):
            if p.is_file() and (p.name.endswith(SUFFIX) or p.name.endswith(".tmp")):
                p.unlink()
                removed += 1
                if p.name == MANIFEST:
                    fsync_directory(self._directory)
        fsync_directory(self._directory)
        self._manifest_on_disk = None
        return removed
