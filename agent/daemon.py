"""The daemon: one root ``asyncio.TaskGroup`` owning the cycle runner, the probes, the publisher,
the local API and the systemd watchdog.

:class:`Daemon` is the reusable part (no signals, no socket, no systemd): the fleet simulator
can run many in one process, each with its own state directory, a shared fake clock, a
seeded random source and an in-memory or real transport. :func:`run_daemon` adds what a
service needs: the state lock, the Unix-socket API, SIGTERM/SIGINT handling and ``sd_notify``
READY/WATCHDOG/STOPPING. Both take the clock as an argument (the service: the host's
:class:`runtime.clock.SystemClock`); nothing in the environment selects another.

Failure policy (docs/design.md, convention 12): an expected condition (broker down, a refused value, a
stopped use case) is handled where it happens; anything unexpected escapes the task group,
cancels every task, and ends the process with a non-zero status so systemd restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Mapping, Sequence

from agent.api import serve
from agent.brokers import BrokerAddress, broker_order
from agent.config import AgentConfig, ScheduleConfig
from agent.core import Agent
from agent.errors import ConsentRequiredError, UseCaseStoppedError, ValueRefusedError
from agent.identity import device_identity
from agent.mechanism_calls import counter_input, privatization_of
from agent.opening import StateLock, check_probes, load_registry, open_agent
from agent.probes import Probe, Sample, build_probes
from agent.publisher import Publisher, ReceiptPolicy
from agent.schedule import next_cycle_after, plausible_next
from agent.state import AgentDoc
from agent.transport import Connection, ReceiptConnection, Route, Transport
from protocol.interfaces import Privatization
from protocol.randomness import RandomSource, SystemRandom
from runtime.backoff import Backoff
from runtime.clock import Clock, SystemClock
from runtime.sd_notify import Notifier

__all__ = ["Daemon", "StateLock", "check_probes", "load_registry", "open_agent", "run_daemon"]

log = logging.getLogger("ldp_agent")


class _Shutdown(Exception):  # noqa: N818 - a signal, not an error
    """Raised inside the task group to stop every task on SIGTERM/SIGINT."""


class LazyMqttTransport:
    """Imports the MQTT adapter on the first connection, so an idle daemon does not load it.

    Args:
        cfg: the config.
        rng: the source of client identifiers.
        address: the broker (default: the first of ``[broker]``).
    """

    def __init__(self, cfg: AgentConfig, rng: RandomSource, address: BrokerAddress | None = None) -> None:
        self._cfg = cfg
        self._rng = rng
        self._broker = address or cfg.broker.endpoints[0]
        self._inner: Transport | None = None

    @property
    def address(self) -> str:
        """The broker's ``host:port``."""
        return str(self._broker)

    def connect(self) -> contextlib.AbstractAsyncContextManager[Connection]:
        if self._inner is None:
            from agent.mqtt import MqttTransport  # noqa: PLC0415 - aiomqtt only once something is sent

            self._inner = MqttTransport(self._cfg.broker, self._rng, address=self._broker)
        return self._inner.connect()

    def connect_receipts(self) -> contextlib.AbstractAsyncContextManager[ReceiptConnection]:
        from agent.mqtt import MqttTransport  # noqa: PLC0415 - aiomqtt only once something is sent

        if not isinstance(self._inner, MqttTransport):
            self._inner = MqttTransport(self._cfg.broker, self._rng, address=self._broker)
        return self._inner.connect_receipts()


def broker_routes(cfg: AgentConfig, rng: RandomSource) -> list[Route]:
    """One route per configured broker, in this device's order (agent.brokers), its primary first.

    Raises:
        ConfigError: the identity the order depends on cannot be read (agent.identity).
    """
    order = broker_order(device_identity(cfg.broker, source=str(cfg.source or "<config>")), cfg.broker.endpoints)
    return [Route(str(a), LazyMqttTransport(cfg, rng, a)) for a in order]


