"""The use-case registry: the example loads, every mistake gets its own message, the hash is canonical."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.registry import (
    CORRECTIONS,
    HASH_SIZE,
    MAX_REPORT_BYTES,
    MECHANISM_NAMES,
    Period,
    Registry,
    RegistryError,
    parse_registry,
)
from protocol.sfp import DEFAULT_ALPHABET

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "usecases.example.toml"
SOURCE = "/etc/ldp/usecases.toml"
SALT = "00112233445566778899aabbccddeeff"

BASE = f"""
format = 1
salt = "{SALT}"

[use_cases.flag]
mechanism = "rr"
epsilon = 1.0
period = "1d"
daily_limit = 1
lifetime_epsilon = 100
[use_cases.flag.collector]
min_reports = 10

[use_cases.usage]
mechanism = "one-bit-mean"
epsilon = 1
period = "6h"
daily_limit = 4
lifetime_epsilon = 100
parameters = {{ m = 21600, gamma = 0.2 }}
[use_cases.usage.collector]
min_reports = 10

[use_cases.homepage]
mechanism = "rappor"
epsilon = 0.54
period = "1d"
daily_limit = 1
lifetime_epsilon = 100
parameters = {{ k = 128, h = 2, cohorts = 32, f = 0.75, p = 0.5, q = 0.75 }}
[use_cases.homepage.collector]
min_reports = 10
dictionary = "candidates.txt"
"""


def load(text: str = BASE) -> Registry:
    """Parse a registry text as if it were the file SOURCE."""
    return parse_registry(text, source=SOURCE)


def error(text: str) -> RegistryError:
    """The RegistryError that loading ``text`` raises."""
    with pytest.raises(RegistryError) as info:
        load(text)
    return info.value


def expect(text: str, *, kind: str, use_case: str | None, field: str) -> RegistryError:
    """Loading fails with this kind, naming the file, the use case and the field."""
    err = error(text)
    assert (err.kind, err.use_case, err.field) == (kind, use_case, field), err
    message = str(err)
    assert SOURCE in message
    if use_case is not None:
        assert repr(use_case) in message
    if field:
        assert repr(field) in message
    return err


def drop_key(use_case: str, key: str, text: str = BASE) -> str:
    """``text`` without the line ``key = ...`` of the use case's own table."""
    head = f"[use_cases.{use_case}]\n"
    start = text.index(head) + len(head)
    end = text.index("\n[", start)
    block = text[start:end].split("\n")
    lines = [ln for ln in block if not ln.startswith(f"{key} =")]
    assert len(lines) == len(block) - 1, key
    return text[:start] + "\n".join(lines) + text[end:]


def replace(old: str, new: str, text: str = BASE) -> str:
    """``text`` with exactly one occurrence of ``old`` replaced."""
    assert text.count(old) == 1, old
    return text.replace(old, new)


# --- loading ------------------------------------------------------------------------------------


