"""How word discovery is decoded when the use case leaves it open: 003 Alg. 10's ``T`` and the word cap.

A discovery use case (SFP, 003 §4.3) may fix ``collector.top_t``; otherwise the collector
chooses ``T``, the (piece, fragment) pairs kept per position, for the period's number of
reports with :func:`discovery_top_t`, from the mechanism's own planner figures
(:meth:`protocol.server.contract.ServerMechanism.plan`). ``ldp-collector plan sfp`` prints the same
choice from raw parameters (:mod:`collector.planner.discovery`), through :func:`choose_top_t`.

This module is on the live path (``collector.estimation``): it needs only the standard
library and :mod:`collector.decoding.stats`, never the planner.
"""

from __future__ import annotations

import math

from collector.decoding.stats import normal_quantile
from protocol.interfaces import as_discovery
from protocol.server.contract import DiscoveryServer
from protocol.sfp import PUZZLE_PIECES

__all__ = [
    "SFP_MAX_WORDS",
    "choose_top_t",
    "discovery_figures",
    "discovery_top_t",
    "fragment_pairs",
    "smallest_word_found",
]

SFP_MAX_WORDS = 2_000_000
"""Most words one discovery assembles (``protocol.server.sfp.reconstruct``'s ``max_words``)."""


def fragment_pairs(alphabet_size: int, fragment_length: int) -> int:
    """The (piece, fragment) pairs one position can hold: the null pairs a fragment must beat."""
    return PUZZLE_PIECES * int(alphabet_size**fragment_length)


def _touchard(order: int, lam: float) -> float:
    """``E[X^order]`` for ``X ~ Poisson(lam)``: ``Σ_j S(order, j) lam^j`` (Stirling numbers of the 2nd kind)."""
    row = [1]  # S(0, 0)
    for i in range(1, order + 1):
        row = [0] + [j * (row[j] if j < len(row) else 0) + row[j - 1] for j in range(1, i + 1)]
    return math.fsum(float(coef) * lam**j for j, coef in enumerate(row))


def smallest_word_found(
    *, word_se: float, frag_se: float, positions: int, pairs: int, alpha: float, assembled: float
) -> float:
    """The smallest count a word needs to be found: the larger of the word test's and the fragment test's floor.

    The word test is Bonferroni over the ``assembled`` words at level ``alpha``; a fragment at
    each of the ``positions`` must beat the largest of the ``pairs`` null pairs.
    """
    z_word = normal_quantile(1 - alpha / max(assembled, 1.0))
    z_frag = normal_quantile(1 - 1 / pairs)  # a fragment must beat the largest of the null pairs
    return max(z_word * word_se, positions * z_frag * frag_se)


def choose_top_t(
    *,
    word_se: float,
    frag_se: float,
    positions: int,
    pairs: int,
    n: int,
    release_threshold: float,
    alpha: float,
    assembled: float,
    max_words: int,
) -> int:
    """003 Alg. 10's ``T``: enough pieces per position to find every word that can be released, at a bounded cost.

    *Enough.* A word can be released only if its count is at least
    ``c_min = max(release_threshold, smallest word found)`` (:func:`smallest_word_found`, as
    printed by ``plan sfp``), and at most ``n / c_min`` distinct words have that many reports.
    Each holds one (piece, fragment) pair per position; its fragment count is near
    ``c_min / positions``, above every null pair (that is the fragment floor). Words just below
    ``c_min`` compete for the same places through their noise, so ``T`` keeps twice as many:
    ``2 n / c_min``.

    *Bounded.* The words assembled are ``Σ_w Π_ℓ X_wℓ`` over the 256 puzzle pieces ``w``,
    ``X_wℓ`` the pairs of piece ``w`` kept at position ``ℓ``. The kept pairs' pieces are
    uniform (the piece is a hash), so ``X_wℓ`` is about Poisson with mean ``T / 256``, and a
    piece's words appear at every position together, so the expected number assembled is
    ``256 E[X^positions]`` (the Touchard polynomial). ``T`` is capped where that reaches half
    of ``max_words``, the other half left for the fluctuation of the largest pieces.

    Returns:
        ``T`` (at least 1).
    """
    floor = smallest_word_found(
        word_se=word_se, frag_se=frag_se, positions=positions, pairs=pairs, alpha=alpha, assembled=assembled
    )
    c_min = max(float(release_threshold), floor, 1.0)
    needed = math.ceil(2 * n / c_min)
    lo, hi = 1, max(1, min(needed, pairs))
    if PUZZLE_PIECES * _touchard(positions, hi / PUZZLE_PIECES) <= max_words / 2:
        return hi
    while lo < hi:  # the assembled count grows with T: the largest T within budget
        mid = (lo + hi + 1) // 2
        if PUZZLE_PIECES * _touchard(positions, mid / PUZZLE_PIECES) <= max_words / 2:
            lo = mid
        else:
            hi = mid - 1
    return lo


