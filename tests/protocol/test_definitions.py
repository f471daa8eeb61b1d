"""Use cases are versioned one by one: the definition hash, and the catalog of definitions a collector accepts."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import re
from pathlib import Path

import pytest

from protocol.catalog import Catalog, CatalogError
from protocol.errors import MalformedReportError
from protocol.randomness import SeededRandom
from protocol.registry import Registry, definition_hash, parse_registry
from protocol.wire import Report, decode_report, encode_report

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "usecases.example.toml"

# The definition hashes of the example registry's use cases. They travel in every report:
# a change here means every device running this registry would be refused by a collector
# that is not given the new one. Change them only on purpose (and say so in the changelog).
PINNED = {
    "app-usage-histogram": "261842da11a033105dd20895f9823e31",
    "app-usage-seconds": "cff7fb92a9ceb7d057eeff07c168c0c8",
    "dark-mode-enabled": "374613624c06622accc6b1a2990a0c55",
    "emoji": "5338c1d1a3d62708a30b002d3afa08d4",
    "homepage": "9913d4c5797c0b30ff9752f410b2051a",
    "new-words": "d69411edd1391dfa6dc752cd0d62450b",
    "safari-energy-domains": "d92913148e1ddd198d96dc30d5b080d0",
    # The frequency oracles at the local-privacy limit (added in 0.2.0).
    "default-browser": "82fd2ce28e76c24e941b5c29094cd6e1",
    "emoji-olh": "e48cf51ae1a69ca728e17ae33e6d8d63",
    "keyboard-locale": "d5b3858755ba2d196480ef6740ce8ae5",
    "screen-resolution": "ab1e91e218d739b63f5607b3980751fd",
    "utc-offset": "dab605bfc137331165e7c87d7cfad96a",
}


def _example(text: str | None = None) -> Registry:
    return parse_registry(EXAMPLE.read_bytes() if text is None else text, source=str(EXAMPLE))


def _edit(text: str, use_case: str, old: str, new: str) -> str:
    """``text`` with ``old`` replaced by ``new`` inside the table of ``use_case`` only."""
    start = text.index(f"[use_cases.{use_case}]")
    nxt = re.search(r"^\[use_cases\.(?!" + re.escape(use_case) + r"[.\]])", text[start + 1 :], re.M)
    end = len(text) if nxt is None else start + 1 + nxt.start()
    table = text[start:end]
    assert old in table, (use_case, old)
    return text[:start] + table.replace(old, new, 1) + text[end:]


def test_the_example_registrys_definition_hashes_are_pinned() -> None:
    """Each use case of deploy/usecases.example.toml keeps the definition hash devices report under."""
    registry = _example()
    assert {name: uc.definition.hex() for name, uc in registry.use_cases.items()} == PINNED
    assert {uc.ref for uc in registry.use_cases.values()} == {f"{n}@{h[:8]}" for n, h in PINNED.items()}


def test_adding_changing_or_removing_a_use_case_leaves_the_others_alone() -> None:
    """Only the definition that changed gets a new hash; the registry's hash changes with any of them."""
    text = EXAMPLE.read_text(encoding="utf-8")
    base = _example(text)
    added = text + '\n[use_cases.new-flag]\nmechanism = "rr"\nepsilon = 1\nperiod = "1d"\ndaily_limit = 1\n'
    added += 'owner = "team@example.org"\nexpires = 2030-01-01\n'  # the example registry is strict
    added += "lifetime_epsilon = 10\n[use_cases.new-flag.collector]\nmin_reports = 10\n"
    changed = _edit(text, "emoji", "epsilon = 4", "epsilon = 3")
    removed = text[: text.index("[use_cases.homepage]")]  # the tables from homepage on
    variants = {"added": added, "changed": changed}
    for what, variant in variants.items():
        registry = _example(variant)
        assert registry.hash != base.hash, what
        for name, uc in base.use_cases.items():
            if what == "changed" and name == "emoji":
                assert registry[name].definition != uc.definition
            else:
                assert registry[name].definition.hex() == PINNED[name], (what, name)
    # Removing use cases (everything from homepage on) leaves the rest as pinned.
    smaller = _example(removed)
    assert smaller.use_cases
    for name, uc in smaller.use_cases.items():
        assert uc.definition.hex() == PINNED[name]


@pytest.mark.parametrize(
    ("use_case", "old", "new"),
    [
        ("emoji", "epsilon = 4", "epsilon = 4.5"),  # ε
        ("emoji", 'period = "1d"', 'period = "6h"'),  # period
        ("emoji", "daily_limit = 1", "daily_limit = 2"),  # a limit
        ("emoji", "lifetime_epsilon = 1_500", "lifetime_epsilon = 1_600"),  # the cap
        ("emoji", "m = 1_024", "m = 2_048"),  # a parameter
        ("homepage", "cohorts = 32, f = 0.75", "cohorts = 32, f = 0.8"),  # a memoized mechanism's parameter
    ],
)
def test_what_changes_a_report_changes_the_definition(use_case: str, old: str, new: str) -> None:
    """Mechanism parameters, ε, period and limits are part of the definition."""
    changed = _example(_edit(EXAMPLE.read_text(encoding="utf-8"), use_case, old, new))
    assert changed[use_case].definition.hex() != PINNED[use_case]