def test_example_registry_loads_with_the_papers_parameters() -> None:
    """deploy/usecases.example.toml loads: one use case per mechanism with the deployed parameters."""
    reg = parse_registry(EXAMPLE.read_bytes(), source=str(EXAMPLE))
    by_mech = {uc.mechanism.name: uc for uc in reg.use_cases.values()}
    assert set(by_mech) == set(MECHANISM_NAMES)
    m = {name: uc.mechanism for name, uc in by_mech.items()}
    one_bit = m["one-bit-mean"]
    assert (one_bit.epsilon, one_bit.m, one_bit.gamma) == (1.0, 21_600, 0.2)  # type: ignore[attr-defined]
    assert by_mech["one-bit-mean"].period is Period.SIX_HOURS
    assert (m["dbitflip"].k, m["dbitflip"].d) == (32, 4)  # type: ignore[attr-defined]
    assert (m["cms"].epsilon, m["cms"].k, m["cms"].m) == (4.0, 65_536, 1_024)  # type: ignore[attr-defined]
    assert (m["hcms"].epsilon, m["hcms"].k, m["hcms"].m) == (4.0, 1_024, 32_768)  # type: ignore[attr-defined]
    sfp = m["sfp"]
    assert (sfp.epsilon, sfp.epsilon_fragment) == (2.0, 6.0)  # type: ignore[attr-defined]
    assert (sfp.k, sfp.m, sfp.k_fragment, sfp.m_fragment) == (2_048, 1_024, 2_048, 1_024)  # type: ignore[attr-defined]
    rappor = m["rappor"]
    assert (rappor.k, rappor.h, rappor.cohorts) == (128, 2, 32)  # type: ignore[attr-defined]
    assert (rappor.f, rappor.p, rappor.q) == (0.75, 0.5, 0.75)  # type: ignore[attr-defined]
    assert math.isclose(by_mech["rappor"].cost, 0.5343, abs_tol=1e-4)  # 004 §5.4
    for uc in reg.use_cases.values():
        assert uc.cost <= uc.epsilon + 1e-9
        assert uc.lifetime_epsilon >= uc.cost
    assert len(reg.hash) == HASH_SIZE


def test_base_registry_loads_into_frozen_objects() -> None:
    """A registry decodes into frozen, typed objects with the constructed mechanism."""
    reg = load()
    assert sorted(reg.use_cases) == ["flag", "homepage", "usage"]
    flag = reg["flag"]
    assert flag.mechanism.name == "rr"
    assert flag.period is Period.DAY
    assert flag.seed is None
    assert flag.collector.min_reports == 10
    assert flag.collector.release_threshold == 0.0
    assert reg["homepage"].collector.dictionary == "candidates.txt"
    with pytest.raises(dataclasses.FrozenInstanceError):
        flag.epsilon = 2.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        reg.use_cases["x"] = flag  # type: ignore[index]
    assert "flag" in reg
    assert "nope" not in reg


def test_cost_is_the_mechanisms_exact_epsilon() -> None:
    """The cost charged per report is mechanism.epsilon_report, never above the declared ε."""
    reg = load()
    for uc in reg.use_cases.values():
        assert uc.cost == uc.mechanism.epsilon_report
        assert uc.cost <= uc.epsilon + 1e-9
    # 1BitMean with output perturbation costs less than its ε (000 §4).
    assert reg["usage"].cost < reg["usage"].epsilon


def test_period_slots() -> None:
    """Slot indices count whole 6-hour or daily slots since the epoch; nothing finer."""
    assert Period.SIX_HOURS.seconds == 21_600
    assert Period.DAY.seconds == 86_400
    assert Period.SIX_HOURS.index_at(0) == 0
    assert Period.SIX_HOURS.index_at(21_599.9) == 0
    assert Period.SIX_HOURS.index_at(21_600) == 1
    assert Period.DAY.index_at(1_700_000_000) == 19_675
    assert Period.DAY.max_index == 2**33 // 86_400
    with pytest.raises(ValueError, match="epoch"):
        Period.DAY.index_at(-1)
    with pytest.raises(ValueError, match="epoch"):
        Period.DAY.index_at(math.nan)


# --- each kind of mistake -------------------------------------------------------------------------


def test_invalid_toml_names_the_file() -> None:
    """A TOML syntax error is reported as such, with the file name and TOML's position."""
    err = expect(BASE + "\n[use_cases.flag\n", kind="syntax", use_case=None, field="")
    assert "line" in str(err)
    with pytest.raises(RegistryError, match="UTF-8"):
        parse_registry(b"format = 1\n\xff\n", source=SOURCE)


def test_duplicate_use_case_is_a_syntax_error() -> None:
    """Defining a use case twice is refused (TOML forbids redefining a table)."""
    expect(BASE + '\n[use_cases.flag]\nmechanism = "rr"\n', kind="syntax", use_case=None, field="")


