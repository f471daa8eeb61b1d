"""``ldp-agent generate``: the writer of each language, over :func:`agent.codegen.signatures`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from agent.codegen import Signature, signatures
from agent.codegen_c import write_c
from agent.codegen_python import write_python
from protocol.registry import Registry

__all__ = ["LANGUAGES", "generate"]

_WRITERS: Final[dict[str, Callable[[Registry, list[Signature]], str]]] = {"python": write_python, "c": write_c}

LANGUAGES: Final = tuple(_WRITERS)
"""The languages ``ldp-agent generate --language`` writes."""


def generate(registry: Registry, language: str) -> str:
    """The code of ``language`` (one of :data:`LANGUAGES`) for every use case of ``registry``.

    Raises:
        agent.codegen.GenerateError: two use cases make the same identifier.
        ValueError: an unknown language.
    """
    writer = _WRITERS.get(language)
    if writer is None:
        raise ValueError(f"unknown language {language!r}; one of {', '.join(LANGUAGES)}")
    return writer(registry, signatures(registry))
