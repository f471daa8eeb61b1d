"""The device half privatizes exactly as the previous release did: the same coins, the same records.

For every use case of ``deploy/usecases.example.toml`` and ``deploy/fleet.usecases.toml``, a
device sets up its state and privatizes a sequence of values (repeats included, so memos are
reused) with a seeded random source; release 0.1.0 (installed from its wheel) does the same in
a subprocess. Every record's wire form and every saved state must be equal byte for byte:
whatever the mechanism code's layout, a device's coins and records do not change.

The previous release is given each registry without its metadata (``strict``, ``owner``,
``expires``, ...), keys it does not know and refuses (``tests/compat/test_registry_metadata.py``);
they are outside every hash, so both releases build the same use cases from the two texts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from protocol.randomness import SeededRandom
from protocol.registry import Registry, UseCase, parse_registry
from tests.compat.previous_release import PreviousRelease, for_previous, known_to_previous

ROOT = Path(__file__).resolve().parents[2]
REGISTRIES = (ROOT / "deploy" / "usecases.example.toml", ROOT / "deploy" / "fleet.usecases.toml")
"""The registries compared, each without the use cases of mechanisms the previous release lacks."""
SEEDS = range(6)

# A value sequence per kind of recorded value, with repeats (memos are reused) and edges.
VALUES: dict[str, list[Any]] = {
    "bit": [1, 0, 1, 1, 0],
    "count": [0, 5_000, 21_600, 5_000, 1],
    "number": [0.0, 123.5, 20_000.0, 123.5, 99_999.0],
    "string": ["example.com", "😀", "bruh", "example.com", "a", "hello"],
}

# Run by the previous release: the same computation, printed as hex msgpack per use case.
_RECORDS = """
import json, sys
from pathlib import Path
import msgpack
from protocol.randomness import SeededRandom
from protocol.registry import parse_registry

out = {}
values = json.loads(sys.argv[2])
for path in json.loads(sys.argv[1]):
    registry = parse_registry(Path(path).read_bytes(), source=path)
    for name, uc in registry.use_cases.items():
        mech = uc.mechanism
        for seed in json.loads(sys.argv[3]):
            rng = SeededRandom(seed)
            state = mech.setup_plain(rng)
            rows = [state]
            for value in values[mech.value_type.value]:
                if mech.kind.value == "categories" and isinstance(value, str):
                    value = mech.fixed_categories[len(value) % len(mech.fixed_categories)]
                if mech.privatization.value == "counter":
                    value = mech.counter_input(value)
                record, state = mech.privatize_plain(mech.check_value(value), state, rng)
                rows.append([record, state])
            out[f"{path}:{name}:{seed}"] = msgpack.packb(rows, use_bin_type=True).hex()
print(json.dumps(out))
"""


def _rows(uc: UseCase, seed: int) -> bytes:
    """This release's records and states for one use case and seed, as the previous release packs them."""
    mech: Any = uc.mechanism
    rng = SeededRandom(seed)
    state = mech.setup_plain(rng)
    rows: list[Any] = [state]
    for raw in VALUES[mech.value_type.value]:
        value = raw
        if mech.kind.value == "categories" and isinstance(raw, str):
            value = mech.fixed_categories[len(raw) % len(mech.fixed_categories)]
        if mech.privatization.value == "counter":
            value = mech.counter_input(value)
        record, state = mech.privatize_plain(mech.check_value(value), state, rng)
        rows.append([record, state])
    packed: bytes = msgpack.packb(rows, use_bin_type=True)
    return packed


def _known(path: Path) -> str:
    return known_to_previous(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def previous_records(previous_release: PreviousRelease, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What release 0.1.0 produced, per registry, use case and seed (keyed by this tree's paths), from
    copies of the registries it can read (:func:`for_previous`)."""
    copies = tmp_path_factory.mktemp("registries-without-metadata")
    paths: dict[str, str] = {}
    for path in REGISTRIES:
        stripped = copies / path.name
        stripped.write_text(for_previous(path.read_text(encoding="utf-8")), encoding="utf-8")
        paths[str(stripped)] = str(path)
    found: dict[str, str] = previous_release.run(
        _RECORDS, json.dumps(list(paths)), json.dumps(VALUES), json.dumps(list(SEEDS))
    )
    # The previous release names each row by the copy it read: the rows by this tree's file.
    renamed = {}
    for key, value in found.items():
        read, _, rest = key.partition(":")
        renamed[f"{paths[read]}:{rest}"] = value
    return renamed


def _cases() -> list[tuple[str, Registry, str]]:
    out = []
    for path in REGISTRIES:
        registry = parse_registry(_known(path), source=str(path))
        out += [(str(path), registry, name) for name in registry.use_cases]
    return out


@pytest.mark.parametrize(("path", "registry", "name"), _cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_use_case_privatizes_exactly_as_the_previous_release(
    previous_records: dict[str, str], path: str, registry: Registry, name: str
) -> None:
    """Same seed, same values: the same records and saved states as release 0.1.0, byte for byte."""
    for seed in SEEDS:
        assert _rows(registry[name], seed).hex() == previous_records[f"{path}:{name}:{seed}"], (name, seed)
