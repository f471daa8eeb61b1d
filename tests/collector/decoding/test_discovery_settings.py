"""The T the collector decodes word discovery with is the one ``ldp-collector plan sfp`` prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.decoding.discovery_settings import SFP_MAX_WORDS, discovery_top_t
from collector.planner import sfp_top_t
from protocol.registry import parse_registry
from protocol.server.contract import discovery_server

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "usecases.example.toml"


@pytest.mark.parametrize("n", [10_000, 1_000_000, 10_000_000])
@pytest.mark.parametrize("threshold", [0.0, 1000.0, 20_000.0])
def test_the_live_top_t_is_the_planners(n: int, threshold: float) -> None:
    """For the deployed new-words use case, discovery_top_t (from the server half) equals sfp_top_t (raw parameters)."""
    registry = parse_registry(EXAMPLE.read_bytes(), source=str(EXAMPLE))
    server = discovery_server(registry.use_cases["new-words"].server)
    raw = sfp_top_t(
        epsilon=2.0,
        epsilon_fragment=6.0,
        k=2048,
        m=1024,
        k_fragment=2048,
        m_fragment=1024,
        length=10,
        fragment_length=2,
        alphabet_size=28,
        n=n,
        release_threshold=threshold,
    )
    live = discovery_top_t(server, n=n, alphabet_size=28, release_threshold=threshold, max_words=SFP_MAX_WORDS)
    assert live == raw >= 1


def test_no_reports_keep_one_piece() -> None:
    """With no reports there is nothing to find: T is 1."""
    registry = parse_registry(EXAMPLE.read_bytes(), source=str(EXAMPLE))
    server = discovery_server(registry.use_cases["new-words"].server)
    assert discovery_top_t(server, n=0, alphabet_size=28) == 1
