"""Value generators of the fleet simulator: what each simulated device records, per period.

The simulator needs to know the truth exactly, so every value a device records comes from
a generator here, and the simulator tallies what was actually reported. A generator yields,
for one use case and one period offset (0 = the first period of the simulation), the value
of every device at once (``None``: that device records nothing in that period). It draws
from numpy generators seeded by ``(seed, use case, period)`` and never from a device's own
random source, so the values do not depend on how the devices are split across worker
processes, and the devices' privatization coins stay independent of the data.

Kinds (``--generator USE_CASE=KIND[:key=value,...]``):

============  =====================================================  ==========================
kind          values                                                 parameters (defaults)
============  =====================================================  ==========================
constant      the same number (or string) for every device           ``value``
uniform       uniform on ``[low, high]``                             ``low`` (0), ``high``
normal        normal, clipped at 0                                   ``mean``, ``sd``
exponential   exponential                                            ``mean``
drift         slowly drifting counters: a per-device base times      ``start``, ``spread``
              ``(1 + rate) ** day`` and a small per-period noise     (start/2), ``rate``
                                                                     (0.05), ``noise`` (0.1)
bernoulli     0 or 1 (randomized-response flags)                     ``p`` (0.3)
zipf          strings of the use case's dictionary, Zipf by rank     ``s`` (1.1), ``top``
exp-strings   strings, weight ``exp(-rank / scale)``                 ``scale`` (10), ``top``
population    a user-supplied CSV (see below)                        ``path``
============  =====================================================  ==========================

A use case named ``X-olh`` draws exactly ``X``'s values (:func:`stream_name`): the demo compares
a mechanism with its optimal-local-hashing pair on the same data.

Every random kind also takes ``per=device`` (each device draws once and keeps its value,
like a setting) or ``per=period`` (a fresh draw every period, like a usage counter). String
kinds draw from ``words=FILE`` (one per line) when given, else from the use case itself: its
collector dictionary (CMS, HCMS, RAPPOR), its categories (basic RAPPOR), or a built-in word
list (SFP).

Populations (``--population [USE_CASE=]FILE``), so a user can replay their own data:

* header ``value,weight``: each device draws its value from the rows with probability
  proportional to ``weight`` (values are numbers, or strings if any is not a number);
  ``per=period`` (the default for counters) redraws every period.
* header ``device,period,value``: per-device time series. ``device`` is any label (each
  distinct label is one simulated device, in order of first appearance), ``period`` the
  period offset from the start of the simulation in the use case's periods (0, 1, ...), and
  ``value`` what that device records in that period; a missing row records nothing.
"""

from __future__ import annotations

import csv
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from protocol.interfaces import EstimateKind, Privatization, as_discovery, as_frequencies, as_histogram
from protocol.registry import UseCase

__all__ = [
    "KINDS",
    "PAIRED_SUFFIX",
    "SFP_WORDS",
    "GeneratorError",
    "GeneratorSpec",
    "Population",
    "ValueGenerator",
    "build_generator",
    "default_spec",
    "load_population",
    "parse_spec",
    "periods_in",
    "read_lines",
    "stream_name",
    "value_type",
]

KINDS = (
    "constant",
    "uniform",
    "normal",
    "exponential",
    "drift",
    "bernoulli",
    "zipf",
    "exp-strings",
    "population",
)
"""The generator kinds, as ``--generator`` names them."""

SFP_WORDS = (
    "hello",
    "world",
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "privacy",
    "sketch",
    "fragment",
    "puzzle",
    "telemetry",
    "device",
    "report",
    "collector",
    "broker",
    "estimate",
    "window",
    "keyboard",
    "emoji",
    "rapport",
    "cohort",
    "bloom",
    "filter",
    "memo",
    "rounding",
    "counter",
    "bucket",
    "histogram",
    "period",
    "shuffle",
    "noise",
    "signal",
    "vector",
    "median",
)
"""Words the SFP generator draws from when a use case has no word list (lower-case ASCII, at most 10 letters)."""

