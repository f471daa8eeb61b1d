"""Built-in probes: values the agent measures on the host itself.

* :class:`UptimeProbe` - seconds the host was up, from ``/proc/uptime``, accrued into a
  counter use case between samples.
* :class:`ActiveSecondsProbe` - seconds each systemd unit was active (its cgroup populated)
  or each application was used (deltas of a usage tracker's cumulative counters), one counter
  key per unit or application.
* :class:`ProcessNamesProbe` - the distinct names of running processes (``/proc/<pid>/comm``),
  once per collection cycle, into a string use case.

A probe keeps its previous reading in memory only, never on disk: after a restart the first
reading is a new baseline (that interval is not counted). A probe returns records; the daemon
hands them to the agent, which privatizes them like any application's values.
"""

from __future__ import annotations

import logging
import math
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from agent.config import ActiveSecondsProbe as ActiveSecondsConfig
from agent.config import ProbeConfig
from agent.config import ProcessNamesProbe as ProcessNamesConfig
from agent.config import UptimeProbe as UptimeConfig
from runtime.resources import ResourceErrors

__all__ = [
    "ActiveSecondsProbe",
    "Probe",
    "ProcessNamesProbe",
    "Sample",
    "UptimeProbe",
    "build_probes",
]

log = logging.getLogger("ldp_agent.probes")

_SHORTAGES = ResourceErrors(log)
"""Samples that failed for want of a system resource (a full file table): logged once per run of
them, never once per sample (runtime/resources.py)."""

Sample = tuple[str, object, str | None]
"""``(use_case, value, counter_key)``: one value to record."""


class Probe(Protocol):
    """Something that measures the host."""

    per_cycle: bool
    """True: sampled once per collection cycle; False: every probe interval."""

    def use_cases(self) -> list[str]:
        """The use cases this probe feeds."""
        ...

    def sample(self, now: float) -> list[Sample]:
        """Measure; ``now`` is the agent's wall clock."""
        ...


class _Accrual:
    """Whole seconds between readings of a growing quantity, carrying the fractions."""

    def __init__(self) -> None:
        self.last: float | None = None
        self.carry = 0.0

    def step(self, reading: float) -> int | None:
        if self.last is None or reading < self.last:
            # First reading, or the source was reset: a new baseline.
            self.last = reading
            return None
        delta = reading - self.last + self.carry
        self.last = reading
        whole = math.floor(delta)
        self.carry = delta - whole
        return int(whole)


class UptimeProbe:
    """Seconds of uptime accrued since the previous sample.

    Args:
        use_case: the counter use case.
        path: the uptime source (``/proc/uptime``: seconds since boot, first field).
    """

    per_cycle = False

    def __init__(self, use_case: str, path: Path = Path("/proc/uptime")) -> None:
        self.use_case = use_case
        self.path = path
        self._acc = _Accrual()

    def use_cases(self) -> list[str]:
        return [self.use_case]

    def sample(self, now: float) -> list[Sample]:
        try:
            up = float(self.path.read_text(encoding="ascii").split()[0])
        except (OSError, ValueError, IndexError) as e:
            if not _SHORTAGES.failed("uptime probe", e):
                log.warning("uptime probe: cannot read %s: %s", self.path, e)
            return []  # the next sample accrues the interval from the last reading
        _SHORTAGES.succeeded("uptime probe")
        seconds = self._acc.step(up)
        return [] if seconds is None else [(self.use_case, seconds, None)]


class ActiveSecondsProbe:
    """Active seconds per systemd unit or per application.

    Args:
        cfg: the probe's config section.
    """

    per_cycle = False

    def __init__(self, cfg: ActiveSecondsConfig) -> None:
        self.cfg = cfg
        self._last_now: float | None = None
        self._acc: dict[str, _Accrual] = {name: _Accrual() for name in cfg.targets}

    def use_cases(self) -> list[str]:
        return sorted(set(self.cfg.targets.values()))

    def _unit_active(self, unit: str) -> bool:
        events = self.cfg.cgroup_root / unit / "cgroup.events"
        try:
            return "populated 1" in events.read_text(encoding="ascii")
        except OSError:
            return False

    def sample(self, now: float) -> list[Sample]:
        if self.cfg.source == "systemd":
            last, self._last_now = self._last_now, now
            if last is None or now <= last:
                return []
            out: list[Sample] = []
            for unit, use_case in sorted(self.cfg.targets.items()):
                # Sampling: a unit active at this sample is counted as active for the whole interval.
                seconds = int(now - last) if self._unit_active(unit) else 0
                out.append((use_case, seconds, unit))
            return out
        assert self.cfg.path is not None
        try:
            counters = tomllib.loads(self.cfg.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            if not _SHORTAGES.failed("active-seconds probe", e):
                log.warning("active-seconds probe: cannot read %s: %s", self.cfg.path, e)
            return []
        _SHORTAGES.succeeded("active-seconds probe")
        out = []
        for name, use_case in sorted(self.cfg.targets.items()):
            value = counters.get(name, 0)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                log.warning("active-seconds probe: %s: %r is not a number of seconds", name, value)
                continue
            delta = self._acc[name].step(float(value))
            if delta is not None:
                out.append((use_case, delta, name))
        return out


class ProcessNamesProbe:
    """The distinct names of running processes.

    Args:
        use_case: the string use case.
        max_names: at most this many names per sample (the first in sorted order).
        proc: the proc filesystem.
    """

    per_cycle = True

    def __init__(self, use_case: str, max_names: int = 512, proc: Path = Path("/proc")) -> None:
        self.use_case = use_case
        self.max_names = max_names
        self.proc = proc

    def use_cases(self) -> list[str]:
        return [self.use_case]

    def sample(self, now: float) -> list[Sample]:
        names: set[str] = set()
        try:
            entries = list(self.proc.iterdir())
        except OSError as e:
            if not _SHORTAGES.failed("process-names probe", e):
                log.warning("process-names probe: cannot list %s: %s", self.proc, e)
            return []
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                name = (entry / "comm").read_text(encoding="utf-8", errors="replace").strip()
            except OSError as e:
                if _SHORTAGES.failed("process-names probe", e):
                    # Out of files: the names read so far are only part of them; none is recorded.
                    return []
                continue  # the process exited meanwhile
            if name:
                names.add(name)
        _SHORTAGES.succeeded("process-names probe")
        return [(self.use_case, n, None) for n in sorted(names)[: self.max_names]]


def build_probes(configs: Sequence[ProbeConfig]) -> list[Probe]:
    """Probes from their config sections."""
    probes: list[Probe] = []
    for cfg in configs:
        if isinstance(cfg, UptimeConfig):
            probes.append(UptimeProbe(cfg.use_case))
        elif isinstance(cfg, ProcessNamesConfig):
            probes.append(ProcessNamesProbe(cfg.use_case, cfg.max_names))
        else:
            probes.append(ActiveSecondsProbe(cfg))
    return probes
