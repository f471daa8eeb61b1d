"""``ldp-agent generate``: the Python it writes passes mypy --strict and the C compiles with -Wall -Wextra
-Werror, for both example registries; a wrong type in a call fails to type-check or to compile; values
recorded through the generated code reach a real agent; a mechanism it has never seen gets typed code."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agent.client import AgentClient, AsyncAgentClient, Outcome
from agent.codegen import GenerateError, signatures
from agent.codegen_c import CLIENT_NAMES
from agent.generate import LANGUAGES, generate
from protocol.registry import BUILTIN_MECHANISMS, Registry, parse_registry
from tests.clients.cbuild import CLIENT, CBuild, build
from tests.clients.conftest import FLEET_REGISTRY, ROOT, RunningAgent
from tests.krr import ENTRY as KRR

EXAMPLES = (ROOT / "deploy" / "usecases.example.toml", FLEET_REGISTRY)
SAMPLE = {"bool": "True", "int": "1", "float": "1.5", "str": '"hello"'}
"""A value of each Python type the generated methods take (a string of a-z: every alphabet has it)."""
C_SAMPLE = {"bool": "true", "long long": "1", "double": "1.5", "const char *": '"hello"'}


def _registry(path: Path) -> Registry:
    return parse_registry(path.read_bytes(), source=path.name)


@pytest.fixture(scope="module")
def c_client(tmp_path_factory: pytest.TempPathFactory) -> CBuild:
    """The C client, built once for these tests."""
    return build(tmp_path_factory.mktemp("c-client-generate"))


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def _calls(module: ModuleType, target: str, *, awaited: bool) -> list[str]:
    """A call of every record method of ``module.Telemetry`` with a value of its type (categories: the first)."""
    lines = []
    for name, method in inspect.getmembers(module.Telemetry, inspect.isfunction):
        if not name.startswith("record_"):
            continue
        annotation = inspect.signature(method).parameters["value"].annotation
        value = SAMPLE.get(annotation) or f"list({module.__name__}.{annotation})[0]"
        key = ', key="editor"' if "key" in inspect.signature(method).parameters else ""
        lines.append(f"    {'await ' if awaited else ''}{target}.{name}({value}{key})")
    return lines


def _mypy(directory: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    """``mypy --strict`` on ``files``, with no configuration but the flag, finding ``agent`` in this tree."""
    env = dict(os.environ, MYPYPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(directory / ".mypy_cache"), *map(str, files)],
        capture_output=True,
        text=True,
        cwd=directory,
        env=env,
        timeout=600,
        check=False,
    )


def test_the_generated_python_passes_mypy_strict_and_a_wrong_type_fails_it(tmp_path: Path) -> None:
    """Both example registries: the module and a program calling every method type-check under --strict;
    a string for a counter, a bare string for a category and a key for a non-counter do not."""
    files = []
    for path in EXAMPLES:
        module_path = tmp_path / f"telemetry_{path.stem.replace('.', '_')}.py"
        module_path.write_text(generate(_registry(path), "python"), encoding="utf-8")
        module = _load(module_path)
        use = tmp_path / f"use_{module_path.stem}.py"
        use.write_text(
            "\n".join(
                [
                    f"import {module.__name__}",
                    "",
                    "",
                    f"def main(t: {module.__name__}.Telemetry) -> None:",
                    *_calls(module, "t", awaited=False),
                    "",
                    "",
                    f"async def amain(t: {module.__name__}.AsyncTelemetry) -> None:",
                    *_calls(module, "t", awaited=True),
                    "",
                ]
            ),
            encoding="utf-8",
        )
        files += [module_path, use]
    checked = _mypy(tmp_path, *files)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Success: no issues found in 4 source files" in checked.stdout
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        "from telemetry_fleet_usecases import Telemetry\n\n\n"
        "def main(t: Telemetry) -> None:\n"
        '    t.record_app_usage_seconds("thirty", key="editor")\n'
        '    t.record_default_browser("firefox")\n'
        '    t.record_emoji("x", key="k")\n',
        encoding="utf-8",
    )
    refused = _mypy(tmp_path, wrong)
    assert refused.returncode == 1, refused.stdout
    assert 'Argument 1 to "record_app_usage_seconds" of "Telemetry" has incompatible type "str"; expected "int"' in (
        refused.stdout
    )
    assert 'has incompatible type "str"; expected "DefaultBrowser"' in refused.stdout
    assert 'Unexpected keyword argument "key" for "record_emoji" of "Telemetry"' in refused.stdout


def _header_calls(header: str) -> list[str]:
    """A call of every function the generated header declares, with a value of its C type."""
    firsts = dict(re.findall(r"typedef enum (\w+) \{\n    (\w+),", header))  # enum type -> its first constant
    calls = []
    for name, c_type, key in re.findall(
        r"static inline ldp_status (\w+)\(ldp_client \*client, (.+?) value(, const char \*key)?, ldp_outcome", header
    ):
        value = C_SAMPLE.get(c_type) or firsts[c_type]
        keyed = ', "editor"' if key else ""
        calls.append(f'    report("{name}", {name}(&client, {value}{keyed}, &outcome));')
    return calls


_MAIN = """
#include <stdio.h>