def test_unknown_mechanism() -> None:
    """A mechanism name outside the list gets its own message listing the valid ones."""
    err = expect(
        replace('mechanism = "rr"', 'mechanism = "laplace"'),
        kind="unknown-mechanism",
        use_case="flag",
        field="mechanism",
    )
    assert "one-bit-mean" in str(err)


@pytest.mark.parametrize("field", ["mechanism", "epsilon", "period", "daily_limit", "lifetime_epsilon"])
def test_missing_field(field: str) -> None:
    """A missing required field is named."""
    err = expect(drop_key("flag", field), kind="missing-field", use_case="flag", field=field)
    assert "missing" in str(err)


def test_missing_collector_and_parameters() -> None:
    """The collector table, its min_reports and a mechanism's required parameters are required."""
    expect(
        replace("[use_cases.flag.collector]\nmin_reports = 10\n", ""),
        kind="missing-field",
        use_case="flag",
        field="collector",
    )
    expect(
        replace("[use_cases.flag.collector]\nmin_reports = 10\n", "[use_cases.flag.collector]\n"),
        kind="missing-field",
        use_case="flag",
        field="collector.min_reports",
    )
    expect(replace("m = 21600, gamma", "gamma"), kind="missing-field", use_case="usage", field="parameters.m")


@pytest.mark.parametrize("bad", ["0", "0.0", "-1", "-0.5", "nan", "inf", "65"])
def test_epsilon_must_be_positive_and_finite(bad: str) -> None:
    """ε <= 0, non-finite or above 64 is out of range, with its own message."""
    err = expect(
        replace("epsilon = 1.0\n", f"epsilon = {bad}\n"), kind="out-of-range", use_case="flag", field="epsilon"
    )
    assert "expected a number in (0, 64]" in str(err)


@pytest.mark.parametrize(
    ("old", "new", "use_case", "field"),
    [
        ("epsilon = 1.0\n", 'epsilon = "1"\n', "flag", "epsilon"),
        ("epsilon = 1.0\n", "epsilon = true\n", "flag", "epsilon"),
        ('period = "6h"', "period = 6", "usage", "period"),
        ("daily_limit = 4\n", "daily_limit = 4.0\n", "usage", "daily_limit"),
        ("daily_limit = 4\n", "daily_limit = true\n", "usage", "daily_limit"),
        ('mechanism = "rr"', "mechanism = 1", "flag", "mechanism"),
        ("parameters = { m = 21600, gamma = 0.2 }", "parameters = [1, 2]", "usage", "parameters"),
        ('dictionary = "candidates.txt"', "dictionary = 3", "homepage", "collector.dictionary"),
        (
            "[use_cases.flag.collector]\nmin_reports = 10",
            "[use_cases.flag.collector]\nmin_reports = 1.5",
            "flag",
            "collector.min_reports",
        ),
    ],
)
def test_wrong_type(old: str, new: str, use_case: str, field: str) -> None:
    """A value of the wrong TOML type names the expected type and what was found."""
    err = expect(replace(old, new), kind="bad-type", use_case=use_case, field=field)
    assert "expected" in str(err)


def test_wrong_type_top_level() -> None:
    """Top-level and use-case tables of the wrong type are refused."""
    expect(replace("format = 1", 'format = "1"'), kind="bad-type", use_case=None, field="format")
    err = error("format = 1\n[use_cases]\nflag = 3\n")
    assert (err.kind, err.use_case) == ("bad-type", "flag")


