"""Every mechanism of the example registry runs in the agent: values in, decodable reports out, no raw value kept."""

from __future__ import annotations

from pathlib import Path

import msgpack

from agent.config import PolicyConfig, load_config
from agent.core import Agent
from agent.daemon import check_probes
from agent.policy import check_registry
from agent.sealed import Sealer
from protocol.randomness import SeededRandom
from protocol.registry import parse_registry
from protocol.wire import decode_report
from tests.agent.conftest import KEY, START
from tests.support.clocks import FakeClock

ROOT = Path(__file__).resolve().parents[2]

VALUES: dict[str, list[tuple[object, str | None]]] = {
    "app-usage-seconds": [(5_400, "editor"), (60, "shell")],
    "app-usage-histogram": [(7_200.5, None)],
    "emoji": [("🙂-private", None), ("🎉-private", None)],
    "safari-energy-domains": [("private-energy.example", None)],
    "new-words": [("bruhprivate", None)],
    "homepage": [("private-home.example", None)],
    "dark-mode-enabled": [(1, None)],
    "emoji-olh": [("🙃-private", None)],
    "default-browser": [("vivaldi", None)],
    "keyboard-locale": [("pt-PT", None)],
    "screen-resolution": [("3440x1440", None)],
    "utc-offset": [("utc+05:45", None)],
}


def test_example_registry_end_to_end(tmp_path: Path) -> None:
    """Each use case of deploy/usecases.example.toml records, reports what the collector decodes, keeps no value."""
    path = ROOT / "deploy" / "usecases.example.toml"
    registry = parse_registry(path.read_bytes(), source=str(path))
    check_registry(registry, PolicyConfig())  # the default local policy admits the example registry
    check_probes(load_config(ROOT / "deploy" / "agent.example.toml"), registry)  # and the example probes fit it
    assert set(VALUES) == set(registry.use_cases)
    clock = FakeClock(START)
    agent = Agent(registry=registry, state_dir=tmp_path / "state", sealer=Sealer(KEY), clock=clock, rng=SeededRandom(5))
    agent.grant_consent()
    for name, values in VALUES.items():
        for value, key in values:
            agent.record(name, value, key=key)
    clock.set(clock.time() + 86_400.0)
    agent.collect()
    reported = {}
    for p in agent.outbox():
        report = decode_report(p.entry.payload, registry)
        reported[report.use_case.name] = report.count
    assert reported == {name: min(len(values), registry[name].daily_limit) for name, values in VALUES.items()}
    blob = b"".join(
        msgpack.packb(Sealer(KEY).read(f, "usecase:" + f.name[3:-7], 1), use_bin_type=True)
        for f in (tmp_path / "state").glob("uc-*.sealed")
    )
    for values in VALUES.values():
        for value, key in values:
            if isinstance(value, str):
                assert value.encode() not in blob
            if key is not None:
                assert key.encode() not in blob
