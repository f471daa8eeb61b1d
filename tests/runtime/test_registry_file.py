"""Reading the registry file: one message for a file that cannot be read, one dotted path for a bad field."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.registry import RegistryError
from runtime.errors import SettingFileError
from runtime.registry_file import read_registry, registry_field

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "usecases.example.toml"


def test_the_example_registry_reads() -> None:
    """deploy/usecases.example.toml reads and parses, with its path as the source."""
    registry = read_registry(EXAMPLE)
    assert registry.use_cases
    assert registry.source == str(EXAMPLE)


def test_a_missing_file_and_a_directory_name_the_setting(tmp_path: Path) -> None:
    """A file that cannot be read raises SettingFileError with the setting and the reason."""
    with pytest.raises(SettingFileError, match="No such file or directory") as info:
        read_registry(tmp_path / "none.toml", setting="registry.path")
    assert info.value.setting == "registry.path"
    with pytest.raises(SettingFileError, match="cannot read"):
        read_registry(tmp_path)


def test_a_bad_field_is_named_by_its_dotted_path(tmp_path: Path) -> None:
    """A registry mistake names the field as written in the file: use_cases.<name>.<field>."""
    bad = tmp_path / "r.toml"
    bad.write_text(EXAMPLE.read_text(encoding="utf-8").replace('period = "6h"', 'period = "2d"', 1), encoding="utf-8")
    with pytest.raises(RegistryError) as info:
        read_registry(bad)
    assert registry_field(info.value).startswith("use_cases.")
    assert registry_field(info.value).endswith(".period")
    bad.write_text(EXAMPLE.read_text(encoding="utf-8").replace("format = 1", "format = 2", 1), encoding="utf-8")
    with pytest.raises(RegistryError) as info:
        read_registry(bad)
    assert registry_field(info.value) == "format"