@pytest.mark.parametrize(
    ("old", "new", "use_case", "field"),
    [
        ("epsilon = 1.0\n", "epsilon = 1.0\nepsilom = 1.0\n", "flag", "epsilom"),
        ("gamma = 0.2 }", "gamma = 0.2, alpha = 3 }", "usage", "parameters.alpha"),
        (
            "[use_cases.flag.collector]\nmin_reports = 10",
            "[use_cases.flag.collector]\nmin_reports = 10\nthreshold = 5",
            "flag",
            "collector.threshold",
        ),
        ("gamma = 0.2 }", "gamma = 0.2, epsilon = 1.0 }", "usage", "parameters.epsilon"),
        ("epsilon = 1.0\n", f'epsilon = 1.0\nseed = "{SALT}"\n', "flag", "seed"),
        (
            "[use_cases.flag.collector]\nmin_reports = 10",
            '[use_cases.flag.collector]\nmin_reports = 10\ndictionary = "d.txt"',
            "flag",
            "collector.dictionary",
        ),
    ],
)
def test_unknown_key(old: str, new: str, use_case: str, field: str) -> None:
    """Unknown keys are errors at every level: use case, parameters, collector, seed where unused."""
    expect(replace(old, new), kind="unknown-key", use_case=use_case, field=field)


def test_unknown_top_level_key() -> None:
    """An unknown top-level key is refused and the allowed keys are listed."""
    err = expect(replace("format = 1", "format = 1\nversion = 2"), kind="unknown-key", use_case=None, field="version")
    assert "salt" in str(err)


@pytest.mark.parametrize(
    ("old", "new", "use_case", "field"),
    [
        ("m = 21600, gamma = 0.2", "m = 0, gamma = 0.2", "usage", "parameters.m"),
        ("m = 21600, gamma = 0.2", "m = 21600, gamma = 0.7", "usage", "parameters.gamma"),
        ("p = 0.5, q = 0.75", "p = 0.75, q = 0.5", "homepage", "parameters.q"),
    ],
)
def test_bad_parameter_from_the_mechanism(old: str, new: str, use_case: str, field: str) -> None:
    """The mechanism's own ParameterError becomes a registry error naming the parameter and its range."""
    err = expect(replace(old, new), kind="bad-parameter", use_case=use_case, field=field)
    assert "must be" in str(err)


def test_declared_epsilon_below_the_mechanisms_cost() -> None:
    """RAPPOR's ε follows from f, p, q, h: declaring less than that is its own error."""
    err = expect(
        replace("epsilon = 0.54", "epsilon = 0.5"), kind="epsilon-too-small", use_case="homepage", field="epsilon"
    )
    assert "0.534" in str(err)


def test_other_value_errors() -> None:
    """Bad period, format, name, seed, limits and lifetime cap each say what is allowed."""
    expect(replace('period = "6h"', 'period = "12h"'), kind="bad-value", use_case="usage", field="period")
    expect(replace("format = 1", "format = 2"), kind="bad-value", use_case=None, field="format")
    expect(replace("format = 1", "# no format"), kind="missing-field", use_case=None, field="format")
    expect(replace("daily_limit = 4", "daily_limit = 0"), kind="out-of-range", use_case="usage", field="daily_limit")
    expect(
        replace("[use_cases.flag]", "[use_cases.Flag]").replace("use_cases.flag.", "use_cases.Flag."),
        kind="bad-value",
        use_case="Flag",
        field="",
    )
    expect(replace(f'salt = "{SALT}"', 'salt = "zz"'), kind="bad-value", use_case=None, field="salt")
    expect(replace(f'salt = "{SALT}"', 'salt = "0011"'), kind="out-of-range", use_case=None, field="salt")
    low_cap = replace("lifetime_epsilon = 100\nparameters = { m", "lifetime_epsilon = 0.1\nparameters = { m")
    expect(low_cap, kind="out-of-range", use_case="usage", field="lifetime_epsilon")
    expect("format = 1\n[use_cases]\n", kind="missing-field", use_case=None, field="use_cases")
    expect(
        replace('dictionary = "candidates.txt"', 'dictionary = ""'),
        kind="bad-value",
        use_case="homepage",
        field="collector.dictionary",
    )


