"""The use-case registry: which use cases exist, how each is privatized, and how much it may cost.

Agent and collector load the same TOML file (docs/design.md §4). Parsing
is pure: :func:`parse_registry` takes the file's bytes and a ``source`` name for messages;
reading the file is the caller's job (``protocol/`` does no I/O). Everything is validated
once, here, and decoded into frozen objects: a :class:`Registry` of :class:`UseCase`, each
holding its constructed mechanism. Any mistake raises :class:`RegistryError` naming the
file, the use case and the field, with a machine-readable ``kind``; unknown keys are errors
(docs/design.md, convention 6), nothing falls back silently.

Schema (``docs/wire-format.md`` has the full table)::

    format = 1
    salt = "<hex, >= 16 bytes>"          # optional; public seeds of hashed use cases derive from it
    strict = true                        # optional: refuse a use case without owner and expires

    [use_cases.emoji]
    mechanism = "cms"                     # rr, one-bit-mean, dbitflip, rappor, cms, hcms, sfp,
                                          # olh, grr, oue, ss, pgr
    epsilon = 4                           # declared ε of one report (see below)
    period = "1d"                         # "6h" or "1d": the reporting slot
    daily_limit = 1                       # records per device per day (also per report)
    lifetime_epsilon = 400                # cap on the ε a device ever spends on this use case
    seed = "<hex>"                        # optional public hash seed (else derived from salt)
    description = "..."                   # optional, free text, not part of the hash
    owner = "keyboard-team@example.org"   # who answers for it (metadata, not part of any hash)
    expires = 2027-06-30                  # from 00:00 UTC that day agents record nothing more
    data_review = "https://..."           # optional: the review that approved the collection
    notification_emails = ["..."]         # optional: who is told about it
    parameters = { k = 65536, m = 1024 }  # the mechanism's constructor arguments
    [use_cases.emoji.collector]
    min_reports = 1000                    # no estimate is released from fewer reports
    release_threshold = 0                 # optional: counts below it are withheld (003 §3.2.2 T)
    dictionary = "dictionaries/emoji.txt" # optional: cms / hcms dictionary, RAPPOR candidates
    correction = "bh"                     # optional, cms/hcms/sfp/rappor: bh, bonferroni, storey or pfer
    alpha = 0.05                          # optional: its level (pfer: false positives expected)
    top_t = 400                           # optional, sfp: pieces kept per position (003 Alg. 10 T)

**Declared ε and the cost charged.** ``epsilon`` is the most one report of the use case may
cost. For the mechanisms whose ε is a single constructor parameter (``rr``,
``one-bit-mean``, ``dbitflip``, ``cms``, ``hcms``) it *is* that parameter and must not be
repeated under ``parameters``. RAPPOR has no ε parameter (its ε follows from ``f, p, q, h``,
004 Thm 1-2) and SFP has two (ε for the word sketch, ε' for the fragment sketch, 003 §4.3);
for those the parameters are given under ``parameters`` and ``epsilon`` is the declared bound.
For every mechanism the loader checks ``mechanism.epsilon_report <= epsilon``, and the cost
an accountant charges per report is ``mechanism.epsilon_report`` (:attr:`UseCase.cost`),
which can be below the declared value (output perturbation, 000 §4, or coin rounding).

**Public hash seeds.** Hashed mechanisms (``rappor``, ``cms``, ``hcms``, ``sfp``) need a
public seed of at least 16 bytes (the "public coins" of 003 §4.1 and 004 §4). A use case may
give it explicitly as ``seed = "<hex>"``; otherwise it is derived from the registry's
``salt`` and the use-case name as ``BLAKE2b-256(key=salt, person="ldp-uc-seed", name)``, so a
registry needs one random salt rather than one seed per use case. Renaming a use case
therefore changes its derived seed (and its hash functions): give an explicit seed to keep
the functions across a rename. Seeds are public; they need not be secret, only fixed.

**Metadata.** ``owner``, ``expires``, ``data_review`` and ``notification_emails`` say who
answers for a use case and until when it may collect (:mod:`protocol.metadata`). They are
outside every hash, so a registry of the previous release (without them) parses as it did, and
adding or changing them leaves every definition as it was. ``strict = true`` refuses a use
case without an ``owner`` or an ``expires`` date, naming every such use case.

The decoded objects and their hashes are :mod:`protocol.use_cases`; this module reads a file
into them and re-exports them, so callers import both from here.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Final, TypeVar

from protocol import cms, dbitflip, grr, hcms, olh, one_bit_mean, oue, pgr, randomized_response, rappor, sfp, ss
from protocol.envelope import HASH_SIZE, MAX_REPORT_BYTES
from protocol.errors import ParameterError
from protocol.interfaces import EstimateKind, Mechanism, MechanismEntry
from protocol.metadata import MAX_EMAILS, UseCaseMetadata, check_data_review, check_email, check_owner
from protocol.schema import Range, SchemaError, decode
from protocol.use_cases import (
    REF_HEX_DIGITS,
    REGISTRY_FORMAT,
    CollectorSettings,
    Period,
    Registry,
    RegistryError,
    UseCase,
    WireMechanism,
    canonical_hash,
    definition_hash,
    mechanism_fingerprint,
)

__all__ = [
    "BUILTIN_MECHANISMS",
    "CORRECTIONS",
    "HASH_SIZE",
    "MAX_REPORT_BYTES",
    "MECHANISM_NAMES",
    "REF_HEX_DIGITS",
    "REGISTRY_FORMAT",
    "CollectorSettings",
    "Period",
    "Registry",
    "RegistryError",
    "UseCase",
    "UseCaseMetadata",
    "WireMechanism",
    "definition_hash",
    "mechanism_fingerprint",
    "parse_registry",
]

_SEED_PERSON: Final = b"ldp-uc-seed"
_NAME_RE: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_MAX_DAILY_LIMIT: Final = 10_000
_EPSILON_MAX: Final = 64.0
# Float noise allowed when comparing a mechanism's computed ε with the declared one.
_EPSILON_SLACK: Final = 1e-9
_T = TypeVar("_T")


# --- mechanisms: the entries a registry is built from ----------------------------------------

BUILTIN_MECHANISMS: Final[tuple[MechanismEntry, ...]] = (
    randomized_response.ENTRY,
    one_bit_mean.ENTRY,
    dbitflip.ENTRY,
    rappor.ENTRY,
    cms.ENTRY,
    hcms.ENTRY,
    sfp.ENTRY,
    olh.ENTRY,
    grr.ENTRY,
    oue.ENTRY,
    ss.ENTRY,
    pgr.ENTRY,
)
"""The seven mechanisms of the source papers, in the order the docs list them, then the five
frequency oracles at the local-privacy limit (docs/estimation.md). A caller that needs another
(a test, an extension) passes its entry to :func:`parse_registry` beside these."""

MECHANISM_NAMES: Final = tuple(e.name for e in BUILTIN_MECHANISMS)
"""The built-in mechanism names."""

CORRECTIONS: Final = ("bonferroni", "bh", "storey", "pfer")
"""The multiple-testing corrections a frequency use case may name (``collector.decoding.stats``)."""
_TOP_T_MAX: Final = 1 << 20


# --- parsing -----------------------------------------------------------------------------

# The shapes of the file's tables, read by protocol.schema (the reader the config files
# use too): keys, types and ranges. What depends on the mechanism (its parameters, which
# collector settings apply, the seed) is checked after decoding, below.


@dataclass(frozen=True, kw_only=True)
class _CollectorTable:
    # The agent refuses a word with characters outside SFP's alphabet, so the alphabet is part
    # of what a report means: a parameter of the mechanism, under the definition hash.
    MOVED_KEYS: ClassVar[Mapping[str, str]] = MappingProxyType(
        {"alphabet": "moved to parameters.alphabet of the sfp use case (the agent checks words against it)"}
    )

    min_reports: Annotated[int, Range(0, 1 << 62)]
    release_threshold: Annotated[float, Range(0.0)] = 0.0
    dictionary: str | None = None
    correction: str | None = None
    alpha: Annotated[float, Range(0.0, low_open=True)] | None = None
    top_t: Annotated[int, Range(1, _TOP_T_MAX)] | None = None


@dataclass(frozen=True, kw_only=True)
class _UseCaseTable:
    mechanism: str
    epsilon: Annotated[float, Range(0.0, _EPSILON_MAX, low_open=True)]
    period: str
    daily_limit: Annotated[int, Range(1, _MAX_DAILY_LIMIT)]
    lifetime_epsilon: Annotated[float, Range(0.0, low_open=True)]
    parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    seed: str | None = None
    collector: _CollectorTable
    description: str = ""
    owner: str | None = None
    expires: datetime.date | None = None
    data_review: str | None = None
    notification_emails: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class _RegistryTable:
    format: Annotated[int, Range(0, 1 << 31)]
    salt: str | None = None
    strict: bool = False
    use_cases: Mapping[str, Any]


class _Errors:
    """Makes the RegistryError of one use case (or of the top level), naming source, use case and field."""

    def __init__(self, source: str, use_case: str | None, prefix: str = "") -> None:
        self.source = source
        self.use_case = use_case
        self.prefix = prefix

    def error(self, field: str, kind: str, problem: str) -> RegistryError:
        return RegistryError(
            source=self.source, use_case=self.use_case, field=self.prefix + field, kind=kind, problem=problem
        )

    def decode(self, cls: type[_T], raw: object) -> _T:
        try:
            return decode(cls, raw)
        except SchemaError as exc:
            raise self.error(exc.field, exc.kind, exc.problem) from None

    def hex_bytes(self, field: str, text: str, *, min_len: int, max_len: int) -> bytes:
        try:
            value = bytes.fromhex(text)
        except ValueError:
            raise self.error(field, "bad-value", f"expected hexadecimal digits; got {text!r}") from None
        if not min_len <= len(value) <= max_len:
            raise self.error(
                field,
                "out-of-range",
                f"must be {min_len} to {max_len} bytes ({2 * min_len}+ hex digits); got {len(value)}",
            )
        return value


def parse_registry(
    data: bytes | str,
    *,
    source: str = "<registry>",
    mechanisms: Sequence[MechanismEntry] = BUILTIN_MECHANISMS,
) -> Registry:
    """Parse and validate a registry file's contents.

    Args:
        data: the TOML text (bytes are decoded as UTF-8).
        source: the file name, used in every error message.
        mechanisms: the mechanisms a use case may name (the built-in ones by default).

    Returns:
        The frozen registry, with each use case's mechanism constructed.

    Raises:
        RegistryError: on any mistake, naming the source, the use case and the field.
    """
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RegistryError(
                source=source, use_case=None, field="", kind="syntax", problem=f"not UTF-8 text ({exc})"
            ) from None
    else:
        text = data
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(
            source=source, use_case=None, field="", kind="syntax", problem=f"invalid TOML: {exc}"
        ) from None

    entries = {e.name: e for e in mechanisms}
    top = _Errors(source, None)
    file = top.decode(_RegistryTable, doc)
    if file.format != REGISTRY_FORMAT:
        raise top.error(
            "format", "bad-value", f"this version reads registry format {REGISTRY_FORMAT}; got {file.format}"
        )
    salt = None if file.salt is None else top.hex_bytes("salt", file.salt, min_len=16, max_len=64)
    if not file.use_cases:
        raise top.error("use_cases", "missing-field", "the registry defines no use case; add a [use_cases.NAME] table")

    use_cases: dict[str, UseCase] = {}
    for name, table in file.use_cases.items():
        if not _NAME_RE.fullmatch(name):
            raise RegistryError(
                source=source,
                use_case=name,
                field="",
                kind="bad-value",
                problem="a use-case name is 1-64 of a-z, 0-9, '.', '_', '-', starting with a letter or digit",
            )
        if not isinstance(table, dict):
            raise RegistryError(
                source=source, use_case=name, field="", kind="bad-type", problem="expected a table [use_cases.NAME]"
            )
        use_cases[name] = _parse_use_case(_Errors(source, name), name, table, salt, entries)

    ordered = {name: use_cases[name] for name in sorted(use_cases)}
    for uc in ordered.values():
        _check_report_size(source, uc)
    if file.strict:
        _check_strict(source, ordered)
    return Registry(
        use_cases=MappingProxyType(ordered), hash=canonical_hash(ordered), source=source, strict=file.strict
    )


def _parse_use_case(
    r: _Errors, name: str, raw: Mapping[str, Any], salt: bytes | None, entries: Mapping[str, MechanismEntry]
) -> UseCase:
    t = r.decode(_UseCaseTable, raw)
    mech_name = t.mechanism
    spec = entries.get(mech_name)
    if spec is None:
        known = ", ".join(entries)
        raise r.error("mechanism", "unknown-mechanism", f"unknown mechanism {mech_name!r}; one of {known}")
    try:
        period = Period(t.period)
    except ValueError:
        raise r.error("period", "bad-value", f'must be "6h" or "1d"; got {t.period!r}') from None

    seed = _seed(r, spec, t, name, salt)
    mechanism = _build_mechanism(r, spec, t, name, seed)

    cost = float(mechanism.epsilon_report)
    if cost > t.epsilon + _EPSILON_SLACK:
        raise r.error(
            "epsilon",
            "epsilon-too-small",
            f"one {mech_name} report with these parameters costs ε = {cost:.6g}, more than the declared "
            f"{t.epsilon:g}; raise epsilon or change the parameters",
        )
    if t.lifetime_epsilon < cost:
        raise r.error(
            "lifetime_epsilon",
            "out-of-range",
            f"below the cost of a single report (ε = {cost:.6g}); the use case could never report",
        )

    col = _Errors(r.source, name, prefix="collector.")
    c = t.collector
    if c.dictionary is not None:
        if not spec.dictionary:
            takers = ", ".join(e.name for e in entries.values() if e.dictionary)
            raise col.error("dictionary", "unknown-key", f"{mech_name} takes no dictionary; only {takers} do")
        if not c.dictionary:
            raise col.error("dictionary", "bad-value", "an empty path; give the dictionary file or remove the key")
    correction, alpha = _correction(col, c, mech_name, tested=mechanism.kind.result == "frequencies")
    _discovery(col, c, mech_name, mechanism)

    return UseCase(
        name=name,
        mechanism=mechanism,
        epsilon=t.epsilon,
        period=period,
        daily_limit=t.daily_limit,
        lifetime_epsilon=t.lifetime_epsilon,
        seed=seed,
        collector=CollectorSettings(
            min_reports=c.min_reports,
            release_threshold=c.release_threshold,
            dictionary=c.dictionary,
            correction=correction,
            alpha=alpha,
            top_t=c.top_t,
        ),
        description=t.description,
        metadata=_metadata(r, t),
    )


def _metadata(r: _Errors, t: _UseCaseTable) -> UseCaseMetadata:
    """The use case's metadata, each value checked (:mod:`protocol.metadata`)."""
    if t.owner is not None and (problem := check_owner(t.owner)) is not None:
        raise r.error("owner", "bad-value", problem)
    if t.data_review is not None and (problem := check_data_review(t.data_review)) is not None:
        raise r.error("data_review", "bad-value", problem)
    if len(t.notification_emails) > MAX_EMAILS:
        raise r.error("notification_emails", "out-of-range", f"at most {MAX_EMAILS} addresses")
    for i, email in enumerate(t.notification_emails):
        if (problem := check_email(email)) is not None:
            raise r.error(f"notification_emails[{i}]", "bad-value", problem)
    return UseCaseMetadata(
        owner=t.owner.strip() if t.owner is not None else None,
        expires=t.expires,
        data_review=t.data_review,
        notification_emails=t.notification_emails,
    )


