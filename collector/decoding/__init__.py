"""Decoding that turns aggregates into released estimates, with uncertainty on every number.

* :mod:`collector.decoding.rappor`: RAPPOR against candidate strings (004 §4: Lasso
  selection, least squares, p-values, Bonferroni or Benjamini-Hochberg), with the standard
  errors the residuals show at each candidate's bits
  (:mod:`collector.decoding.residual_variance`) and the share of the reports the fit leaves
  unexplained; the basic variants decoded directly and candidate files
  (:mod:`collector.decoding.rappor_categories`).
* :mod:`collector.decoding.sketches`: CMS/HCMS dictionary queries with a release threshold
  and the top-N list (003 Alg. 4), and SFP word discovery (003 Alg. 10) with tests.
* :mod:`collector.decoding.consistency`: histograms and frequency vectors made
  non-negative and summing to ``n``, reported next to the raw estimate.
* :mod:`collector.decoding.discovery_settings`: the ``T`` and the word cap SFP discovery is
  decoded with when the use case fixes none (the ``ldp-collector plan`` verb, which prints
  the same choice, is :mod:`collector.planner`).
* :mod:`collector.decoding.stats`: normal p-values and multiple-testing control.
* :mod:`collector.decoding.plain`: the released-value record every decoder returns (what a
  person reads of it becomes JSON in ``collector.results`` alone).
* :mod:`collector.decoding.arrays`: the numpy array types the modules above share.

Only numpy and the standard library are used at run time.
"""

from collector.decoding.consistency import ConsistentEstimate, make_consistent, project_simplex
from collector.decoding.plain import ValueEstimate
from collector.decoding.rappor import (
    CategoryDecoding,
    DecodedString,
    RapporDecoder,
    RapporDecoding,
    decode_categories,
    load_candidates,
)
from collector.decoding.sketches import FrequencyEntry, FrequencyRelease, discover_words, query_dictionary
from collector.decoding.stats import CONTROLS, normal_quantile, normal_sf, reject, storey_pi0, z_interval

__all__ = [
    "CONTROLS",
    "CategoryDecoding",
    "ConsistentEstimate",
    "DecodedString",
    "FrequencyEntry",
    "FrequencyRelease",
    "RapporDecoder",
    "RapporDecoding",
    "ValueEstimate",
    "decode_categories",
    "discover_words",
    "load_candidates",
    "make_consistent",
    "normal_quantile",
    "normal_sf",
    "project_simplex",
    "query_dictionary",
    "reject",
    "storey_pi0",
    "z_interval",
]
