"""The frequency oracles added in 0.2.0 are new definitions: the previous release refuses them by name.

Release 0.1.0 knows seven mechanisms. A registry that names ``olh``, ``grr``, ``oue``, ``ss`` or
``pgr`` is refused when its agent or its collector loads it, naming the mechanism (so a fleet
is never half-configured), and a report made under such a use case by this release's agent
is refused by the previous release's decoder without touching any aggregate: 0.1.0 reads
wire format 1 only, so it refuses them by their version before it looks at the use case
(collectors are upgraded before agents, docs/wire-format.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from protocol.randomness import SeededRandom
from protocol.registry import parse_registry
from protocol.wire import encode_report, make_report
from tests.compat.previous_release import MECHANISMS, PreviousRelease, for_previous, without_metadata

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "usecases.example.toml"
NEW = ("olh", "grr", "oue", "ss", "pgr")

# Run by the previous release: load a registry file as its agent and its collector do; print the
# error's kind and message, or "ok".
_LOAD = """
import json, sys
from pathlib import Path
from protocol.registry import RegistryError, parse_registry

try:
    parse_registry(Path(sys.argv[1]).read_bytes(), source=sys.argv[1])
except RegistryError as exc:
    print(json.dumps({"kind": exc.kind, "message": str(exc)}))
else:
    print(json.dumps({"kind": "ok"}))
"""

# Run by the previous release: decode reports (hex) against the registry file it knows.
_DECODE = """
import json, sys
from pathlib import Path
from protocol.errors import MalformedReportError
from protocol.registry import parse_registry
from protocol.wire import decode_report

registry = parse_registry(Path(sys.argv[1]).read_bytes(), source=sys.argv[1])
out = []
for data in json.loads(sys.argv[2]):
    try:
        decode_report(bytes.fromhex(data), registry)
    except MalformedReportError as exc:
        out.append([exc.reason, exc.field])
    else:
        out.append(["decoded", ""])
print(json.dumps(out))
"""


def _use_case_of(mechanism: str) -> str:
    registry = parse_registry(EXAMPLE.read_bytes(), source=str(EXAMPLE))
    return next(name for name, uc in registry.use_cases.items() if uc.mechanism.name == mechanism)


@pytest.mark.parametrize("mechanism", NEW)
def test_the_previous_release_refuses_a_registry_naming_a_new_mechanism(
    previous_release: PreviousRelease, tmp_path: Path, mechanism: str
) -> None:
    """The example registry with one new mechanism's use case: 0.1.0 refuses it as unknown-mechanism, naming it."""
    assert mechanism not in MECHANISMS
    known = for_previous(EXAMPLE.read_text(encoding="utf-8"))
    full = EXAMPLE.read_text(encoding="utf-8")
    name = _use_case_of(mechanism)
    start = full.index(f"[use_cases.{name}]")
    rest = full[start + 1 :]
    end = rest.find("\n[use_cases.", 0)
    while end != -1 and rest[end + len("\n[use_cases.") :].startswith(f"{name}."):
        end = rest.find("\n[use_cases.", end + 1)
    table = full[start : start + 1 + (len(rest) if end == -1 else end)]
    path = tmp_path / "usecases.toml"
    path.write_text(known + "\n" + without_metadata(table) + "\n", encoding="utf-8")
    assert parse_registry(path.read_bytes())[name].mechanism.name == mechanism
    found = previous_release.run(_LOAD, str(path))
    assert found["kind"] == "unknown-mechanism"
    assert f"unknown mechanism {mechanism!r}" in found["message"]
    assert name in found["message"]


def test_the_previous_release_refuses_reports_of_a_new_use_case(
    previous_release: PreviousRelease, tmp_path: Path
) -> None:
    """Reports this release makes for the new use cases decode nowhere in 0.1.0: refused, each, by its format."""
    registry = parse_registry(EXAMPLE.read_bytes(), source=str(EXAMPLE))
    rng = SeededRandom(3)
    reports = []
    for mechanism in NEW:
        uc = registry[_use_case_of(mechanism)]
        mech: Any = uc.mechanism
        categories = mech.fixed_categories
        value = categories[0] if categories else "😀"
        record, _ = mech.privatize(mech.check_value(value), None, rng)
        report = make_report(uc, registry, period=uc.period.index_at(1_700_000_000), records=[record], rng=rng)
        reports.append(encode_report(report).hex())
    path = tmp_path / "usecases.toml"
    path.write_text(for_previous(EXAMPLE.read_text(encoding="utf-8")), encoding="utf-8")
    found = previous_release.run(_DECODE, str(path), json.dumps(reports))
    assert [reason for reason, _ in found] == ["unknown-version"] * len(NEW)
