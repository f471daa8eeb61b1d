"""The PostgreSQL store as a group shares it: exactly once across members, a commit-ordered view,
schema versions, partitions dropped on prune, failures that pass, and collectors end to end."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from collector.cli import check_config
from collector.config import StoreConfig, parse_config
from collector.errors import ConfigError, StoreError, StoreUnavailable
from collector.estimation import compute_estimate
from collector.store import CommitResult, open_store
from collector.store.postgres import SCHEMA_VERSION, PostgresStore
from collector.store.row_format import make_segment, rid_tag, seal
from protocol.registry import Registry
from protocol.wire import DecodedReport, decode_report, encode_report
from tests.collector.processes import BackgroundPublishers, CollectorProcess, wait_committed, write_config
from tests.collector.support import current_period, plain, plain_equal, privatized_reports, reference_aggregates
from tests.collector.test_faults import _check_exact, _stream
from tests.support.broker import Broker, free_port
from tests.support.postgres import PostgresServer, running_postgres

T = TypeVar("T")


def _store(server: PostgresServer, registry: Registry, instance: str = "a") -> PostgresStore:
    return PostgresStore(StoreConfig(url=server.url), registry, instance=instance)


def _payloads(registry: Registry, name: str, count: int, *, seed: int, period: int | None = None) -> list[bytes]:
    period = current_period(registry, name) if period is None else period
    return [encode_report(r) for r in privatized_reports(registry, name, count, period=period, seed=seed)]


def _decoded(registry: Registry, payloads: Sequence[bytes]) -> list[DecodedReport]:
    return [decode_report(p, registry) for p in payloads]


def _at_once(work: Callable[[int], T], count: int, *, timeout: float = 300) -> list[T]:
    """``work(0)`` to ``work(count - 1)``, each in its own thread, released together (as members
    would commit); their results in that order. The first exception any raised is raised here."""
    start = threading.Barrier(count)
    results: dict[int, T] = {}
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            start.wait()
            results[index] = work(index)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    if errors:
        raise errors[0]
    assert len(results) == count, "a thread did not finish in time"
    return [results[i] for i in range(count)]


def _sql(server: PostgresServer, text: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(server.url, autocommit=True) as conn:
        cur = conn.execute(text.encode())
        return list(cur.fetchall()) if cur.description is not None else []


def _wait_for_lock_wait(server: PostgresServer) -> None:
    """Poll until some backend waits on a lock (a generous deadline; polled, not timed)."""
    deadline = time.monotonic() + 120
    while int(_sql(server, "SELECT count(*) FROM pg_locks WHERE NOT granted")[0][0]) == 0:
        assert time.monotonic() < deadline, "no transaction ever waited on the lock"
        time.sleep(0.02)


# --------------------------------------------------------------------------- exactly once across members


def test_two_members_committing_the_same_ids_at_once_fold_each_exactly_once(
    postgres: PostgresServer, registry: Registry
) -> None:
    """Two stores (two members) commit the same 600 reports concurrently, in opposite orders: each folded once."""
    payloads = _payloads(registry, "flag", 600, seed=1)
    reports = _decoded(registry, payloads)
    members = [_store(postgres, registry, "a"), _store(postgres, registry, "b")]

    def run(index: int) -> list[CommitResult]:
        mine = reports if index == 0 else reports[::-1]
        return [members[index].commit(mine[i : i + 50], {"messages": 50}) for i in range(0, len(mine), 50)]

    try:
        results = [r for done in _at_once(run, 2) for r in done]
        assert sum(r.reports for r in results) == 600
        assert sum(r.duplicates for r in results) == 600
        key = (registry["flag"].ref, reports[0].period)
        agg, info = members[0].aggregate(*key)
        assert info.reports == 600
        assert plain_equal(agg, reference_aggregates(registry, payloads)[key])
        assert members[1].seen_count() == 600
        assert members[0].counters() == {"messages": 1200, "reports": 600, "records": 600, "duplicates": 600}
        assert members[0].instances() == ["a", "b"]
    finally:
        for m in members:
            m.close()


def test_a_member_waits_for_the_other_holding_the_same_id_then_counts_it_a_duplicate(
    postgres: PostgresServer, registry: Registry
) -> None:
    """While one transaction holds a fresh id uncommitted, another member's commit of it waits, then finds it stored."""
    reports = _decoded(registry, _payloads(registry, "flag", 5, seed=2))
    a, b = _store(postgres, registry, "a"), _store(postgres, registry, "b")
    done: list[CommitResult] = []
    try:
        uc, period = a._use_cases[registry["flag"].ref].id, reports[0].period
        a._ensure_partitions({(uc, period)})
        conn = a._connection()
        conn.execute("BEGIN")
        conn.execute(
            "INSERT INTO seen (uc, period, rid) VALUES (%s, %s, %s)",
            (uc, period, rid_tag(reports[0].report_id, uc, period)),
        )
        worker = threading.Thread(target=lambda: done.append(b.commit(reports, {})))
        worker.start()
        _wait_for_lock_wait(postgres)
        assert not done  # b waits for the id a holds
        conn.execute("COMMIT")
        worker.join(timeout=120)
        assert (done[0].reports, done[0].duplicates) == (4, 1)
    finally:
        a.close()
        b.close()


