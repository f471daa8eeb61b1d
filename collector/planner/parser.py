"""The ``ldp-collector plan`` command line: one subcommand per mechanism, and one for a registry's use case.

Each subcommand names the function that plans it (``args.planner``), so the verb runs the
plan it parsed without looking at the subcommand's name.
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable, Sequence

from collector.planner.discovery import plan_sfp
from collector.planner.histogram import plan_dbitflip
from collector.planner.inputs import Result
from collector.planner.oracles import plan_compare, plan_oracles
from collector.planner.rappor import plan_rappor
from collector.planner.scalars import plan_one_bit_mean, plan_rr
from collector.planner.sketches import SKETCHES, plan_sketch
from collector.planner.use_case import plan_registered

__all__ = ["MECHANISMS", "Planner", "build_parser"]

MECHANISMS: tuple[str, ...] = ("rr", "one-bit-mean", "dbitflip", *(family.name for family in SKETCHES), "sfp", "rappor")
"""The mechanisms planned from raw parameters, each a subcommand (``use-case`` plans any registered one)."""

Planner = Callable[[argparse.Namespace], Result]
"""What a subcommand runs on its parsed arguments (``args.planner``)."""


def _count(text: str) -> float:
    """Accept ``1e6`` and ``1_000_000`` for counts."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _probability(text: str) -> float:
    value = _count(text)
    if not value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}")
    return value


def _common(sp: argparse.ArgumentParser, *, targets: Sequence[str] = ("se",)) -> None:
    sp.add_argument("--epsilon", type=_count, help="privacy parameter epsilon (solved for when omitted, if possible)")
    sp.add_argument("--n", type=_count, help="number of reports (solved for from a target when omitted)")
    if "se" in targets:
        sp.add_argument("--target-se", type=_count, help="target standard error (in the estimate's unit)")
    if "error" in targets:
        sp.add_argument("--target-error", type=_count, help="target error bound holding with probability 1 - delta")
        sp.add_argument("--delta", type=_probability, default=0.05, help="failure probability of the bound (0.05)")
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")