def _check_strict(source: str, use_cases: Mapping[str, UseCase]) -> None:
    """Under ``strict = true``, refuse a registry with a use case lacking an owner or an end date,
    naming every such use case (not only the first), so one edit fixes the file."""
    lacking = {name: uc.metadata.missing for name, uc in use_cases.items() if uc.metadata.missing}
    if not lacking:
        return
    first, fields = next(iter(lacking.items()))
    listed = "; ".join(f"{name} (no {' and no '.join(missing)})" for name, missing in lacking.items())
    raise RegistryError(
        source=source,
        use_case=first,
        field=fields[0],
        kind="missing-field",
        problem=(
            f"strict = true: every use case needs an owner and an expires date (docs/wire-format.md); "
            f"{len(lacking)} lack them: {listed}"
        ),
    )


def _seed(r: _Errors, spec: MechanismEntry, t: _UseCaseTable, name: str, salt: bytes | None) -> bytes | None:
    """The public hash seed: explicit, or derived from the registry salt and the name (None: not hashed)."""
    mech_name = t.mechanism
    if not spec.hashed:
        if t.seed is not None:
            raise r.error("seed", "unknown-key", f"{mech_name} uses no hash seed; remove the key")
        return None
    if t.seed is not None:
        return r.hex_bytes("seed", t.seed, min_len=16, max_len=64)
    if salt is not None:
        return hashlib.blake2b(name.encode(), key=salt, digest_size=32, person=_SEED_PERSON).digest()
    raise r.error(
        "seed",
        "missing-field",
        f'{mech_name} needs a public hash seed: give seed = "<hex>" or a top-level salt',
    )


