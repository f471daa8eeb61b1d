"""How numbers are written for people: one rule, in Python (the CLI) and JavaScript (the dashboard).

:func:`format_number` and :data:`FORMAT_JS` (the dashboard's ``fmt``) follow the same rules,
and the tests run both on the same table:

* ``None``, NaN and infinities are ``n/a``; zero is ``0``.
* From 0.001 up to 10**15: ``digits`` significant digits (4 by default), but never fewer than
  the integer part has: 1000 is ``1,000``, 10955.8 is ``10,956``, 70.2 is ``70.2``. Zeros are
  stripped after the decimal point only, so a whole number keeps its zeros. The integer part
  is grouped by thousands with commas from 1,000 up (``1,500``, ``10,956``, ``1,000,000``), so
  a four-digit figure beside a five-digit one reads as the same format.
* Below 0.001 or from 10**15 up: scientific, ``digits`` significant digits with the
  mantissa's trailing zeros stripped and a bare exponent (``1.5e-5``, ``2.35e15``).
* Rounding is half away from zero on the exact binary value, which is what JavaScript's
  ``toFixed`` and ``toExponential`` do, so both sides print the same digits.
* A negative number is ``-`` and the number's magnitude written as above.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

__all__ = ["FORMAT_JS", "format_number"]

_SMALL = 1e-3
_LARGE = 1e15


def _strip(text: str) -> str:
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def format_number(x: float | int | None, digits: int = 4) -> str:
    """``x`` written for a person (the module's rules), e.g. ``format_number(10955.8) == "10,956"``.

    Raises:
        ValueError: ``digits`` is below 1.
    """
    if digits < 1:
        raise ValueError(f"digits must be at least 1, got {digits}")
    if x is None:
        return "n/a"
    value = float(x)
    if not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    a = abs(value)
    exact = Decimal(a)  # the exact binary value, as JavaScript rounds it
    if a >= _LARGE or a < _SMALL:
        exponent = exact.adjusted()
        mantissa = exact.scaleb(-exponent).quantize(Decimal(1).scaleb(-(digits - 1)), rounding=ROUND_HALF_UP)
        if mantissa >= 10:
            exponent += 1
            mantissa = (mantissa / 10).quantize(Decimal(1).scaleb(-(digits - 1)), rounding=ROUND_HALF_UP)
        return f"{sign}{_strip(f'{mantissa:f}')}e{exponent}"
    decimals = max(0, digits - (math.floor(math.log10(a)) + 1))
    fixed = f"{exact.quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP):f}"
    whole, _, fraction = fixed.partition(".")
    fraction = fraction.rstrip("0")
    if len(whole) > 3:
        whole = f"{int(whole):,}"
    return sign + whole + ("." + fraction if fraction else "")


FORMAT_JS = r"""
// One rule for every number on the page; collector/numbers.py has the same in Python
// (format_number) and the rules, and the tests run both on the same table.
function fmt(x, digits) {
  if (x === null || x === undefined) return "n/a";
  x = Number(x);
  if (!Number.isFinite(x)) return "n/a";
  digits = digits || 4;
  if (x === 0) return "0";
  const sign = x < 0 ? "-" : "", a = Math.abs(x);
  const strip = s => s.includes(".") ? s.replace(/0+$/, "").replace(/\.$/, "") : s;
  if (a >= 1e15 || a < 1e-3) {
    const [mantissa, exponent] = a.toExponential(digits - 1).split("e");
    return sign + strip(mantissa) + "e" + Number(exponent);
  }
  const decimals = Math.max(0, digits - (Math.floor(Math.log10(a)) + 1));
  let [whole, fraction] = a.toFixed(decimals).split(".");
  fraction = (fraction || "").replace(/0+$/, "");
  if (whole.length > 3) whole = whole.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  return sign + whole + (fraction ? "." + fraction : "");
}
"""
"""The dashboard's ``fmt(x, digits)``: :func:`format_number` in JavaScript."""
