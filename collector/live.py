"""Materialised aggregates: what the HTTP API reads instead of re-reading the store.

The store keeps each (use case, period) aggregate as a base plus the segments that commits
added (``collector.store``); reading one decompresses the base and folds every segment. For
the deployed Count Mean Sketch (k = 65,536, m = 1,024) that is a 256 MiB table per read, so
the running service keeps the aggregates people read in memory and keeps them current:

* A key becomes resident when a request first asks for it (read whole once: the base and
  the segments not yet compacted into it). After each commit, ingest names the keys it
  added to (:meth:`LiveAggregates.committed`); a background task folds into each of those
  that is resident only the segments committed since it was last current
  (:meth:`CheckpointStore.catch_up`). It reads the new segments back rather than folding the
  commit's batches from ingest's memory: that keeps the view exact when several collectors
  share one database (every member's commits are folded, whoever serves the request), and
  costs no more than what was added.
* Keys nobody has asked this member for are not materialised. In a group each member would
  otherwise fold every member's segments: for a mechanism whose segments carry records (the
  Safari sketch) that is each report read back and folded once per member, which cost three
  members well over one member's CPU per message (docs/benchmarks.md, "The live view in a
  group of collectors"). Now the member that serves a key pays for keeping it current, and
  members that only ingest pay nothing for it.
* A request checks that its key is current (one query on the segment sequence; normally the
  background task has already caught up), then computes the estimate from memory with
  :func:`collector.estimation.estimate_aggregate` and keeps it with the aggregate's version
  (which changes with every commit that adds to the key). A repeated request for an
  unchanged aggregate reuses it.

Memory is bounded: resident aggregates are kept least recently used first out, up to
``estimation.memory_mib`` MiB of array memory (their numpy arrays, caches included, measured
as the store measures them). An aggregate larger than the whole bound is read for the
request and not kept, as the CLI does.

Damage is refused while running too, not only at the open: an answer leaves only after a
check of the file (:meth:`Store.check`, the open's checks without the report ids, which no
read here touches) that began after everything the answer was computed from had been read.
A flip in an index or in ``sqlite_sequence`` is covered by no row checksum and reads as a
silently missing segment; checking after the read catches it before anybody sees the number,
and from then on every request is refused, naming the file, as the open refuses it, and
:meth:`run` raises it, which stops the service (docs/deploy.md, "When the store is damaged").
Nothing read since the last check, nothing to check: a repeated request for an unchanged
aggregate costs no check. The service also runs the full check (report ids included) every
``store.check_interval_s`` (:meth:`check`).

Threads, not processes: one thread owns the read-only SQLite connection and does every read
and fold; estimates run in ``estimation.workers`` other threads. Worker processes would need
each aggregate copied to them (what they did before: each re-read it from SQLite), while the
heavy parts of an estimate - numpy gathers and sums over the sketch, the Lasso's BLAS - release
the GIL, so a thread keeps them off the event loop just as well. Each resident aggregate has
a lock: a fold waits for an estimate reading it, and the other way round.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from collector.config import CollectorConfig
from collector.errors import StoreDamaged, StoreError
from collector.estimation import default_period, estimate_aggregate, registry_dir, resolve, series_of
from collector.results import CollectorStatus, EstimateResult, MaterialisedStatus, Series
from collector.status import status_of
from collector.store import KeyInfo, Store, footprint, open_store
from collector.threads import thread_count
from protocol.catalog import Catalog, catalog_of
from protocol.registry import Registry, UseCase
from protocol.server.contract import Aggregate
from protocol.server.parallel import Threads
from runtime.closing import close_in_thread

__all__ = ["Key", "LiveAggregates"]

log = logging.getLogger(__name__)

T = TypeVar("T")

Key = tuple[str, int]
"""A (use case, period) pair."""

_MIN_BYTES = 4096  # what an entry is charged at least (its Python objects, for tiny aggregates)


@dataclass
class _Entry:
    aggregate: Aggregate
    info: KeyInfo
    seq: int
    version: int
    nbytes: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The latest estimate per ``withheld`` flag, with the version it was computed at.
    estimates: dict[bool, tuple[int, EstimateResult]] = field(default_factory=dict)
    measured: int = 0  # footprint after the last estimate (caches an estimate may add)


class LiveAggregates:
    """The (use case, period) aggregates of one store, materialised and kept current.

    Args:
        config: the collector configuration (store path, estimation settings).
        catalog: the use-case definitions accepted; aggregates are keyed by definition ref.
        memory_bytes: the bound on resident array memory (default ``estimation.memory_mib``).
    """

    def __init__(
        self, config: CollectorConfig, catalog: Catalog | Registry, *, memory_bytes: int | None = None
    ) -> None:
        self.config = config
        self.catalog = catalog_of(catalog)
        self.bound = config.estimation.memory_mib << 20 if memory_bytes is None else memory_bytes
        self._io = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="aggregates")
        self._cpu = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(config.estimation.workers, 1), thread_name_prefix="estimate"
        )
        # What one estimate splits its numpy work between (collector.threads): apart from the
        # estimate threads, which wait for these parts.
        count = thread_count()
        self._numpy = concurrent.futures.ThreadPoolExecutor(max_workers=count, thread_name_prefix="numpy")
        self._threads = Threads(self._numpy, count)
        # Everything below is touched only on the aggregates thread (the _io executor) ...
        self._store: Store | None = None
        self._opened_at = -1
        self._entries: collections.OrderedDict[Key, _Entry] = collections.OrderedDict()
        self._bytes = 0
        self._version = 0
        self._totals: tuple[int, list[KeyInfo]] | None = None
        self._loads = self._catch_ups = self._evictions = 0
        self._checks = 0
        # Whether anything was read from the store since its last check, and the damage a
        # check found (every later request is refused with it).
        self._unchecked = False
        self._damage: StoreDamaged | None = None
        # ... except these counters, bumped on the estimate threads under the entry's lock,
        self._estimates = self._reused = 0
        # and these, on the event loop.
        self._dirty: set[Key] = set()
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the event-loop side --------------------------------------------------------------

    async def _on(self, executor: concurrent.futures.Executor, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(fn, *args))

    async def estimate(
        self, use_case: str, period: int | None = None, *, withheld: bool = False
    ) -> tuple[tuple[str, int, int], EstimateResult]:
        """The estimate of ``use_case`` (a name: its current definition; or a definition's ref) for
        ``period`` (default :func:`~collector.estimation.default_period`).

        ``withheld`` also lists the entries that are not released, flagged (the API's ``?withheld=1``).

        Returns:
            ``(use case, period, version)`` - equal for two calls exactly when the result is
            the same computation - and the JSON-ready result of ``estimate_aggregate``.

        Raises:
            KeyError: no accepted definition has that name or ref.
            StoreError: the checkpoint database cannot be read.
        """
        uc = resolve(self.catalog, use_case)
        key, entry = await self._on(self._io, self._io_guarded, self._io_resolve, uc, period)
        version, result = await self._on(self._cpu, self._compute, uc, entry, withheld)
        # The background fold may have added to the entry while it was computed: the check
        # must begin after that read too.
        await self._on(self._io, self._io_guarded, self._io_checked)
        return (key[0], key[1], version), result

    async def series(self, use_case: str, *, limit: int = 120) -> Series:
        """:func:`~collector.estimation.series_of` the latest ``limit`` periods with data.

        Raises:
            KeyError: no accepted definition has that name or ref.
        """
        uc = resolve(self.catalog, use_case)
        return await self._on(self._io, self._io_answer, self._io_series, uc, limit)

    async def status(self) -> CollectorStatus:
        """:func:`~collector.status.status_of` the store."""
        return await self._on(self._io, self._io_answer, self._io_status)

    async def check(self) -> None:
        """Check the whole store as the open does, report ids included (the service's periodic check).

        Raises:
            StoreDamaged: naming the file and what is wrong; every later request is refused with it.
            StoreUnavailable: the store cannot be read now.
        """
        await self._on(self._io, self._io_guarded, self._io_check, True)

    def committed(self, keys: Iterable[Key]) -> None:
        """Note that a commit added to ``keys``; :meth:`run` folds it into those that are resident."""
        self._dirty.update(keys)
        self._wake.set()

    async def run(self) -> None:
        """Fold commits into the resident aggregates as :meth:`committed` reports them, until cancelled.

        A store that cannot be read is logged and retried at the next commit: requests read
        the store themselves and report the error, so the view is never served stale silently.

        Raises:
            StoreDamaged: the open, a read or a check of the store found damage (the
                service then stops, as at start, before it acknowledges another report).
        """
        self._loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._damage is not None:
                raise self._damage
            keys, self._dirty = self._dirty, set()
            try:
                await self._on(self._io, self._io_guarded, self._io_fold, sorted(keys))
            except StoreDamaged:
                raise
            except StoreError as exc:
                log.warning("materialised aggregates not updated: %s", exc)

    def statistics(self) -> MaterialisedStatus:
        """A snapshot of the counters (approximate while the aggregates thread works)."""
        return MaterialisedStatus(
            resident=len(self._entries),
            bytes=self._bytes,
            bound=self.bound,
            loads=self._loads,
            catch_ups=self._catch_ups,
            evictions=self._evictions,
            estimates=self._estimates,
            reused=self._reused,
            checks=self._checks,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        # Waits for the running estimate: off the event loop, to its end (convention 14).
        await close_in_thread(self.close)

    def close(self) -> None:
        """Stop the threads (waiting for the running task) and close the database."""
        self._cpu.shutdown(wait=True, cancel_futures=True)
        self._numpy.shutdown(wait=True, cancel_futures=True)
        self._io.shutdown(wait=True, cancel_futures=True)
        if self._store is not None:
            self._store.close()
            self._store = None
        self._entries.clear()
        self._bytes = 0

    # -- the estimate threads ---------------------------------------------------------------

    def _compute(self, uc: UseCase, entry: _Entry, withheld: bool) -> tuple[int, EstimateResult]:
        with entry.lock:
            cached = entry.estimates.get(withheld)
            if cached is not None and cached[0] == entry.version:
                self._reused += 1
                return cached
            result = estimate_aggregate(
                uc,
                entry.aggregate,
                entry.info,
                confidence=self.config.estimation.confidence,
                registry_dir=registry_dir(self.catalog, uc),
                withheld=withheld,
                threads=self._threads,
            )
            entry.estimates[withheld] = (entry.version, result)
            # An estimate may keep a transform with the aggregate (HCMS keeps its Hadamard
            # rows): charge it at the next accounting.
            entry.measured = footprint(entry.aggregate)
            self._estimates += 1
            return entry.estimates[withheld]

    # -- the aggregates thread --------------------------------------------------------------

    def _io_answer(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on this thread, returned only once the store has been checked after its reads."""

        def answer() -> T:
            result = fn(*args)
            self._io_checked()
            return result

        return self._io_guarded(answer)

    def _io_guarded(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on this thread; damage it meets (at the open, a read or a check) is kept
        and refuses every later request, and :meth:`run` raises it."""
        if self._damage is not None:
            raise self._damage
        try:
            return fn(*args)
        except StoreDamaged as exc:
            self._damage = exc
            self._entries.clear()
            self._bytes = 0
            self._totals = None
            log.error("%s", exc)
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._wake.set)  # run() raises it
            raise

    def _io_checked(self) -> None:
        """Check the store if anything was read from it since its last check."""
        if self._unchecked:
            self._io_check(False)

    def _io_check(self, report_ids: bool) -> None:
        self._io_db().check(report_ids=report_ids)
        self._checks += 1
        self._unchecked = False

    def _io_db(self, use_case: str | None = None) -> Store:
        store = self._store
        # A read-only connection knows the use cases collected when it opened; reopen (once
        # per new commit) in case this one has been collected since.
        if (
            store is not None
            and use_case is not None
            and use_case not in store.use_case_names()
            and store.last_seq() != self._opened_at
        ):
            store.close()
            self._store = store = None
        if store is None:
            store = self._store = open_store(self.config, self.catalog, readonly=True)
            self._opened_at = store.last_seq()
        return store

    def _io_totals(self, use_case: str | None = None) -> list[KeyInfo]:
        store = self._io_db(use_case)
        last = store.last_seq()
        if self._totals is None or self._totals[0] != last:
            self._totals = (last, store.totals())
            self._unchecked = True
        return [i for i in self._totals[1] if use_case is None or i.use_case == use_case]

    def _io_resolve(self, uc: UseCase, period: int | None) -> tuple[Key, _Entry]:
        if period is None:
            period = default_period(uc, self._io_totals(uc.ref))
        key = (uc.ref, period)
        return key, self._io_sync(key)

    def _next_version(self) -> int:
        self._version += 1
        return self._version

    def _io_sync(self, key: Key) -> _Entry:
        """The key's entry, current to the latest commit the store holds."""
        store = self._io_db(key[0])
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self._account(key, entry)
            if entry.seq == store.last_seq():
                return entry
            with entry.lock:
                try:
                    caught = store.catch_up(entry.aggregate, entry.info, entry.seq)
                except BaseException:
                    self._drop(key)  # it may be half folded
                    raise
                if caught is not None:
                    self._unchecked = True
                    entry.aggregate, info, entry.seq = caught
                    if info != entry.info:
                        entry.info = info
                        entry.version = self._next_version()
                        self._catch_ups += 1
                    entry.measured = footprint(entry.aggregate)  # a fold may widen the counters
            if caught is not None:
                self._account(key, entry)
                return entry
            self._drop(key)
        aggregate, info, seq = store.aggregate_at(*key)
        self._unchecked = True
        self._loads += 1
        size = max(footprint(aggregate), _MIN_BYTES)
        entry = _Entry(aggregate=aggregate, info=info, seq=seq, version=self._next_version(), nbytes=size)
        # A key without data is not kept: it is cheap to make again, and a request for an
        # arbitrary empty period must not evict an aggregate people read.
        if size <= self.bound and info.reports > 0:
            self._entries[key] = entry
            self._bytes += size
            self._evict(keep=key)
        return entry

    def _account(self, key: Key, entry: _Entry) -> None:
        size = max(entry.nbytes, entry.measured, _MIN_BYTES)
        if size != entry.nbytes:
            self._bytes += size - entry.nbytes
            entry.nbytes = size
        self._evict(keep=key)

    def _evict(self, *, keep: Key) -> None:
        while self._bytes > self.bound and self._entries:
            oldest = next(iter(self._entries))
            if oldest == keep and len(self._entries) == 1:
                self._drop(oldest)  # grew past the whole bound on its own
                break
            if oldest == keep:
                self._entries.move_to_end(oldest)
                continue
            self._drop(oldest)
            self._evictions += 1

    def _drop(self, key: Key) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.nbytes

    def _io_fold(self, keys: Iterable[Key]) -> None:
        for key in keys:
            # Only what a request made resident is kept current; a key nobody has asked this
            # member for is read when somebody does (module docstring).
            if key in self._entries:
                self._io_sync(key)

    def _io_series(self, uc: UseCase, limit: int) -> Series:
        infos = self._io_totals(uc.ref)[-limit:]
        # Only proportions and means are evaluated per period; their aggregates are tiny, and
        # only this thread folds, so reading them here without the lock is safe.
        confidence = self.config.estimation.confidence
        return series_of(uc, infos, lambda period: self._io_sync((uc.ref, period)).aggregate, confidence=confidence)

    def _io_status(self) -> CollectorStatus:
        totals = self._io_totals()
        store = self._io_db()
        self._unchecked = True  # the counters are read afresh
        counters = store.counters()
        instances = {instance: store.counters(instance) for instance in store.instances()}
        return status_of(self.catalog, totals, counters, instances, store_path=self.config.store.location)