def test_one_device_through_two_members_gets_one_allowance(postgres: PostgresServer, registry: Registry) -> None:
    """The same identity's reports committed by two members, at once: one folded in all, the rest over-allowance."""
    reports = _decoded(registry, _payloads(registry, "flag", 40, seed=3))
    members = [_store(postgres, registry, "a"), _store(postgres, registry, "b")]

    def run(index: int) -> list[CommitResult]:
        mine = reports[index::2]
        parts = [mine[i : i + 5] for i in range(0, len(mine), 5)]
        return [members[index].commit(part, {}, [b"mallory"] * len(part)) for part in parts]

    try:
        results = [r for done in _at_once(run, 2) for r in done]
        assert sum(r.reports for r in results) == 1
        assert sum(r.over_allowance for r in results) == 39
        # Refused reports are not remembered as counted: a redelivery is judged again, as over-allowance.
        assert members[0].seen_count() == 1
        again = members[1].commit(reports, {}, [b"mallory"] * len(reports))
        assert (again.reports, again.duplicates, again.over_allowance) == (0, 1, 39)
    finally:
        for m in members:
            m.close()


# --------------------------------------------------------------------------- the view stays coherent


def test_catch_up_misses_no_segment_whatever_order_members_commit_in(
    postgres: PostgresServer, registry: Registry
) -> None:
    """A transaction that took its version first but commits last holds the others back: a reader never skips it."""
    payloads = _payloads(registry, "hist", 30, seed=4)
    reports = _decoded(registry, payloads)
    period = reports[0].period
    a, b, reader = _store(postgres, registry, "a"), _store(postgres, registry, "b"), _store(postgres, registry, "r")
    done: list[CommitResult] = []
    try:
        a.commit(reports[:10], {})
        agg, info, seq = reader.aggregate_at(registry["hist"].ref, period)
        assert info.reports == 10
        # Member a is inside a commit: it has taken the next version and written its segment, not committed.
        row = a._use_cases[registry["hist"].ref]
        kind, blob, count = make_segment(row, reports[10:20])
        sealed = seal("segments", (row.id, period, kind, 10, count), blob)
        held = a._connection()
        held.execute("BEGIN")
        held.execute(
            "WITH v AS (UPDATE clock SET version = version + 1 RETURNING version) "
            "INSERT INTO segments (version, uc, period, kind, reports, records, data) "
            "SELECT v.version, %s, %s, %s, 10, %s, %s FROM v",
            (row.id, period, kind, count, sealed),
        )
        # Member b commits later reports meanwhile: it cannot take a version until a commits.
        worker = threading.Thread(target=lambda: done.append(b.commit(reports[20:], {})))
        worker.start()
        _wait_for_lock_wait(postgres)
        assert reader.last_seq() == seq  # nothing new is visible yet
        caught = reader.catch_up(agg, info, seq)
        assert caught is not None
        assert caught[1].reports == 10
        held.execute("COMMIT")
        worker.join(timeout=120)
        assert done[0].reports == 10
        caught = reader.catch_up(*caught)
        assert caught is not None
        agg, info, seq = caught
        assert info.reports == 30
        assert seq == reader.last_seq()
        assert plain_equal(agg, reference_aggregates(registry, payloads)[(registry["hist"].ref, period)])
    finally:
        for s in (a, b, reader):
            s.close()