def test_hashed_mechanism_needs_a_seed() -> None:
    """Without a salt, a hashed use case must give its seed explicitly; a short seed is refused."""
    no_salt = replace(f'salt = "{SALT}"\n', "")
    expect(no_salt, kind="missing-field", use_case="homepage", field="seed")
    with_seed = replace("epsilon = 0.54\n", f'epsilon = 0.54\nseed = "{"ab" * 16}"\n', no_salt)
    assert load(with_seed)["homepage"].seed == bytes.fromhex("ab" * 16)
    short = replace("epsilon = 0.54\n", 'epsilon = 0.54\nseed = "abcd"\n', no_salt)
    expect(short, kind="out-of-range", use_case="homepage", field="seed")


# --- seeds -------------------------------------------------------------------------------------


def test_derived_seed_is_the_documented_function_of_salt_and_name() -> None:
    """seed = BLAKE2b-256(key=salt, person='ldp-uc-seed', name); an explicit seed overrides it."""
    reg = load()
    want = hashlib.blake2b(b"homepage", key=bytes.fromhex(SALT), digest_size=32, person=b"ldp-uc-seed").digest()
    assert reg["homepage"].seed == want
    assert reg["homepage"].mechanism.seed == want  # type: ignore[attr-defined]
    renamed = load(BASE.replace("use_cases.homepage", "use_cases.homepage2"))
    assert renamed["homepage2"].seed != want
    explicit = load(replace("epsilon = 0.54\n", f'epsilon = 0.54\nseed = "{want.hex()}"\n'))
    assert explicit["homepage"].seed == want
    assert explicit.hash == reg.hash  # the same seed, given explicitly, is the same registry


# --- the canonical hash ----------------------------------------------------------------------------


def test_hash_ignores_formatting_comments_order_and_spelling() -> None:
    """Comments, whitespace, key and table order, 4 vs 4.0, inline vs sub-tables, written-out defaults."""
    h = load().hash
    variants = [
        "# a comment\n" + BASE.replace("\n", "   # trailing\n").replace("# trailing\n", "\n", 1),
        BASE.replace("epsilon = 1.0\n", "epsilon = 1\n"),
        BASE.replace("lifetime_epsilon = 100\n", "lifetime_epsilon = 100.0\n"),
        BASE.replace("parameters = { m = 21600, gamma = 0.2 }", "parameters = { gamma = 0.2, m = 21_600 }"),
        BASE.replace("parameters = { m = 21600, gamma = 0.2 }", "[use_cases.usage.parameters]\nm = 21600\ngamma = 0.2"),
        BASE.replace("h = 2,", 'h = 2, variant = "standard",'),
        BASE.replace('mechanism = "rr"\n', 'mechanism = "rr"\ndescription = "a flag"\n'),
        BASE.replace(
            "min_reports = 10\n\n[use_cases.usage]", "min_reports = 10\nrelease_threshold = 0\n\n[use_cases.usage]"
        ),
    ]
    blocks = BASE.split("\n[use_cases.")
    variants.append(blocks[0] + "".join("\n[use_cases." + b for b in blocks[1:][::-1]))
    for text in variants:
        assert load(text).hash == h, text


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("epsilon = 1.0", "epsilon = 1.5"),
        ("gamma = 0.2", "gamma = 0.25"),
        ('period = "6h"', 'period = "1d"'),
        ("daily_limit = 4", "daily_limit = 5"),
        ("lifetime_epsilon = 100\nparameters = { m", "lifetime_epsilon = 101\nparameters = { m"),
        ('dictionary = "candidates.txt"', 'dictionary = "other.txt"'),
        ('dictionary = "candidates.txt"', 'dictionary = "candidates.txt"\nrelease_threshold = 5'),
        (f'salt = "{SALT}"', f'salt = "{SALT[::-1]}"'),
        ("[use_cases.flag]", "[use_cases.flag2]"),
        ("cohorts = 32", "cohorts = 16"),
    ],
)
def test_hash_changes_with_any_semantic_change(old: str, new: str) -> None:
    """Changing a parameter, ε, period, limit, collector setting, seed or name changes the hash."""
    text = replace(old, new)
    if old == "[use_cases.flag]":
        text = text.replace("[use_cases.flag.collector]", "[use_cases.flag2.collector]")
    assert load(text).hash != load().hash


