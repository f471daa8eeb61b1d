"""The fleet's scale mode, privatizing: every simulated device's permanent state held as arrays,
and its records made by the mechanisms' vectorised privatizers (``setup_many``,
``privatize_many`` of :mod:`protocol.server`).

A :class:`DevicePrivatizer` belongs to one use case and the whole fleet. Its per-device state
is drawn once, when it is made, and kept for the run, as an agent keeps its permanent state
(docs/state-integrity.md): 1BitMean's α and memo bits (000 §3.1), dBitFlipPM's buckets and
memoized answers (000 §3.4). Row ``i`` of the state is device ``i``'s and nobody else's.
Mechanisms whose vectorised privatizer keeps no per-device memo (RAPPOR's ``privatize_many``
draws a fresh ``B'`` per call, 004 §2) are privatized device by device through the agent's
own path (:func:`agent.mechanism_calls.privatize`) with each device's plain state, so the memo is
still per device and never redrawn. Event mechanisms (Count Mean Sketch, Hadamard CMS,
randomized response, and the frequency oracles whose server half privatizes in bulk) keep no
state: each record has fresh coins (003 §3.2.1).

Values go in as the agent takes them: checked by the mechanism, and a counter's period total
(one value per period here) clamped by ``counter_input`` (000 §1.1).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from agent.mechanism_calls import privatization_of, privatize
from protocol.cms import CountMeanSketch
from protocol.dbitflip import DBitFlip
from protocol.hcms import HadamardCountMeanSketch
from protocol.interfaces import Privatization
from protocol.one_bit_mean import OneBitMean
from protocol.randomized_response import RandomizedResponse
from protocol.randomness import RandomSource
from protocol.registry import UseCase
from protocol.server.cms import CMSServer
from protocol.server.contract import BatchPrivatizer
from protocol.server.dbitflip import DBitFlipServer, DBitFlipStates
from protocol.server.hcms import HCMSServer
from protocol.server.one_bit_mean import OneBitMeanServer, OneBitMeanStates
from protocol.server.randomized_response import RRServer

__all__ = ["DevicePrivatizer", "device_privatizer"]

_States_co = TypeVar("_States_co", covariant=True)


class _SetsUpMany(Protocol[_States_co]):
    """A server half that draws many devices' permanent states at once."""

    def setup_many(self, n: int, rng: RandomSource) -> _States_co: ...


ServerT = TypeVar("ServerT", bound=_SetsUpMany[Any])
StatesT = TypeVar("StatesT")


class DevicePrivatizer:
    """Records of one use case for chosen devices of the fleet (device by device, the agent's path).

    Args:
        use_case: the use case.
        devices: how many devices the fleet has (rows of the state).
        rng: the coins; the states are drawn from it here, once.
    """

    vectorised = False

    def __init__(self, use_case: UseCase, devices: int, rng: RandomSource) -> None:
        self.use_case = use_case
        self.devices = devices
        mech = use_case.mechanism
        self._states: list[Any] = [mech.setup_plain(rng) for _ in range(devices)]

    def value(self, raw: object) -> Any:
        """The value the mechanism privatizes for a recorded ``raw`` value (checked; a counter clamped).

        Raises:
            protocol.errors.InputError: the mechanism refuses the value.
        """
        mech = self.use_case.mechanism
        checked = mech.check_value(raw)
        if self._counter and not isinstance(checked, str | bytes):
            return mech.counter_input(checked)
        return checked

    @functools.cached_property
    def _counter(self) -> bool:
        """Whether the use case's values are counters: asked once, not once per value."""
        return privatization_of(self.use_case) is Privatization.COUNTER

    def records(self, rows: npt.NDArray[np.int64], values: Sequence[Any], rng: RandomSource) -> list[Any]:
        """The wire form of device ``rows[i]``'s record of ``values[i]`` (values from :meth:`value`)."""
        out = []
        for row, value in zip(rows.tolist(), values, strict=True):
            record, self._states[row] = privatize(self.use_case, value, self._states[row], rng)
            out.append(record)
        return out

    def plain_state(self, row: int) -> Any:
        """Device ``row``'s state in the agent's plain form (for tests)."""
        return self._states[row]