def test_concurrent_compactions_of_one_key_fold_each_segment_once(postgres: PostgresServer, registry: Registry) -> None:
    """Two members compacting the same key at once: one does it, the other leaves it; nothing lost or doubled."""
    payloads = _payloads(registry, "emoji", 40, seed=5)
    reports = _decoded(registry, payloads)
    a, b = _store(postgres, registry, "a"), _store(postgres, registry, "b")
    try:
        for i in range(0, 40, 5):
            a.commit(reports[i : i + 5], {})
        key = (registry["emoji"].ref, reports[0].period)
        results = _at_once(lambda i: (a, b)[i].compact(*key), 2, timeout=120)
        # One folded the 8 segments; the other either found the key locked or nothing left to fold.
        assert sorted(results) == [0, 8]
        agg, info = b.aggregate(*key)
        assert info.reports == 40
        assert plain_equal(agg, reference_aggregates(registry, payloads)[key])
    finally:
        a.close()
        b.close()


# --------------------------------------------------------------------------- schema, config, retention


def test_a_newer_schema_is_refused_naming_both_versions(postgres: PostgresServer, registry: Registry) -> None:
    """A database written by a newer collector is not touched: opening raises StoreError with both versions."""
    _store(postgres, registry).close()
    _sql(postgres, f"UPDATE meta SET value = '{SCHEMA_VERSION + 1}'::bytea WHERE key = 'schema'")
    for readonly in (False, True):
        with pytest.raises(StoreError, match=f"schema {SCHEMA_VERSION + 1}.*{SCHEMA_VERSION}") as info:
            PostgresStore(StoreConfig(url=postgres.url), registry, readonly=readonly)
        assert postgres.url in str(info.value)


def test_a_password_in_the_url_and_two_stores_are_refused_naming_the_field(tmp_path: Path) -> None:
    """store.url with a password (in the authority or the query) and path + url together are ConfigErrors."""
    base = {"registry": "r.toml"}
    for url in ("postgresql://ldp:secret@db/ldp", "postgresql://ldp@db/ldp?password=secret"):
        with pytest.raises(ConfigError, match=r"store\.url: holds a password") as info:
            parse_config({**base, "store": {"url": url}}, source="c.toml")
        assert str(info.value).startswith("c.toml: store.url:")
        assert "secret" not in str(info.value)
    with pytest.raises(ConfigError, match=r"store\.path: give either path"):
        parse_config({**base, "store": {"url": "postgresql://ldp@db/ldp", "path": "x.sqlite3"}}, source="c.toml")
    with pytest.raises(ConfigError, match=r"store\.url: expected a PostgreSQL URL"):
        parse_config({**base, "store": {"url": "mysql://ldp@db/ldp"}}, source="c.toml")
    config = parse_config(
        {**base, "store": {"url": "postgresql://ldp@/ldp?host=/run/postgresql", "password_file": "pw"}},
        source=str(tmp_path / "c.toml"),
        base=tmp_path,
    )
    assert config.store.url == "postgresql://ldp@/ldp?host=/run/postgresql"
    assert config.store.password_file == tmp_path / "pw"
    assert config.store.location == config.store.url


def test_the_password_comes_from_its_file_or_the_systemd_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """password_file wins; without it $CREDENTIALS_DIRECTORY/store-password; a shared or empty file is refused."""
    from collector.config import read_store_password  # noqa: PLC0415 - the function under test

    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "store-password").write_text("from-credential\n", encoding="utf-8")
    pw = tmp_path / "pw"
    pw.write_text("from-file\n", encoding="utf-8")
    pw.chmod(0o600)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    url = "postgresql://ldp@db/ldp"
    assert read_store_password(StoreConfig(url=url, password_file=pw)) == "from-file"
    assert read_store_password(StoreConfig(url=url)) == "from-credential"
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    assert read_store_password(StoreConfig(url=url)) is None
    pw.chmod(0o644)  # the rules of every secret file: readable by its owner only
    with pytest.raises(ConfigError, match=r"store\.password_file: .*chmod 600"):
        read_store_password(StoreConfig(url=url, password_file=pw))
    empty = tmp_path / "empty"
    empty.write_text("\n", encoding="utf-8")
    empty.chmod(0o600)
    with pytest.raises(ConfigError, match=r"store\.password_file: .* is empty"):
        read_store_password(StoreConfig(url=url, password_file=empty))


