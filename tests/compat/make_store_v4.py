"""Write tests/compat/fixtures/store-v4/: a SQLite checkpoint store of schema 4.

Run with the code whose store is schema 4 on ``sys.path`` first, from a checkout of it
(commit a21ec90, the last before recent report ids moved into runs)::

    cd <checkout at a21ec90> && PYTHONPATH=. python <this file> OUT_DIR

The store holds identified reports of three use cases of the collector tests' registry
(tests/collector/support.py, written next to it with its dictionaries) in two periods each,
committed in several commits, one key compacted, a low-water mark raised, reports refused as
over the allowance, and the counters; ``written.json`` lists every payload with its sender and
what the store read back, for the test to compare with. Seeded, so it is the same each time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgpack

from collector.store import SCHEMA_VERSION, CheckpointStore
from protocol.wire import decode_report, encode_report
from tests.collector.support import current_period, load_registry, privatized_reports, write_registry

assert SCHEMA_VERSION == 4, "run this with the code whose checkpoint schema is 4"

NOW = 1_709_294_400.0
out = Path(sys.argv[1])
registry = load_registry(write_registry(out))
store = CheckpointStore(out / "collector.sqlite3", registry, instance="v4")
sent: list[tuple[str, str]] = []
for i, name in enumerate(("flag", "usage", "domains")):
    now = current_period(registry, name, NOW)
    for period in (now - 1, now):
        made = privatized_reports(registry, name, 24, period=period, seed=40 + i * 10 + period % 7)
        payloads = [encode_report(r) for r in made]
        senders = [f"dev-{d:03d}".encode() for d in range(len(payloads))]
        # Device 0 sends a second report: over its allowance, refused.
        payloads.append(encode_report(privatized_reports(registry, name, 1, period=period, seed=99)[0]))
        senders.append(b"dev-000")
        reports = [decode_report(p, registry) for p in payloads]
        for lo in range(0, len(reports), 10):
            store.commit(reports[lo : lo + 10], {"messages": len(reports[lo : lo + 10])}, senders[lo : lo + 10])
        sent += [(p.hex(), s.decode()) for p, s in zip(payloads, senders, strict=True)]
    store.compact(registry[name].ref, now - 1)
store.prune({registry["usage"].ref: current_period(registry, "usage", NOW) - 1})
aggregates = {
    f"{k.use_case}/{k.period}": [
        msgpack.packb(store.aggregate(k.use_case, k.period)[0].to_plain()).hex(),
        k.reports,
        k.records,
    ]
    for k in store.totals()
}
written = {
    "sent": sent,
    "aggregates": aggregates,
    "counters": store.counters(),
    "seen": store.seen_count(),
    "low_water": store.low_water(),
}
store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
store.close()
(out / "written.json").write_text(json.dumps(written, indent=1, sort_keys=True) + "\n", encoding="utf-8")
print(json.dumps({"seen": written["seen"], "counters": written["counters"]}))