class _Memoized(DevicePrivatizer, Generic[ServerT, StatesT]):
    """A memoizing mechanism whose server half draws every device's state at once (``setup_many``)
    and privatizes chosen rows of those states (``privatize_many``)."""

    vectorised = True
    server_type: type[ServerT]

    def __init__(self, use_case: UseCase, devices: int, rng: RandomSource) -> None:
        self.use_case = use_case
        self.devices = devices
        server = use_case.server
        assert isinstance(server, self.server_type)
        self._server: ServerT = server
        self.states: StatesT = server.setup_many(devices, rng)


class _OneBitMean(_Memoized[OneBitMeanServer, OneBitMeanStates]):
    server_type = OneBitMeanServer

    def records(self, rows: npt.NDArray[np.int64], values: Sequence[Any], rng: RandomSource) -> list[Any]:
        s = self.states
        mine = OneBitMeanStates(alphas=s.alphas[rows], memo=s.memo[rows], m=s.m, s=s.s, epsilon=s.epsilon)
        return list(self._server.privatize_many(np.asarray(values, dtype=np.int64), mine, rng).bits.tolist())

    def plain_state(self, row: int) -> Any:
        assert isinstance(self.use_case.mechanism, OneBitMean)
        return self.states.state(row).to_plain()


class _DBitFlip(_Memoized[DBitFlipServer, DBitFlipStates]):
    server_type = DBitFlipServer

    def records(self, rows: npt.NDArray[np.int64], values: Sequence[Any], rng: RandomSource) -> list[Any]:
        s = self.states
        mine = DBitFlipStates(s.buckets[rows], None if s.memo is None else s.memo[rows])
        batch = self._server.privatize_many(np.asarray(values, dtype=np.float64), rng, states=mine)
        return self._server.encode_batch(batch)

    def plain_state(self, row: int) -> Any:
        return self.states.row(row).to_plain()


class _Event(DevicePrivatizer):
    """Count Mean Sketch, Hadamard CMS, randomized response and every server half that privatizes
    in bulk (:class:`protocol.server.contract.BatchPrivatizer`): no state, fresh coins per record."""

    vectorised = True

    def __init__(self, use_case: UseCase, devices: int, rng: RandomSource) -> None:
        self.use_case = use_case
        self.devices = devices

    def records(self, rows: npt.NDArray[np.int64], values: Sequence[Any], rng: RandomSource) -> list[Any]:
        server = self.use_case.server
        if isinstance(server, BatchPrivatizer):
            return server.privatize_records(list(values), rng)
        if isinstance(server, RRServer):
            return list(server.privatize_many(np.asarray(values, dtype=np.uint8), rng).bits.tolist())
        if isinstance(server, HCMSServer):
            h = server.privatize_many(list(values), rng)
            return [list(r) for r in zip(h.j.tolist(), h.ell.tolist(), h.bits.tolist(), strict=True)]
        assert isinstance(server, CMSServer)
        c = server.privatize_many(list(values), rng)
        return [[j, bytes(b)] for j, b in zip(c.indices.tolist(), c.bits, strict=True)]

    def plain_state(self, row: int) -> Any:
        return None


def device_privatizer(use_case: UseCase, devices: int, rng: RandomSource) -> DevicePrivatizer:
    """The privatizer of ``use_case`` for a fleet of ``devices``: vectorised where the mechanism's
    batch privatizer keeps per-device state (or needs none), device by device otherwise."""
    mech = use_case.mechanism
    if isinstance(mech, OneBitMean):
        return _OneBitMean(use_case, devices, rng)
    if isinstance(mech, DBitFlip):
        return _DBitFlip(use_case, devices, rng)
    if isinstance(mech, RandomizedResponse | HadamardCountMeanSketch | CountMeanSketch):
        return _Event(use_case, devices, rng)
    if mech.privatization is Privatization.EVENT and isinstance(use_case.server, BatchPrivatizer):
        return _Event(use_case, devices, rng)
    return DevicePrivatizer(use_case, devices, rng)