def _partitions(server: PostgresServer) -> set[str]:
    rows = _sql(
        server,
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent IN ('seen'::regclass, 'allowance'::regclass, 'allowance_keys'::regclass)",
    )
    return {str(r[0]) for r in rows}


def test_pruning_a_period_drops_its_partitions(postgres: PostgresServer, registry: Registry) -> None:
    """Report ids, allowance tags and the key of a closed period go with their partitions; later periods stay."""
    now = current_period(registry, "flag")
    old = _decoded(registry, _payloads(registry, "flag", 8, seed=6, period=now - 3))
    new = _decoded(registry, _payloads(registry, "flag", 8, seed=7, period=now))
    store = _store(postgres, registry)
    try:
        store.commit(old, {}, [f"dev-{i}".encode() for i in range(8)])
        store.commit(new, {}, [f"dev-{i}".encode() for i in range(8)])
        uc = store._use_cases[registry["flag"].ref].id
        before = _partitions(postgres)
        for table in ("seen", "allowance", "allowance_keys"):
            assert {f"{table}_u{uc}_p{now - 3}", f"{table}_u{uc}_p{now}"} <= before
        assert _sql(postgres, f"SELECT count(*) FROM allowance WHERE period = {now - 3}") == [(8,)]
        assert store.prune({registry["flag"].ref: now - 1}) == 8
        after = _partitions(postgres)
        assert not {p for p in after if p.endswith(f"_u{uc}_p{now - 3}")}
        assert f"seen_u{uc}_p{now}" in after
        assert _sql(postgres, f"SELECT count(*) FROM allowance_keys WHERE period = {now - 3}") == [(0,)]
        assert store.seen_count() == 8
        assert store.prune({registry["flag"].ref: now - 1}) == 0  # nothing more to do: no write
        # The closed period stays closed: its replays are expired, not folded again.
        replay = store.commit(old, {})
        assert (replay.reports, replay.expired) == (0, 8)
        assert store.aggregate(registry["flag"].ref, now - 3)[1].reports == 8  # the aggregate itself is kept
    finally:
        store.close()


def test_check_config_connects_and_names_the_schema(
    postgres: PostgresServer, registry: Registry, registry_path: Path, tmp_path: Path
) -> None:
    """check-config on PostgreSQL: the schema will be created, then which it holds; a dead server is a ConfigError."""
    config = parse_config({"registry": str(registry_path), "store": {"url": postgres.url}}, source="c.toml")
    assert any("will be created" in line and line.startswith("store.url") for line in check_config(config))
    _store(postgres, registry).close()
    assert any(f"checkpoint schema {SCHEMA_VERSION}" in line for line in check_config(config))
    dead = parse_config(
        {"registry": str(registry_path), "store": {"url": f"postgresql://ldp@127.0.0.1:{free_port()}/ldp"}},
        source="c.toml",
    )
    with pytest.raises(ConfigError, match=r"c\.toml: store\.url: cannot use"):
        check_config(dead)


# --------------------------------------------------------------------------- failures


def test_a_stopped_server_is_store_unavailable_and_a_restart_resumes_exactly_once(
    tmp_path: Path, registry: Registry
) -> None:
    """Server down: commits and reads raise StoreUnavailable (connection); back up, the same batch commits once."""
    payloads = _payloads(registry, "flag", 20, seed=8)
    reports = _decoded(registry, payloads)
    with running_postgres(tmp_path / "pg") as server:
        store = _store(server, registry)
        try:
            assert store.commit(reports[:10], {"messages": 10}).reports == 10
            server.stop()
            with pytest.raises(StoreUnavailable) as info:
                store.commit(reports[10:], {"messages": 10})
            assert info.value.cause == "connection"
            assert server.url in str(info.value)
            with pytest.raises(StoreUnavailable):  # the next attempt reconnects, and fails while down
                store.commit(reports[10:], {"messages": 10})
            with pytest.raises(StoreUnavailable):
                store.totals()
            server.start()
            result = store.commit(reports, {"messages": 20})  # ingest retries with what it holds
            assert (result.reports, result.duplicates) == (10, 10)
            agg, info2 = store.aggregate(registry["flag"].ref, reports[0].period)
            assert info2.reports == 20
            assert plain_equal(agg, reference_aggregates(registry, payloads)[(registry["flag"].ref, reports[0].period)])
        finally:
            store.close()


