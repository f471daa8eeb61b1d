"""What a fleet run simulates: the plan (devices, days, registries, value generators, broker)
and the seed of each device's coins."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from agent.config import BrokerConfig
from fleet.values import GeneratorSpec, Population, ValueGenerator, build_generator, load_population
from protocol.catalog import Catalog
from protocol.registry import Registry, UseCase, parse_registry

__all__ = ["SLOT_SECONDS", "FleetPlan", "RegistryChange", "build_generators", "device_seed"]

SLOT_SECONDS = 21_600
"""One collection slot: the agent's cycles run every 6 hours (000 §6)."""


def device_seed(seed: int, start: int, device: int) -> int:
    """The seed of device ``device``'s random source (independent of the worker split).

    The simulated start time is part of it: report ids come from this source, and the
    collector drops a report whose id it has seen, so two runs over different days must not
    draw the same ids (the same run repeated is, correctly, a redelivery).
    """
    digest = hashlib.blake2b(f"{seed}/{start}/{device}".encode(), digest_size=16, person=b"ldp-fleet-dev").digest()
    return int.from_bytes(digest, "little")


@dataclass(frozen=True, kw_only=True)
class RegistryChange:
    """Every second device (the odd numbers) moves to a second registry at a slot, as a device
    that takes an update restarts its agent with the new file (``ldp-fleet --registry-change``).

    Attributes:
        registry_text: the second registry file's bytes.
        registry_path: where it was read from.
        at_slot: the slot (6-hour step from the start) at whose beginning the devices move,
            before they record that slot's values.
    """

    registry_text: bytes
    registry_path: str
    at_slot: int

    @staticmethod
    def moves(device: int) -> bool:
        """Whether device ``device`` moves (half the fleet, spread over every worker)."""
        return device % 2 == 1

    def registry(self) -> Registry:
        """The parsed second registry."""
        return parse_registry(self.registry_text, source=self.registry_path)


@dataclass(frozen=True, kw_only=True)
class FleetPlan:
    """Everything a worker needs to simulate its devices (picklable, for worker processes).

    Attributes:
        registry_text: the registry file's bytes (parsed again in each worker).
        registry_path: where it was read from (dictionaries resolve against its directory).
        use_cases: the simulated use cases (of either registry, with a change).
        generators: generator specification per use case.
        populations: population file per use case, where one is used.
        devices: how many devices the whole fleet has.
        days: simulated days.
        start: simulated start time (a UTC midnight).
        seed: the simulation seed.
        broker: where to publish (None: the transport factory given to :func:`run_shard`).
        connections: MQTT connections per worker.
        window: publishes in flight per connection.
        jitter_seconds: the agents' cycle jitter.
        state_dir: where sealed state goes (None: in memory).
        change: half the fleet moves to a second registry mid-run (None: no change).
        receipts: wait for the collector's commit receipts (the transport must offer them);
            False: a report is done at the broker's acknowledgement.
        receipt_timeout: real seconds after which a report without its receipt is sent again.
        receipt_wait: real seconds the run waits, after the last slot, for the last receipts.
    """

    registry_text: bytes
    registry_path: str
    use_cases: tuple[str, ...]
    generators: dict[str, GeneratorSpec]
    populations: dict[str, str] = field(default_factory=dict)
    devices: int
    days: int
    start: int
    seed: int
    broker: BrokerConfig | None = None
    connections: int = 4
    window: int = 8
    jitter_seconds: float = 1800.0
    state_dir: str | None = None
    change: RegistryChange | None = None
    receipts: bool = False
    receipt_timeout: float = 30.0
    receipt_wait: float = 300.0

    @property
    def slots(self) -> int:
        """Collection slots with recording (the closing cycle after them comes on top)."""
        return self.days * (86_400 // SLOT_SECONDS)

    def registry(self) -> Registry:
        """The parsed registry."""
        return parse_registry(self.registry_text, source=self.registry_path)

    def catalog(self) -> Catalog:
        """Every definition a simulated device can report under (the second registry's first)."""
        first = self.registry()
        if self.change is None:
            return Catalog.build(first)
        return Catalog.build(self.change.registry(), [first])

    def use_case(self, name: str) -> UseCase:
        """The use case ``name`` as the simulation's values are drawn for it: the first registry's
        definition, or the second's for a use case only it has."""
        first = self.registry()
        if name in first.use_cases:
            return first[name]
        assert self.change is not None, name
        return self.change.registry()[name]


def build_generators(plan: FleetPlan) -> dict[str, ValueGenerator]:
    """The value generator of every simulated use case (drawn for :meth:`FleetPlan.use_case`).

    Raises:
        fleet.values.GeneratorError: for a generator that does not fit its use case.
    """
    base = Path(plan.registry_path).resolve().parent
    populations: dict[str, Population] = {}
    out = {}
    for name in plan.use_cases:
        path = plan.populations.get(name)
        if path is not None and path not in populations:
            populations[path] = load_population(Path(path))
        out[name] = build_generator(
            plan.use_case(name),
            plan.generators[name],
            devices=plan.devices,
            seed=plan.seed,
            registry_dir=base,
            population=populations.get(path) if path is not None else None,
        )
    return out


# --------------------------------------------------------------------------- connections
