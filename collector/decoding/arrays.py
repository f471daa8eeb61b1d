"""The numpy array types the decoders pass between them: one definition for every module of the package."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["Array", "BoolArray", "IntArray"]

Array = npt.NDArray[np.float64]
"""Counts, standard errors, p-values: one float per candidate, bit or cell."""
IntArray = npt.NDArray[np.int64]
"""Indices and whole-number counts."""
BoolArray = npt.NDArray[np.bool_]
"""Masks: which candidates are selected, detected or released."""
