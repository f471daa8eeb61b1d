"""Errors of the protocol package, split by who is at fault.

* :class:`ParameterError` - the caller configured a mechanism wrongly (a bad ε, a
  sketch width that is not a power of two, ...). It is also a :class:`ValueError`.
* :class:`InputError` - a value handed to ``privatize`` does not fit its use case
  (wrong type, out of range). Also a :class:`ValueError`.
* :class:`StateError` - saved per-device state or a saved aggregate cannot be
  restored. Permanent randomness must then not be redrawn silently.
* :class:`MalformedReportError` - bytes from the network are not a valid report; carries a
  machine-readable ``reason`` and the ``field`` at fault (see ``protocol.wire``).
* :class:`TooManyWordsError` - a discovery (SFP, 003 Alg. 10) would assemble more candidate
  words than its cap; the caller keeps fewer pieces per position (a smaller ``T``).
"""

from __future__ import annotations

__all__ = ["InputError", "LdpError", "MalformedReportError", "ParameterError", "StateError", "TooManyWordsError"]


class LdpError(Exception):
    """Base class of every error raised by ``protocol``."""


class ParameterError(LdpError, ValueError):
    """A mechanism parameter is outside its allowed range.

    Attributes:
        name: the parameter's name, as in the constructor.
        allowed: the allowed range, in words ("> 0", "a power of two", ...).
        got: the rejected value.
    """

    def __init__(self, name: str, allowed: str, got: object) -> None:
        self.name = name
        self.allowed = allowed
        self.got = got
        super().__init__(f"parameter {name!r} must be {allowed}; got {got!r}")


class InputError(LdpError, ValueError):
    """A value to privatize does not fit the mechanism (type or range)."""


class StateError(LdpError):
    """Saved device state or a saved aggregate is malformed or does not match its parameters."""


class MalformedReportError(LdpError):
    """Bytes received from the network are not a valid report.

    Attributes:
        reason: a short machine-readable code (``"oversize"``, ``"bad-type"``, ...).
        field: the dotted path of the offending field, or ``""`` for the whole message.
    """

    def __init__(self, reason: str, field: str = "", detail: str = "") -> None:
        self.reason = reason
        self.field = field
        self.detail = detail
        where = f" at {field!r}" if field else ""
        extra = f": {detail}" if detail else ""
        super().__init__(f"malformed report ({reason}){where}{extra}")


class TooManyWordsError(LdpError, ValueError):
    """A discovery would assemble more words than it may score.

    Attributes:
        words: how many words the kept pieces would assemble.
        max_words: the cap.
    """

    def __init__(self, words: int, max_words: int) -> None:
        self.words = words
        self.max_words = max_words
        super().__init__(f"{words} assembled words, more than max_words={max_words}; lower top_t")
