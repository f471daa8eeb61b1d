"""``ldp-collector plan``: parameters and expected errors from the papers' formulas, before collecting.

For a mechanism, its privacy parameters, a number of reports ``n`` and a target (a standard
error, a high-probability error bound, a device bandwidth, a number of strings to detect),
the verb prints the parameters and what they give, from closed forms only (nothing is
simulated). One module per job:

* :mod:`collector.planner.scalars`: ``rr`` (the SE of a proportion) and ``one-bit-mean``
  (000 Thm 1, eq. 2, §4 and Thm 5);
* :mod:`collector.planner.histogram`: ``dbitflip`` (000 Thm 2), solving for ``d`` or ``n``;
* :mod:`collector.planner.sketches`: ``cms`` and ``hcms`` (003 Thm 4.2, 4.4 and §5), searching
  ``(k, m)`` for a target SE or within a bandwidth;
* :mod:`collector.planner.discovery`: ``sfp`` (003 §4.3, Thm 4.5) and Alg. 10's ``T``;
* :mod:`collector.planner.rappor`: ``rappor`` (004 Thm 1-2 and Appendix);
* :mod:`collector.planner.use_case`: ``use-case``, any registered mechanism as a registry
  configures it, from the figures its own module states
  (:meth:`protocol.server.contract.ServerMechanism.plan`);
* :mod:`collector.planner.parser`, :mod:`collector.planner.output` and
  :mod:`collector.planner.cli`: the command line, the text and JSON output, and the verb;
* :mod:`collector.planner.inputs`: :class:`PlanError` and the checks every planner shares.

The standard errors of ``rr``, ``dbitflip``, ``cms``, ``hcms`` and ``sfp`` are computed by the
mechanism modules themselves (``plan`` and ``variance_bound``), so the planner and the
estimators cannot drift apart; the planner keeps the algebra that solves for a parameter.

The running collector never imports this package (``tests/test_live_path_imports.py``): what
it needs of the planner's reasoning, the ``T`` word discovery is decoded with, lives in
:mod:`collector.decoding.discovery_settings`.

Entry point: :func:`main` (``ldp-collector plan MECHANISM ...``); :func:`plan` returns the
same result as a dictionary.
"""

from collector.planner.cli import main, plan
from collector.planner.discovery import sfp_top_t
from collector.planner.inputs import PlanError
from collector.planner.parser import MECHANISMS, build_parser
from collector.planner.use_case import plan_use_case

__all__ = ["MECHANISMS", "PlanError", "build_parser", "main", "plan", "plan_use_case", "sfp_top_t"]
