"""The shared TOML schema reader: every mistake names the field, says what was expected and what was found."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import FrozenInstanceError, dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import pytest

from protocol.schema import EMPTY_IS_NONE, Invalid, Range, SchemaError, check_ranges, decode


@dataclass(frozen=True, kw_only=True)
class Uptime:
    kind: ClassVar[str] = "uptime"
    use_case: str


@dataclass(frozen=True, kw_only=True)
class Names:
    kind: ClassVar[str] = "names"
    use_case: str
    most: Annotated[int, Range(1, 512)] = 512


@dataclass(frozen=True, kw_only=True)
class Server:
    MOVED_KEYS: ClassVar[Mapping[str, str]] = {"alphabet": "moved to the registry"}
    host: str
    port: Annotated[int, Range(1, 65535)] = 8883
    ratio: Annotated[float, Range(0, 60, low_open=True)] = 1.0
    user: Annotated[str | None, EMPTY_IS_NONE] = None
    cert: Path | None = None
    key: Path | None = None
    level: Literal["info", "debug"] = "info"
    internal: str = field(default="", metadata={"internal": True})

    def __post_init__(self) -> None:
        check_ranges(self)
        if (self.cert is None) != (self.key is None):
            raise Invalid("key", "cert and key go together")


@dataclass(frozen=True, kw_only=True)
class Doc:
    server: Server
    probes: tuple[Uptime | Names, ...] = ()
    targets: Mapping[str, str] = field(default_factory=dict)
    extra: Any = None


def test_a_good_document_decodes_into_frozen_typed_values() -> None:
    """Types are built as declared (int to float, paths, read-only tables, tagged tables); the result is frozen."""
    doc = decode(
        Doc,
        {
            "server": {"host": "h", "ratio": 2, "user": "", "cert": "c", "key": "k"},
            "probes": [{"kind": "uptime", "use_case": "u"}, {"kind": "names", "use_case": "n", "most": 3}],
            "targets": {"a": "b"},
            "extra": [1, "x"],
        },
    )
    assert doc.server.ratio == 2.0
    assert isinstance(doc.server.ratio, float)
    assert doc.server.user is None
    assert doc.server.cert == Path("c")
    assert doc.probes == (Uptime(use_case="u"), Names(use_case="n", most=3))
    assert doc.extra == [1, "x"]
    with pytest.raises(TypeError):
        doc.targets["c"] = "d"  # type: ignore[index]
    with pytest.raises(FrozenInstanceError):
        doc.server.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("server", "where", "kind", "words"),
    [
        (
            {"host": "h", "port": "1883"},
            "server.port",
            "bad-type",
            "expected an integer in [1, 65535]; got string '1883'",
        ),
        ({"host": "h", "port": 70000}, "server.port", "out-of-range", "expected an integer in [1, 65535]; got 70000"),
        ({"host": "h", "port": True}, "server.port", "bad-type", "got boolean True"),
        ({"host": "h", "ratio": 0}, "server.ratio", "out-of-range", "expected a number in (0, 60]; got 0"),
        ({"host": "h", "ratio": float("nan")}, "server.ratio", "out-of-range", "(0, 60]"),
        ({"host": "h", "prot": 1}, "server.prot", "unknown-key", "unknown key (known: cert, host, key, level"),
        ({"host": "h", "internal": "x"}, "server.internal", "unknown-key", "unknown key"),
        ({"host": "h", "alphabet": "ab"}, "server.alphabet", "unknown-key", "moved to the registry"),
        ({"port": 1}, "server.host", "missing-field", "is required but missing"),
        ({"host": "h", "cert": "c"}, "server.key", "bad-value", "cert and key go together"),
        ({"host": "h", "level": "loud"}, "server.level", "bad-value", "must be one of 'info', 'debug'; got string"),
        ({"host": "h", "cert": ""}, "server.cert", "bad-type", "expected a path"),
        ({"host": 3}, "server.host", "bad-type", "expected a string; got integer 3"),
    ],
)
def test_each_mistake_names_its_field_and_kind(server: object, where: str, kind: str, words: str) -> None:
    """Wrong type, out of range, unknown, moved, missing, cross-field, not one of: field, kind and message."""
    with pytest.raises(SchemaError) as info:
        decode(Doc, {"server": server})
    assert (info.value.field, info.value.kind) == (where, kind)
    assert words in info.value.problem
    assert str(info.value).startswith(f"{where}: ")


def test_arrays_and_tagged_tables_name_their_index() -> None:
    """An element of an array is named by its index; a table's kind must be one of the known ones."""
    with pytest.raises(SchemaError) as info:
        decode(Doc, {"server": {"host": "h"}, "probes": [{"kind": "uptime", "use_case": "u"}, {"kind": "gps"}]})
    assert info.value.field == "probes[1].kind"
    assert "must be one of 'names', 'uptime'; got 'gps'" in info.value.problem
    with pytest.raises(SchemaError) as info:
        decode(Doc, {"server": {"host": "h"}, "probes": [{"kind": "names", "use_case": "n", "most": 0}]})
    assert info.value.field == "probes[0].most"
    with pytest.raises(SchemaError, match="expected an array; got a table"):
        decode(Doc, {"server": {"host": "h"}, "probes": {}})
    with pytest.raises(SchemaError, match="expected a table; got integer 3") as info:
        decode(Doc, {"server": 3})
    assert info.value.field == "server"


def test_values_built_in_code_meet_the_same_ranges() -> None:
    """check_ranges in __post_init__ refuses what the decoder would, with the same message."""
    with pytest.raises(Invalid, match=r"expected an integer in \[1, 65535\]; got 0"):
        Server(host="h", port=0)


def test_hooks_decode_their_type() -> None:
    """A hook replaces the built-in decoding of its type (a config resolves relative paths with one)."""
    doc = decode(
        Doc, {"server": {"host": "h", "cert": "c", "key": "k"}}, hooks={Path: lambda raw, where: Path("/b", str(raw))}
    )
    assert doc.server.cert == Path("/b/c")


def test_json_null_is_none_only_where_the_schema_allows_none() -> None:
    """A JSON null reads as None for an optional field and is refused, naming the field, for another."""
    doc = decode(Server, {"host": "h", "user": None, "cert": None, "key": None})
    assert (doc.user, doc.cert) == (None, None)
    with pytest.raises(SchemaError) as caught:
        decode(Server, {"host": None})
    assert (caught.value.field, caught.value.kind) == ("host", "bad-type")