static int failures;

static void report(const char *function, ldp_status status) {
    printf("%s %s\\n", function, ldp_status_name(status));
    if (status != LDP_OK)
        failures++;
}

int main(int argc, char **argv) {
    ldp_client client;
    ldp_outcome outcome;
    (void)outcome;
    if (ldp_client_init(&client, argc > 1 ? argv[1] : NULL) != LDP_OK)
        return 2;
"""


def _program(header: Path, calls: list[str]) -> str:
    return f'#include "{header.name}"\n{_MAIN}' + "\n".join(calls) + "\n    return failures ? 1 : 0;\n}\n"


def test_the_generated_c_compiles_with_every_warning_an_error_and_a_wrong_type_does_not(
    c_client: CBuild, tmp_path: Path
) -> None:
    """Both example registries: the header and a program calling every function compile under -Wall -Wextra
    -Werror -pedantic (C99); a string for a counter and a string for a category are compile errors."""
    for path in EXAMPLES:
        header = tmp_path / f"{path.stem.replace('.', '_')}.h"
        text = generate(_registry(path), "c")
        header.write_text(text, encoding="utf-8")
        program = tmp_path / f"use_{header.stem}.c"
        program.write_text(_program(header, _header_calls(text)), encoding="utf-8")
        built = c_client.compile([program], tmp_path / f"use_{header.stem}", f"-I{tmp_path}")
        assert built.returncode == 0, built.stderr
        assert len(_header_calls(text)) == len(_registry(path).use_cases)
    wrong = tmp_path / "wrong.c"
    for call in (
        'ldp_record_app_usage_seconds(&client, "thirty", "editor", NULL)',
        'ldp_record_default_browser(&client, "firefox", NULL)',
    ):
        wrong.write_text(_program(tmp_path / "fleet_usecases.h", [f"    (void){call};"]), encoding="utf-8")
        refused = c_client.compile([wrong], tmp_path / "wrong", f"-I{tmp_path}")
        assert refused.returncode != 0, call
        assert "error" in refused.stderr
        assert call.split("(")[0] in refused.stderr, refused.stderr


def test_values_recorded_through_the_generated_code_reach_a_real_agent(
    c_client: CBuild, running_agent: RunningAgent, tmp_path: Path
) -> None:
    """Every generated Python method (blocking and asyncio) and every generated C function records into
    a daemon with the same registry; the agent's status shows the values waiting."""
    registry = _registry(FLEET_REGISTRY)
    module_path = tmp_path / "telemetry_live.py"
    module_path.write_text(generate(registry, "python"), encoding="utf-8")
    module: Any = _load(module_path)
    telemetry = module.Telemetry(AgentClient(running_agent.socket))
    replies = [
        telemetry.record_app_usage_seconds(60, key="editor"),
        telemetry.record_app_usage_histogram(120.5),
        telemetry.record_dark_mode_enabled(True),
        telemetry.record_default_browser(module.DefaultBrowser.FIREFOX),
        telemetry.record_emoji("😀"),
        telemetry.record_safari_energy_domains("example.com"),
    ]
    assert [r.outcome for r in replies] == [Outcome.RECORDED] * 6
    assert [r.counter for r in replies] == [True, True, False, False, False, False]
    aio = module.AsyncTelemetry(AsyncAgentClient(running_agent.socket))
    assert asyncio.run(aio.record_default_browser(module.DefaultBrowser.FIREFOX)).outcome is Outcome.DUPLICATE
    header = tmp_path / "live.h"
    header.write_text(generate(registry, "c"), encoding="utf-8")
    program = tmp_path / "live.c"
    program.write_text(_program(header, _header_calls(header.read_text(encoding="utf-8"))), encoding="utf-8")
    built = c_client.compile([program], tmp_path / "live", f"-I{tmp_path}")
    assert built.returncode == 0, built.stderr
    ran = subprocess.run(
        [str(tmp_path / "live"), str(running_agent.socket)], capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.count(" ok\n") == len(registry.use_cases)
    status = running_agent.cli("status", "--json")
    rows = {row["use_case"]: row for row in json.loads(status.stdout)["use_cases"]}
    assert rows["emoji"]["pending_records"] == 1  # one a day: the reservoir keeps one of the two
    assert rows["app-usage-seconds"]["open_counters"] == 1  # the key "editor", from both


def test_a_mechanism_the_generator_has_never_seen_gets_typed_code(c_client: CBuild, tmp_path: Path) -> None:
    """k-ary randomized response (tests/krr.py, outside the packages) over categories: an enumeration in
    both languages, asked of the mechanism; the generator's modules name no mechanism."""
    text = """
format = 1
[use_cases.theme]
owner = "design-systems@example.org"
expires = 2030-01-01
description = "The colour theme."
mechanism = "krr"
epsilon = 1
period = "1d"
daily_limit = 1
lifetime_epsilon = 10
parameters = { categories = ["light", "dark", "high contrast", "1990s \\"retro\\"", "café"] }
[use_cases.theme.collector]
min_reports = 10
"""
    registry = parse_registry(text, source="themes.toml", mechanisms=(*BUILTIN_MECHANISMS, KRR))
    python = generate(registry, "python")
    assert "class Theme(enum.Enum):" in python
    assert "    HIGH_CONTRAST = 'high contrast'" in python
    assert "    V_1990S_RETRO = '1990s \"retro\"'" in python
    assert "def record_theme(self, value: Theme) -> RecordReply:" in python
    module_path = tmp_path / "themes.py"
    module_path.write_text(python, encoding="utf-8")
    assert [m.value for m in _load(module_path).Theme] == ["light", "dark", "high contrast", '1990s "retro"', "café"]
    header = tmp_path / "themes.h"
    header.write_text(generate(registry, "c"), encoding="utf-8")
    calls = [
        f'    report("t", ldp_record_theme(&client, {c}, NULL));'
        for c in ("LDP_THEME_LIGHT", "LDP_THEME_HIGH_CONTRAST", "LDP_THEME_1990S_RETRO", "LDP_THEME_CAF")
    ]
    program = tmp_path / "themes.c"
    program.write_text(_program(header, calls), encoding="utf-8")
    assert c_client.compile([program], tmp_path / "themes", f"-I{tmp_path}").returncode == 0
    assert '"1990s \\"retro\\""' in header.read_text(encoding="utf-8")
    assert '"caf\\303\\251"' in header.read_text(encoding="utf-8")  # UTF-8 bytes, in octal
    names = {e.name for e in BUILTIN_MECHANISMS} | {"krr", "rappor-basic"}
    for module in ("codegen", "codegen_python", "codegen_c", "generate"):
        tree = ast.parse((ROOT / "agent" / f"{module}.py").read_text(encoding="utf-8"))
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert not strings & names, (module, strings & names)


def test_names_that_would_clash_are_made_distinct_or_refused(c_client: CBuild, tmp_path: Path) -> None:
    """A use case named like a client function gets another C name; two use cases of one identifier are refused."""
    text = """
format = 1
[use_cases.bool]
mechanism = "rr"
epsilon = 1
period = "1d"
daily_limit = 1
lifetime_epsilon = 10
[use_cases.bool.collector]
min_reports = 10
"""
    header = tmp_path / "clash.h"
    header.write_text(generate(parse_registry(text, source="clash.toml"), "c"), encoding="utf-8")
    assert "ldp_record_bool_2(ldp_client *client, bool value" in header.read_text(encoding="utf-8")
    program = tmp_path / "clash.c"
    program.write_text(_program(header, ['    report("b", ldp_record_bool_2(&client, true, NULL));']), encoding="utf-8")
    assert c_client.compile([program], tmp_path / "clash", f"-I{tmp_path}").returncode == 0
    twice = text.replace("bool", "bo-ol") + text.replace("bool", "bo_ol").replace("format = 1", "", 1)
    both = parse_registry(twice, source="twice.toml")
    with pytest.raises(GenerateError, match="both make the identifier 'bo_ol'"):
        signatures(both)


def test_the_client_names_the_c_generator_avoids_are_the_headers(tmp_path: Path) -> None:
    """CLIENT_NAMES is every name clients/c/ldp_client.h declares, and the generated header's own two."""
    header = (CLIENT / "ldp_client.h").read_text(encoding="utf-8")
    declared = set(re.findall(r"\b(LDP_[A-Z_]+|ldp_[a-z_]+)\b", header))
    assert declared | {"LDP_USE_CASES_H", "LDP_REGISTRY_HASH"} == CLIENT_NAMES


def test_the_command_prints_the_code_without_an_agent_config(tmp_path: Path) -> None:
    """`ldp-agent generate` needs no config; an unreadable or invalid registry exits 2 naming it."""
    env = dict(os.environ, LDP_AGENT_CONFIG=str(tmp_path / "none.toml"))
    for language in LANGUAGES:
        done = subprocess.run(
            [sys.executable, "-m", "agent", "generate", "--language", language, str(FLEET_REGISTRY)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == generate(
            parse_registry(FLEET_REGISTRY.read_bytes(), source=str(FLEET_REGISTRY)), language
        )
    bad = tmp_path / "bad.toml"
    bad.write_text("format = 1\n[use_cases.x]\nmechanism = 'laplace'\n", encoding="utf-8")
    for path, words in ((tmp_path / "missing.toml", "cannot read"), (bad, "is required but missing")):
        done = subprocess.run(
            [sys.executable, "-m", "agent", "generate", "--language", "c", str(path)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2
        assert words in done.stderr
        assert str(path) in done.stderr
