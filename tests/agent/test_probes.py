"""Built-in probes: uptime accrual, active seconds from systemd cgroups or a usage file, process names."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from agent.config import ActiveSecondsProbe as ActiveSecondsConfig
from agent.probes import ActiveSecondsProbe, ProcessNamesProbe, UptimeProbe


def test_uptime_accrues_whole_seconds_from_a_baseline(tmp_path: Path) -> None:
    """The first reading is a baseline; later ones give whole seconds, carrying fractions; a reset re-baselines."""
    up = tmp_path / "uptime"
    probe = UptimeProbe("seconds", up)
    readings = ["100.5 1.0", "160.0 1.0", "220.7 1.0", "5.0 1.0", "65.0 1.0"]
    got = []
    for r in readings:
        up.write_text(r + "\n")
        got.append(probe.sample(0.0))
    assert got == [[], [("seconds", 59, None)], [("seconds", 61, None)], [], [("seconds", 60, None)]]
    up.unlink()
    assert probe.sample(0.0) == []  # unreadable: nothing, and a warning


def test_active_seconds_of_systemd_units(tmp_path: Path) -> None:
    """A unit whose cgroup is populated at a sample counts the interval as active; others count zero."""
    for unit, populated in (("a.service", 1), ("b.service", 0)):
        (tmp_path / unit).mkdir()
        (tmp_path / unit / "cgroup.events").write_text(f"populated {populated}\nfrozen 0\n")
    cfg = ActiveSecondsConfig(
        source="systemd",
        targets=MappingProxyType({"a.service": "usage", "b.service": "usage", "gone.service": "usage"}),
        cgroup_root=tmp_path,
    )
    probe = ActiveSecondsProbe(cfg)
    assert probe.sample(1_000.0) == []
    assert probe.sample(1_300.0) == [
        ("usage", 300, "a.service"),
        ("usage", 0, "b.service"),
        ("usage", 0, "gone.service"),
    ]
    assert probe.use_cases() == ["usage"]


def test_active_seconds_from_a_usage_file(tmp_path: Path) -> None:
    """Cumulative per-application seconds are read as deltas; bad entries are skipped."""
    usage = tmp_path / "usage.toml"
    cfg = ActiveSecondsConfig(
        source="file", path=usage, targets=MappingProxyType({"editor": "apps", "shell": "apps", "odd": "apps"})
    )
    probe = ActiveSecondsProbe(cfg)
    usage.write_text('editor = 100\nshell = 7.5\nodd = "x"\n')
    assert probe.sample(0.0) == []
    usage.write_text('editor = 160\nshell = 9.0\nodd = "x"\n')
    assert probe.sample(0.0) == [("apps", 60, "editor"), ("apps", 1, "shell")]
    usage.write_text("not toml [")
    assert probe.sample(0.0) == []


def test_process_names_are_distinct_sorted_and_bounded(tmp_path: Path) -> None:
    """Each distinct running process name once, at most max_names of them."""
    for pid, name in ((1, "init"), (2, "zsh"), (3, "bash"), (4, "bash")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "comm").write_text(name + "\n")
    (tmp_path / "5").mkdir()  # a process that exited while being read: no comm file
    probe = ProcessNamesProbe("procs", max_names=2, proc=tmp_path)
    assert probe.sample(0.0) == [("procs", "bash", None), ("procs", "init", None)]
