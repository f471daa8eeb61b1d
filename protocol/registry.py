"""The use-case registry: which use cases exist, how each is privatized, and how much it may cost.

Agent and collector load the same TOML file (DESIGN "Wire format and registry"). Parsing
is pure: :func:`parse_registry` takes the file's bytes and a ``source`` name for messages;
reading the file is the caller's job (``protocol/`` does no I/O). Everything is validated
once, here, and decoded into frozen objects: a :class:`Registry` of :class:`UseCase`, each
holding its constructed mechanism. Any mistake raises :class:`RegistryError` naming the
file, the use case and the field, with a machine-readable ``kind``; unknown keys are errors
(STYLE rule 15), nothing falls back silently.

Schema (``docs/wire-format.md`` has the full table)::

    format = 1
    salt = "<hex, >= 16 bytes>"          # optional; public seeds of hashed use cases derive from it

    [use_cases.emoji]
    mechanism = "cms"                     # rr, one-bit-mean, dbitflip, rappor, cms, hcms, sfp
    epsilon = 4                           # declared ε of one report (see below)
    period = "1d"                         # "6h" or "1d": the reporting slot
    daily_limit = 1                       # records per device per day (also per report)
    lifetime_epsilon = 400                # cap on the ε a device ever spends on this use case
    seed = "<hex>"                        # optional public hash seed (else derived from salt)
    description = "..."                   # optional, free text, not part of the hash
    parameters = { k = 65536, m = 1024 }  # the mechanism's constructor arguments
    [use_cases.emoji.collector]
    min_reports = 1000                    # no estimate is released from fewer reports
    release_threshold = 0                 # optional: counts below it are withheld (003 §3.2.2 T)
    dictionary = "dictionaries/emoji.txt" # optional: cms / hcms dictionary, RAPPOR candidates
    correction = "bh"                     # optional, cms/hcms/sfp/rappor: bh, bonferroni, storey or pfer
    alpha = 0.05                          # optional: its level (pfer: false positives expected)
    alphabet = "abcdefghijklmnopqrstuvwxyz' "  # optional, sfp: characters words are assembled from
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

**Canonical hash.** :attr:`Registry.hash` (16 bytes) is the first half of SHA-256 over a
canonical msgpack encoding of the *constructed* objects: for each use case, its name, the
mechanism's name and every dataclass field of the mechanism (so defaults written out or left
implicit, ``4`` or ``4.0``, key order, comments and formatting do not matter), the resolved
seed, period, limits and collector settings. Descriptions are excluded. Any change that
affects what a report means or how it is handled changes the hash. Reports of wire format 1
carry it; the collector still reads them for the registry files it is given.

**Definition hash.** Each use case is versioned on its own: :attr:`UseCase.definition` (16
bytes, :func:`definition_hash`) covers exactly what changes what one of its reports means:
its name, the mechanism's registry name and constructor parameters (the public seed
included), the declared ε, the period, the daily limit and the lifetime cap. It leaves out
the collector settings (a dictionary, a threshold or a correction changes what the collector
releases, not what a report says), the description, the registry's other use cases and the
names of the Python classes that implement them. Reports of wire format 2 carry it, so adding,
changing or retiring one use case never touches the reports of the others
(``docs/deploy.md``, "Changing the registry on a running fleet").
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Final, TypeVar

import msgpack

from protocol import cms, dbitflip, hcms, one_bit_mean, randomized_response, rappor, sfp
from protocol.envelope import HASH_SIZE, MAX_REPORT_BYTES, largest_report_size
from protocol.errors import LdpError, ParameterError
from protocol.interfaces import EstimateKind, Mechanism, MechanismEntry
from protocol.schema import Range, SchemaError, decode

if TYPE_CHECKING:
    from protocol.server.contract import ServerMechanism

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
    "WireMechanism",
    "definition_hash",
    "mechanism_fingerprint",
    "parse_registry",
]

REGISTRY_FORMAT: Final = 1
"""The registry file format this module reads (top-level ``format = 1``)."""


REF_HEX_DIGITS: Final = 8
"""Hex digits of the definition hash in a definition's name (:attr:`UseCase.ref`)."""

_HASH_DOMAIN: Final = b"ldp-telemetry/registry/v1\x00"
_DEFINITION_DOMAIN: Final = b"ldp-telemetry/use-case-definition/v1\x00"
_SEED_PERSON: Final = b"ldp-uc-seed"
_NAME_RE: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_MAX_DAILY_LIMIT: Final = 10_000
_EPSILON_MAX: Final = 64.0
# Float noise allowed when comparing a mechanism's computed ε with the declared one.
_EPSILON_SLACK: Final = 1e-9
_T = TypeVar("_T")


