"""Estimates with their uncertainty, as every mechanism's server half returns them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["BitEstimates", "Estimate", "VectorEstimate"]


@dataclass(frozen=True)
class Estimate:
    """One number estimated from ``n`` reports, with its standard error.

    ``standard_error`` comes from the mechanism paper's variance formula evaluated at the
    estimate (a plug-in), not from a bound that ignores the data.
    """

    value: float
    standard_error: float
    n: int


@dataclass(frozen=True, eq=False)
class VectorEstimate:
    """A vector of estimates (a histogram, counts over a dictionary) with per-entry SE."""

    values: npt.NDArray[np.float64]
    standard_errors: npt.NDArray[np.float64]
    n: int

    def __len__(self) -> int:
        return int(self.values.size)

    def __getitem__(self, i: int) -> Estimate:
        return Estimate(float(self.values[i]), float(self.standard_errors[i]), self.n)


@dataclass(frozen=True, eq=False)
class BitEstimates:
    """Per-cohort estimates ``t_ij`` of the number of devices with Bloom bit ``i`` set (RAPPOR,
    004 §4): what a candidate decoder regresses on the candidates' design matrix.

    Attributes:
        values: ``(cohorts, k)`` estimates ``t_ij`` (row ``j`` is cohort ``j``).
        standard_errors: ``(cohorts, k)`` plug-in standard errors.
        cohort_sizes: ``(cohorts,)`` number of reports ``N_j`` per cohort.
        n: total number of reports.
    """

    values: npt.NDArray[np.float64]
    standard_errors: npt.NDArray[np.float64]
    cohort_sizes: npt.NDArray[np.int64]
    n: int

    def flat(self) -> VectorEstimate:
        """The ``Y`` vector of 004 §4 (cohort-major: entry ``j·k + i`` is ``t_ij``) with its SEs."""
        return VectorEstimate(self.values.ravel().copy(), self.standard_errors.ravel().copy(), self.n)
