"""SFP words the collector can never discover are refused at ``record``: nothing stored, no ε spent.

A word is checked against its use case's alphabet (``parameters.alphabet``) after NFC, so the
message names the characters and the alphabet, and "é" typed two ways is one word
(protocol/sfp.py, "Encoding" and "Alphabet"; docs/wire-format.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.cli import main
from agent.core import Agent
from agent.errors import ValueRefusedError
from agent.sealed import Sealer
from protocol.randomness import SeededRandom
from protocol.registry import Registry, parse_registry
from protocol.sfp import SequenceFragmentPuzzle
from runtime.exit_status import ExitStatus
from tests.agent.conftest import KEY, REGISTRY
from tests.support.clocks import FakeClock

DAY = 86_400.0

SFP_USE_CASES = """
[use_cases.new-words]
mechanism = "sfp"
epsilon = 8
period = "1d"
daily_limit = 2
lifetime_epsilon = 100
parameters = { epsilon = 2, epsilon_fragment = 6, k = 16, m = 64, k_fragment = 16, m_fragment = 64 }
[use_cases.new-words.collector]
min_reports = 1

[use_cases.palabras]
mechanism = "sfp"
epsilon = 8
period = "1d"
daily_limit = 4
lifetime_epsilon = 100
[use_cases.palabras.parameters]
epsilon = 2
epsilon_fragment = 6
k = 16
m = 64
k_fragment = 16
m_fragment = 64
alphabet = "abcdefghijklmnopqrstuvwxyzñßãé' "
[use_cases.palabras.collector]
min_reports = 1
"""
"""``new-words`` keeps the default alphabet (a-z, apostrophe, space); ``palabras`` has Unicode letters."""

SFP_REGISTRY = REGISTRY + SFP_USE_CASES


@pytest.fixture
def sfp_registry() -> Registry:
    return parse_registry(SFP_REGISTRY, source="usecases.toml")


@pytest.fixture
def sfp_agent(tmp_path: Path, sfp_registry: Registry, clock: FakeClock) -> Callable[[], Agent]:
    def build() -> Agent:
        return Agent(
            registry=sfp_registry,
            state_dir=tmp_path / "state",
            sealer=Sealer(KEY),
            clock=clock,
            rng=SeededRandom(3),
        )

    return build


def _state_files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _snapshot(agent: Agent, state: Path) -> tuple[Any, ...]:
    rows = {r.use_case: (r.records_today, r.epsilon_today, r.epsilon_total) for r in agent.use_case_status()}
    return rows, agent.ledger(), agent.outbox_size, _state_files(state)


@pytest.mark.parametrize(
    ("use_case", "word", "named"),
    [
        ("new-words", "für", ["'ü' (U+00FC LATIN SMALL LETTER U WITH DIAERESIS)"]),
        ("new-words", "não", ["'ã' (U+00E3 LATIN SMALL LETTER A WITH TILDE)"]),
        ("new-words", "Hello", ["'H' (U+0048 LATIN CAPITAL LETTER H)"]),
        ("palabras", "größe", ["'ö' (U+00F6 LATIN SMALL LETTER O WITH DIAERESIS)"]),
        ("palabras", "日本", ["'日' (U+65E5", "'本' (U+672C"]),
    ],
)
def test_a_word_outside_the_alphabet_is_refused_and_costs_nothing(  # noqa: PLR0917 - the fixtures and the case
    sfp_agent: Callable[[], Agent],
    sfp_registry: Registry,
    clock: FakeClock,
    tmp_path: Path,
    use_case: str,
    word: str,
    named: list[str],
) -> None:
    """The refusal names each character and the alphabet; state, outbox, ledger and ε stay as they were."""
    agent = sfp_agent()
    agent.grant_consent()
    agent.record(use_case, "hola")
    clock.set(clock.time() + DAY)
    agent.collect()  # a report in the outbox and ε spent, so "unchanged" has something to hold
    agent.record(use_case, "adios")
    before = _snapshot(agent, tmp_path / "state")
    with pytest.raises(ValueRefusedError) as refused:
        agent.record(use_case, word)
    message = str(refused.value)
    for character in named:
        assert character in message
    mechanism: Any = sfp_registry[use_case].mechanism
    assert repr(mechanism.alphabet) in message
    assert _snapshot(agent, tmp_path / "state") == before


@pytest.mark.parametrize(
    ("word", "reason"),
    [
        ("", "no word"),
        ("   ", "no word"),
        ("new york", "space inside"),
        (" hola", "space inside"),
    ],
)
def test_a_word_that_can_never_be_released_is_refused(
    sfp_agent: Callable[[], Agent], tmp_path: Path, word: str, reason: str
) -> None:
    """Padding only ever ends a word, so an empty word or one with a space inside is never released."""
    agent = sfp_agent()
    agent.grant_consent()
    before = _snapshot(agent, tmp_path / "state")
    with pytest.raises(ValueRefusedError, match=reason):
        agent.record("new-words", word)
    assert _snapshot(agent, tmp_path / "state") == before


def test_unicode_words_of_the_alphabet_are_taken(sfp_agent: Callable[[], Agent]) -> None:
    """ "año", "straße" and "não" fit the Unicode alphabet; a long word is kept truncated, as it is released."""
    agent = sfp_agent()
    agent.grant_consent()
    for word in ("año", "straße", "não", "internacionalización"):
        assert agent.record("palabras", word).outcome == "recorded"


def test_a_decomposed_letter_is_the_composed_one(sfp_registry: Registry) -> None:
    """NFC on the device: "na\\u0303o" (n, a, combining tilde, o) is taken and privatized exactly as "não"."""
    composed, decomposed = "não", "na\u0303o"
    assert composed != decomposed
    mechanism: Any = sfp_registry["palabras"].mechanism
    assert mechanism.check_discoverable(decomposed) == composed
    assert mechanism.reported_as(decomposed) == composed
    first, _ = mechanism.privatize(decomposed, None, SeededRandom(5))
    second, _ = mechanism.privatize(composed, None, SeededRandom(5))
    assert first == second
    # The whole output distribution, exactly, on a sketch small enough to enumerate.
    tiny = SequenceFragmentPuzzle(
        epsilon=1, epsilon_fragment=1, k=1, m=2, k_fragment=1, m_fragment=2, seed=bytes(16), alphabet="naão "
    )
    assert tiny.output_distribution(decomposed) == tiny.output_distribution(composed)


def _setup(tmp: Path) -> str:
    (tmp / "usecases.toml").write_text(SFP_REGISTRY, encoding="utf-8")
    key = tmp / "state.key"
    key.write_bytes(KEY)
    key.chmod(0o600)
    cfg = tmp / "agent.toml"
    cfg.write_text(
        '[broker]\nhost = "127.0.0.1"\nport = 1\ntls = false\n[registry]\npath = "usecases.toml"\n'
        '[state]\ndirectory = "state"\nkey_file = "state.key"\n[api]\nsocket = "agent.sock"\n'
    )
    return str(cfg)


def _json(capsys: pytest.CaptureFixture[str], cfg: str, *verb: str) -> Any:
    assert main(["--config", cfg, *verb, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_ldp_agent_record_refuses_with_status_3_and_names_the_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ldp-agent record new-words für``: exit 3 (values refused), the character and the alphabet
    named on stderr, status and ledger unchanged."""
    cfg = _setup(tmp_path)
    assert main(["--config", cfg, "consent", "grant"]) == 0
    assert main(["--config", cfg, "record", "new-words", "hello"]) == 0
    capsys.readouterr()
    status, ledger = _json(capsys, cfg, "status"), _json(capsys, cfg, "ledger")
    files = _state_files(tmp_path / "state")
    assert main(["--config", cfg, "record", "new-words", "für"]) == ExitStatus.REFUSED
    assert ExitStatus.REFUSED.value == 3  # the status the exit-status table documents for refused values
    err = capsys.readouterr().err
    assert "'ü' (U+00FC LATIN SMALL LETTER U WITH DIAERESIS)" in err
    assert '"abcdefghijklmnopqrstuvwxyz\' "' in err
    assert _json(capsys, cfg, "status") == status
    assert _json(capsys, cfg, "ledger") == ledger
    assert _state_files(tmp_path / "state") == files
    assert main(["--config", cfg, "record", "palabras", "straße"]) == 0
