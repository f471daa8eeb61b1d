"""A checkpoint store written by the previous release's collector is migrated in place, or refused by name."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from agent.core import Agent
from agent.sealed import Sealer
from collector.cli import main as collector_main
from collector.errors import StoreError
from protocol.randomness import SeededRandom
from protocol.registry import Registry, parse_registry
from protocol.wire import decode_report
from tests.agent.conftest import REGISTRY, START
from tests.collector.stores import StoreSite
from tests.compat.previous_release import PreviousRelease
from tests.support.clocks import FakeClock

DAY = 86_400.0
DEVICES = 12

# Run by the previous release: twelve agents report on every use case for a day; the reports are
# folded into a store of that release in three commits, one key compacted. It prints what the
# store then holds, for this release to compare with.
_WRITE_STORE = """
import json, sys
from pathlib import Path
import msgpack
from agent.core import Agent
from agent.sealed import Sealer
from collector.config import StoreConfig
from collector.store import CheckpointStore
from collector.store.postgres import PostgresStore
from fleet.clock import FakeClock
from protocol.randomness import SeededRandom
from protocol.registry import parse_registry
from protocol.wire import decode_report

registry_path, where, states, start = sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])
registry = parse_registry(Path(registry_path).read_bytes(), source=registry_path)
values = {"flag": 1, "seconds": 600, "hist": 300.0, "procs": "bash", "words": "hello"}
payloads = []
for d in range(12):
    clock = FakeClock(start)
    agent = Agent(registry=registry, state_dir=states / f"d{d}", sealer=Sealer(bytes([d + 1]) * 32), clock=clock,
                  rng=SeededRandom(100 + d))
    agent.grant_consent()
    for name, value in values.items():
        agent.record(name, value if d % 2 else (0 if name == "flag" else value))
    clock.set(start + 86_400)
    agent.collect()
    payloads += [p.entry.payload for p in agent.outbox()]
if where.startswith("postgresql"):
    store = PostgresStore(StoreConfig(url=where), registry, instance="old")
else:
    store = CheckpointStore(Path(where), registry, instance="old")
reports = [decode_report(p, registry) for p in payloads]
for i in range(0, len(reports), 20):
    store.commit(reports[i : i + 20], {"messages": len(reports[i : i + 20])})
key = store.compaction_candidates(1)[0]
store.compact(*key)
aggregates = {f"{k.use_case}/{k.period}": [msgpack.packb(store.aggregate(k.use_case, k.period)[0].to_plain()).hex(),
              k.reports, k.records] for k in store.totals()}
print(json.dumps({"payloads": [p.hex() for p in payloads], "aggregates": aggregates,
                  "counters": store.counters(), "seen": store.seen_count()}))
store.close()
"""

# Run by the previous release on a store this release migrated: it must refuse it, by name.
_OPEN_STORE = """
import json, sys
from pathlib import Path
from collector.config import StoreConfig
from collector.errors import StoreError
from collector.store import CheckpointStore
from collector.store.postgres import PostgresStore
from protocol.registry import parse_registry

registry_path, where = sys.argv[1], sys.argv[2]
registry = parse_registry(Path(registry_path).read_bytes(), source=registry_path)
try:
    if where.startswith("postgresql"):
        PostgresStore(StoreConfig(url=where), registry, instance="old").close()
    else:
        CheckpointStore(Path(where), registry, instance="old").close()
except StoreError as exc:
    print(json.dumps(str(exc)))
else:
    print(json.dumps("opened"))
"""


def _where(site: StoreSite) -> str:
    return site.url if site.backend == "postgres" else str(site.path)


def _old_store(previous: PreviousRelease, site: StoreSite, tmp_path: Path) -> tuple[Registry, Path, dict[str, object]]:
    registry_path = tmp_path / "usecases.toml"
    registry_path.write_text(REGISTRY, encoding="utf-8")
    registry = parse_registry(registry_path.read_bytes(), source=str(registry_path))
    old = previous.run(_WRITE_STORE, str(registry_path), _where(site), str(tmp_path / "old-agents"), str(START))
    return registry, registry_path, old


def test_the_previous_releases_store_is_migrated_in_place_and_keeps_every_count(
    previous_release: PreviousRelease, site: StoreSite, tmp_path: Path
) -> None:
    """Read-only use names the migration; opening for writing migrates; sums, ids and counters are kept."""
    registry, registry_path, old = _old_store(previous_release, site, tmp_path)
    with pytest.raises(StoreError, match="ldp-collector migrate"):
        site.open(registry, readonly=True)
    store = site.open(registry, instance="new")
    try:
        totals = {(k.use_case, k.period): k for k in store.totals()}
        aggregates = old["aggregates"]
        assert isinstance(aggregates, dict)
        assert len(totals) == len(aggregates)
        for key, (blob, reports, records) in aggregates.items():
            name, period = key.split("/")
            ref = registry[name].ref
            agg, info = store.aggregate(ref, int(period))
            assert msgpack.packb(agg.to_plain()).hex() == blob, key
            assert (info.reports, info.records) == (reports, records)
        assert store.seen_count() == old["seen"]
        assert store.counters("old") == old["counters"]
        # The ids of what the previous release folded are remembered: redelivered, they count once.
        payloads = [bytes.fromhex(p) for p in old["payloads"]]  # type: ignore[attr-defined]
        again = store.commit([decode_report(p, registry) for p in payloads], {})
        assert (again.reports, again.duplicates) == (0, len(payloads))
        # Reports of this release (format 2) fold into the same aggregates.
        clock = FakeClock(START)
        agent = Agent(
            registry=registry, state_dir=tmp_path / "new", sealer=Sealer(b"\x77" * 32), clock=clock, rng=SeededRandom(5)
        )
        agent.grant_consent()
        agent.record("procs", "bash")
        clock.set(START + DAY)
        agent.collect()
        (fresh,) = [decode_report(p.entry.payload, registry) for p in agent.outbox()]
        assert fresh.version == 2
        assert store.commit([fresh], {}).reports == 1
        assert store.aggregate(registry["procs"].ref, fresh.period)[1].reports == DEVICES + 1
    finally:
        store.close()
    ((schema,),) = site.query("SELECT value FROM meta WHERE key = 'schema'")
    assert (bytes(schema) if site.backend == "postgres" else schema) == (b"2" if site.backend == "postgres" else 5)
    # The previous release refuses the migrated store rather than count into it.
    refusal = previous_release.run(_OPEN_STORE, str(registry_path), _where(site))
    assert "schema" in refusal
    assert "opened" not in refusal


def test_ldp_collector_migrate_migrates_and_says_what_it_found(
    previous_release: PreviousRelease, site: StoreSite, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ldp-collector migrate` on the previous release's store: exit 0, each definition named; then `status` works."""
    registry, registry_path, _ = _old_store(previous_release, site, tmp_path)
    config = tmp_path / "collector.toml"
    config.write_text(
        f'registry = "{registry_path}"\n[store]\n{site.toml()}[http]\nenabled = false\n', encoding="utf-8"
    )
    assert collector_main(["--config", str(config), "status"]) == 1
    assert "ldp-collector migrate" in capsys.readouterr().err
    assert collector_main(["--config", str(config), "migrate"]) == 0
    out = capsys.readouterr().out
    assert "at this release's schema; 5 of the 5 accepted definitions have a row" in out
    for uc in registry.use_cases.values():
        assert f"  {uc.ref}\n" in out
    assert collector_main(["--config", str(config), "status"]) == 0
    assert "procs@" in capsys.readouterr().out
