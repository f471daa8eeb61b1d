"""The device half of every mechanism is pure Python: importing it and privatizing with it
never loads numpy (a device carries no numpy; docs/design.md, "Two halves of a mechanism")."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Each module here is a device half (or what one needs); a split mechanism adds its own.
DEVICE_MODULES = [
    "protocol.hashing",
    "protocol.randomized_response",
    "protocol.randomness",
]


@pytest.mark.parametrize("module", DEVICE_MODULES)
def test_a_device_half_loads_no_numpy(module: str) -> None:
    """Importing the module in a fresh interpreter leaves numpy unloaded."""
    code = f"import sys, {module}; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", f"{module} imports numpy"