MAX_POPULATION_ROWS = 5_000_000
"""A population file with more rows is refused (the simulator holds it in memory)."""


class GeneratorError(ValueError):
    """A generator specification or population file is invalid (the message says where and why)."""


@dataclass(frozen=True)
class GeneratorSpec:
    """A parsed ``KIND[:key=value,...]`` specification.

    Attributes:
        kind: one of :data:`KINDS`.
        params: the ``key=value`` pairs, as strings.
    """

    kind: str
    params: Mapping[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        if not self.params:
            return self.kind
        return self.kind + ":" + ",".join(f"{k}={v}" for k, v in self.params.items())


def parse_spec(text: str) -> GeneratorSpec:
    """Parse ``KIND[:key=value,...]``.

    Raises:
        GeneratorError: for an unknown kind or a malformed parameter list.
    """
    kind, _, rest = text.strip().partition(":")
    kind = kind.strip()
    if kind not in KINDS:
        raise GeneratorError(f"unknown generator {kind!r}; choose one of {', '.join(KINDS)}")
    params: dict[str, str] = {}
    if rest.strip():
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or not key:
                raise GeneratorError(f"generator {kind}: parameters are key=value pairs; got {item!r}")
            if key in params:
                raise GeneratorError(f"generator {kind}: parameter {key!r} given twice")
            params[key] = value.strip()
    return GeneratorSpec(kind, params)


def value_type(use_case: UseCase) -> str:
    """What a use case records: ``"bit"`` (rr), ``"count"`` (1BitMean: integers in [0, m]),
    ``"number"`` (dBitFlip: non-negative numbers) or ``"string"`` (the hashed mechanisms)."""
    return str(use_case.mechanism.value_type.value)


def _count_high(use_case: UseCase) -> float:
    """The top of a count's range (1BitMean's ``m``)."""
    bounds = use_case.mechanism.value_range
    if bounds is None:
        raise GeneratorError(f"{use_case.name}: a count without a range")
    return bounds[1]


def default_spec(use_case: UseCase) -> GeneratorSpec:
    """A generator that suits the use case when the user names none.

    Counters drift slowly around a third of their range (1BitMean) or are exponential
    (dBitFlip histograms, mean at a fifth of the bucket range); flags are Bernoulli per
    device; dictionary strings are Zipf (one new value per period, except RAPPOR, whose
    values are per-device settings such as a homepage).
    """
    mech = use_case.mechanism
    kind = value_type(use_case)
    if kind == "bit":
        return GeneratorSpec("bernoulli", {"p": "0.3"})
    if kind == "count":
        third = max(1, int(_count_high(use_case)) // 3)
        return GeneratorSpec("drift", {"start": str(third), "spread": str(third // 2), "rate": "0.05"})
    if kind == "number":
        edges = list(as_histogram(mech).bucket_edges)
        span = float(edges[-1] - edges[0]) if math.isfinite(edges[-1]) else float(edges[-2] - edges[0])
        return GeneratorSpec("exponential", {"mean": f"{max(span / 5, 1e-9):g}"})
    if mech.privatization is Privatization.STRING:
        # Memoized strings are per-device settings (a homepage), not events.
        return GeneratorSpec("zipf", {"s": "1.2", "per": "device"})
    return GeneratorSpec("zipf", {"s": "1.1"})


def read_lines(path: Path) -> list[str]:
    """Entries of a dictionary-style file: one per line, stripped, blank lines and ``#`` comments skipped,
    duplicates removed (first kept), as the collector reads dictionaries.

    Raises:
        GeneratorError: if the file cannot be read.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise GeneratorError(f"cannot read {path}: {e}") from None
    entries = [line.strip() for line in text.splitlines()]
    return list(dict.fromkeys(e for e in entries if e and not e.startswith("#")))


# --------------------------------------------------------------------------- populations


@dataclass(frozen=True)
class Population:
    """A user-supplied population (``--population``).

    Attributes:
        path: the CSV file.
        values: ``value,weight`` rows' values (``None`` for a time series).
        weights: their probabilities, summing to 1.
        series: ``device,period,value`` rows as device index -> period offset -> value.
        devices: labels of the time series' devices, in order of first appearance.
    """

    path: Path
    values: tuple[object, ...] | None = None
    weights: npt.NDArray[np.float64] | None = None
    series: tuple[dict[int, object], ...] | None = None
    devices: tuple[str, ...] = ()

    @property
    def is_series(self) -> bool:
        """True for a ``device,period,value`` time series."""
        return self.series is not None


def _number_or_none(text: str) -> int | float | None:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _typed(raw: Sequence[str]) -> list[object]:
    # Numbers if every value is one (integers stay integers), else the strings themselves.
    numbers = [_number_or_none(v) for v in raw]
    if raw and all(n is not None for n in numbers):
        return list(numbers)
    return list(raw)


def load_population(path: Path) -> Population:
    """Read a population CSV (``value,weight`` or ``device,period,value``).

    Raises:
        GeneratorError: naming the file, the line and the problem.
    """
    try:
        fh = path.open(encoding="utf-8", newline="")
    except OSError as e:
        raise GeneratorError(f"cannot read population {path}: {e.strerror}") from None
    with fh:
        reader = csv.reader(fh)
        try:
            header = [h.strip().lower() for h in next(reader)]
        except StopIteration:
            raise GeneratorError(
                f"{path}: empty file; expected a header 'value,weight' or 'device,period,value'"
            ) from None
        except (csv.Error, UnicodeDecodeError) as e:
            raise GeneratorError(f"{path}: line 1: {e}") from None
        if header == ["value", "weight"]:
            return _weighted(path, reader)
        if header == ["device", "period", "value"]:
            return _series(path, reader)
        raise GeneratorError(
            f"{path}: line 1: the header must be 'value,weight' or 'device,period,value'; got {','.join(header)!r}"
        )


def _rows(path: Path, reader: Any, width: int) -> list[tuple[int, list[str]]]:
    rows: list[tuple[int, list[str]]] = []
    try:
        for row in reader:
            line = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != width:
                raise GeneratorError(f"{path}: line {line}: expected {width} columns, found {len(row)}")
            rows.append((line, [c.strip() for c in row]))
            if len(rows) > MAX_POPULATION_ROWS:
                raise GeneratorError(f"{path}: more than {MAX_POPULATION_ROWS} rows")
    except (csv.Error, UnicodeDecodeError) as e:
        raise GeneratorError(f"{path}: line {reader.line_num}: {e}") from None
    if not rows:
        raise GeneratorError(f"{path}: no data rows after the header")
    return rows


def _weighted(path: Path, reader: Any) -> Population:
    rows = _rows(path, reader, 2)
    weights = []
    for line, (_, w) in rows:
        x = _number_or_none(w)
        if x is None or x < 0:
            raise GeneratorError(f"{path}: line {line}: weight must be a non-negative number; got {w!r}")
        weights.append(float(x))
    total = math.fsum(weights)
    if total <= 0:
        raise GeneratorError(f"{path}: the weights sum to 0")
    values = _typed([v for _, (v, _) in rows])
    return Population(path=path, values=tuple(values), weights=np.array(weights) / total)


def _series(path: Path, reader: Any) -> Population:
    rows = _rows(path, reader, 3)
    index: dict[str, int] = {}
    series: list[dict[int, object]] = []
    raw_values: list[str] = []
    keys: list[tuple[int, int, int]] = []
    for line, (device, period, value) in rows:
        p = _number_or_none(period)
        if not isinstance(p, int) or p < 0:
            raise GeneratorError(f"{path}: line {line}: period must be a whole number >= 0 (an offset); got {period!r}")
        if not device:
            raise GeneratorError(f"{path}: line {line}: empty device label")
        d = index.setdefault(device, len(index))
        if d == len(series):
            series.append({})
        if p in series[d]:
            raise GeneratorError(f"{path}: line {line}: device {device!r} has period {p} twice")
        series[d][p] = None  # placeholder, typed below
        raw_values.append(value)
        keys.append((line, d, p))
    typed = _typed(raw_values)
    for (_, d, p), v in zip(keys, typed, strict=True):
        series[d][p] = v
    return Population(path=path, series=tuple(series), devices=tuple(index))


# --------------------------------------------------------------------------- generators


def _stable_id(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


PAIRED_SUFFIX = "-olh"
"""A use case named ``X-olh`` asks ``X``'s question with optimal local hashing (the demo's
side-by-side use cases, deploy/fleet.usecases.toml): it draws ``X``'s values, so the two
mechanisms are compared on the very same data."""


def stream_name(use_case: str) -> str:
    """The name whose value stream a use case draws: its own, or its pair's (:data:`PAIRED_SUFFIX`)."""
    return use_case.removesuffix(PAIRED_SUFFIX) or use_case


class ValueGenerator:
    """The values of every device for one use case, period by period.

    Args:
        use_case: the use case the values are recorded into.
        spec: the generator specification.
        devices: how many devices are simulated.
        seed: the simulation seed.
        strings: the strings string kinds draw from (rank order), for string use cases.
        population: the loaded population, for ``population``.

    Raises:
        GeneratorError: if the parameters do not fit the kind or the use case.
    """

    def __init__(
        self,
        use_case: UseCase,
        spec: GeneratorSpec,
        *,
        devices: int,
        seed: int,
        strings: Sequence[str] = (),
        population: Population | None = None,
    ) -> None:
        self.use_case = use_case
        self.spec = spec
        self.devices = devices
        self.seed = seed
        self.type = value_type(use_case)
        self.strings = tuple(strings)
        self.population = population
        self._params = dict(spec.params)
        self._uc_id = _stable_id(stream_name(use_case.name))
        self._period_days = use_case.period.seconds / 86_400
        self._used: set[str] = {"per"}
        mech = use_case.mechanism
        self._m = int(_count_high(use_case)) if self.type == "count" else 0
        kind = spec.kind
        # Flags and RAPPOR values are settings a device keeps; counters and events change.
        per_default = "device" if (self.type == "bit" or mech.privatization is Privatization.STRING) else "period"
        per = self._params.get("per", per_default)
        if per not in ("device", "period"):
            raise GeneratorError(f"{use_case.name}: per must be 'device' or 'period'; got {per!r}")
        self.per_device = per == "device"
        self._drift = (0.0, 0.0, 0.0, 0.0)
        self._draw = self._setup(kind)
        unknown = sorted(set(self._params) - self._used)
        if unknown:
            raise GeneratorError(f"{use_case.name}: generator {kind} takes no parameter {unknown[0]!r}")
        self._stable: list[object] | None = None
        self._base: npt.NDArray[np.float64] | None = None

    # -- parameters

    def _float(self, key: str, default: float | None = None, *, low: float | None = None) -> float:
        self._used.add(key)
        raw = self._params.get(key)
        if raw is None:
            if default is None:
                raise GeneratorError(f"{self.use_case.name}: generator {self.spec.kind} needs {key}=<number>")
            return default
        x = _number_or_none(raw)
        if x is None:
            raise GeneratorError(f"{self.use_case.name}: {key} must be a number; got {raw!r}")
        if low is not None and x < low:
            raise GeneratorError(f"{self.use_case.name}: {key} must be at least {low:g}; got {x:g}")
        return float(x)

    def _rng(self, *labels: int) -> np.random.Generator:
        return np.random.default_rng([self.seed & 0xFFFF_FFFF_FFFF_FFFF, self._uc_id, *labels])

    def _choices(self) -> tuple[str, ...]:
        self._used.add("words")
        self._used.add("top")
        words = self._params.get("words")
        choices = tuple(read_lines(Path(words))) if words else self.strings
        if "top" in self._params:
            top = int(self._float("top", low=1))
            choices = choices[:top]
        if not choices:
            raise GeneratorError(
                f"{self.use_case.name}: no strings to draw from (give the use case a dictionary or words=FILE)"
            )
        return choices

    def _setup(self, kind: str) -> Callable[[np.random.Generator, int], list[object]] | None:
        """The draw function of ``kind`` (None for drift and time series, which :meth:`values` computes)."""
        if self.type == "string" and kind in ("uniform", "normal", "exponential", "drift", "bernoulli"):
            raise GeneratorError(f"{self.use_case.name} records strings; generator {kind} makes numbers")
        if self.type != "string" and kind in ("zipf", "exp-strings"):
            raise GeneratorError(f"{self.use_case.name} records numbers; generator {kind} makes strings")
        setups: dict[str, Callable[[], Callable[[np.random.Generator, int], list[object]] | None]] = {
            "constant": self._setup_constant,
            "uniform": self._setup_uniform,
            "normal": self._setup_normal,
            "exponential": self._setup_exponential,
            "bernoulli": self._setup_bernoulli,
            "drift": self._setup_drift,
            "zipf": lambda: self._setup_strings(kind),
            "exp-strings": lambda: self._setup_strings(kind),
        }
        return setups.get(kind, self._setup_population)()

    def _setup_constant(self) -> Callable[[np.random.Generator, int], list[object]]:
        self._used.add("value")
        raw = self._params.get("value")
        if raw is None:
            raise GeneratorError(f"{self.use_case.name}: generator constant needs value=<value>")
        value: object = raw if self.type == "string" else _number_or_none(raw)
        if value is None:
            raise GeneratorError(f"{self.use_case.name}: value must be a number; got {raw!r}")
        return lambda rng, n: [self._coerce(value)] * n

    def _setup_uniform(self) -> Callable[[np.random.Generator, int], list[object]]:
        low, high = self._float("low", 0.0), self._float("high")
        if high < low:
            raise GeneratorError(f"{self.use_case.name}: uniform needs low <= high")
        return lambda rng, n: self._numbers(rng.uniform(low, high, n))

    def _setup_normal(self) -> Callable[[np.random.Generator, int], list[object]]:
        mean, sd = self._float("mean"), self._float("sd", low=0.0)
        return lambda rng, n: self._numbers(rng.normal(mean, sd, n))

    def _setup_exponential(self) -> Callable[[np.random.Generator, int], list[object]]:
        mean = self._float("mean", low=0.0)
        return lambda rng, n: self._numbers(rng.exponential(mean, n))

    def _setup_bernoulli(self) -> Callable[[np.random.Generator, int], list[object]]:
        p = self._float("p", 0.3, low=0.0)
        if p > 1:
            raise GeneratorError(f"{self.use_case.name}: p must be in [0, 1]; got {p:g}")
        return lambda rng, n: self._numbers((rng.random(n) < p).astype(np.float64))

    def _setup_drift(self) -> None:
        start = self._float("start", low=0.0)
        spread = self._float("spread", start / 2, low=0.0)
        rate = self._float("rate", 0.05, low=-1.0)
        noise = self._float("noise", 0.1, low=0.0)
        self._drift = (start, spread, rate, noise)
        if self.per_device:
            raise GeneratorError(f"{self.use_case.name}: drift changes every period (per=period)")

    def _setup_strings(self, kind: str) -> Callable[[np.random.Generator, int], list[object]]:
        choices = self._choices()
        ranks = np.arange(1, len(choices) + 1, dtype=np.float64)
        if kind == "zipf":
            weights = ranks ** -self._float("s", 1.1, low=0.0)
        else:
            weights = np.exp(-(ranks - 1) / self._float("scale", 10.0, low=1e-9))
        p = weights / weights.sum()
        return lambda rng, n: [choices[i] for i in rng.choice(len(choices), size=n, p=p)]

    def _setup_population(self) -> Callable[[np.random.Generator, int], list[object]] | None:
        self._used.add("path")
        pop = self.population
        if pop is None:
            raise GeneratorError(f"{self.use_case.name}: generator population needs a file (--population)")
        if pop.is_series:
            assert pop.series is not None
            if len(pop.series) < self.devices:
                raise GeneratorError(
                    f"{pop.path}: the time series has {len(pop.series)} devices; "
                    f"--devices {self.devices} must not exceed it"
                )
            self.per_device = False
            for row in pop.series:
                for v in row.values():
                    self._check(v, pop.path)
            return None
        assert pop.values is not None
        assert pop.weights is not None
        for v in pop.values:
            self._check(v, pop.path)
        values, probs = pop.values, pop.weights
        return lambda rng, n: [self._coerce(values[i]) for i in rng.choice(len(values), size=n, p=probs)]

    # -- values

    def _check(self, value: object, path: Path) -> None:
        if self.type == "string":
            if not isinstance(value, str):
                raise GeneratorError(f"{path}: {self.use_case.name} records strings; the population holds numbers")
            return
        if not isinstance(value, int | float) or value < 0:
            raise GeneratorError(f"{path}: {self.use_case.name} records non-negative numbers; found {value!r}")
        if self.type == "bit" and value not in (0, 1):
            raise GeneratorError(f"{path}: {self.use_case.name} (rr) records 0 or 1; found {value!r}")

    def _coerce(self, value: object) -> object:
        if self.type == "string":
            return str(value)
        x = float(value)  # type: ignore[arg-type]
        if self.type == "bit":
            return 1 if x >= 0.5 else 0
        if self.type == "count":
            # 1BitMean counts integers in [0, m] (000 §2.1).
            return int(min(max(round(x), 0), self._m))
        return max(x, 0.0) if not isinstance(value, int) else max(value, 0)

    def _numbers(self, xs: npt.NDArray[np.float64]) -> list[object]:
        return [self._coerce(float(x)) for x in xs]

    def values(self, offset: int) -> list[object | None]:
        """Every device's value in period ``offset`` of the simulation (``None``: records nothing).

        Deterministic in ``(seed, use case, offset)`` and the number of devices.
        """
        n = self.devices
        if self.spec.kind == "population" and self.population is not None and self.population.is_series:
            assert self.population.series is not None
            return [None if (v := self.population.series[d].get(offset)) is None else self._coerce(v) for d in range(n)]
        if self.spec.kind == "drift":
            start, spread, rate, noise = self._drift
            if self._base is None:
                self._base = np.maximum(self._rng(0).uniform(start - spread, start + spread, n), 0.0)
            day = offset * self._period_days
            jitter = self._rng(1, offset).normal(0.0, noise, n)
            return self._numbers(self._base * (1.0 + rate) ** day * np.maximum(1.0 + jitter, 0.0))
        assert self._draw is not None
        if self.per_device:
            if self._stable is None:
                self._stable = self._draw(self._rng(0), n)
            return list(self._stable)
        return list(self._draw(self._rng(1, offset), n))


def build_generator(
    use_case: UseCase,
    spec: GeneratorSpec,
    *,
    devices: int,
    seed: int,
    registry_dir: Path,
    population: Population | None = None,
) -> ValueGenerator:
    """A generator for ``use_case``, with its strings taken from the use case itself.

    Raises:
        GeneratorError: if the use case and the generator do not fit together.
    """
    mech = use_case.mechanism
    strings: Sequence[str] = ()
    if value_type(use_case) == "string" and "words" not in spec.params:
        if mech.kind is EstimateKind.CATEGORIES:
            strings = tuple(as_frequencies(mech).fixed_categories or ())
        elif mech.kind is EstimateKind.DISCOVERY:
            longest = as_discovery(mech).longest
            strings = tuple(w for w in SFP_WORDS if len(w) <= longest)
        elif use_case.collector.dictionary is not None:
            path = Path(use_case.collector.dictionary)
            strings = read_lines(path if path.is_absolute() else registry_dir / path)
    return ValueGenerator(use_case, spec, devices=devices, seed=seed, strings=strings, population=population)


def periods_in(use_case: UseCase, days: int) -> int:
    """How many of the use case's periods ``days`` simulated days hold."""
    return days * (86_400 // use_case.period.seconds)
