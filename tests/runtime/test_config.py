"""Config files: read, parsed and decoded with one error type naming the file and the field."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from runtime.config import load_config_file, parse_config_text
from runtime.errors import ConfigFileError


@dataclass(frozen=True, kw_only=True)
class Files:
    data: Path
    socket: Path | None = None


@dataclass(frozen=True, kw_only=True)
class Doc:
    files: Files


def test_relative_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    """A config and the files it names move together; ~ is the user's home."""
    path = tmp_path / "c.toml"
    path.write_text('[files]\ndata = "state/data"\nsocket = "/run/x.sock"\n', encoding="utf-8")
    doc = load_config_file(Doc, path)
    assert doc.files.data == tmp_path / "state" / "data"
    assert doc.files.socket == Path("/run/x.sock")
    home = parse_config_text(Doc, '[files]\ndata = "~/d"\n', source="c.toml", base=tmp_path)
    assert home.files.data == Path("~/d").expanduser()


@pytest.mark.parametrize(
    ("text", "field", "kind", "words"),
    [
        ("[files\n", "", "syntax", "not valid TOML"),
        ("[files]\n", "files.data", "missing-field", "is required"),
        ('[files]\ndata = ""\n', "files.data", "bad-type", "expected a path"),
        ("[files]\ndata = 3\n", "files.data", "bad-type", "expected a path; got integer 3"),
    ],
)
def test_errors_name_the_file_and_the_field(text: str, field: str, kind: str, words: str) -> None:
    """Syntax errors and schema errors alike are ConfigFileError with the file, the field and a kind."""
    with pytest.raises(ConfigFileError, match=words) as info:
        parse_config_text(Doc, text, source="c.toml", base=Path("/etc"))
    assert (info.value.path, info.value.field, info.value.kind) == ("c.toml", field, kind)
    assert str(info.value).startswith(f"c.toml: {field}: " if field else "c.toml: ")


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    """A missing file or one that is not UTF-8 is refused, naming it."""
    with pytest.raises(ConfigFileError, match="cannot read the file: No such file or directory") as info:
        load_config_file(Doc, tmp_path / "none.toml")
    assert info.value.kind == "unreadable"
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'[files]\ndata = "\xe9"\n')
    with pytest.raises(ConfigFileError, match="cannot read the file"):
        load_config_file(Doc, latin)