class RegistryError(LdpError, ValueError):
    """The registry file is invalid. A configuration mistake: fix the file.

    Attributes:
        source: the file (or other source name) being loaded.
        use_case: the use case at fault, or ``None`` for a top-level problem.
        field: the dotted path of the field at fault (``"parameters.m"``), or ``""``.
        kind: machine-readable: ``syntax``, ``missing-field``, ``unknown-key``, ``bad-type``,
            ``out-of-range``, ``bad-value``, ``unknown-mechanism``, ``bad-parameter``,
            ``epsilon-too-small``.
        problem: what was expected and what was found.
    """

    def __init__(self, *, source: str, use_case: str | None, field: str, kind: str, problem: str) -> None:
        self.source = source
        self.use_case = use_case
        self.field = field
        self.kind = kind
        self.problem = problem
        where = source
        if use_case is not None:
            where += f": use case {use_case!r}"
        if field:
            where += f": field {field!r}"
        super().__init__(f"{where}: {problem}")


WireMechanism = Mechanism
"""The mechanism contract (:class:`protocol.interfaces.Mechanism`), under its former name here."""


class Period(enum.Enum):
    """The reporting slot of a use case. Reports carry the slot index, never a finer time."""

    SIX_HOURS = "6h"
    DAY = "1d"

    @property
    def seconds(self) -> int:
        """Length of one slot in seconds."""
        return _PERIOD_SECONDS[self.value]

    @property
    def max_index(self) -> int:
        """Largest plausible slot index: slots starting before 2**33 s after the epoch (year 2242)."""
        return _PERIOD_MAX_INDEX[self.value]

    def index_at(self, unix_seconds: float) -> int:
        """The slot number containing ``unix_seconds`` (slots are aligned to the Unix epoch, UTC)."""
        if not math.isfinite(unix_seconds) or unix_seconds < 0:
            raise ValueError(f"a time in seconds since the epoch, >= 0; got {unix_seconds!r}")
        return int(unix_seconds // self.seconds)


_PERIOD_SECONDS: Final = MappingProxyType({"6h": 21_600, "1d": 86_400})
_PERIOD_MAX_INDEX: Final = MappingProxyType({k: (1 << 33) // v for k, v in _PERIOD_SECONDS.items()})


@dataclass(frozen=True, kw_only=True)
class CollectorSettings:
    """Collector-side settings of a use case.

    Attributes:
        min_reports: no estimate is released for a period with fewer reports.
        release_threshold: estimated counts below it are withheld (the threshold T of 003 §3.2.2);
            0 releases everything.
        dictionary: path of the dictionary (CMS, HCMS) or candidate strings (RAPPOR), one per line,
            relative to the registry file's directory; ``None`` if none is configured.
        correction: the multiple-testing correction of the release test of every frequency
            output (CMS, HCMS, SFP, RAPPOR; ``collector.decoding.release``): each entry is tested
            one-sided against ``release_threshold`` and the correction runs over all entries
            tested (004 §4 names Bonferroni and Benjamini-Hochberg; ``collector.decoding.stats``
            has all four). The default, Benjamini-Hochberg at 0.05, bounds the expected share of
            released entries whose true count is below the threshold by 5 % at any number of
            reports (DESIGN invariant 9).
        alpha: its level: the family-wise error (``bonferroni``), the false-discovery rate
            (``bh``, ``storey``), both in (0, 1); the expected number of false positives
            (``pfer``), any positive number.
        alphabet: SFP only: the characters discovered words are assembled from (the space
            pads short words); ``None``: the collector's default.
        top_t: SFP only: ``T``, the (puzzle piece, fragment) pairs kept per position in
            discovery (003 Alg. 10 step 10); ``None``: derived by the collector's planner.
    """

    min_reports: int
    release_threshold: float = 0.0
    dictionary: str | None = None
    correction: str = "bh"
    alpha: float = 0.05
    alphabet: str | None = None
    top_t: int | None = None


@dataclass(frozen=True, kw_only=True)
class UseCase:
    """One use case: its mechanism (constructed and validated), limits and collector settings.

    Attributes:
        name: the use case's name, as it travels in reports.
        mechanism: the frozen mechanism object.
        epsilon: the declared ε of one report (``>= mechanism.epsilon_report``).
        period: the reporting slot.
        daily_limit: most records a device sends per day; also the most one report may carry.
        lifetime_epsilon: cap on the ε a device ever spends on this use case.
        seed: the public hash seed, for hashed mechanisms; ``None`` otherwise.
        collector: collector-side settings.
        description: free text for people (not part of the registry hash).
    """

    name: str
    mechanism: Mechanism
    epsilon: float
    period: Period
    daily_limit: int
    lifetime_epsilon: float
    seed: bytes | None
    collector: CollectorSettings
    description: str = ""

    @property
    def fingerprint(self) -> bytes:
        """:func:`mechanism_fingerprint` of this use case's mechanism."""
        return mechanism_fingerprint(self.mechanism)

    @functools.cached_property
    def server(self) -> ServerMechanism:
        """The server half of this use case's mechanism (:mod:`protocol.server`; numpy), built
        when a server first asks for it: a device never does."""
        from protocol.server.contract import server_of  # noqa: PLC0415 - the server half, only where it runs

        return server_of(self.mechanism)

    @functools.cached_property
    def definition(self) -> bytes:
        """The 16-byte hash of this use case's definition (:func:`definition_hash`), carried in
        every report made under it (wire format 2)."""
        return definition_hash(self)

    @property
    def ref(self) -> str:
        """``name@<first 8 hex digits of the definition>``: how people, the API and the store
        name one definition of a use case (``emoji@3f2a9c1b``)."""
        return f"{self.name}@{self.definition.hex()[:REF_HEX_DIGITS]}"

    @property
    def cost(self) -> float:
        """The ε an accountant charges for one report: the mechanism's exact ``epsilon_report``."""
        return float(self.mechanism.epsilon_report)

    @functools.cached_property
    def max_report_bytes(self) -> int:
        """Bytes of this use case's largest encoded report: ``daily_limit`` records, each at
        its largest, under the largest period index (``protocol.envelope.largest_report_size``)."""
        return largest_report_size(
            use_case=self.name,
            max_period=self.period.max_index,
            daily_limit=self.daily_limit,
            max_record_bytes=self.mechanism.max_record_bytes,
        )


@dataclass(frozen=True, eq=False)
class Registry:
    """A loaded registry. Compare registries by :attr:`hash`.

    Attributes:
        use_cases: the use cases by name (read-only).
        hash: the 16-byte canonical hash that every report carries.
        source: where the registry was loaded from (for messages).
    """

    use_cases: Mapping[str, UseCase]
    hash: bytes
    source: str = "<registry>"

    @property
    def hash_hex(self) -> str:
        """The canonical hash in hex, for logs and the CLI."""
        return self.hash.hex()

    def __getitem__(self, name: str) -> UseCase:
        return self.use_cases[name]

    def __contains__(self, name: object) -> bool:
        return name in self.use_cases


# --- mechanisms: the entries a registry is built from ----------------------------------------

BUILTIN_MECHANISMS: Final[tuple[MechanismEntry, ...]] = (
    randomized_response.ENTRY,
    one_bit_mean.ENTRY,
    dbitflip.ENTRY,
    rappor.ENTRY,
    cms.ENTRY,
    hcms.ENTRY,
    sfp.ENTRY,
)
"""The seven mechanisms of the source papers, in the order the docs list them. A caller that
needs another (a test, an extension) passes its entry to :func:`parse_registry` beside these."""

MECHANISM_NAMES: Final = tuple(e.name for e in BUILTIN_MECHANISMS)
"""The built-in mechanism names."""

CORRECTIONS: Final = ("bonferroni", "bh", "storey", "pfer")
"""The multiple-testing corrections a frequency use case may name (``collector.decoding.stats``)."""
_TOP_T_MAX: Final = 1 << 20
_FRAGMENT_CANDIDATES_MAX: Final = 1 << 24
"""Most (puzzle piece, fragment) pairs per position an alphabet may give (``protocol.sfp``)."""


# --- parsing -----------------------------------------------------------------------------

# The shapes of the file's tables, read by protocol.schema (the reader the config files
# use too): keys, types and ranges. What depends on the mechanism (its parameters, which
# collector settings apply, the seed) is checked after decoding, below.


@dataclass(frozen=True, kw_only=True)
class _CollectorTable:
    min_reports: Annotated[int, Range(0, 1 << 62)]
    release_threshold: Annotated[float, Range(0.0)] = 0.0
    dictionary: str | None = None
    correction: str | None = None
    alpha: Annotated[float, Range(0.0, low_open=True)] | None = None
    alphabet: str | None = None
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


@dataclass(frozen=True, kw_only=True)
class _RegistryTable:
    format: Annotated[int, Range(0, 1 << 31)]
    salt: str | None = None
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
    return Registry(use_cases=MappingProxyType(ordered), hash=_canonical_hash(ordered), source=source)


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
            alphabet=c.alphabet,
            top_t=c.top_t,
        ),
        description=t.description,
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
    """Check a discovery mechanism's ``alphabet`` and ``top_t`` (``None``: the collector's defaults)."""
    for key, value in (("alphabet", c.alphabet), ("top_t", c.top_t)):
        if value is not None and mechanism.kind is not EstimateKind.DISCOVERY:
            raise col.error(
                key, "unknown-key", f"{mech_name} discovers no strings; only discovery mechanisms (sfp) take {key}"
            )
    if c.alphabet is not None:
        symbols = len(set(c.alphabet))
        if not c.alphabet.strip(" "):
            raise col.error("alphabet", "bad-value", "give the characters words are made of (and the space)")
        # SFP's fragment candidates per position (003 Alg. 10 step 8): 256 pieces x |alphabet|^l.
        fragment_length = mechanism.fragment_length if isinstance(mechanism, sfp.SequenceFragmentPuzzle) else 1
        pairs = sfp.PUZZLE_PIECES * symbols**fragment_length
        if pairs > _FRAGMENT_CANDIDATES_MAX:
            raise col.error(
                "alphabet",
                "out-of-range",
                f"{symbols} characters give {pairs} fragment candidates per position, more than "
                f"{_FRAGMENT_CANDIDATES_MAX}; use fewer characters or a shorter fragment_length",
            )


# --- canonical hash ------------------------------------------------------------------------


def _canonical(value: object) -> object:  # noqa: PLR0911  one case per kind of value a registry holds
    """A plain, order-independent form of a parsed value for hashing."""
    if value is None or isinstance(value, bool | str | bytes):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        # 4 and 4.0 mean the same; -0.0 and 0.0 too.
        return int(value) if value.is_integer() else value
    if type(value).__module__ == "numpy":
        # A numpy scalar or array (never in built-in parameters; an extension may hold one):
        # its Python value, without importing numpy here.
        return _canonical(value.tolist())  # type: ignore[attr-defined]
    if isinstance(value, enum.Enum):
        return _canonical(value.value)
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _canonical(value[k]) for k in sorted(value, key=str)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"type": type(value).__name__, "fields": dict(sorted(fields.items()))}
    raise TypeError(f"registry hash: cannot canonicalise a {type(value).__name__}")


def mechanism_fingerprint(mechanism: Mechanism) -> bytes:
    """16 bytes that identify a mechanism's parameters (name, every field, the seed).

    Canonical like the registry hash (``4`` and ``4.0`` agree). The agent stores it next to
    permanent state and the collector next to aggregates: when a registry changes the
    parameters, state drawn or folded under the old ones is never reused.
    """
    doc = {"name": mechanism.name, "mechanism": _canonical(mechanism)}
    encoded = msgpack.packb(doc, use_bin_type=True)
    return hashlib.sha256(b"ldp-telemetry/mechanism/v1\x00" + encoded).digest()[:HASH_SIZE]


def _definition_canonical(value: object) -> object:
    """:func:`_canonical`, but with no Python class name in it: a dataclass (a mechanism or its
    buckets) is its constructor fields, and its ``kind`` where it declares one, so renaming or
    splitting a class leaves every definition hash as it was."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _definition_canonical(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        kind = getattr(type(value), "kind", None)
        doc: dict[str, object] = {"fields": dict(sorted(fields.items()))}
        if isinstance(kind, str):
            doc["kind"] = kind
        return doc
    if isinstance(value, list | tuple):
        return [_definition_canonical(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _definition_canonical(value[k]) for k in sorted(value, key=str)}
    return _canonical(value)


def definition_hash(use_case: UseCase) -> bytes:
    """The 16-byte hash of one use case's definition (the module docstring says what it covers).

    The first half of SHA-256 over a domain tag and the canonical msgpack encoding of the
    name, the mechanism's registry name, its constructor parameters, ε, period, daily limit
    and lifetime cap (``4`` and ``4.0`` agree; key order and formatting do not matter).
    """
    doc = {
        "name": use_case.name,
        "mechanism": use_case.mechanism.name,
        "parameters": _definition_canonical(use_case.mechanism),
        "epsilon": _canonical(use_case.epsilon),
        "period": use_case.period.value,
        "daily_limit": use_case.daily_limit,
        "lifetime_epsilon": _canonical(use_case.lifetime_epsilon),
    }
    encoded = msgpack.packb(doc, use_bin_type=True)
    return hashlib.sha256(_DEFINITION_DOMAIN + encoded).digest()[:HASH_SIZE]


def _canonical_hash(use_cases: Mapping[str, UseCase]) -> bytes:
    doc = {
        "format": REGISTRY_FORMAT,
        "use_cases": {
            name: {
                "mechanism": _canonical(uc.mechanism),
                "mechanism_name": uc.mechanism.name,
                "epsilon": _canonical(uc.epsilon),
                "period": uc.period.value,
                "daily_limit": uc.daily_limit,
                "lifetime_epsilon": _canonical(uc.lifetime_epsilon),
                "seed": uc.seed,
                "collector": _canonical(uc.collector),
            }
            for name, uc in sorted(use_cases.items())
        },
    }
    encoded = msgpack.packb(doc, use_bin_type=True)
    return hashlib.sha256(_HASH_DOMAIN + encoded).digest()[:HASH_SIZE]
