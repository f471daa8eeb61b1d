"""SFP's alphabet: a parameter under the definition hash, Unicode characters, NFC on both sides."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from protocol.errors import InputError
from protocol.randomness import SeededRandom
from protocol.registry import RegistryError, mechanism_fingerprint, parse_registry
from protocol.server.sfp import SFPServer
from protocol.sfp import DEFAULT_ALPHABET, SequenceFragmentPuzzle

SEED = b"sfp-alphabet-test-seed-0123"

REGISTRY = """
format = 1
salt = "00112233445566778899aabbccddeeff"
[use_cases.words]
mechanism = "sfp"
epsilon = 8
period = "1d"
daily_limit = 2
lifetime_epsilon = 100
parameters = {{ epsilon = 2, epsilon_fragment = 6, k = 16, m = 64, k_fragment = 16, m_fragment = 64{extra} }}
[use_cases.words.collector]
min_reports = 10
{collector}
"""


def _registry(extra: str = "", collector: str = "") -> Any:
    return parse_registry(REGISTRY.format(extra=extra, collector=collector), source="usecases.toml")


def test_the_default_alphabet_written_out_changes_no_hash() -> None:
    """Left implicit or written out, the default alphabet is the same definition, fingerprint and registry."""
    implicit = _registry()
    explicit = _registry(f', alphabet = "{DEFAULT_ALPHABET}"')
    assert implicit["words"].definition == explicit["words"].definition
    assert implicit["words"].fingerprint == explicit["words"].fingerprint
    assert implicit.hash == explicit.hash
    other = _registry(', alphabet = "abcdefghijklmnopqrstuvwxyzñ\' "')
    assert other["words"].definition != implicit["words"].definition
    assert mechanism_fingerprint(other["words"].mechanism) != implicit["words"].fingerprint
    assert other.hash != implicit.hash


def test_collector_alphabet_is_refused_naming_where_it_went() -> None:
    """The old key is refused with the place the alphabet moved to."""
    with pytest.raises(RegistryError, match=r"moved to parameters\.alphabet") as err:
        _registry(collector='alphabet = "abc "')
    assert err.value.field == "collector.alphabet"


def _mech(alphabet: str) -> SequenceFragmentPuzzle:
    return SequenceFragmentPuzzle(
        epsilon=8.0, epsilon_fragment=8.0, k=64, m=512, k_fragment=64, m_fragment=512, seed=SEED, alphabet=alphabet
    )


def test_characters_are_code_points_after_nfc() -> None:
    """ "ß" and "ã" are one character each; a decomposed letter is composed before padding and truncation."""
    mech = _mech("abcdefghijklmnopqrstuvwxyzñßã ")
    assert mech.pad("straße") == "straße    "
    assert mech.pad("na\u0303o") == mech.pad("não") == "não       "
    assert mech.fragment_of(mech.pad("straße"), 2) == "ße"
    # Past `length` nothing is checked: the word is released truncated.
    assert mech.check_discoverable("abcdefghij日本") == "abcdefghij日本"
    assert mech.reported_as("abcdefghij日本") == "abcdefghij"
    with pytest.raises(InputError, match=r"'日' \(U\+65E5 CJK UNIFIED IDEOGRAPH-65E5\)"):
        mech.check_discoverable("日本")


def test_a_letter_without_a_precomposed_form_is_two_characters() -> None:
    """ "g̃" has no precomposed form: after NFC it is "g" and U+0303, both needed in the alphabet."""
    with_mark = _mech("abcdefghijklmnopqrstuvwxyz\u0303 ")
    assert with_mark.check_discoverable("g\u0303o") == "g\u0303o"
    without = _mech("abcdefghijklmnopqrstuvwxyz ")
    with pytest.raises(InputError, match="U\\+0303 COMBINING TILDE"):
        without.check_discoverable("g\u0303o")


def test_unicode_words_are_reconstructed_under_one_spelling() -> None:
    """ "año", "straße" and "não" come back whole; "não" sent decomposed by half the devices is one word,
    and the decomposed spelling the alphabet could also assemble is never released."""
    mech = _mech("abcdefghijklmnopqrstuvwxyzñßã\u0303 ")
    server = SFPServer(mech)
    truth = {"año": 3_000, "straße": 2_000, "não": 2_500}
    values = [w for w, c in truth.items() for _ in range(c)]
    values = [("na\u0303o" if w == "não" and i % 2 else w) for i, w in enumerate(values)]
    aggregate = server.new_aggregate()
    aggregate.add(server.privatize_many(values, SeededRandom(11)))
    found = {d.word: d for d in aggregate.reconstruct(top_t=64, threshold=500)}
    assert set(found) == set(truth)
    for word, count in truth.items():
        assert abs(found[word].count - count) <= 5 * found[word].standard_error


def test_the_alphabet_defaults_for_reconstruction() -> None:
    """Without an alphabet argument the puzzle assembles from the mechanism's own."""
    mech = _mech("abñ ")
    server = SFPServer(mech)
    aggregate = server.new_aggregate()
    aggregate.add(server.privatize_many(["ñab"] * 500 + ["ba"] * 300, SeededRandom(2)))
    assert {d.word for d in aggregate.reconstruct(top_t=8, threshold=100)} == {"ñab", "ba"}
    assert {d.word for d in aggregate.reconstruct(alphabet="ab ", top_t=8, threshold=100)} == {"ba"}
    assert dataclasses.replace(mech, alphabet=DEFAULT_ALPHABET).symbols[-1] == " "
