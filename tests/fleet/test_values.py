"""The fleet simulator's value generators and population files."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fleet.values import (
    GeneratorError,
    GeneratorSpec,
    Population,
    ValueGenerator,
    build_generator,
    default_spec,
    load_population,
    parse_spec,
    read_lines,
    stream_name,
)
from protocol.registry import Registry, parse_registry

ROOT = Path(__file__).resolve().parents[2]
REGISTRY_PATH = ROOT / "deploy" / "fleet.usecases.toml"


@pytest.fixture(scope="module")
def registry() -> Registry:
    """The fleet registry shipped in deploy/."""
    return parse_registry(REGISTRY_PATH.read_bytes(), source=str(REGISTRY_PATH))


def _gen(
    registry: Registry,
    name: str,
    spec: str,
    *,
    devices: int = 1000,
    seed: int = 7,
    population: Population | None = None,
) -> ValueGenerator:
    return build_generator(
        registry.use_cases[name],
        parse_spec(spec),
        devices=devices,
        seed=seed,
        registry_dir=REGISTRY_PATH.parent,
        population=population,
    )


def _numbers(values: list[object | None]) -> list[float]:
    assert all(isinstance(v, int | float) for v in values)
    return [float(v) for v in values]  # type: ignore[arg-type]


def test_parse_spec_reads_kind_and_parameters() -> None:
    """A spec is KIND[:key=value,...]; str() writes it back."""
    spec = parse_spec("normal:mean=3000, sd=100")
    assert spec == GeneratorSpec("normal", {"mean": "3000", "sd": "100"})
    assert str(spec) == "normal:mean=3000,sd=100"
    assert parse_spec("zipf").params == {}


@pytest.mark.parametrize(
    ("text", "needle"),
    [("laplace", "unknown generator"), ("normal:mean", "key=value"), ("normal:mean=1,mean=2", "twice")],
)
def test_parse_spec_rejects_malformed(text: str, needle: str) -> None:
    """Unknown kinds and malformed parameter lists are refused with a reason."""
    with pytest.raises(GeneratorError, match=needle):
        parse_spec(text)


@pytest.mark.parametrize(
    ("name", "spec", "needle"),
    [
        ("emoji", "normal:mean=1,sd=1", "records strings"),
        ("app-usage-seconds", "zipf", "records numbers"),
        ("app-usage-seconds", "normal:mean=1", "needs sd"),
        ("app-usage-seconds", "uniform:high=5,width=2", "no parameter 'width'"),
        ("dark-mode-enabled", "bernoulli:p=2", "p must be in"),
        ("app-usage-seconds", "population", "needs a file"),
        ("app-usage-seconds", "drift:start=10,per=device", "per=period"),
    ],
)
def test_generator_refuses_what_does_not_fit(registry: Registry, name: str, spec: str, needle: str) -> None:
    """A generator whose values or parameters do not fit its use case is refused before running."""
    with pytest.raises(GeneratorError, match=needle):
        _gen(registry, name, spec)


def test_default_generators_fit_every_fleet_use_case(registry: Registry) -> None:
    """Every use case of the fleet registry has a default generator whose values the mechanism takes."""
    for uc in registry.use_cases.values():
        gen = _gen(registry, uc.name, str(default_spec(uc)), devices=50)
        values = gen.values(0)
        assert len(values) == 50
        assert all(v is not None for v in values)


def test_values_are_deterministic_and_independent_of_other_periods(registry: Registry) -> None:
    """The same seed gives the same values whatever was drawn before; another seed differs."""
    a = _gen(registry, "app-usage-histogram", "exponential:mean=4000")
    b = _gen(registry, "app-usage-histogram", "exponential:mean=4000")
    c = _gen(registry, "app-usage-histogram", "exponential:mean=4000", seed=8)
    b.values(0)
    assert a.values(3) == b.values(3)
    assert a.values(3) != c.values(3)
    assert a.values(3) != a.values(4)


def test_per_device_values_stay_and_per_period_values_change(registry: Registry) -> None:
    """per=device draws once per device (a setting); per=period redraws (a usage value)."""
    flags = _gen(registry, "dark-mode-enabled", "bernoulli:p=0.4")
    assert flags.values(0) == flags.values(5)
    redrawn = _gen(registry, "dark-mode-enabled", "bernoulli:p=0.4,per=period")
    assert redrawn.values(0) != redrawn.values(5)


def test_bernoulli_share_matches_p(registry: Registry) -> None:
    """Bernoulli flags are 0/1 with share p (within 5 binomial SE)."""
    values = _gen(registry, "dark-mode-enabled", "bernoulli:p=0.3", devices=20_000).values(0)
    assert set(values) == {0, 1}
    se = math.sqrt(0.3 * 0.7 / 20_000)
    assert abs(np.mean(_numbers(values)) - 0.3) < 5 * se


def test_counts_are_clipped_integers_in_range(registry: Registry) -> None:
    """1BitMean values are integers in [0, m] whatever the generator draws."""
    values = _gen(registry, "app-usage-seconds", "normal:mean=20000,sd=8000").values(0)
    assert all(isinstance(v, int) and 0 <= v <= 21_600 for v in values)
    assert max(_numbers(values)) == 21_600
    assert min(_numbers(values)) == 0


def test_drift_moves_the_mean_slowly(registry: Registry) -> None:
    """Drifting counters grow by about (1 + rate) per day around their start."""
    gen = _gen(registry, "app-usage-seconds", "drift:start=6000,spread=2000,rate=0.1,noise=0.05", devices=5000)
    day0 = np.mean(_numbers(gen.values(0)))
    day5 = np.mean(_numbers(gen.values(20)))
    assert abs(day0 - 6000) < 150
    assert abs(day5 / day0 - 1.1**5) < 0.03


def test_zipf_ranks_dictionary_order(registry: Registry) -> None:
    """Zipf strings come from the dictionary, the first entries most often."""
    values = _gen(registry, "emoji", "zipf:s=1.2").values(0)
    words = read_lines(REGISTRY_PATH.parent / "dictionaries" / "emoji.txt")
    assert set(values) <= set(words)
    assert values.count(words[0]) > values.count(words[1]) > values.count(words[20])


def test_exp_strings_and_top(registry: Registry) -> None:
    """exp-strings with top=K only draws among the first K strings."""
    values = _gen(registry, "safari-energy-domains", "exp-strings:scale=3,top=5").values(0)
    words = read_lines(REGISTRY_PATH.parent / "dictionaries" / "web-domains.txt")
    assert set(values) <= set(words[:5])


def test_basic_rappor_draws_its_categories(registry: Registry) -> None:
    """Basic RAPPOR values are its categories."""
    values = _gen(registry, "default-browser", "zipf").values(0)
    cats = registry.use_cases["default-browser"].mechanism.categories  # type: ignore[attr-defined]
    assert set(values) <= set(cats)


def test_weighted_population_is_drawn_in_proportion(tmp_path: Path, registry: Registry) -> None:
    """A value,weight population is drawn with probability proportional to weight."""
    csv = tmp_path / "pop.csv"
    csv.write_text("value,weight\n100,1\n2000,3\n\n5000,0\n", encoding="utf-8")
    pop = load_population(csv)
    assert pop.values == (100, 2000, 5000)
    values = _gen(registry, "app-usage-seconds", "population", devices=8000, population=pop).values(0)
    share = values.count(2000) / len(values)
    assert abs(share - 0.75) < 5 * math.sqrt(0.75 * 0.25 / 8000)
    assert 5000 not in values


def test_string_population_for_a_frequency_use_case(tmp_path: Path, registry: Registry) -> None:
    """Strings in a value,weight population feed a string use case."""
    csv = tmp_path / "words.csv"
    csv.write_text("value,weight\nnews.example,2\nmaps.example,1\n", encoding="utf-8")
    values = _gen(registry, "safari-energy-domains", "population", population=load_population(csv)).values(1)
    assert set(values) == {"news.example", "maps.example"}


def test_time_series_population_replays_each_device(tmp_path: Path, registry: Registry) -> None:
    """device,period,value rows are each device's value in that period; missing rows record nothing."""
    csv = tmp_path / "series.csv"
    csv.write_text("device,period,value\nphone-a,0,10\nphone-b,0,20\nphone-a,1,30\n", encoding="utf-8")
    pop = load_population(csv)
    assert pop.devices == ("phone-a", "phone-b")
    gen = _gen(registry, "app-usage-seconds", "population", devices=2, population=pop)
    assert gen.values(0) == [10, 20]
    assert gen.values(1) == [30, None]
    assert gen.values(2) == [None, None]
    with pytest.raises(GeneratorError, match="must not exceed"):
        _gen(registry, "app-usage-seconds", "population", devices=3, population=pop)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("", "empty file"),
        ("a,b\n1,2\n", "header must be"),
        ("value,weight\n", "no data rows"),
        ("value,weight\n1,2,3\n", "line 2: expected 2 columns"),
        ("value,weight\n1,-2\n", "line 2: weight must be"),
        ("value,weight\n1,0\n", "sum to 0"),
        ("device,period,value\nd,x,1\n", "line 2: period must be"),
        ("device,period,value\nd,0,1\nd,0,2\n", "line 3: device 'd' has period 0 twice"),
    ],
)
def test_population_errors_name_the_line(tmp_path: Path, content: str, needle: str) -> None:
    """A malformed population file is refused with its name, the line and the problem."""
    csv = tmp_path / "bad.csv"
    csv.write_text(content, encoding="utf-8")
    with pytest.raises(GeneratorError, match=needle) as info:
        load_population(csv)
    assert str(csv) in str(info.value)