class Daemon:
    """The long-lived tasks of one agent.

    Args:
        agent: the agent core.
        transport: the broker connection factory, or one route per broker in the device's order.
        clock: the wall clock; cycles wait on it.
        rng: randomness for jitter and backoff.
        schedule: when cycles run.
        probes: built-in probes.
        backoff: the reconnect policy.
        receipts: wait for commit receipts (None: a broker acknowledgement is final).
    """

    def __init__(
        self,
        agent: Agent,
        transport: Transport | Sequence[Route],
        *,
        clock: Clock,
        rng: RandomSource,
        schedule: ScheduleConfig | None = None,
        probes: Sequence[Probe] = (),
        backoff: Backoff | None = None,
        receipts: ReceiptPolicy | None = None,
    ) -> None:
        self.agent = agent
        self.clock = clock
        self.rng = rng
        self.schedule = schedule or ScheduleConfig()
        self.probes = list(probes)
        self.publisher = Publisher(agent, transport, clock=clock, rng=rng, backoff=backoff, receipts=receipts)
        self.next_cycle: float | None = None
        self.cycles_run = 0
        self.on_status: Callable[[str], None] | None = None
        """Called with a one-line status after each cycle (the service passes it to sd_notify)."""

    def _next_after(self, t: float) -> float:
        s = self.schedule
        return next_cycle_after(t, interval_hours=s.interval_hours, jitter_seconds=s.jitter_seconds, rng=self.rng)

    def _record(self, samples: list[Sample]) -> None:
        by_use_case: dict[str, list[Sample]] = {}
        for sample in samples:
            by_use_case.setdefault(sample[0], []).append(sample)
        for name, items in by_use_case.items():
            use_case = self.agent.registry.use_cases.get(name)
            if use_case is None:
                continue
            batch = items
            bounds = use_case.mechanism.value_range
            if privatization_of(use_case) is Privatization.COUNTER and bounds is not None:
                # A probe interval can exceed the counter's range (a long suspend): clip to it.
                batch = [(n, counter_input(use_case, v), k) for n, v, k in items if isinstance(v, int)]
            try:
                self.agent.record_many(batch)
            except ConsentRequiredError:
                return
            except UseCaseStoppedError as e:
                log.debug("probe values not recorded: %s", e)
            except ValueRefusedError as e:
                log.warning("probe values refused: %s", e)

    def sample_probes(self, *, per_cycle: bool) -> None:
        """Sample the probes of one kind and record what they measured (only with consent)."""
        now = self.clock.time()
        for probe in self.probes:
            if probe.per_cycle != per_cycle:
                continue
            samples = probe.sample(now)  # always sampled, so baselines never span the time before consent
            if self.agent.consented:
                self._record(samples)

    def run_cycle(self) -> None:
        """One collection cycle: flush counter probes, close periods, sample per-cycle probes, publish."""
        if not self.agent.consented:
            return
        self.sample_probes(per_cycle=False)
        summary = self.agent.collect()
        self.sample_probes(per_cycle=True)
        self.cycles_run += 1
        log.info(
            "collection cycle: %d reports with %d records staged (ε %.4g), %d records over the limits",
            summary.reports,
            summary.records,
            summary.epsilon,
            summary.unsent,
        )
        self.publisher.kick()
        if self.on_status is not None:
            self.on_status(
                f"cycle {self.cycles_run}: {summary.reports} reports staged; {self.agent.outbox_size} in the outbox"
            )

    def _schedule_doc(self) -> AgentDoc:
        return self.agent.load_schedule() if self.agent.consented else AgentDoc()

    async def run_cycles(self) -> None:
        """Run collection cycles when due, forever."""
        s = self.schedule
        while True:
            doc = self._schedule_doc()
            now = self.clock.time()
            if not doc.next_cycle or not plausible_next(
                doc.next_cycle, now, interval_hours=s.interval_hours, jitter_seconds=s.jitter_seconds
            ):
                doc.next_cycle = self._next_after(now)
                self.agent.save_schedule(doc)
            self.next_cycle = doc.next_cycle
            await self.clock.sleep_until(doc.next_cycle)
            now = self.clock.time()
            self.run_cycle()
            # Missed slots coalesce: the next cycle is the first slot after now.
            doc = self._schedule_doc()
            doc.cycles += 1 if self.agent.consented else 0
            doc.last_cycle = now
            doc.next_cycle = self._next_after(now)
            self.agent.save_schedule(doc)

    async def run_probes(self) -> None:
        """Sample the interval probes, forever."""
        if not any(not p.per_cycle for p in self.probes):
            return
        while True:
            self.sample_probes(per_cycle=False)
            await self.clock.sleep(self.schedule.probe_interval_seconds)

    def start(self, tg: asyncio.TaskGroup) -> None:
        """Start the daemon's tasks in ``tg``."""
        tg.create_task(self.run_cycles(), name="cycles")
        tg.create_task(self.run_probes(), name="probes")
        tg.create_task(self.publisher.run(), name="publisher")
        self.publisher.kick()  # reports left from before a restart

    def shutdown(self) -> None:
        """Persist what is in flight: the counter probes' last interval."""
        with contextlib.suppress(ConsentRequiredError):
            self.sample_probes(per_cycle=False)


