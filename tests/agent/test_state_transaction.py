"""The device's state has one transaction: nothing outside writes into the state in memory, every
use-case file is sealed by agent.transaction.commit, and a step leaves the state it was computed from
as it was (docs/state-integrity.md, "The manifest")."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from agent import transaction
from agent.core import Agent
from agent.device_state import DeviceState, Slot
from agent.sealed import Sealer
from agent.statefiles import StateFiles
from protocol.plain import Plain
from protocol.randomness import SeededRandom
from protocol.receipts import Receipt
from protocol.registry import Registry, parse_registry
from tests.agent.conftest import KEY, REGISTRY
from tests.support.clocks import FakeClock

ROOT = Path(__file__).resolve().parents[2]
DAY = 86_400.0
VALUES: dict[str, tuple[object, str | None]] = {
    "flag": (1, None),
    "seconds": (600, "editor"),
    "hist": (300.0, None),
    "procs": ("bash", None),
    "words": ("hello", None),
}
_MUTATORS = frozenset({"append", "extend", "insert", "pop", "clear", "update", "setdefault", "remove", "sort"})


# ---------------------------------------------------------------------------- who writes into the model


def _chain(node: ast.expr) -> list[str]:
    """The attribute names of ``a.b.c[...]`` from the outermost in: ``["c", "b"]``, and the base's name."""
    names: list[str] = []
    while isinstance(node, ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
        node = node.value
    names.append(node.id if isinstance(node, ast.Name) else "")
    return names


def _targets(tree: ast.AST) -> Iterator[ast.expr]:
    """Every expression stored into or deleted, and every object a mutating method is called on."""
    for node in ast.walk(tree):
        found: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            found = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            found = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            found = [node.func.value]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
            name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            if name in ("setattr", "__setattr__", "__delattr__", "delattr") and node.args:
                found = [ast.copy_location(ast.Attribute(value=node.args[0], attr="<setattr>", ctx=ast.Store()), node)]
        while found:
            target = found.pop()
            if isinstance(target, ast.Tuple | ast.List):
                found.extend(target.elts)
            elif isinstance(target, ast.Starred):
                found.append(target.value)
            else:
                yield target


def _model_names() -> frozenset[str]:
    """The fields of the state in memory and the attributes of the file I/O's instances."""
    files = ast.parse((ROOT / "agent" / "statefiles.py").read_text(encoding="utf-8"))
    io_attributes = {t.attr for t in _targets(files) if isinstance(t, ast.Attribute) and _chain(t)[1:] == ["self"]}
    fields = {f.name for cls in (DeviceState, Slot) for f in dataclasses.fields(cls)}
    return frozenset(io_attributes | fields)


def _violations(source: str, names: frozenset[str]) -> list[str]:
    """Where ``source`` writes into the state in memory or the file I/O's attributes: a store, a
    deletion or a mutating call on an attribute chain that passes through one of ``names``, on
    anything but ``self`` itself."""
    out = []
    for target in _targets(ast.parse(source)):
        chain = _chain(target)
        if chain[-1] == "self" and len(chain) == 2:
            continue  # an object setting its own attribute (the frozen model has no such code)
        if "<setattr>" in chain or set(chain[:-1]) & names:
            out.append(f"line {target.lineno}: {ast.unparse(target)}")
    return out


def test_no_module_of_the_agent_writes_into_the_state_in_memory() -> None:
    """No module of agent/ assigns, deletes or mutates an attribute of the state model or of StateFiles."""
    names = _model_names()
    found = {}
    for path in sorted((ROOT / "agent").glob("*.py")):
        bad = _violations(path.read_text(encoding="utf-8"), names)
        if bad:
            found[path.name] = bad
    assert not found, found


def test_the_ownership_check_finds_the_writes_it_forbids() -> None:
    """The check above is not vacuous: the writes of the code before the transaction are found."""
    before = """
def apply(files, slot, manifest, notices, consent):
    files.manifest = manifest
    self._files.load_blocked = e
    slot.broken = "why"
    slot.stale = False
    files.ledger.notices.extend(notices)
    files.slots[slot.name] = slot
    state.slots["x"].doc.permanent[b"k"] = 1
    object.__setattr__(state, "manifest", manifest)
"""
    assert len(_violations(before, _model_names())) == 8


def test_the_state_in_memory_is_frozen_and_the_file_io_holds_no_public_attribute(tmp_path: Path) -> None:
    """DeviceState and Slot are frozen; a StateFiles' attributes are private (read through properties)."""
    for cls in (DeviceState, Slot):
        assert getattr(cls, "__dataclass_params__").frozen, cls  # noqa: B009  a dataclass's own parameters
    files = StateFiles(tmp_path / "state", Sealer(KEY))
    assert all(name.startswith("_") for name in vars(files)), vars(files)
    with pytest.raises(dataclasses.FrozenInstanceError):
        DeviceState().manifest = None  # type: ignore[misc]


# ---------------------------------------------------------------------------- every step through the transaction


SYNC = "<fsync of the directory>"
"""What :class:`_Watch` records when a rename is made durable."""


class _Watch:
    """Which sealed files are written, and whether inside agent.transaction.commit."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.inside = False
        self.commits: list[transaction.Change] = []
        self.writes: list[tuple[str, bool]] = []
        real = transaction.commit

        def commit(files: StateFiles, state: DeviceState, change: transaction.Change) -> DeviceState:
            self.inside = True
            self.commits.append(change)
            try:
                return real(files, state, change)
            finally:
                self.inside = False

        monkeypatch.setattr(transaction, "commit", commit)
        watch = self

        class WatchingSealer(Sealer):
            def write(
                self, path: Path, purpose: str, version: int, document: Plain, *, sync_directory: bool = True
            ) -> None:
                watch.writes.append((path.name, watch.inside))
                super().write(path, purpose, version, document, sync_directory=sync_directory)
                if sync_directory:
                    watch.writes.append((SYNC, watch.inside))

        real_sync = StateFiles.sync

        def sync(files: StateFiles) -> None:
            watch.writes.append((SYNC, watch.inside))
            real_sync(files)

        monkeypatch.setattr(StateFiles, "sync", sync)

        self.sealer = WatchingSealer(KEY)

    def step(self) -> tuple[list[transaction.Change], list[tuple[str, bool]]]:
        """The commits and writes since the last call."""
        out = (self.commits, self.writes)
        self.commits, self.writes = [], []
        return out


def _agent(tmp_path: Path, registry: Registry, clock: FakeClock, sealer: Sealer, seed: int = 7) -> Agent:
    return Agent(registry=registry, state_dir=tmp_path / "state", sealer=sealer, clock=clock, rng=SeededRandom(seed))


def test_recording_collection_and_acknowledgement_each_go_through_the_transaction(
    tmp_path: Path, registry: Registry, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step that changes a use case writes its file inside transaction.commit, and only there."""
    watch = _Watch(monkeypatch)
    agent = _agent(tmp_path, registry, clock, watch.sealer)
    agent.grant_consent()
    watch.step()

    def check(what: str, step: Callable[[], object]) -> None:
        step()
        commits, writes = watch.step()
        use_case_writes = [(name, inside) for name, inside in writes if name.startswith("uc-")]
        assert any(c.documents for c in commits), what
        assert use_case_writes, what
        assert all(inside for _, inside in use_case_writes), (what, writes)

    check("record", lambda: agent.record("seconds", 600, key="editor"))
    check("record_many", lambda: agent.record_many([(n, v, k) for n, (v, k) in VALUES.items()]))
    check("record_each", lambda: agent.record_each([("flag", 0, None), ("words", "again", None)]))
    clock.set(clock.time() + DAY)
    check("collect", agent.collect)
    pending = agent.outbox()
    assert len(pending) >= 4
    check("acknowledge", lambda: agent.acknowledge(pending[:1], broker="b:1"))
    check("mark_sent", lambda: agent.mark_sent(pending[1:2], broker="b:1"))
    check("mark_refused", lambda: agent.mark_refused([(pending[2], "not authorized")], broker="b:1"))
    receipt = Receipt(correlation=pending[1].entry.report_id, counted=True)
    check("settle", lambda: agent.settle([receipt], broker="b:1"))
    changed = parse_registry(REGISTRY.replace("k = 128, h = 2", "k = 256, h = 2"), source="changed")
    check("registry change", lambda: _agent(tmp_path, changed, clock, watch.sealer, seed=8))


def _recorded_a_day_ago(tmp_path: Path, registry: Registry, clock: FakeClock, watch: _Watch) -> Agent:
    """An agent with consent and a value for every use case, the clock a day on (every period
    due to close), and the watch's record of those writes taken away."""
    agent = _agent(tmp_path, registry, clock, watch.sealer)
    agent.grant_consent()
    agent.record_many([(n, v, k) for n, (v, k) in VALUES.items()])
    clock.set(clock.time() + DAY)
    watch.step()
    return agent


def test_the_first_ledger_is_recorded_in_the_manifest_before_the_steps_other_files(
    tmp_path: Path, registry: Registry, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first acknowledgement writes the ledger, then the manifest marked as having one, then the use cases."""
    watch = _Watch(monkeypatch)
    agent = _recorded_a_day_ago(tmp_path, registry, clock, watch)
    agent.collect()
    watch.step()
    pending = agent.outbox()
    agent.acknowledge(pending[:1])
    _, writes = watch.step()
    names = [name for name, _ in writes if name != SYNC]
    assert names[:2] == ["ledger.sealed", "manifest.sealed"], names
    assert names[2].startswith("uc-"), names
    assert names[-1] == "manifest.sealed", names
    agent.acknowledge(pending[1:2])
    _, writes = watch.step()
    assert [name for name, _ in writes].count("manifest.sealed") == 1, writes  # recorded once only
    (tmp_path / "state" / "ledger.sealed").unlink()
    assert "was deleted" in _agent(tmp_path, registry, clock, watch.sealer).status().ledger


def test_a_cycle_syncs_the_directory_once_after_its_use_case_files_and_before_the_manifest(
    tmp_path: Path, registry: Registry, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The use-case files of one step are renamed, then made durable by one fsync of the
    directory, and only then does the manifest name their generations (agent/transaction.py)."""
    watch = _Watch(monkeypatch)
    agent = _recorded_a_day_ago(tmp_path, registry, clock, watch)
    agent.collect()
    _, writes = watch.step()
    names = [name for name, _ in writes]
    files = [i for i, name in enumerate(names) if name.startswith("uc-")]
    assert len(files) == len(VALUES), names
    first_sync = names.index(SYNC)
    assert files[-1] < first_sync < names.index("manifest.sealed"), names
    assert names.count(SYNC) == 2, names  # the use cases' together, the manifest's own


def _view(state: DeviceState) -> Any:
    """Everything a state holds, in plain form, to compare before and after a step."""
    return {
        "consent": None if state.consent is None else state.consent.to_plain(),
        "ledger": None if state.ledger is None else state.ledger.to_plain(),
        "manifest": None if state.manifest is None else state.manifest.to_plain(),
        "slots": {
            name: (None if slot.doc is None else slot.doc.to_plain(), slot.broken, slot.stale)
            for name, slot in state.slots.items()
        },
        "sent_records": {
            name: [e.sent_records for e in slot.doc.outbox] for name, slot in state.slots.items() if slot.doc
        },
    }


def test_a_step_leaves_the_state_it_was_computed_from_as_it_was(
    make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    """Recording, collection, sends, acknowledgements and receipts replace the state; the one before is untouched."""
    agent = make_agent()
    agent.grant_consent()

    def collect() -> object:
        clock.set(clock.time() + DAY)
        return agent.collect()

    steps: list[tuple[str, Callable[[], object]]] = [
        ("record", lambda: agent.record_many([(n, v, k) for n, (v, k) in VALUES.items()])),
        ("record_each", lambda: agent.record_each([(n, v, k) for n, (v, k) in VALUES.items()])),
        ("collect", collect),
        ("mark_sent", lambda: agent.mark_sent(agent.outbox()[:2])),
        ("mark_refused", lambda: agent.mark_refused([(p, "quota exceeded") for p in agent.outbox()[2:3]])),
        ("settle", lambda: agent.settle([Receipt(p.entry.report_id, counted=True) for p in agent.outbox()[:1]])),
        ("acknowledge", lambda: agent.acknowledge(agent.outbox()[:3])),
    ]
    for what, step in steps:
        before = agent._state  # the state in force, held across the step
        view = _view(before)
        step()
        assert agent._state is not before, what
        assert _view(before) == view, what


# ---------------------------------------------------------------------------- the ledger and the counter's value


def test_the_ledger_lists_the_records_each_report_was_made_of(
    make_agent: Callable[..., Agent], clock: FakeClock
) -> None:
    """Staged and acknowledged in one process, or across a restart: the ledger's records are the report's."""
    agent = make_agent()
    agent.grant_consent()
    agent.record_many([(n, v, k) for n, (v, k) in VALUES.items()])
    clock.set(clock.time() + DAY)
    agent.collect()
    pending = agent.outbox()
    assert all(p.entry.sent_records is not None for p in pending)
    half = len(pending) // 2
    agent.acknowledge(pending[:half])
    restarted = make_agent(seed=8)
    later = restarted.outbox()
    assert all(p.entry.sent_records is None for p in later)  # not sealed: read from the payload
    restarted.acknowledge(later)
    ledger = {e.report_id: e.records for e in restarted.ledger()}
    assert len(ledger) == len(pending)
    for p in pending:
        assert ledger[p.entry.report_id] == msgpack.unpackb(p.entry.payload, raw=False)["r"]


def test_a_counter_value_is_checked_once(make_agent: Callable[..., Agent], monkeypatch: pytest.MonkeyPatch) -> None:
    """Recording a counter's value asks its mechanism to check it once, not once per use of it."""
    agent = make_agent()
    agent.grant_consent()
    mechanism = type(agent.registry.use_cases["seconds"].mechanism)
    real = mechanism.check_value
    calls: list[object] = []

    def counting(self: Any, value: object) -> Any:
        calls.append(value)
        return real(self, value)

    monkeypatch.setattr(mechanism, "check_value", counting)
    outcome = agent.record("seconds", 30_000, key="editor")
    assert calls == [30_000]
    assert outcome.note  # the clamping note comes from the same checked value