def build_parser() -> argparse.ArgumentParser:
    """The ``ldp-collector plan`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="ldp-collector plan",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Choose parameters before collecting: for a mechanism, epsilon, a number of reports and a\n"
            "target error (or a bandwidth), print the parameters and the expected standard error from the\n"
            "papers' formulas (000 Thm 1-2; 003 Thm 4.2, 4.4 and §5; 004 Thm 1-2 and Appendix)."
        ),
        epilog=(
            "examples:\n"
            "  ldp-collector plan one-bit-mean --epsilon 1 --gamma 0.2 --m 21600 --target-se 60\n"
            "  ldp-collector plan dbitflip --epsilon 1 --k 32 --n 3e5 --target-se 0.005\n"
            "  ldp-collector plan cms --epsilon 4 --n 1e8 --target-se 6000 --top-share 0.01 --dictionary-size 2600\n"
            "  ldp-collector plan hcms --epsilon 4 --n 1e8 --bandwidth 26\n"
            "  ldp-collector plan rappor --k 128 --h 2 --cohorts 16 --f 0.5 --p 0.5 --q 0.75 --n 1e6 --candidates 200\n"
            "  ldp-collector plan rappor --variant basic --f 0 --p 0.5 --q 0.75 --target-strings 1000 "
            "--candidates 1e4\n"
            "  ldp-collector plan use-case --registry /etc/ldp/usecases.toml app-usage-seconds --n 1e5\n"
            "  ldp-collector plan oracles --epsilon 4 --n 1e5 --dictionary-size 2600\n"
            "  ldp-collector plan compare --registry /etc/ldp/usecases.toml emoji"
        ),
    )
    sub = parser.add_subparsers(dest="mechanism", required=True, metavar="MECHANISM")

    sp = sub.add_parser("rr", help="binary randomized response: SE of a proportion")
    _common(sp)
    sp.set_defaults(planner=plan_rr)

    sp = sub.add_parser("one-bit-mean", help="1BitMean (000 Thm 1): error of a mean counter")
    _common(sp, targets=("se", "error"))
    sp.add_argument("--m", type=_count, required=True, help="the counter's range [0, m] (e.g. 21600 s in 6 hours)")
    sp.add_argument("--gamma", type=float, default=0.0, help="output perturbation gamma (000 §4), in [0, 0.5)")
    sp.set_defaults(planner=plan_one_bit_mean)

    sp = sub.add_parser("dbitflip", help="dBitFlip / dBitFlipPM (000 Thm 2): histogram error; solves for d or n")
    _common(sp, targets=("se", "error"))
    sp.add_argument("--k", type=int, required=True, help="number of buckets")
    sp.add_argument("--d", type=int, help="buckets each device reports on (solved for when omitted)")
    sp.set_defaults(planner=plan_dbitflip)

    _add_sketch_parsers(sub)
    _add_sfp_parser(sub)
    _add_rappor_parser(sub)

    sp = sub.add_parser(
        "use-case", help="a use case of a registry, any mechanism: the SE its module's formula gives at n reports"
    )
    sp.add_argument("--registry", required=True, help="the use-case registry (TOML)")
    sp.add_argument("use_case", metavar="USE_CASE", help="the use case's name")
    sp.add_argument("--n", type=_count, help="number of reports (solved for from --target-se when omitted)")
    sp.add_argument("--target-se", type=_count, help="target standard error of the headline estimate")
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")
    sp.set_defaults(planner=plan_registered)
    _add_oracle_parsers(sub)
    return parser


def _add_oracle_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser(
        "oracles", help="every frequency oracle for an epsilon, a domain and n: SE, record size, decode cost"
    )
    sp.add_argument("--epsilon", type=_count, required=True, help="epsilon of one report")
    sp.add_argument("--n", type=_count, required=True, help="reports per period")
    sp.add_argument("--categories", type=_count, help="a fixed list of this many categories (grr, oue, ss, pgr, olh)")
    sp.add_argument(
        "--dictionary-size", type=_count, help="an open domain queried with this many candidates (cms, hcms, olh)"
    )
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")
    sp.set_defaults(planner=plan_oracles)

    sp = sub.add_parser(
        "compare", help="each frequency use case of a registry against every oracle: what switching would give"
    )
    sp.add_argument("--registry", required=True, help="the use-case registry (TOML)")
    sp.add_argument(
        "use_cases", metavar="USE_CASE", nargs="*", help="use cases to compare (default: every frequency one)"
    )
    sp.add_argument("--n", type=_count, help="reports per period (default: each use case's collector.min_reports)")
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")
    sp.set_defaults(planner=plan_compare)


def _add_sketch_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for family in SKETCHES:
        sp = sub.add_parser(family.name, help=f"{family.title}: SE of a count, bandwidth and server cost")
        sp.set_defaults(planner=functools.partial(plan_sketch, family=family))
        _common(sp)
        sp.add_argument("--k", type=int, help="hash functions (searched over powers of two when omitted)")
        sp.add_argument("--m", type=int, help="sketch width (searched when omitted)")
        sp.add_argument("--bandwidth", type=_count, help="device bandwidth budget in bits per report (003 §5)")
        sp.add_argument("--dictionary-size", type=int, default=0, help="entries queried, p of 003 §5's server cost")
        sp.add_argument(
            "--max-cells",
            type=_count,
            default=float(1 << 27),
            help="largest sketch k*m the search considers (server memory; default 2^27)",
        )
        sp.add_argument(
            "--top-share",
            type=_probability,
            default=0.1,
            help="share of the reports held by the most frequent value; bounds sum f^2 <= F n^2 (default 0.1)",
        )


def _add_sfp_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("sfp", help="Sequence Fragment Puzzle (003 §4.3): word and fragment SEs")
    sp.add_argument("--epsilon", type=_count, default=2.0, help="epsilon of the word record (003 §6.1: 2)")
    sp.add_argument("--epsilon-fragment", type=_count, default=6.0, help="epsilon' of the fragment record (6)")
    sp.add_argument("--n", type=_count, required=True, help="number of reports")
    sp.add_argument("--k", type=int, default=2048)
    sp.add_argument("--m", type=int, default=1024)
    sp.add_argument("--k-fragment", type=int, default=2048)
    sp.add_argument("--m-fragment", type=int, default=1024)
    sp.add_argument("--length", type=int, default=10, help="characters per word (10)")
    sp.add_argument("--fragment-length", type=int, default=2, help="characters per fragment (2)")
    sp.add_argument(
        "--alphabet-size", type=int, default=28, help="symbols words are made of (28: a-z, apostrophe and space)"
    )
    sp.add_argument(
        "--alphabet",
        help="the characters words are made of, as in parameters.alphabet (the space included); sets the size",
    )
    sp.add_argument(
        "--release-threshold", type=_count, default=0.0, help="the use case's release threshold (for top_t)"
    )
    sp.add_argument("--assembled", type=_count, default=1e4, help="words the puzzle assembles (tests corrected for)")
    sp.add_argument("--alpha", type=_probability, default=0.05, help="Bonferroni level over the assembled words")
    sp.add_argument("--top-share", type=_probability, default=0.1, help="share of the most frequent word")
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")
    sp.set_defaults(planner=plan_sfp)


def _add_rappor_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("rappor", help="RAPPOR (004 Thm 1-2, Appendix): epsilons, SE, detectable strings")
    sp.add_argument("--variant", choices=["standard", "one-time", "basic", "basic-one-time"], default="standard")
    sp.add_argument("--k", type=int, default=128, help="Bloom filter bits (categories for basic)")
    sp.add_argument("--h", type=int, default=2, help="hash functions (1 for basic)")
    sp.add_argument("--cohorts", type=int, default=64)
    sp.add_argument("--f", type=float, default=0.5)
    sp.add_argument("--p", type=float, default=0.5)
    sp.add_argument("--q", type=float, default=0.75)
    sp.add_argument("--n", type=_count, help="number of reports (solved for from a target when omitted)")
    sp.add_argument("--candidates", type=_count, help="strings tested, M of the Bonferroni correction (default k)")
    sp.add_argument("--alpha", type=_probability, default=0.05, help="family-wise level (0.05)")
    sp.add_argument(
        "--target-strings", type=_count, help="solve n so this many equally frequent strings are detectable"
    )
    sp.add_argument("--target-share", type=_probability, help="solve n so a string with this share is detectable")
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")
    sp.set_defaults(planner=plan_rappor)
