"""What the distribution ships besides code: type markers, the license."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("package", ["protocol", "runtime", "agent", "collector", "fleet"])
def test_each_package_ships_its_py_typed_marker(package: str) -> None:
    """PEP 561: py.typed is in the package and listed as package data, so installed copies are typed."""
    assert (ROOT / package / "py.typed").is_file()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "py.typed" in project["tool"]["setuptools"]["package-data"][package]


def test_the_license_file_is_the_one_pyproject_names() -> None:
    """pyproject.toml says Apache-2.0, and LICENSE holds that license's text."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
