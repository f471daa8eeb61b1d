"""A fleet spread over several brokers: one connection pool per broker, each simulated device
publishing through its own primary broker and failing over in its own order, as an agent with
``[broker] addresses`` does (:mod:`agent.brokers`).

The order of a device is the rendezvous order of its name (its sub-identity, or its number
for an anonymous test broker), so the devices spread evenly over the brokers and a device keeps
its broker for the whole run. A report goes to the first broker of that
order whose pool takes it; a pool that fails (its broker is gone) passes the report to the
next broker, and the collector, subscribed to every broker, folds each report once whichever
broker carried it. Receipts come back through the broker that delivered the report, on the
pool that published it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from agent.brokers import BrokerAddress, broker_order
from agent.errors import TransportError
from agent.transport import PublishRefusedError
from fleet.pool import ConnectionPool

__all__ = ["BrokerPools"]


class BrokerPools:
    """Pools on several brokers behind the interface of one :class:`ConnectionPool`.

    Args:
        pools: one pool per broker, in the order of ``addresses``.
        addresses: the brokers.
    """

    def __init__(self, pools: Sequence[ConnectionPool], addresses: Sequence[BrokerAddress]) -> None:
        if len(pools) != len(addresses) or not pools:
            raise ValueError("one pool per broker, at least one")
        self._pools = list(pools)
        self._index = {address: i for i, address in enumerate(addresses)}
        self._addresses = list(addresses)
        self._orders: dict[str, list[int]] = {}
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> BrokerPools:
        try:
            for pool in self._pools:
                await self._stack.enter_async_context(pool)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    def _order(self, device: str) -> list[int]:
        order = self._orders.get(device)
        if order is None:
            order = self._orders[device] = [self._index[a] for a in broker_order(device, self._addresses)]
        return order

    async def publish(
        self, topic: str, payload: bytes, *, correlation: bytes | None = None, device: str | None = None
    ) -> None:
        """Publish through ``device``'s primary broker, or the next ones of its order if that fails
        (without ``device``, the topic less its use case names the device).

        Raises:
            PublishRefusedError: a broker refused this message (its ACL); no other is tried.
            TransportError: no broker of the order took it (the last failure).
        """
        failure: TransportError | None = None
        for i in self._order(device if device is not None else topic.rpartition("/")[0]):
            try:
                await self._pools[i].publish(topic, payload, correlation=correlation)
            except PublishRefusedError:
                raise
            except TransportError as exc:
                failure = exc
                continue
            return
        assert failure is not None
        raise failure

    async def repair(self, *, attempt: int) -> None:
        """Reopen broken connections on every broker; fail only if no broker can be reached.

        Raises:
            TransportError: every broker failed to reconnect (the last failure).
        """
        failures: list[TransportError] = []
        for pool in self._pools:
            try:
                await pool.repair(attempt=attempt)
            except TransportError as exc:
                failures.append(exc)
        if len(failures) == len(self._pools):
            raise failures[-1]
