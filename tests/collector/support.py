"""Shared helpers of the collector tests: a small registry and report generators."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from collector.numbers import format_number
from collector.results import to_json
from protocol.randomness import SeededRandom
from protocol.registry import Registry, parse_registry
from protocol.wire import Report, decode_report, encode_report, make_report

# One small use case per mechanism whose module is present. Dictionaries live next to the file.
REGISTRY_TEXT = """
format = 1
salt = "3f9a6c21d4e87b05a1c3e5f7092b4d6f8a1c3e5f7092b4d6f8a1c3e5f7092b4d"

[use_cases.flag]
mechanism = "rr"
epsilon = 1.0
period = "1d"
daily_limit = 1
lifetime_epsilon = 400
[use_cases.flag.collector]
min_reports = 20

[use_cases.usage]
mechanism = "one-bit-mean"
epsilon = 1
period = "6h"
daily_limit = 80
lifetime_epsilon = 50_000
parameters = { m = 3_600 }
[use_cases.usage.collector]
min_reports = 20

[use_cases.hist]
mechanism = "dbitflip"
epsilon = 2
period = "1d"
daily_limit = 4
lifetime_epsilon = 1_000
[use_cases.hist.parameters]
d = 3
buckets = { kind = "linear", low = 0, high = 100, count = 8 }
[use_cases.hist.collector]
min_reports = 20

[use_cases.home]
mechanism = "rappor"
epsilon = 4
period = "1d"
daily_limit = 1
lifetime_epsilon = 400
parameters = { k = 32, h = 2, cohorts = 4, f = 0.25, p = 0.25, q = 0.75 }
[use_cases.home.collector]
min_reports = 20
dictionary = "homepages.txt"

[use_cases.domains]
mechanism = "hcms"
epsilon = 4
period = "1d"
daily_limit = 2
lifetime_epsilon = 3_000
parameters = { k = 16, m = 64 }
[use_cases.domains.collector]
min_reports = 20
release_threshold = 10
dictionary = "domains.txt"

[use_cases.emoji]
mechanism = "cms"
epsilon = 4
period = "1d"
daily_limit = 1
lifetime_epsilon = 1_500
parameters = { k = 16, m = 64 }
[use_cases.emoji.collector]
min_reports = 20
release_threshold = 5
dictionary = "emoji.txt"

[use_cases.words]
mechanism = "sfp"
epsilon = 12
period = "1d"
daily_limit = 2
lifetime_epsilon = 6_000
[use_cases.words.parameters]
epsilon = 6
epsilon_fragment = 6
m = 256
k = 16
m_fragment = 256
k_fragment = 16
length = 6
[use_cases.words.collector]
min_reports = 20
release_threshold = 50
"""

DOMAINS = [f"site{i}.example" for i in range(40)]
EMOJI = ["smile", "heart", "tears-of-joy", "thumbs-up", "fire", "sparkles", "pray", "rofl"]
WORDS = ["bae", "yeet", "vibe", "stan", "rizz", "slay"]
HOMEPAGES = [f"home{i}.example" for i in range(12)]


def write_registry(directory: Path, text: str = REGISTRY_TEXT) -> Path:
    """Write the registry and its dictionaries into ``directory``; return the registry path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "domains.txt").write_text("\n".join(DOMAINS) + "\n", encoding="utf-8")
    (directory / "homepages.txt").write_text("\n".join(HOMEPAGES) + "\n", encoding="utf-8")
    (directory / "emoji.txt").write_text("\n".join(EMOJI) + "\n", encoding="utf-8")
    path = directory / "registry.toml"
    path.write_text(text, encoding="utf-8")
    return path


def load_registry(path: Path) -> Registry:
    """Parse a registry file."""
    return parse_registry(path.read_bytes(), source=str(path))


def current_period(registry: Registry, use_case: str, now: float | None = None) -> int:
    """The period index of ``use_case`` at ``now`` (default: the real clock)."""
    return registry.use_cases[use_case].period.index_at(time.time() if now is None else now)