@settings(max_examples=30, deadline=None)
@given(st.permutations(["flag", "usage", "homepage"]), st.booleans())
def test_hash_is_independent_of_use_case_order(order: list[str], spaced: bool) -> None:
    """Any order of the use-case tables (and blank-line layout) gives the same hash."""
    head, *blocks = BASE.split("\n[use_cases.")
    sep = "\n\n\n[use_cases." if spaced else "\n[use_cases."
    groups: dict[str, str] = {}
    for b in blocks:  # a use case's own table and its sub-tables stay together
        name = b.split("]", 1)[0].split(".", 1)[0]
        groups[name] = groups.get(name, "") + sep + b
    text = head + "".join(groups[name] for name in order)
    assert load(text).hash == load().hash


HISTOGRAM = """
format = 1
[use_cases.hist]
mechanism = "dbitflip"
epsilon = 1
period = "6h"
daily_limit = 4
lifetime_epsilon = 100
[use_cases.hist.parameters]
d = 4
buckets = { kind = "linear", low = 0, high = 21_600, count = 32 }
[use_cases.hist.collector]
min_reports = 0
"""


def test_buckets_table_becomes_a_bucketing_object() -> None:
    """dBitFlip's buckets are a TOML table; its mistakes name the sub-field."""
    reg = load(HISTOGRAM)
    assert reg["hist"].mechanism.k == 32  # type: ignore[attr-defined]
    expect(
        HISTOGRAM.replace("count = 32", "count = 0"),
        kind="bad-parameter",
        use_case="hist",
        field="parameters.buckets.count",
    )
    expect(
        HISTOGRAM.replace('kind = "linear"', 'kind = "log"'),
        kind="bad-parameter",
        use_case="hist",
        field="parameters.buckets.kind",
    )
    expect(HISTOGRAM.replace("d = 4", "d = 33"), kind="bad-parameter", use_case="hist", field="parameters.d")


def test_rappor_correction_defaults_and_choices() -> None:
    """The release test defaults to Benjamini-Hochberg at 0.05 (the FDR bound); pfer takes a count above 1."""
    settings = load().use_cases["homepage"].collector
    assert (settings.correction, settings.alpha) == ("bh", 0.05)
    text = replace('dictionary = "candidates.txt"', 'dictionary = "candidates.txt"\ncorrection = "pfer"\nalpha = 3')
    settings = load(text).use_cases["homepage"].collector
    assert (settings.correction, settings.alpha) == ("pfer", 3.0)
    bonferroni = load(
        replace('dictionary = "candidates.txt"', 'dictionary = "candidates.txt"\ncorrection = "bonferroni"')
    )
    assert bonferroni.use_cases["homepage"].collector.correction == "bonferroni"
    assert bonferroni.hash != load().hash


@pytest.mark.parametrize(
    ("extra", "kind", "field", "message"),
    [
        ('correction = "holm"', "bad-value", "collector.correction", "bonferroni, bh, storey, pfer"),
        ("correction = 1", "bad-type", "collector.correction", "expected"),
        ("alpha = 1.5", "out-of-range", "collector.alpha", "<= 1"),
        ("alpha = 1", "out-of-range", "collector.alpha", "(0, 1) for bh"),
        ('correction = "bonferroni"\nalpha = 0', "out-of-range", "collector.alpha", "> 0"),
        ('correction = "pfer"\nalpha = -2', "out-of-range", "collector.alpha", "> 0"),
    ],
)
def test_rappor_correction_errors(extra: str, kind: str, field: str, message: str) -> None:
    """A bad correction or level names the use case and the field."""
    text = replace('dictionary = "candidates.txt"', f'dictionary = "candidates.txt"\n{extra}')
    err = expect(text, kind=kind, use_case="homepage", field=field)
    assert message in str(err)


