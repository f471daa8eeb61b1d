"""Who answers for a use case and until when it may collect: its metadata, outside every hash.

A use case of the registry may name its ``owner`` (who answers for it), the date it
``expires``, a ``data_review`` (the URL of the review that approved it) and the
``notification_emails`` of the people told about it. None of them changes what a report
means, so none is part of the definition hash, the registry hash or the mechanism's
fingerprint (:mod:`protocol.use_cases`): adding them to a deployed registry, or moving an
``expires`` date, leaves every definition, every device's state and every ε spent as they were.

**Expiry is a privacy property**: collection that nobody renewed stops by itself. From 00:00
UTC on its ``expires`` date an agent records nothing more for the use case (the values it
recorded before are still sent when their period ends); a registry with a later date resumes
it with its state and ε intact, since it is the same definition (docs/deploy.md, "Owners and
end dates"). The collector keeps an expired use case's data and marks it as expired.

A registry may ask for the metadata to be there: ``strict = true`` at its top refuses a use
case without an ``owner`` or an ``expires`` date; without it, ``check-config`` on both sides
warns about each one (:func:`metadata_warnings`).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "MAX_EMAILS",
    "MAX_OWNER_CHARS",
    "REQUIRED",
    "UseCaseMetadata",
    "check_data_review",
    "check_email",
    "check_owner",
    "metadata_warnings",
]

REQUIRED: Final = ("owner", "expires")
"""The metadata every use case should have, and must under ``strict = true``."""

MAX_OWNER_CHARS: Final = 200
MAX_EMAILS: Final = 32
_MAX_URL_CHARS: Final = 2_000
_EMAIL: Final = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
_URL: Final = re.compile(r"https?://\S+")
_EPOCH: Final = datetime.date(1970, 1, 1)


@dataclass(frozen=True, kw_only=True)
class UseCaseMetadata:
    """A use case's metadata (the module docstring says what each means). Not hashed.

    Attributes:
        owner: who answers for the use case (a team, a person, an address); ``None``: not given.
        expires: the first UTC day on which the use case records nothing more; ``None``: not given.
        data_review: the URL of the review that approved the collection; ``None``: not given.
        notification_emails: who is told about the use case (its expiry among others).
    """

    owner: str | None = None
    expires: datetime.date | None = None
    data_review: str | None = None
    notification_emails: tuple[str, ...] = ()

    @property
    def missing(self) -> tuple[str, ...]:
        """The required metadata (:data:`REQUIRED`) this use case lacks, in that order."""
        return tuple(name for name in REQUIRED if getattr(self, name) is None)

    @property
    def expires_at(self) -> float | None:
        """The Unix time expiry begins (00:00 UTC on ``expires``), or ``None`` without a date."""
        if self.expires is None:
            return None
        return float((self.expires - _EPOCH).days * 86_400)

    def expired(self, now: float) -> bool:
        """True from 00:00 UTC on the ``expires`` date on (never without a date)."""
        at = self.expires_at
        return at is not None and now >= at

    def describe_owner(self) -> str:
        """The owner for a message, or a sentence saying there is none."""
        return self.owner if self.owner is not None else "no owner named in the registry"


def check_owner(text: str) -> str | None:
    """The problem with an ``owner`` value, or ``None`` when it is one."""
    if not text.strip():
        return "an empty owner; name who answers for the use case (a team, a person, an address)"
    if len(text) > MAX_OWNER_CHARS or any(c in text for c in "\r\n"):
        return f"one line of at most {MAX_OWNER_CHARS} characters; got {len(text)} characters"
    return None


def check_data_review(text: str) -> str | None:
    """The problem with a ``data_review`` value, or ``None`` when it is a URL."""
    if len(text) > _MAX_URL_CHARS or not _URL.fullmatch(text):
        return f"expected an http:// or https:// URL (the review that approved the collection); got {text[:80]!r}"
    return None


def check_email(text: str) -> str | None:
    """The problem with one of ``notification_emails``, or ``None`` when it is an address."""
    if len(text) > 254 or not _EMAIL.fullmatch(text):
        return f"expected an e-mail address such as team@example.org; got {text[:80]!r}"
    return None


def metadata_warnings(use_cases: Iterable[tuple[str, UseCaseMetadata]], *, now: float) -> list[str]:
    """One line per use case that lacks an owner or an end date, or whose end date has passed.

    What ``check-config`` prints as warnings on both sides (the agent's and the collector's),
    so that both say the same thing of one registry.
    """
    lines = []
    for name, meta in use_cases:
        missing = meta.missing
        if missing:
            lacks = " and ".join(f"no {field}" for field in missing)
            lines.append(
                f"use case {name!r} has {lacks}: give it an owner and an expires date "
                "(`strict = true` at the top of the registry refuses a use case without them)"
            )
        if meta.expires is not None and meta.expired(now):
            lines.append(
                f"use case {name!r} expired on {meta.expires.isoformat()} (owner: {meta.describe_owner()}): "
                "agents record nothing more for it; a later expires date resumes it"
            )
    return lines