def _notify_status(notifier: Notifier, line: str) -> None:
    notifier.notify(f"STATUS={line}")


async def _stop_on(event: asyncio.Event) -> None:
    await event.wait()
    raise _Shutdown


async def run_daemon(
    cfg: AgentConfig,
    *,
    clock: Clock | None = None,
    rng: RandomSource | None = None,
    transport: Transport | None = None,
    environ: Mapping[str, str] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run the agent service until SIGTERM/SIGINT (or ``stop`` is set).

    Raises:
        ConfigError, PolicyError, KeyUnavailableError, AgentBusyError: start-up failures.
        ExceptionGroup: an unexpected failure of a task.
    """
    clock = clock or SystemClock()
    rng = rng or SystemRandom()
    registry = load_registry(cfg)
    check_probes(cfg, registry)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    # Every resource is released whatever fails, the last taken first: the probes' last
    # interval saved, STOPPING said, the notifier and the signal handlers gone, then the state
    # lock (docs/design.md, convention 14).
    with contextlib.ExitStack() as resources:
        resources.enter_context(StateLock(cfg.state.directory))
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
            resources.callback(loop.remove_signal_handler, sig)
        notifier = resources.enter_context(contextlib.closing(Notifier(environ)))
        resources.callback(notifier.notify, "STOPPING=1")
        agent = open_agent(cfg, registry, clock=clock, rng=rng, environ=environ)
        daemon = Daemon(
            agent,
            transport or broker_routes(cfg, rng),
            clock=clock,
            rng=rng,
            schedule=cfg.schedule,
            probes=build_probes(cfg.probes),
            backoff=Backoff(initial=cfg.broker.backoff_initial, cap=cfg.broker.backoff_max),
            receipts=(
                ReceiptPolicy(timeout=cfg.broker.receipt_timeout_seconds, cap=cfg.broker.receipt_backoff_max)
                if cfg.broker.receipts
                else None
            ),
        )
        resources.callback(daemon.shutdown)
        await _serve(daemon, cfg, notifier, stop)


async def _serve(d: Daemon, cfg: AgentConfig, notifier: Notifier, stop: asyncio.Event) -> None:
    """Run the daemon's tasks and its local API until ``stop`` is set."""
    agent = d.agent
    d.on_status = lambda line: _notify_status(notifier, line)
    # Read at each request; an in-memory transport without a name shows none.
    brokers = lambda: (tuple(b for b in d.publisher.brokers if b), d.publisher.broker_in_use or None)  # noqa: E731
    async with serve(agent, cfg.api.socket, mode=cfg.api.socket_mode, brokers=brokers):
        try:
            async with asyncio.TaskGroup() as tg:
                d.start(tg)
                if notifier.watchdog_interval is not None:
                    tg.create_task(notifier.run_watchdog(), name="watchdog")
                tg.create_task(_stop_on(stop), name="stop")
                notifier.notify("READY=1", f"STATUS=serving; consent {'granted' if agent.consented else 'not granted'}")
                log.info(
                    "agent running: registry %s, %d use cases, consent %s",
                    agent.registry.hash_hex,
                    len(agent.registry.use_cases),
                    "granted" if agent.consented else "not granted",
                )
        except* _Shutdown:
            log.info("stopping")
