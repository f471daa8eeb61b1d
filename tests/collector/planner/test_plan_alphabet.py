"""``ldp-collector plan use-case`` for an SFP use case: the alphabet's size enters the plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from collector.planner import main, plan

REGISTRY = """
format = 1
salt = "00112233445566778899aabbccddeeff"
{use_cases}
"""

USE_CASE = """
[use_cases.{name}]
mechanism = "sfp"
epsilon = 8
period = "1d"
daily_limit = 2
lifetime_epsilon = 6_000
parameters = {{ epsilon = 2, epsilon_fragment = 6, m = 1024, k = 2048, m_fragment = 1024, k_fragment = 2048{extra} }}
[use_cases.{name}.collector]
min_reports = 10_000
release_threshold = 1_000
"""

ALPHABETS = {
    "english": "",
    "spanish": ', alphabet = "abcdefghijklmnopqrstuvwxyzáéíóúüñ\' "',
    "cjk": ', alphabet = "{}"'.format("".join(chr(0x4E00 + i) for i in range(200)) + " "),
}


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    path = tmp_path / "usecases.toml"
    cases = "".join(USE_CASE.format(name=name, extra=extra) for name, extra in ALPHABETS.items())
    path.write_text(REGISTRY.format(use_cases=cases), encoding="utf-8")
    return path


def _plan(registry: Path, name: str, n: str = "1e6") -> dict[str, Any]:
    return plan(["use-case", "--registry", str(registry), name, "--n", n])


def test_the_default_alphabet_plans_as_plan_sfp_does(registry: Path) -> None:
    """With the default alphabet (28 characters) the use case's plan is ``plan sfp``'s at its defaults."""
    mine = _plan(registry, "english")
    raw = plan(["sfp", "--n", "1e6", "--release-threshold", "1000", "--alpha", "0.05"])
    assert mine["alphabet_size"] == 28
    for key in ("fragment_pairs_per_position", "smallest_word_found", "top_t"):
        assert mine[key] == pytest.approx(raw[key]), key


def test_a_larger_alphabet_needs_more_reports_to_find_a_word(registry: Path) -> None:
    """More characters, more null fragment pairs to beat: the fragments' floor rises with the alphabet."""
    plans = {name: _plan(registry, name) for name in ALPHABETS}
    assert [plans[n]["alphabet_size"] for n in ALPHABETS] == [28, 35, 201]
    pairs = [plans[n]["fragment_pairs_per_position"] for n in ALPHABETS]
    assert pairs == [256 * 28**2, 256 * 35**2, 256 * 201**2]
    floors = [plans[n]["smallest_word_found_by_its_fragments"] for n in ALPHABETS]
    assert floors[0] < floors[1] < floors[2]
    # The word sketch does not see the alphabet.
    assert len({plans[n]["standard_error"] for n in ALPHABETS}) == 1


def test_plan_use_case_prints_the_alphabet(registry: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The text plan names the alphabet's size and the fragment pairs it gives."""
    assert main(["use-case", "--registry", str(registry), "spanish", "--n", "1e6"]) == 0
    out = capsys.readouterr().out
    assert "alphabet size: 35" in out
    assert "fragment pairs per position: 313600" in out


def test_plan_sfp_takes_the_alphabet_itself() -> None:
    """``plan sfp --alphabet`` counts the characters; the plan is that of ``--alphabet-size`` with the count."""
    spanish = "abcdefghijklmnopqrstuvwxyzáéíóúüñ' "
    by_text = plan(["sfp", "--n", "1e6", "--alphabet", spanish])
    by_size = plan(["sfp", "--n", "1e6", "--alphabet-size", "35"])
    assert by_text["alphabet_size"] == 35
    assert by_text == by_size
    assert plan(["sfp", "--n", "1e6"])["alphabet_size"] == 28
