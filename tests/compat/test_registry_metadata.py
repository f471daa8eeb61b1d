"""Registry metadata against release 0.1.0: its registries still parse, with the same hashes, and it
refuses the new keys by name rather than misreading them (docs/deploy.md, "Owners and end dates")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from protocol.registry import parse_registry
from tests.compat.previous_release import PreviousRelease, for_previous, known_to_previous

ROOT = Path(__file__).resolve().parents[2]
REGISTRIES = tuple(ROOT / "deploy" / name for name in ("usecases.example.toml", "fleet.usecases.toml"))

# Run by the previous release: the registry hash of each file, or the error it refuses it with.
_PARSE = """
import json, sys
from pathlib import Path
from protocol.registry import RegistryError, parse_registry

out = {}
for path in json.loads(sys.argv[1]):
    try:
        out[path] = {"hash": parse_registry(Path(path).read_bytes(), source=path).hash_hex}
    except RegistryError as e:
        out[path] = {"kind": e.kind, "field": e.field, "message": str(e)}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def previous_parse(previous_release: PreviousRelease, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """What release 0.1.0 makes of each example registry, as shipped and without its metadata."""
    directory = tmp_path_factory.mktemp("registries")
    paths = []
    for path in REGISTRIES:
        # Only the use cases of mechanisms 0.1.0 knows (it refuses the others by name:
        # tests/compat/test_new_mechanisms.py), with and without the metadata.
        text = known_to_previous(path.read_text(encoding="utf-8"))
        for label, body in (("with", text), ("without", for_previous(text))):
            copy = directory / f"{label}-{path.name}"
            copy.write_text(body, encoding="utf-8")
            paths.append(str(copy))
    found: dict[str, object] = previous_release.run(_PARSE, json.dumps(paths))
    return found


@pytest.mark.parametrize("path", REGISTRIES, ids=lambda p: p.name)
def test_a_registry_of_the_previous_format_parses_with_the_hash_the_previous_release_gives_it(
    previous_parse: dict[str, object], path: Path
) -> None:
    """Without its metadata the file is one 0.1.0 reads; this release reads it too, with 0.1.0's hash,
    and the file with its metadata has that same hash."""
    text = known_to_previous(path.read_text(encoding="utf-8"))
    entry = next(v for k, v in previous_parse.items() if k.endswith(f"without-{path.name}"))
    assert isinstance(entry, dict)
    plain = parse_registry(for_previous(text), source=path.name)
    full = parse_registry(text, source=path.name)
    assert not plain.strict
    assert all(not uc.metadata.owner for uc in plain.use_cases.values())
    assert full.strict
    assert entry == {"hash": plain.hash_hex} == {"hash": full.hash_hex}
    assert {n: uc.definition for n, uc in plain.use_cases.items()} == {
        n: uc.definition for n, uc in full.use_cases.items()
    }


@pytest.mark.parametrize("path", REGISTRIES, ids=lambda p: p.name)
def test_the_previous_release_refuses_a_registry_with_metadata_naming_the_key(
    previous_parse: dict[str, object], path: Path
) -> None:
    """0.1.0 refuses the new keys as unknown, naming one (it never reads them as something else)."""
    entry = next(v for k, v in previous_parse.items() if k.endswith(f"with-{path.name}") and "without" not in k)
    assert isinstance(entry, dict)
    assert entry["kind"] == "unknown-key", entry
    assert entry["field"] in {"strict", "owner", "expires", "data_review", "notification_emails"}, entry
