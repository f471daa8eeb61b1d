"""The plan of word discovery: the Sequence Fragment Puzzle (003 §4.3), and the ``T`` it is decoded with.

The word sketch is a CMS over ``n`` reports and each fragment sketch a CMS over the
``n / positions`` reports that chose its position (003 §4.3); ``ε + ε'`` per report
(003 Thm 4.5). :func:`sfp_top_t` chooses Alg. 10's ``T`` (pieces kept per position) from raw
parameters, by the rule the collector applies to a use case that sets no ``collector.top_t``
(:func:`collector.decoding.discovery_settings.choose_top_t`).
"""

from __future__ import annotations

import argparse
import math

from collector.decoding.discovery_settings import SFP_MAX_WORDS, choose_top_t, fragment_pairs, smallest_word_found
from collector.planner.inputs import PlanError, Result, need
from collector.planner.sketches import CMS, sketch_variance

__all__ = ["plan_sfp", "sfp_top_t"]


def _sfp_errors(
    *, eps: float, eps_f: float, k: int, m: int, kf: int, mf: int, n: float, positions: int, share: float
) -> tuple[float, float]:
    word_se = math.sqrt(sketch_variance(CMS, eps=eps, k=k, m=m, n=n, top_share=share))
    frag_se = math.sqrt(sketch_variance(CMS, eps=eps_f, k=kf, m=mf, n=n / positions, top_share=share))
    return word_se, frag_se


def sfp_top_t(
    *,
    epsilon: float,
    epsilon_fragment: float,
    k: int,
    m: int,
    k_fragment: int,
    m_fragment: int,
    length: int,
    fragment_length: int,
    n: int,
    alphabet_size: int,
    release_threshold: float = 0.0,
    alpha: float = 0.05,
    assembled: float = 1e4,
    top_share: float = 0.1,
    max_words: int = SFP_MAX_WORDS,
) -> int:
    """003 Alg. 10's ``T`` for SFP's raw parameters: enough pieces per position, at a bounded cost.

    The word and fragment standard errors are 003 Thm 4.2's bounds with ``Σf² <= F n²``
    (``F`` = ``top_share``); the rule is
    :func:`collector.decoding.discovery_settings.choose_top_t`'s.

    Returns:
        ``T`` (at least 1).
    """
    positions = length // fragment_length
    if n <= 0:
        return 1
    word_se, frag_se = _sfp_errors(
        eps=epsilon,
        eps_f=epsilon_fragment,
        k=k,
        m=m,
        kf=k_fragment,
        mf=m_fragment,
        n=float(n),
        positions=positions,
        share=top_share,
    )
    return choose_top_t(
        word_se=word_se,
        frag_se=frag_se,
        positions=positions,
        pairs=fragment_pairs(alphabet_size, fragment_length),
        n=n,
        release_threshold=release_threshold,
        alpha=alpha,
        assembled=assembled,
        max_words=max_words,
    )


def plan_sfp(a: argparse.Namespace) -> Result:
    """``plan sfp``: the word and fragment SEs, the smallest word found, and ``T``."""
    eps = need(a.epsilon, "epsilon")
    eps_f = need(a.epsilon_fragment, "epsilon_fragment")
    n = need(a.n, "n")
    k, m = int(a.k), int(a.m)
    kf, mf = int(a.k_fragment), int(a.m_fragment)
    length, fl = int(a.length), int(a.fragment_length)
    if length % fl:
        raise PlanError("--fragment-length must divide --length")
    positions = length // fl
    share = float(a.top_share)
    alpha = float(a.alpha)
    assembled = float(max(int(a.assembled), 1))
    word_se, frag_se = _sfp_errors(eps=eps, eps_f=eps_f, k=k, m=m, kf=kf, mf=mf, n=n, positions=positions, share=share)
    # The alphabet's size sets the null fragment pairs a true fragment must beat (003 Alg. 10 step 8).
    alphabet_size = int(a.alphabet_size) if a.alphabet is None else len(set(a.alphabet))
    pairs = fragment_pairs(alphabet_size, fl)
    top_t = sfp_top_t(
        epsilon=eps,
        epsilon_fragment=eps_f,
        k=k,
        m=m,
        k_fragment=kf,
        m_fragment=mf,
        length=length,
        fragment_length=fl,
        n=int(n),
        alphabet_size=alphabet_size,
        release_threshold=float(a.release_threshold),
        alpha=alpha,
        assembled=assembled,
        top_share=share,
    )
    floor = smallest_word_found(
        word_se=word_se, frag_se=frag_se, positions=positions, pairs=pairs, alpha=alpha, assembled=assembled
    )
    return {
        "mechanism": "sfp",
        "epsilon": eps,
        "epsilon_fragment": eps_f,
        "epsilon_report": eps + eps_f,
        "n": int(n),
        "positions": positions,
        "word_standard_error": word_se,
        "fragment_standard_error": frag_se,
        "alphabet_size": alphabet_size,
        "fragment_pairs_per_position": pairs,
        "smallest_word_found": floor,
        "top_t": top_t,
        "bandwidth_bits": math.log2(positions) + math.log2(kf) + mf + math.log2(k) + m,
        "formulas": [
            "003 Thm 4.5: eps + eps' per report",
            "word: 003 Thm 4.2 over n reports; fragment: 003 Thm 4.2 over n/positions reports",
            "smallest word found ~ max(z_word SE_word, positions z_frag SE_frag), "
            "z_word = Phi^-1(1 - alpha/assembled), z_frag = Phi^-1(1 - 1/(256 |alphabet|^l))",
            "top_t = min(2 n / max(release threshold, smallest word found), the largest T with "
            "256 E[Poisson(T/256)^positions] <= max_words / 2) (003 Alg. 10's T)",
        ],
    }
