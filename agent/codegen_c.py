"""``ldp-agent generate --language c``: one typed function per use case, over the C client (clients/c/).

It writes a header of ``static inline`` functions, ``ldp_record_<use case>``, each calling the
client's function of its type, and an ``enum`` per use case with fixed categories (with a
function giving each constant's category). C99; it compiles with ``-Wall -Wextra -Werror``, so
a value of the wrong type is a compile error (``tests/clients/test_generate.py``). What each
function takes is :mod:`agent.codegen`'s reading of the mechanism.
"""

from __future__ import annotations

import re
import textwrap

from agent.codegen import Shape, Signature
from protocol.registry import Registry

__all__ = ["CLIENT_NAMES", "write_c"]

# The C type of each shape and the client function that records it (clients/c/ldp_client.h).
_CALLS = {
    Shape.BIT: ("bool", "ldp_record_bool"),
    Shape.COUNT: ("long long", "ldp_record_int"),
    Shape.NUMBER: ("double", "ldp_record_double"),
    Shape.STRING: ("const char *", "ldp_record_string"),
}


def _comment(lines: list[str], indent: str = "") -> str:
    """A block comment of ``lines``, wrapped; no ``*/`` inside can end it early."""
    body = []
    for line in lines:
        body += textwrap.wrap(line.replace("*/", "* /"), 96 - len(indent)) or [""]
    return "\n".join([f"{indent}/*", *(f"{indent} * {b}".rstrip() for b in body), f"{indent} */"])


def _literal(text: str) -> str:
    """``text`` as a C string literal: printable ASCII as is, every other byte of its UTF-8 in octal."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= byte < 0x7F and char != "?":  # "?" escaped too: no trigraph can form
            out.append(char)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _constant(text: str) -> str:
    return re.sub(r"[^0-9A-Z]+", "_", text.upper()).strip("_") or "VALUE"


CLIENT_NAMES = frozenset(
    (
        "LDP_AGENT_SOCKET",
        "LDP_BAD_REQUEST",
        "LDP_BUSY",
        "LDP_CLIENT_H",
        "LDP_CONSENT_REQUIRED",
        "LDP_DEFAULT_SOCKET",
        "LDP_DROPPED",
        "LDP_DUPLICATE",
        "LDP_INVALID_ARGUMENT",
        "LDP_MAX_REPLY_BYTES",
        "LDP_MAX_REQUEST_BYTES",
        "LDP_OK",
        "LDP_PATH_BYTES",
        "LDP_PROTOCOL_ERROR",
        "LDP_RECORDED",
        "LDP_REFUSED_OTHER",
        "LDP_REPLY_TOO_LARGE",
        "LDP_SOCKET_VARIABLE",
        "LDP_STATE_UNREADABLE",
        "LDP_STATE_UNWRITABLE",
        "LDP_TEXT_BYTES",
        "LDP_UNAVAILABLE",
        "LDP_UNKNOWN_USE_CASE",
        "LDP_USE_CASE_EXPIRED",
        "LDP_USE_CASE_STOPPED",
        "LDP_VALUE_REFUSED",
        "ldp_client",
        "ldp_client_init",
        "ldp_outcome",
        "ldp_outcome_kind",
        "ldp_outcome_name",
        "ldp_record_bool",
        "ldp_record_double",
        "ldp_record_int",
        "ldp_record_string",
        "ldp_record_text",
        "ldp_status",
        "ldp_status_name",
        "LDP_USE_CASES_H",
        "LDP_REGISTRY_HASH",
    )
)
"""Every name ldp_client.h declares, and this header's own: a generated name never takes one
(``tests/clients/test_generate.py`` keeps the list equal to the header's)."""


class _Names:
    """Hands out C names, each once, none of them the client's (a repeat gets ``_2``, ...)."""

    def __init__(self) -> None:
        self.taken = set(CLIENT_NAMES)

    def claim(self, name: str) -> str:
        candidate, n = name, 1
        while candidate in self.taken:
            n += 1
            candidate = f"{name}_{n}"
        self.taken.add(candidate)
        return candidate


def _function(sig: Signature, name: str, enum: tuple[str, str] | None) -> str:
    key = ", const char *key" if sig.counter else ""
    if enum is not None:
        enum_type, name_of = enum
        return "\n".join(
            [
                f"static inline ldp_status {name}(ldp_client *client, {enum_type} value, ldp_outcome *outcome) {{",
                f"    const char *name = {name_of}(value);",
                "    if (name == NULL)",
                "        return LDP_INVALID_ARGUMENT;",
                f"    return ldp_record_string(client, {_literal(sig.use_case)}, name, outcome);",
                "}",
            ]
        )
    c_type, call = _CALLS[sig.shape]
    args = f"client, {_literal(sig.use_case)}, value"
    if sig.shape in (Shape.COUNT, Shape.NUMBER):
        args += ", key" if sig.counter else ", NULL"
    head = f"static inline ldp_status {name}(ldp_client *client, {c_type} value{key}, ldp_outcome *outcome)"
    return "\n".join([f"{head} {{", f"    return {call}({args}, outcome);", "}"])


def _enum(sig: Signature, names: _Names) -> tuple[str, str, str]:
    """The enumeration of a use case's categories and the function naming each; (source, type, function)."""
    enum = names.claim(f"ldp_{sig.name}")
    name_of = names.claim(f"{enum}_name")
    prefix = f"LDP_{_constant(sig.name)}_"
    constants = [names.claim(prefix + _constant(c)) for c in sig.categories]
    lines = [f"typedef enum {enum} {{"]
    lines += [f"    {c}," for c in constants]
    lines += [f"}} {enum};", "", f"/* The category each constant of {enum} stands for (NULL for no constant). */"]
    lines.append(f"static inline const char *{name_of}({enum} value) {{")
    lines.append("    switch (value) {")
    for constant, category in zip(constants, sig.categories, strict=True):
        lines += [f"    case {constant}:", f"        return {_literal(category)};"]
    lines += ["    }", "    return NULL;", "}"]
    return "\n".join(lines), enum, name_of


def write_c(registry: Registry, sigs: list[Signature]) -> str:
    """The C header for ``registry``'s use cases (their :class:`~agent.codegen.Signature`)."""
    guard = "LDP_USE_CASES_H"
    parts = [
        _comment(
            [
                f"Typed recording for the use cases of {registry.source} (registry {registry.hash_hex}).",
                "Written by `ldp-agent generate --language c`: write it again when the registry changes. "
                "Each function records one value through the agent's socket with the C client (clients/c/, "
                "ldp_client.h; link with libldp_client.a) and returns its status; `outcome` may be NULL.",
            ]
        ),
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        "#include <stdbool.h>",
        "#include <stddef.h>",
        "",
        '#include "ldp_client.h"',
        "",
        f"#define LDP_REGISTRY_HASH {_literal(registry.hash_hex)}",
    ]
    names = _Names()
    for sig in sigs:
        parts += ["", _comment(list(sig.doc))]
        enum = None
        if sig.shape is Shape.CATEGORY:
            source, enum_type, name_of = _enum(sig, names)
            parts += [source, ""]
            enum = (enum_type, name_of)
        parts.append(_function(sig, names.claim(f"ldp_record_{sig.name}"), enum))
    parts += ["", f"#endif /* {guard} */"]
    return "\n".join(parts) + "\n"