SKETCHES = (
    BASE
    + """
[use_cases.emoji]
mechanism = "cms"
epsilon = 4
period = "1d"
daily_limit = 1
lifetime_epsilon = 100
parameters = { k = 16, m = 64 }
[use_cases.emoji.collector]
min_reports = 10
dictionary = "emoji.txt"

[use_cases.domains]
mechanism = "hcms"
epsilon = 4
period = "1d"
daily_limit = 1
lifetime_epsilon = 100
parameters = { k = 16, m = 64 }
[use_cases.domains.collector]
min_reports = 10
dictionary = "domains.txt"

[use_cases.words]
mechanism = "sfp"
epsilon = 8
period = "1d"
daily_limit = 1
lifetime_epsilon = 100
parameters = { epsilon = 2, epsilon_fragment = 6, k = 16, m = 64, k_fragment = 16, m_fragment = 64 }
[use_cases.words.collector]
min_reports = 10
"""
)


@pytest.mark.parametrize("use_case", ["emoji", "domains", "words"])
def test_every_frequency_mechanism_takes_a_correction(use_case: str) -> None:
    """cms, hcms and sfp take correction and alpha like RAPPOR; the default is BH at 0.05; they change the hash."""
    head = f"[use_cases.{use_case}.collector]\nmin_reports = 10"
    assert load(SKETCHES).use_cases[use_case].collector.correction == "bh"
    text = replace(head, f'{head}\ncorrection = "storey"\nalpha = 0.1', SKETCHES)
    settings = load(text).use_cases[use_case].collector
    assert (settings.correction, settings.alpha) == ("storey", 0.1)
    assert load(text).hash != load(SKETCHES).hash
    pfer = load(replace(head, f'{head}\ncorrection = "pfer"\nalpha = 4', SKETCHES)).use_cases[use_case].collector
    assert (pfer.correction, pfer.alpha) == ("pfer", 4.0)


@pytest.mark.parametrize(
    ("use_case", "extra", "kind", "field"),
    [
        ("emoji", 'correction = "holm"', "bad-value", "collector.correction"),
        ("domains", "alpha = 1", "out-of-range", "collector.alpha"),
        ("words", "alpha = -0.1", "out-of-range", "collector.alpha"),
        ("words", 'correction = "fdr"', "bad-value", "collector.correction"),
        ("words", "top_t = 0", "out-of-range", "collector.top_t"),
        ("words", 'top_t = "many"', "bad-type", "collector.top_t"),
        ("words", 'alphabet = "abc "', "unknown-key", "collector.alphabet"),
        ("emoji", 'alphabet = "abc "', "unknown-key", "collector.alphabet"),
        ("domains", "top_t = 10", "unknown-key", "collector.top_t"),
    ],
)
def test_frequency_setting_errors_name_the_field(use_case: str, extra: str, kind: str, field: str) -> None:
    """A bad release or discovery setting of cms, hcms or sfp names the file, the use case and the field."""
    head = f"[use_cases.{use_case}.collector]\nmin_reports = 10"
    expect(replace(head, f"{head}\n{extra}", SKETCHES), kind=kind, use_case=use_case, field=field)


WORDS_PARAMETERS = "parameters = { epsilon = 2, epsilon_fragment = 6, k = 16, m = 64, k_fragment = 16, m_fragment = 64"


