"""The collector's HTTP API, dashboard and Prometheus endpoint, on asyncio streams.

Routes (all ``GET``; JSON unless stated):

=========================================  ==========================================================
``/``                                      the dashboard (one self-contained HTML page, no CDN)
``/metrics``                               Prometheus text format: messages, rejections by reason,
                                           duplicates, aggregation lag, checkpoint age, buffer fill
``/healthz``                               liveness: broker connection, checkpoint age
``/api/v1/status``                         registry hash, periods per use case, lifetime counters,
                                           live ingest metrics and transport state
``/api/v1/use-cases``                      the use cases with their mechanism and release rules
``/api/v1/use-cases/{name}``               one use case and its periods with report counts
``/api/v1/use-cases/{name}/estimate``      the estimate (``?period=P``; default the latest period;
                                           ``&withheld=1`` also lists withheld entries, flagged)
``/api/v1/use-cases/{name}/series``        per-period values (means, proportions) and report counts
=========================================  ==========================================================

Estimates come from aggregates kept materialised in memory and current as commits land
(``collector.live``), computed in threads (``estimation.workers``) so a dictionary query or a
RAPPOR decode never stalls ingest on the event loop. An estimate is computed once per version
of its aggregate; a repeated request for an unchanged aggregate reuses the encoded answer.

The server is deliberately small: HTTP/1.1, one request per connection, request head
capped at 16 KiB and read with a timeout. It binds to loopback by default; put a reverse
proxy with authentication in front of it to expose it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from collector.config import CollectorConfig
from collector.dashboard import DASHBOARD_HTML
from collector.errors import CollectorError
from collector.estimation import registry_of
from collector.live import LiveAggregates
from collector.metrics import IngestMetrics, render_prometheus
from protocol.registry import Period

if TYPE_CHECKING:
    from collector.service import Service

__all__ = ["HttpApi", "serve_http"]

log = logging.getLogger(__name__)

_HEAD_LIMIT = 16 * 1024
_READ_TIMEOUT = 10.0
_MAX_PERIOD = max(p.max_index for p in Period)  # larger indices overflowed SQLite's integers (HTTP 500)
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class _Response:
    status: int
    body: bytes
    content_type: str = "application/json"


def _json(status: int, data: object) -> _Response:
    return _Response(status, json.dumps(data, sort_keys=True, allow_nan=False).encode())


def _error(status: int, message: str) -> _Response:
    return _json(status, {"error": message})


class HttpApi:
    """The HTTP endpoints over a checkpoint store, optionally attached to a running service.

    Args:
        config: the collector configuration (store path, registry, estimation settings).
        service: the running service, for live metrics; None serves a store read-only.
    """

    def __init__(
        self, config: CollectorConfig, *, service: Service | None = None, live: LiveAggregates | None = None
    ) -> None:
        self.config = config
        self.service = service
        if live is None and service is not None:
            live = service.live
        self._owns_live = live is None
        self.live = live or LiveAggregates(config, registry_of(config))
        # The encoded estimate per request, with the version it was computed for.
        self._bodies: dict[tuple[str, int | None, bool], tuple[tuple[str, int, int], bytes]] = {}
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The bound port (useful when configured as 0)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> int:
        """Bind and start accepting; returns the port."""
        http = self.config.http
        self._server = await asyncio.start_server(self._handle, http.host, http.port, limit=_HEAD_LIMIT)
        log.info("HTTP API and dashboard on http://%s:%d/", http.host, self.port)
        return self.port

    async def serve(self) -> None:
        """Serve until cancelled."""
        if self._server is None:
            await self.start()
        assert self._server is not None
        try:
            await self._server.serve_forever()
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop accepting; release the materialised aggregates if this API made them."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        if self._owns_live:
            await asyncio.to_thread(self.live.close)

    async def _estimate(self, name: str, period: int | None, *, withheld: bool) -> _Response:
        version, result = await self.live.estimate(name, period, withheld=withheld)
        cached = self._bodies.get((name, period, withheld))
        if cached is not None and cached[0] == version:
            return _Response(200, cached[1])
        response = _json(200, result)
        if len(self._bodies) >= 1024:
            self._bodies.clear()  # requests name arbitrary periods; keep this bounded
        self._bodies[(name, period, withheld)] = (version, response.body)
        return response

    # -- request handling ----------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT)
            except asyncio.LimitOverrunError:
                # RFC 6585 §5: say why instead of closing silently; the rest is not read.
                await self._write(writer, _error(431, f"request head over {_HEAD_LIMIT} bytes"), head_only=False)
                # Read (a bounded amount of) what the client is still sending: closing with
                # unread input sends a reset, which can destroy the answer before it is read.
                with contextlib.suppress(Exception):
                    for _ in range(4):
                        if not await asyncio.wait_for(reader.read(_HEAD_LIMIT), 1.0):
                            break
                return
            except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                return
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = request_line.split(" ")
            if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                response = _error(400, "malformed request line")
                method = "GET"
            else:
                method, target = parts[0], parts[1]
                response = await self._route(method, target)
            await self._write(writer, response, head_only=method == "HEAD")
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 5.0)

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, response: _Response, *, head_only: bool) -> None:
        head = (
            f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Error')}\r\n"
            f"Content-Type: {response.content_type}\r\n"
            f"Content-Length: {len(response.body)}\r\n"
            "Cache-Control: no-store\r\n"
            "X-Content-Type-Options: nosniff\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + (b"" if head_only else response.body))
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    async def _route(self, method: str, target: str) -> _Response:
        if method not in ("GET", "HEAD"):
            return _error(405, "only GET and HEAD are served")
        url = urllib.parse.urlsplit(target)
        query = urllib.parse.parse_qs(url.query)
        path = url.path.rstrip("/") or "/"
        segments = [urllib.parse.unquote(s) for s in path.strip("/").split("/")] if path != "/" else []
        routes: dict[str, Callable[[], Awaitable[_Response]]] = {
            "/": self._dashboard,
            "/metrics": self._metrics,
            "/healthz": self._health,
            "/api/v1/status": self._status,
            "/api/v1/use-cases": self._use_cases,
        }
        try:
            if path in routes:
                return await routes[path]()
            if len(segments) >= 4 and segments[:3] == ["api", "v1", "use-cases"]:
                name = segments[3]
                if len(segments) == 4:
                    return await self._use_case(name)
                if len(segments) == 5 and segments[4] == "estimate":
                    raw = query.get("period", [None])[0]
                    try:
                        period = None if raw is None else int(raw)
                    except ValueError:
                        return _error(400, f"period must be an integer; got {str(raw)[:40]!r}")
                    if period is not None and not 0 <= period <= _MAX_PERIOD:
                        return _error(400, f"period must be a slot index in [0, {_MAX_PERIOD}]; got {str(raw)[:40]}")
                    flag = query.get("withheld", ["0"])[0]
                    if flag not in ("0", "1"):
                        return _error(400, f"withheld must be 0 or 1; got {flag!r}")
                    return await self._estimate(name, period, withheld=flag == "1")
                if len(segments) == 5 and segments[4] == "series":
                    return _json(200, await self.live.series(name))
            return _error(404, f"no such resource: {path}")
        except KeyError as exc:
            return _error(404, f"unknown use case {exc.args[0]!r}")
        except CollectorError as exc:
            return _error(500, str(exc))
        except Exception as exc:
            # One failing request must not take ingest down with it: answer 500, keep the
            # traceback in the log, and leave the root task group alone.
            log.exception("HTTP %s %s failed", method, target)
            return _error(500, f"{type(exc).__name__}: {exc}")

    async def _dashboard(self) -> _Response:
        return _Response(200, DASHBOARD_HTML.encode(), "text/html; charset=utf-8")

    def _live(self) -> tuple[IngestMetrics | None, Any]:
        if self.service is None:
            return None, None
        return self.service.metrics, self.service.transport.statistics()

    async def _metrics(self) -> _Response:
        metrics, transport = self._live()
        text = render_prometheus(metrics or IngestMetrics(), transport, instance=self.config.instance)
        return _Response(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")

    async def _health(self) -> _Response:
        metrics, transport = self._live()
        body: dict[str, Any] = {"status": "ok", "instance": self.config.instance}
        if metrics is not None and transport is not None:
            snap = metrics.snapshot()
            body.update(connected=transport.connected, checkpoint_age_seconds=snap["checkpoint_age_seconds"])
        if metrics is not None and metrics.store_error:
            # Up, but not counting: reports wait at the broker until the store takes commits again.
            body.update(status="unhealthy", cause=metrics.store_error, detail=metrics.store_error_detail)
            return _json(503, body)
        return _json(200, body)

    async def _status(self) -> _Response:
        status = await self.live.status()
        metrics, transport = self._live()
        status["instance"] = self.config.instance
        if metrics is not None:
            status["live"] = metrics.snapshot()
        if transport is not None:
            status["transport"] = {
                "connected": transport.connected,
                "connects": transport.connects,
                "buffered": transport.buffered,
                "unacked": transport.unacked,
                "capacity": transport.capacity,
                "received": transport.received,
                "acked": transport.acked,
                "stale_acks": transport.stale_acks,
                "dropped": transport.dropped,
                "protocol_errors": transport.protocol_errors,
                "over_receive_maximum": transport.over_receive_maximum,
                "receipts_sent": transport.receipts_sent,
                "receipts_dropped": transport.receipts_dropped,
                "broker": dict(transport.broker),
            }
        return _json(200, status)

    async def _use_cases(self) -> _Response:
        status = await self.live.status()
        return _json(
            200,
            [
                {k: v for k, v in info.items() if k != "periods"} | {"name": name, "periods": len(info["periods"])}
                for name, info in status["use_cases"].items()
            ],
        )

    async def _use_case(self, name: str) -> _Response:
        status = await self.live.status()
        if name not in status["use_cases"]:
            raise KeyError(name)
        return _json(200, {"name": name} | status["use_cases"][name])


async def serve_http(service: Service) -> None:
    """Serve the HTTP API of a running service until cancelled."""
    api = HttpApi(service.config, service=service)
    await api.serve()