def test_opening_against_a_server_that_is_down_is_store_unavailable(tmp_path: Path, registry: Registry) -> None:
    """The factory on a URL nobody listens at: StoreUnavailable (a restart may succeed), not a damaged store."""
    config = parse_config(
        {"registry": "r.toml", "store": {"url": f"postgresql://ldp@127.0.0.1:{free_port()}/ldp"}}, source="c.toml"
    )
    with pytest.raises(StoreUnavailable) as info:
        open_store(config, registry)
    assert info.value.cause == "connection"


# --------------------------------------------------------------------------- end to end


def _status(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as response:
        return json.loads(response.read())


def test_two_collectors_in_a_group_on_postgres_count_every_report_once_and_both_serve_it(
    tmp_path: Path, mosquitto: Broker, postgres: PostgresServer, registry: Registry, registry_path: Path
) -> None:
    """`ldp-collector run` x2, [store] url, a shared group: every report once; each member serves the estimate."""
    ports = [free_port(), free_port()]
    collectors = [
        CollectorProcess(
            write_config(
                tmp_path / f"m{i}",
                registry=registry_path,
                host=mosquitto.host,
                port=mosquitto.port,
                client_id=f"ldp-collector-m{i}",
                instance=f"m{i}",
                shared_group="collectors",
                store=postgres.url,
                http_port=ports[i],
            ),
            log=tmp_path / f"m{i}.log",
        )
        for i in range(2)
    ]
    items = _stream(registry, 6000, seed=9)
    try:
        for c in collectors:
            c.start()
        publishers = BackgroundPublishers(mosquitto.host, mosquitto.port, [items[i::3] for i in range(3)])
        publishers.start()
        publishers.join(timeout=600)
        wait_committed(postgres.url, registry, len(items), timeout=600)
        final = _check_exact(postgres.url, registry, items)
        assert final["reports"] == len(items)
        store = PostgresStore(StoreConfig(url=postgres.url), registry, readonly=True)
        try:
            per_member = {i: store.counters(i).get("reports", 0) for i in store.instances()}
        finally:
            store.close()
        assert sum(per_member.values()) == len(items)
        assert all(per_member.get(f"m{i}", 0) > 0 for i in range(2)), per_member  # the group split the stream
        period = current_period(registry, "flag")
        config = parse_config({"registry": str(registry_path), "store": {"url": postgres.url}})
        expected = compute_estimate(config, "flag", period)
        for port in ports:
            served = _get(port, f"/api/v1/use-cases/flag/estimate?period={period}")
            assert served["reports"] == expected.reports == sum(1 for t, _ in items if t.endswith("/flag"))
            assert served["estimate"] == plain(expected)["estimate"]
        for c in collectors:
            assert c.stop() == 0
    finally:
        for c in collectors:
            c.close()


def test_a_partition_gone_behind_the_stores_back_is_made_again(postgres: PostgresServer, registry: Registry) -> None:
    """A commit into a period whose partitions vanished (a restored backup) recreates them instead of failing."""
    reports = _decoded(registry, _payloads(registry, "flag", 10, seed=10))
    store = _store(postgres, registry)
    try:
        store.commit(reports[:5], {})
        uc, period = store._use_cases[registry["flag"].ref].id, reports[0].period
        _sql(postgres, f"DROP TABLE seen_u{uc}_p{period}, allowance_u{uc}_p{period}, allowance_keys_u{uc}_p{period}")
        assert store.commit(reports[5:], {}, [b"dev"] * 5).reports == 1
        assert f"seen_u{uc}_p{period}" in _partitions(postgres)
    finally:
        store.close()


def test_a_collector_whose_database_goes_down_is_unhealthy_acknowledges_nothing_and_resumes_exactly_once(
    tmp_path: Path, mosquitto: Broker, registry: Registry, registry_path: Path
) -> None:
    """PostgreSQL stopped mid-stream: /healthz 503 (connection), nothing more acknowledged; restarted: all once."""
    http_port = free_port()
    first, second = _stream(registry, 2000, seed=11), _stream(registry, 3000, seed=12)
    with running_postgres(tmp_path / "pg") as server:
        config = write_config(
            tmp_path / "c",
            registry=registry_path,
            host=mosquitto.host,
            port=mosquitto.port,
            store=server.url,
            http_port=http_port,
        )
        log = tmp_path / "collector.log"
        collector = CollectorProcess(config, log=log)
        try:
            collector.start()
            publishers = BackgroundPublishers(mosquitto.host, mosquitto.port, [first])
            publishers.start()
            publishers.join(timeout=300)
            wait_committed(server.url, registry, len(first), timeout=300)
            server.stop()
            publishers = BackgroundPublishers(mosquitto.host, mosquitto.port, [second])
            publishers.start()
            deadline = time.monotonic() + 120
            while (health := _status(http_port, "/healthz"))[0] == 200:
                assert time.monotonic() < deadline, "never reported unhealthy"
                time.sleep(0.1)
            code, body = health
            assert code == 503
            assert body["cause"] == "connection"
            assert server.url in body["detail"]
            # The status reads the store too: it answers 503 while the server is down.
            assert _status(http_port, "/api/v1/status")[0] == 503
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=60) as response:
                metrics = response.read().decode()
            assert "ldp_collector_store_available 0" in metrics
            server.start()
            publishers.join(timeout=300)
            wait_committed(server.url, registry, len(first) + len(second), timeout=300)
            assert _get(http_port, "/healthz")["status"] == "ok"
            assert collector.stop() == 0
            assert _check_exact(server.url, registry, first + second)["reports"] == len(first) + len(second)
            text = log.read_text(encoding="utf-8", errors="replace")
            assert "checkpoint store unavailable (connection)" in text
            assert "available again" in text
        finally:
            collector.close()


