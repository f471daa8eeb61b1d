"""The collector benchmark runs end to end on a small stream and says what it measured.

Not a measurement (figures at this size are noise): the run itself asserts that every
report of the warm-up and of the stream was committed exactly once; this checks the shape
of the document the issue's targets are read from, and that each drain mode did what its
name says.
"""

from __future__ import annotations

from benchmarks.bench_collector import MODES, Setup, _median_of, bench

MESSAGES = 600


def test_a_small_group_run_reports_every_mode_and_target() -> None:
    doc = bench(0, MESSAGES, setups=(Setup("postgresql", 1), Setup("postgresql", 3)), modes=MODES, references=False)

    (row,) = doc["results"]
    assert row["shape"] == "counters"
    assert row["messages"] == MESSAGES
    assert row["warmup_messages"] > 0
    one, three = row["collector_postgresql_1"], row["collector_postgresql_3"]
    assert "isolated_msgs_per_s" not in one  # one member alone is the backlog run
    for mode in ("backlog", "live"):
        assert one[f"{mode}_messages_per_member"] == [MESSAGES]
        assert sum(three[f"{mode}_messages_per_member"]) == MESSAGES
        # Read from /proc in clock ticks (10 ms): 600 messages at under 17 µs each can round to
        # no tick at all, so only its presence is checked here; the warm-up's CPU (below,
        # thousands of messages) shows the accounting works.
        assert one[f"{mode}_collector_cpu_us_per_msg"] >= 0
    # One at a time: each member drained its own share of the shared subscription.
    assert sum(three["isolated_messages_per_member"]) == MESSAGES
    assert all(count > 0 for count in three["isolated_messages_per_member"])
    assert one["warmup_collector_cpu_s_per_member"] > 0

    targets = {t["target"].split(":")[0]: t for t in doc["targets"]}
    assert set(targets) == {"counters backlog", "counters live", "counters isolated"}
    assert all(isinstance(t["pass"], bool) for t in targets.values())


def test_repeated_runs_are_summarised_by_their_medians() -> None:
    runs = [
        {"live_msgs_per_s": 10.0, "live_collector_cpu_us_per_msg": 30.0, "per": [1], "n": 3},
        {"live_msgs_per_s": 30.0, "live_collector_cpu_us_per_msg": 20.0, "per": [2], "n": 3},
        {"live_msgs_per_s": 20.0, "live_collector_cpu_us_per_msg": 90.0, "per": [3], "n": 3},
    ]
    out = _median_of(runs)
    assert (out["live_msgs_per_s"], out["live_collector_cpu_us_per_msg"]) == (20.0, 30.0)
    assert out["live_collector_cpu_us_per_msg_runs"] == [30.0, 20.0, 90.0]
    assert out["per"] == [1]  # details that are not one number: the first run's
    assert "n_runs" not in out


def test_a_small_run_compares_one_broker_with_two() -> None:
    """``--brokers``: the same stream through one collector on one broker and on two, every report
    committed once in each (the run asserts it), with each setup's figures and the ratio."""
    doc = bench(0, MESSAGES, setups=(), modes=("backlog", "live"), references=False, brokers=True)

    (row,) = doc["results"]
    compared = row["one_broker_against_two"]
    for setup in ("brokers_1", "brokers_2"):
        for mode in ("backlog", "live"):
            assert compared[setup][f"{mode}_msgs_per_s"] > 0
            assert compared[setup][f"{mode}_collector_cpu_us_per_msg"] >= 0  # clock ticks: see above
            assert set(compared[setup][f"{mode}_cores_busy"]) == {"collector", "brokers"}
    assert {"backlog_two_over_one", "live_two_over_one"} <= set(compared)
    print(compared)


def test_the_cms_and_olh_streams_are_drained_and_counted() -> None:
    """The emoji stream under CMS and under OLH: each drained into a SQLite collector, every message committed."""
    doc = bench(0, 0, setups=(Setup("sqlite", 1),), modes=("backlog",), references=False, cms=300, olh=300)
    rows = {row["shape"]: row for row in doc["results"]}
    assert set(rows) == {"cms", "olh"}
    for row in rows.values():
        assert row["messages"] == 300
        assert row["collector_sqlite_1"]["backlog_messages_per_member"] == [300]
    assert rows["olh"]["payload_bytes_mean"] < rows["cms"]["payload_bytes_mean"]