def _build_mechanism(r: _Errors, spec: MechanismEntry, t: _UseCaseTable, name: str, seed: bytes | None) -> Mechanism:
    """The mechanism the use case's ``parameters`` describe; each key is checked and converted first."""
    mech_name = t.mechanism
    raw_params = t.parameters
    params = _Errors(r.source, name, prefix="parameters.")
    allowed = spec.required | spec.optional
    if spec.epsilon_parameter and "epsilon" in raw_params:
        raise params.error("epsilon", "unknown-key", f"for {mech_name} ε is the use case's `epsilon`; remove it here")
    for key in raw_params:
        if key not in allowed:
            problem = f"unknown key in the parameters of {mech_name}; allowed keys: {', '.join(sorted(allowed))}"
            raise params.error(key, "unknown-key", problem)
    for key in sorted(spec.required):
        if key not in raw_params:
            raise params.error(key, "missing-field", f"{mech_name} requires parameter {key!r}; add it")

    # Any: the constructor's keyword arguments, each converted by its entry's converter above.
    kwargs: dict[str, Any] = {}
    for key, value in raw_params.items():
        convert = spec.converters.get(key)
        if convert is None:
            kwargs[key] = value
            continue
        try:
            kwargs[key] = convert(value)
        except ParameterError as exc:
            sub = key if exc.name == key else f"{key}.{exc.name}"
            raise params.error(sub, "bad-parameter", f"{mech_name}: {exc}") from None
    if spec.epsilon_parameter:
        kwargs["epsilon"] = t.epsilon
    if seed is not None:
        kwargs["seed"] = seed
    try:
        mechanism = spec.build(**kwargs)
    except ParameterError as exc:
        raise params.error(exc.name, "bad-parameter", f"{mech_name}: {exc}") from None
    except (ValueError, TypeError) as exc:
        raise params.error("", "bad-parameter", f"{mech_name} rejects its parameters: {exc}") from None
    return mechanism