def test_population_values_must_fit_the_use_case(tmp_path: Path, registry: Registry) -> None:
    """Strings cannot feed a counter, nor numbers other than 0/1 a flag."""
    words = tmp_path / "w.csv"
    words.write_text("value,weight\nabc,1\n", encoding="utf-8")
    with pytest.raises(GeneratorError, match="non-negative numbers"):
        _gen(registry, "app-usage-seconds", "population", population=load_population(words))
    numbers = tmp_path / "n.csv"
    numbers.write_text("value,weight\n3,1\n", encoding="utf-8")
    with pytest.raises(GeneratorError, match="0 or 1"):
        _gen(registry, "dark-mode-enabled", "population", population=load_population(numbers))


def test_an_olh_pair_draws_its_sketchs_values() -> None:
    """emoji-olh draws exactly emoji's values (same dictionary and generator), device by device, period by period."""
    registry = parse_registry(REGISTRY_PATH.read_bytes(), source=str(REGISTRY_PATH))
    assert stream_name("emoji-olh") == "emoji"
    assert stream_name("emoji") == "emoji"
    gens = {
        name: build_generator(
            registry[name], default_spec(registry[name]), devices=50, seed=3, registry_dir=REGISTRY_PATH.parent
        )
        for name in ("emoji", "emoji-olh")
    }
    for period in range(3):
        assert gens["emoji"].values(period) == gens["emoji-olh"].values(period)
