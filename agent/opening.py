"""Opening the agent's state: the registry held against the local policy, the probes checked
against it, the lock on the state directory and the :class:`agent.core.Agent` over it.

The daemon and the commands that open the state when no daemon answers (``ldp-agent status``
and the rest, agent/cli.py) share these. They live apart from :mod:`agent.daemon` so that a
command loads neither asyncio nor the publisher (docs/deploy.md, "The device's footprint").
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from agent.config import ActiveSecondsProbe, AgentConfig
from agent.core import Agent
from agent.errors import AgentBusyError, ConfigError
from agent.identity import device_identity
from agent.mechanism_calls import privatization_of
from agent.policy import check_registry
from agent.sealed import Sealer, create_key_file, load_key
from protocol.interfaces import Privatization, ValueType
from protocol.randomness import RandomSource
from protocol.registry import Registry, RegistryError
from runtime.clock import Clock
from runtime.errors import SettingFileError
from runtime.registry_file import read_registry, registry_field

__all__ = ["StateLock", "check_probes", "load_registry", "open_agent"]

log = logging.getLogger("ldp_agent")


def load_registry(cfg: AgentConfig) -> Registry:
    """Read and validate the registry, then hold it against the local policy.

    Raises:
        ConfigError: the registry file cannot be read or is invalid.
        PolicyError: the registry asks for more than the local policy allows.
    """
    path = cfg.registry.path
    try:
        registry = read_registry(path, setting="registry.path")
    except SettingFileError as e:
        raise ConfigError(str(cfg.source or "<config>"), e.setting, e.problem) from None
    except RegistryError as e:
        raise ConfigError(str(path), registry_field(e), e.problem) from None
    check_registry(registry, cfg.policy)
    return registry


def check_probes(cfg: AgentConfig, registry: Registry) -> None:
    """Every probe feeds a use case of the registry, of a kind it can feed.

    Raises:
        ConfigError: naming the probe and the use case.
    """
    for i, probe in enumerate(cfg.probes):
        if isinstance(probe, ActiveSecondsProbe):
            names, where = sorted(set(probe.targets.values())), f"probes[{i}].targets"
        else:
            names, where = [probe.use_case], f"probes[{i}].use_case"
        wants_counter = probe.kind in ("uptime", "active-seconds")
        for name in names:
            use_case = registry.use_cases.get(name)
            if use_case is None:
                raise ConfigError(str(cfg.source or "<config>"), where, f"use case {name!r} is not in the registry")
            kind = privatization_of(use_case)
            if wants_counter:
                ok = kind is Privatization.COUNTER
                need = "a counter use case (a mechanism that privatizes period totals)"
            else:
                ok = kind is not Privatization.COUNTER and use_case.mechanism.value_type is ValueType.STRING
                need = "a string use case (a mechanism that records strings)"
            if not ok:
                raise ConfigError(
                    str(cfg.source or "<config>"),
                    where,
                    f"the {probe.kind} probe needs {need}; {name!r} is {use_case.mechanism.name}",
                )


def open_agent(
    cfg: AgentConfig,
    registry: Registry,
    *,
    clock: Clock,
    rng: RandomSource,
    environ: Mapping[str, str] | None = None,
) -> Agent:
    """The agent over the configured state directory and key.

    Raises:
        KeyUnavailableError: the key cannot be loaded.
    """
    st = cfg.state
    if st.create_key and st.key_file is not None and create_key_file(st.key_file):
        log.info("created a new state key in %s", st.key_file)
    key = load_key(key_file=st.key_file, key_credential=st.key_credential, environ=environ)
    return Agent(
        registry=registry,
        state_dir=st.directory,
        sealer=Sealer(key),
        clock=clock,
        rng=rng,
        topic_prefix=cfg.broker.topic_prefix,
        device_identity=device_identity(cfg.broker, source=str(cfg.source or "<config>")),
        outbox_max_reports=st.outbox_max_reports,
        outbox_max_age_days=st.outbox_max_age_days,
        ledger_retention_days=st.ledger_retention_days,
    )


class StateLock:
    """An exclusive ``flock`` on ``<state_dir>/lock``: one process owns the state at a time."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock without waiting.

        Raises:
            AgentBusyError: another process holds it.
        """
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AgentBusyError(f"another agent process holds {self.path}") from None
        self._fd = fd

    def release(self) -> None:
        """Release the lock."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> StateLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
