"""The PostgreSQL fixture really starts a server, gives each test its own database, and keeps
committed rows across a crash and restart."""

from __future__ import annotations

import psycopg

from tests.support.postgres import PostgresServer


def test_each_test_gets_a_fresh_database(postgres: PostgresServer) -> None:
    """A new database has none of the tables another test made."""
    with psycopg.connect(postgres.url) as conn:
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()
        assert tables == (0,)
        conn.execute("CREATE TABLE t (x integer)")


def test_committed_rows_survive_an_immediate_stop(postgres: PostgresServer) -> None:
    """A row committed before ``pg_ctl stop -m immediate`` is there after the restart, over TCP and the socket."""
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x integer)")
        conn.execute("INSERT INTO t VALUES (42)")
    postgres.restart(mode="immediate")
    with psycopg.connect(postgres.socket_url) as conn:
        assert conn.execute("SELECT x FROM t").fetchall() == [(42,)]