def discovery_top_t(
    server: DiscoveryServer,
    *,
    n: int,
    alphabet_size: int,
    release_threshold: float = 0.0,
    alpha: float = 0.05,
    assembled: float = 1e4,
    max_words: int = SFP_MAX_WORDS,
) -> int:
    """:func:`choose_top_t` for a configured discovery mechanism, from its server half's planner figures.

    The word and fragment standard errors and the number of positions are the mechanism's
    :meth:`~protocol.server.contract.ServerMechanism.plan` figures (``standard_error``,
    ``fragment_standard_error``, ``positions``; the same 003 Thm 4.2 bounds with
    ``Σf² <= 0.1 n²``); a fragment is ``longest / positions`` characters. A mechanism whose
    figures name no fragments gets ``T = 2 n / max(release_threshold, 1)``, capped as above.
    """
    if n <= 0:
        return 1
    figures = server.plan(float(n))
    positions = max(1, int(figures.figures.get("positions", 1)))
    fragment_length = max(1, as_discovery(server.mechanism).longest // positions)
    return choose_top_t(
        word_se=figures.standard_error,
        frag_se=float(figures.figures.get("fragment_standard_error", 0.0)),
        positions=positions,
        pairs=fragment_pairs(alphabet_size, fragment_length),
        n=n,
        release_threshold=release_threshold,
        alpha=alpha,
        assembled=assembled,
        max_words=max_words,
    )


def discovery_figures(
    server: DiscoveryServer, *, n: int, release_threshold: float = 0.0, alpha: float = 0.05, assembled: float = 1e4
) -> dict[str, float]:
    """What the mechanism's own alphabet makes of discovery at ``n`` reports (``plan use-case``).

    The alphabet's size sets the null (piece, fragment) pairs a true fragment must beat at each
    position (``256 |alphabet|**fragment_length``), hence the smallest word found and ``T``;
    a larger alphabet needs more reports to find the same words. The figures are those
    ``plan sfp`` prints from raw parameters, here from the use case's definition.
    """
    alphabet_size = len(set(as_discovery(server.mechanism).alphabet))
    figures = server.plan(float(max(n, 1)))
    positions = max(1, int(figures.figures.get("positions", 1)))
    pairs = fragment_pairs(alphabet_size, max(1, as_discovery(server.mechanism).longest // positions))
    frag_se = float(figures.figures.get("fragment_standard_error", 0.0))
    floor = smallest_word_found(
        word_se=figures.standard_error,
        frag_se=frag_se,
        positions=positions,
        pairs=pairs,
        alpha=alpha,
        assembled=assembled,
    )
    # The fragment test's share of the floor, the part the alphabet moves.
    fragment_floor = smallest_word_found(
        word_se=0.0, frag_se=frag_se, positions=positions, pairs=pairs, alpha=alpha, assembled=assembled
    )
    top_t = discovery_top_t(
        server, n=n, alphabet_size=alphabet_size, release_threshold=release_threshold, alpha=alpha, assembled=assembled
    )
    return {
        "alphabet_size": float(alphabet_size),
        "fragment_pairs_per_position": float(pairs),
        "smallest_word_found": floor,
        "smallest_word_found_by_its_fragments": fragment_floor,
        "top_t": float(top_t),
    }
