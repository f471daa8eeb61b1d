"""Use-case metadata (owner, end date, review, e-mails): outside every hash, checked, and required under strict."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest

from protocol.metadata import UseCaseMetadata, metadata_warnings
from protocol.registry import RegistryError, parse_registry
from tests.compat.previous_release import without_metadata

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = tuple(
    ROOT / "deploy" / n for n in ("usecases.example.toml", "fleet.usecases.toml", "fleet.usecases.v2.toml")
)

BASE = """
format = 1
{top}

[use_cases.flag]
mechanism = "rr"
epsilon = 1.0
period = "1d"
daily_limit = 1
lifetime_epsilon = 100
{flag}
[use_cases.flag.collector]
min_reports = 10

[use_cases.usage]
mechanism = "one-bit-mean"
epsilon = 1
period = "6h"
daily_limit = 4
lifetime_epsilon = 100
parameters = {{ m = 21600, gamma = 0.2 }}
{usage}
[use_cases.usage.collector]
min_reports = 10
"""

OWNED = 'owner = "team@example.org"\nexpires = 2027-06-30'


def _registry(*, top: str = "", flag: str = "", usage: str = "") -> str:
    return BASE.format(top=top, flag=flag, usage=usage)


def _error(text: str) -> RegistryError:
    with pytest.raises(RegistryError) as info:
        parse_registry(text, source="usecases.toml")
    return info.value


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_metadata_is_outside_every_hash(path: Path) -> None:
    """With or without its metadata, every use case has the same definition, fingerprint and registry hash."""
    text = path.read_text(encoding="utf-8")
    full = parse_registry(text, source=path.name)
    bare = parse_registry(without_metadata(text), source=path.name)
    assert full.strict
    assert not bare.strict
    assert full.hash == bare.hash
    for name, uc in full.use_cases.items():
        assert uc.metadata.missing == (), name
        old = bare[name]
        assert old.metadata == UseCaseMetadata()
        assert (uc.definition, uc.fingerprint, uc.ref) == (old.definition, old.fingerprint, old.ref)


def test_moving_the_end_date_or_the_owner_keeps_the_definition() -> None:
    """A later expires date, another owner, a review and e-mails: the same definition (a renewal, not a change)."""
    first = parse_registry(_registry(flag=OWNED), source="a.toml")
    renewed = parse_registry(
        _registry(
            flag='owner = "other@example.org"\nexpires = 2030-01-01\ndata_review = "https://example.org/r/1"\n'
            'notification_emails = ["a@example.org"]'
        ),
        source="b.toml",
    )
    assert first["flag"].definition == renewed["flag"].definition
    assert first.hash == renewed.hash
    assert renewed["flag"].metadata.expires == datetime.date(2030, 1, 1)
    assert renewed["flag"].metadata.notification_emails == ("a@example.org",)


def test_a_registry_without_metadata_parses_as_before() -> None:
    """No strict, no owner, no expires: a registry of the previous format loads, with empty metadata."""
    registry = parse_registry(_registry(), source="old.toml")
    assert not registry.strict
    assert all(uc.metadata.missing == ("owner", "expires") for uc in registry.use_cases.values())


def test_strict_refuses_naming_every_use_case_that_lacks_metadata() -> None:
    """Under strict = true the error names each use case without an owner or an end date, and what it lacks."""
    error = _error(_registry(top="strict = true", flag='owner = "team@example.org"'))
    assert error.kind == "missing-field"
    assert (error.use_case, error.field) == ("flag", "expires")
    assert "2 lack them" in str(error)
    assert "flag (no expires)" in str(error)
    assert "usage (no owner and no expires)" in str(error)
    assert parse_registry(_registry(top="strict = true", flag=OWNED, usage=OWNED), source="ok.toml").strict


@pytest.mark.parametrize(
    ("line", "field", "kind"),
    [
        ('owner = ""', "owner", "bad-value"),
        ('owner = "a\\nb"', "owner", "bad-value"),
        ("owner = 3", "owner", "bad-type"),
        ('expires = "soon"', "expires", "bad-type"),
        ("expires = 2027-06-30T00:00:00Z", "expires", "bad-type"),
        ('data_review = "ftp://example.org/r"', "data_review", "bad-value"),
        ('data_review = "see the wiki"', "data_review", "bad-value"),
        ('notification_emails = "team@example.org"', "notification_emails", "bad-type"),
        ('notification_emails = ["nobody"]', "notification_emails[0]", "bad-value"),
        ("owners = 1", "owners", "unknown-key"),
    ],
)
def test_each_bad_metadata_value_is_named(line: str, field: str, kind: str) -> None:
    """A wrong owner, date, review URL or address is refused naming the use case and the field."""
    error = _error(_registry(flag=line))
    assert (error.use_case, error.field, error.kind) == ("flag", field, kind), str(error)


def test_strict_must_be_a_boolean() -> None:
    """strict = "yes" is refused at the top level."""
    error = _error(_registry(top='strict = "yes"'))
    assert (error.use_case, error.field, error.kind) == (None, "strict", "bad-type")


def test_expiry_begins_at_midnight_utc_of_the_date() -> None:
    """Expired from 00:00 UTC on the expires date on; never without a date."""
    meta = UseCaseMetadata(owner="t", expires=datetime.date(2027, 6, 30))
    midnight = datetime.datetime(2027, 6, 30, tzinfo=datetime.UTC).timestamp()
    assert meta.expires_at == midnight
    assert not meta.expired(midnight - 0.001)
    assert meta.expired(midnight)
    assert not UseCaseMetadata().expired(1e12)


def test_warnings_name_each_use_case_lacking_metadata_and_each_expired_one() -> None:
    """One line per use case without an owner or a date, one per use case past its date; none otherwise."""
    registry = parse_registry(_registry(flag='owner = "t@example.org"\nexpires = 2027-06-30'), source="w.toml")
    now = datetime.datetime(2027, 7, 1, tzinfo=datetime.UTC).timestamp()
    lines = metadata_warnings(((n, uc.metadata) for n, uc in registry.use_cases.items()), now=now)
    assert len(lines) == 2
    assert re.search(r"'flag' expired on 2027-06-30 \(owner: t@example.org\)", lines[0])
    assert "'usage' has no owner and no expires" in lines[1]
    before = metadata_warnings(((n, uc.metadata) for n, uc in registry.use_cases.items()), now=now - 2 * 86_400)
    assert len(before) == 1


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_example_registries_are_renewed_ahead_of_their_end_date(path: Path) -> None:
    """Every use case of the shipped registries runs at least another 90 days (renew them before that:
    a later expires date keeps every definition, state and ε spent)."""
    registry = parse_registry(path.read_bytes(), source=path.name)
    soon = datetime.datetime.now(datetime.UTC).date() + datetime.timedelta(days=90)
    for name, uc in registry.use_cases.items():
        assert uc.metadata.expires is not None, (path.name, name)
        assert uc.metadata.expires > soon, (path.name, name)
