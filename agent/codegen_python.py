"""``ldp-agent generate --language python``: one typed method per use case, over :mod:`agent.client`.

The module it writes holds an enumeration per use case with fixed categories, and two classes
with one ``record_<use case>`` method per use case: ``Telemetry`` (blocking, over
:class:`agent.client.AgentClient`) and ``AsyncTelemetry`` (asyncio). It passes ``mypy
--strict``, so a wrong value is found when the application is type-checked
(``tests/clients/test_generate.py``). What each method takes is :mod:`agent.codegen`'s reading
of the mechanism.
"""

from __future__ import annotations

import re
import textwrap

from agent.codegen import Shape, Signature, unique
from protocol.registry import Registry

__all__ = ["write_python"]

_TYPES = {Shape.BIT: "bool", Shape.COUNT: "int", Shape.NUMBER: "float", Shape.STRING: "str"}
_CLASSES = ("Telemetry", "AsyncTelemetry")
# The module's other names, which no enumeration may take.
_TAKEN = (*_CLASSES, "AgentClient", "AsyncAgentClient", "RecordReply", "REGISTRY_HASH")


def _docstring(lines: list[str], indent: str) -> str:
    """A triple-quoted docstring of ``lines``, wrapped, whatever characters they hold."""
    body = []
    for i, line in enumerate(lines):
        text = line.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
        body += textwrap.wrap(text, 96 - len(indent)) or [""]
        if i == 0 and len(lines) > 1:
            body.append("")
    first, *rest = body
    out = f'{indent}"""{first}'
    for line in rest:
        out += f"\n{indent}{line}" if line else "\n"
    return out + (f'\n{indent}"""' if rest else '"""')


def _class_name(use_case: str) -> str:
    words = re.findall(r"[0-9a-zA-Z]+", use_case)
    name = "".join(w[:1].upper() + w[1:] for w in words) or "Categories"
    return name if name[0].isalpha() else f"UseCase{name}"


def _member(category: str) -> str:
    name = re.sub(r"[^0-9a-zA-Z]+", "_", category).strip("_").upper()
    return name if name[:1].isalpha() else f"V_{name}" if name else "V"


def _enums(sigs: list[Signature]) -> dict[str, str]:
    """The enumeration's class name of each use case with categories (none clashes with another name)."""
    wanted = [s for s in sigs if s.shape is Shape.CATEGORY]
    names = unique([*_TAKEN, *(_class_name(s.use_case) for s in wanted)])[len(_TAKEN) :]
    return {s.use_case: name for s, name in zip(wanted, names, strict=True)}


def _enum_source(sig: Signature, name: str) -> str:
    lines = [f"class {name}(enum.Enum):", _docstring([f"The categories of use case {sig.use_case!r}."], "    "), ""]
    for member, category in zip(unique([_member(c) for c in sig.categories]), sig.categories, strict=True):
        lines.append(f"    {member} = {category!r}")
    return "\n".join(lines)


def _method(sig: Signature, enum_name: str | None, *, asynchronous: bool) -> str:
    value_type = enum_name or _TYPES[sig.shape]
    key = ", *, key: str | None = None" if sig.counter else ""
    sent = "value.value" if enum_name else "value"
    call = f"self.client.record({sig.use_case!r}, {sent}{', key=key' if sig.counter else ''})"
    head = "async def" if asynchronous else "def"
    return "\n".join(
        [
            f"    {head} record_{sig.name}(self, value: {value_type}{key}) -> RecordReply:",
            _docstring(list(sig.doc), "        "),
            f"        return {'await ' if asynchronous else ''}{call}",
        ]
    )


def write_python(registry: Registry, sigs: list[Signature]) -> str:
    """The Python module for ``registry``'s use cases (their :class:`~agent.codegen.Signature`)."""
    enums = _enums(sigs)
    exported = sorted([*_CLASSES, *enums.values(), "REGISTRY_HASH"])
    parts = [
        _docstring(
            [
                f"Typed recording for the use cases of {registry.source} (registry {registry.hash_hex}).",
                "Written by `ldp-agent generate --language python`: write it again when the registry changes. "
                "Each method records one value through the agent's socket (agent.client) and returns what the "
                "agent did with it; a refusal raises the agent.client exception of its kind.",
            ],
            "",
        ),
        "",
        "from __future__ import annotations",
        "",
        "import enum",
        "",
        "from agent.client import AgentClient, AsyncAgentClient, RecordReply",
        "",
        f"__all__ = {exported!r}",
        "",
        f"REGISTRY_HASH = {registry.hash_hex!r}",
        '"""The canonical hash of the registry this module was written from."""',
    ]
    for sig in sigs:
        if sig.use_case in enums:
            parts += ["", "", _enum_source(sig, enums[sig.use_case])]
    for cls, client, asynchronous in (
        ("Telemetry", "AgentClient", False),
        ("AsyncTelemetry", "AsyncAgentClient", True),
    ):
        how = "asyncio" if asynchronous else "blocking"
        parts += [
            "",
            "",
            f"class {cls}:",
            _docstring([f"One method per use case, recording through {client} ({how})."], "    "),
            "",
            f"    def __init__(self, client: {client} | None = None) -> None:",
            f"        self.client = client if client is not None else {client}()",
        ]
        for sig in sigs:
            parts += ["", _method(sig, enums.get(sig.use_case), asynchronous=asynchronous)]
    return "\n".join(parts) + "\n"