def test_members_pruning_at_once_drop_each_partition_once(postgres: PostgresServer, registry: Registry) -> None:
    """Three members prune the same closed period together: the ids are forgotten once, no member fails."""
    now = current_period(registry, "flag")
    old = _decoded(registry, _payloads(registry, "flag", 12, seed=13, period=now - 4))
    members = [_store(postgres, registry, f"m{i}") for i in range(3)]
    try:
        members[0].commit(old, {})
        removed = _at_once(lambda i: members[i].prune({registry["flag"].ref: now}), 3, timeout=120)
        assert sorted(removed) == [0, 0, 12]
        assert not {p for p in _partitions(postgres) if p.endswith(f"_p{now - 4}")}
        assert all(m.low_water()[registry["flag"].ref] == now for m in members)
        members[0].verify()  # the use case row's checksum followed the mark
    finally:
        for m in members:
            m.close()


@pytest.mark.parametrize(
    ("table", "change"),
    [
        ("segments", "UPDATE segments SET data = overlay(data PLACING '\\xff'::bytea FROM 40 FOR 1)"),
        ("segments", "UPDATE segments SET reports = reports + 1"),
        ("seen", "UPDATE seen SET rid = overlay(rid PLACING '\\x00'::bytea FROM 3 FOR 1)"),
        ("use_cases", "UPDATE use_cases SET low_water = low_water + 64"),
        ("counters", "UPDATE counters SET value = value + 1 WHERE name = 'reports'"),
        ("clock", "UPDATE clock SET version = 0"),
    ],
)
def test_a_changed_row_stops_a_member_at_start_naming_the_table(
    postgres: PostgresServer, registry: Registry, table: str, change: str
) -> None:
    """The schema-2 checksums hold in PostgreSQL too: a row changed behind the store's back is refused at open."""
    store = _store(postgres, registry)
    store.commit(_decoded(registry, _payloads(registry, "usage", 6, seed=14)), {"messages": 6})
    store.close()
    _sql(postgres, change)
    with pytest.raises(StoreError, match=f"damaged: table {table}") as info:
        _store(postgres, registry)
    assert postgres.url in str(info.value)


def test_a_unix_socket_url_reaches_the_same_store(
    postgres: PostgresServer, registry: Registry, registry_path: Path
) -> None:
    """``postgresql://USER@/DB?host=/socket/dir&port=P`` decodes, and the store opens through the socket."""
    url = postgres.socket_url
    config = parse_config({"registry": str(registry_path), "store": {"url": url}}, source="c.toml")
    store = open_store(config, registry)
    try:
        store.commit(_decoded(registry, _payloads(registry, "flag", 3, seed=15)), {})
        assert store.location == url
    finally:
        store.close()
    tcp = _store(postgres, registry)
    try:
        assert tcp.counters()["reports"] == 3
    finally:
        tcp.close()