# A device's true value, per use case of the test registry.
_VALUES: dict[str, Callable[[np.random.Generator], Any]] = {
    "flag": lambda rng: int(rng.random() < 0.3),
    "usage": lambda rng: int(rng.integers(0, 3_601)),
    "hist": lambda rng: float(rng.integers(0, 100)),
    "home": lambda rng: HOMEPAGES[int(rng.zipf(1.5)) % len(HOMEPAGES)],
    "domains": lambda rng: DOMAINS[int(rng.zipf(1.3)) % len(DOMAINS)],
    "emoji": lambda rng: EMOJI[int(rng.zipf(1.4)) % len(EMOJI)],
    "words": lambda rng: WORDS[int(rng.zipf(1.6)) % len(WORDS)],
}


def _value(use_case: str, i: int, rng: np.random.Generator) -> Any:
    return _VALUES[use_case](rng)  # KeyError for a use case it has no values for


def privatized_reports(
    registry: Registry, use_case: str, count: int, *, period: int, seed: int, records: int = 1
) -> list[Report]:
    """``count`` reports of ``records`` privatized records each, from ``count`` fresh devices."""
    uc = registry.use_cases[use_case]
    mech: Any = uc.mechanism
    rng = SeededRandom(seed)
    values = np.random.default_rng(seed)
    out = []
    for i in range(count):
        state = mech.setup(rng)
        recs = []
        for _ in range(records):
            record, state = mech.privatize(_value(use_case, i, values), state, rng)
            recs.append(record)
        out.append(make_report(uc, registry, period=period, records=recs, rng=rng))
    return out


def bit_reports(
    registry: Registry, use_case: str, count: int, *, period: int, seed: int, records: int = 1
) -> Iterator[bytes]:
    """Encoded reports of random bits for a one-bit mechanism (rr, one-bit-mean), fast.

    The bits are what such a device sends (each record is one privatized bit); generating
    them directly keeps streams of 10^5 reports cheap.
    """
    uc = registry.use_cases[use_case]
    gen = np.random.default_rng(seed)
    bits = gen.integers(0, 2, size=(count, records), dtype=np.uint8).tolist()
    ids = gen.bytes(16 * count)
    for i in range(count):
        yield encode_report(
            Report(
                use_case=uc.name,
                definition=uc.definition,
                period=period,
                report_id=ids[16 * i : 16 * i + 16],
                records=bits[i],
            )
        )


def reference_aggregates(registry: Registry, payloads: Sequence[bytes]) -> dict[tuple[str, int], Any]:
    """The in-process reference: every payload decoded and folded, keyed by (definition ref, period)."""
    out: dict[tuple[str, int], Any] = {}
    for payload in payloads:
        report = decode_report(payload, registry)
        key = (report.use_case.ref, report.period)
        if key not in out:
            out[key] = report.use_case.server.new_aggregate()
        out[key].add(report.batch)
    return out


def plain(result: object) -> Any:
    """A typed result as the API's JSON reads it back (what a script or the dashboard sees)."""
    return json.loads(to_json(result))


def plain_equal(a: Any, b: Any) -> bool:
    """Whether two aggregates hold exactly the same sums."""
    result: bool = a.to_plain() == b.to_plain()
    return result


def run_async(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test function in a fresh event loop (the suite has no async plugin)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


def shown_row(item: dict[str, Any]) -> list[str]:
    """A released entry's row as the dashboard shows it (value, count, SE, CI, p-value): the
    count and the spread of its conditional interval, or near the cutoff the interval alone
    (docs/estimation.md, "What is shown")."""
    near = item.get("near_cutoff", False)
    spread = item.get("selection_standard_error", item["standard_error"])
    return [
        item["value"],
        "near cutoff" if near else format_number(item["count"]),
        "" if near else format_number(spread),
        f"{format_number(item['ci'][0])} … {format_number(item['ci'][1])}",
        format_number(item["p_value"], 2),
    ]