def _check_report_size(source: str, uc: UseCase) -> None:
    """Refuse a use case whose largest report the pipe cannot carry (:data:`MAX_REPORT_BYTES`).

    Such a report would be acknowledged by the broker and then refused by the collector as
    ``oversize``, after the device had charged its ε; refusing it here names the fix.
    """
    size = uc.max_report_bytes
    if size <= MAX_REPORT_BYTES:
        return
    fits = next(
        (
            n
            for n in range(uc.daily_limit - 1, 0, -1)
            if dataclasses.replace(uc, daily_limit=n).max_report_bytes <= MAX_REPORT_BYTES
        ),
        0,
    )
    fix = f"lower daily_limit to at most {fits:,}" if fits else "choose smaller parameters"
    raise RegistryError(
        source=source,
        use_case=uc.name,
        field="daily_limit",
        kind="out-of-range",
        problem=(
            f"a report of {uc.daily_limit:,} records takes up to {size:,} bytes, over the "
            f"{MAX_REPORT_BYTES:,}-byte cap on a report; {fix}"
        ),
    )


def _correction(col: _Errors, c: _CollectorTable, mech_name: str, *, tested: bool) -> tuple[str, float]:
    """The release test's ``correction`` and ``alpha`` (defaults: Benjamini-Hochberg at 0.05).

    Every frequency output (a dictionary, categories, candidates or discovered strings) is
    released entry by entry under a test, so every mechanism of those kinds takes them.
    """
    default = CollectorSettings(min_reports=0)
    for key, value in (("correction", c.correction), ("alpha", c.alpha)):
        if value is not None and not tested:
            raise col.error(
                key,
                "unknown-key",
                f"{mech_name} releases no counted entries; only frequency mechanisms (such as cms, hcms, sfp "
                f"and rappor) take {key}",
            )
    correction = default.correction if c.correction is None else c.correction
    if correction not in CORRECTIONS:
        raise col.error("correction", "bad-value", f"expected one of {', '.join(CORRECTIONS)}; got {correction!r}")
    if c.alpha is None:
        return correction, default.alpha
    if correction != "pfer" and c.alpha > 1.0:
        raise col.error("alpha", "out-of-range", f"must be a finite number > 0 and <= 1; got {c.alpha!r}")
    if correction != "pfer" and c.alpha >= 1.0:
        raise col.error("alpha", "out-of-range", f"must lie in (0, 1) for {correction}; got {c.alpha!r}")
    return correction, c.alpha


def _discovery(col: _Errors, c: _CollectorTable, mech_name: str, mechanism: Mechanism) -> None:
    """Check a discovery mechanism's ``top_t`` (``None``: the collector's planner chooses it).

    Its alphabet is a parameter of the mechanism (``parameters.alphabet``), checked by it.
    """
    if c.top_t is not None and mechanism.kind is not EstimateKind.DISCOVERY:
        raise col.error(
            "top_t", "unknown-key", f"{mech_name} discovers no strings; only discovery mechanisms (sfp) take top_t"
        )