def test_collector_settings_and_descriptions_are_not_part_of_the_definition() -> None:
    """What the collector releases, and what people read, does not change what a report means."""
    text = EXAMPLE.read_text(encoding="utf-8")
    changed = _edit(text, "emoji", "min_reports = 10_000", "min_reports = 5")
    changed = _edit(changed, "emoji", 'description = "', 'description = "Edited. ')
    registry = _example(changed)
    assert registry["emoji"].definition.hex() == PINNED["emoji"]
    assert registry.hash != _example(text).hash


def test_the_definition_does_not_depend_on_class_names() -> None:
    """The same parameters in a class of another name give the same definition hash."""
    uc = _example()["emoji"]
    renamed = type("RenamedSketch", (type(uc.mechanism),), {})
    clone = copy.copy(uc.mechanism)
    object.__setattr__(clone, "__class__", renamed)
    assert type(clone).__name__ == "RenamedSketch"
    assert definition_hash(dataclasses.replace(uc, mechanism=clone)).hex() == PINNED["emoji"]


def _two_versions() -> tuple[Registry, Registry]:
    text = EXAMPLE.read_text(encoding="utf-8")
    v1 = _example(text)
    v2 = parse_registry(_edit(text, "emoji", "epsilon = 4", "epsilon = 3"), source="v2.toml")
    return v1, v2


def test_a_catalog_holds_each_definition_once_current_first() -> None:
    """The current registry's definitions, then the earlier ones it does not have."""
    v1, v2 = _two_versions()
    catalog = Catalog.build(v2, [v1])
    refs = list(catalog.use_cases)
    assert refs[: len(v2.use_cases)] == [uc.ref for uc in v2.use_cases.values()]
    assert refs[len(v2.use_cases) :] == [v1["emoji"].ref]
    assert [uc.ref for uc in catalog.definitions_of("emoji")] == [v2["emoji"].ref, v1["emoji"].ref]
    assert catalog.resolve("emoji") is v2["emoji"]
    assert catalog.resolve(v1["emoji"].ref) is v1["emoji"]
    assert catalog.resolve("emoji@" + v1["emoji"].definition.hex()) is v1["emoji"]
    assert catalog.resolve("emoji@12") is None  # fewer than 8 digits
    assert catalog.resolve("nope") is None
    assert catalog.is_current(v2["emoji"])
    assert not catalog.is_current(v1["emoji"])
    assert catalog.sources(v1["homepage"]) == (v2.source, v1.source)


def test_a_collector_counts_each_report_under_the_definition_it_was_made_with() -> None:
    """Reports of both versions, and format-1 reports of the earlier registry, decode to their own definition."""
    v1, v2 = _two_versions()
    catalog = Catalog.build(v2, [v1])
    rng = SeededRandom(5)
    for registry in (v1, v2):
        uc = registry["emoji"]
        wire, _ = uc.mechanism.privatize_plain("😀", None, rng)
        data = encode_report(_report(uc.name, uc.definition, [wire]))
        assert decode_report(data, catalog).use_case is uc
    legacy = encode_report(_report("emoji", v1.hash, [v1["emoji"].mechanism.privatize_plain("😀", None, rng)[0]], 1))
    assert decode_report(legacy, catalog).use_case is v1["emoji"]
    # Without the earlier registry, both of its forms are refused.
    only_v2 = Catalog.build(v2)
    with pytest.raises(MalformedReportError, match="has no definition") as info:
        decode_report(encode_report(_report("emoji", v1["emoji"].definition, [wire])), only_v2)
    assert info.value.reason == "unknown-definition"
    with pytest.raises(MalformedReportError) as info:
        decode_report(legacy, only_v2)
    assert info.value.reason == "registry-mismatch"


def _report(name: str, digest: bytes, records: list[object], version: int = 2) -> Report:
    return Report(
        use_case=name, definition=digest, period=20_000, report_id=bytes(16), records=records, version=version
    )


def test_retirement_dates_become_period_indices() -> None:
    """A definition retired on a day refuses the periods that start on or after it."""
    v1, v2 = _two_versions()
    day = datetime.date(2026, 12, 1)
    catalog = Catalog.build(v2, [v1], retire={v1["emoji"].ref: day, "homepage": day})
    first_day = (day - datetime.date(1970, 1, 1)).days
    assert catalog.retired_from(v1["emoji"]) == first_day  # 1d periods
    assert catalog.retired_from(v2["homepage"]) == first_day  # the bare name retires every definition
    assert catalog.retired_from(v2["emoji"]) is None
    with pytest.raises(CatalogError, match=r"retire\.nope"):
        Catalog.build(v2, [v1], retire={"nope": day})