def test_sfp_alphabet_and_top_t() -> None:
    """SFP takes its alphabet (a parameter) and T per use case; an alphabet too large for the
    fragment candidates is refused."""
    head = "[use_cases.words.collector]\nmin_reports = 10"
    words = load(SKETCHES).use_cases["words"]
    assert (words.mechanism.alphabet, words.collector.top_t) == (DEFAULT_ALPHABET, None)  # type: ignore[attr-defined]
    text = replace(head, f"{head}\ntop_t = 300", SKETCHES)
    text = replace(WORDS_PARAMETERS, f'{WORDS_PARAMETERS}, alphabet = "abc\' "', text)
    words = load(text).use_cases["words"]
    assert (words.mechanism.alphabet, words.collector.top_t) == ("abc' ", 300)  # type: ignore[attr-defined]
    huge = "".join(chr(0x4E00 + i) for i in range(300))
    err = expect(
        replace(WORDS_PARAMETERS, f'{WORDS_PARAMETERS}, alphabet = "{huge} "', SKETCHES),
        kind="bad-parameter",
        use_case="words",
        field="parameters.alphabet",
    )
    assert "fragment candidates" in str(err)


@pytest.mark.parametrize(
    ("alphabet", "problem"),
    [
        ('""', "the characters words are made of"),
        ("5", "the characters words are made of"),
        ('"abc"', "holds the space"),
        ('"abc\u212b "', "U+212B ANGSTROM SIGN"),
    ],
)
def test_sfp_alphabet_errors_name_the_parameter(alphabet: str, problem: str) -> None:
    """An empty alphabet, one without the padding space, or a character NFC rewrites is refused."""
    text = replace(WORDS_PARAMETERS, f"{WORDS_PARAMETERS}, alphabet = {alphabet}", SKETCHES)
    err = expect(text, kind="bad-parameter", use_case="words", field="parameters.alphabet")
    assert problem in str(err)


@pytest.mark.parametrize("key", ['correction = "bh"', "alpha = 0.1"])
def test_correction_only_for_frequency_mechanisms(key: str) -> None:
    """Only frequency outputs are tested entry by entry: the keys are refused for a proportion."""
    text = replace(
        "[use_cases.flag.collector]\nmin_reports = 10", f"[use_cases.flag.collector]\nmin_reports = 10\n{key}"
    )
    err = expect(text, kind="unknown-key", use_case="flag", field="collector." + key.split(" ", maxsplit=1)[0])
    assert "only frequency mechanisms" in str(err)


def test_corrections_are_the_decoders() -> None:
    """The registry accepts exactly the corrections the collector's decoder implements."""
    from collector.decoding.stats import CONTROLS  # noqa: PLC0415

    assert CORRECTIONS == CONTROLS


# --- size caps -----------------------------------------------------------------------------------


def test_a_use_case_whose_largest_report_exceeds_the_cap_is_refused() -> None:
    """emoji (CMS, m = 1,024) at daily_limit 600 makes 80,464-byte reports: refused, naming figure and fix."""
    text = EXAMPLE.read_text(encoding="utf-8")
    emoji = text.index("[use_cases.emoji]")
    at = text.index("daily_limit = 1\n", emoji)
    big = text[:at] + "daily_limit = 600\n" + text[at + len("daily_limit = 1\n") :]
    with pytest.raises(RegistryError) as info:
        parse_registry(big, source=str(EXAMPLE))
    err = info.value
    assert (err.use_case, err.field, err.kind) == ("emoji", "daily_limit", "out-of-range")
    assert "80,464 bytes" in str(err)
    assert f"{MAX_REPORT_BYTES:,}-byte cap" in str(err)
    assert "at most 488" in str(err)
    fits = text[:at] + "daily_limit = 488\n" + text[at + len("daily_limit = 1\n") :]
    assert parse_registry(fits, source=str(EXAMPLE))["emoji"].max_report_bytes <= MAX_REPORT_BYTES


def test_example_registry_fits_the_cap_with_room() -> None:
    """Every shipped use case's largest report is far below the cap the collector and broker enforce."""
    reg = parse_registry(EXAMPLE.read_bytes(), source=str(EXAMPLE))
    assert max(uc.max_report_bytes for uc in reg.use_cases.values()) < MAX_REPORT_BYTES // 16
