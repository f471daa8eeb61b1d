"""The collector's HTTP API, dashboard and Prometheus endpoint, on aiohttp.

Routes (``GET`` and ``HEAD``; JSON unless stated):

=========================================  ==========================================================
``/``                                      the dashboard (one self-contained HTML page, no CDN)
``/metrics``                               Prometheus (``prometheus_client``): ingest, transport,
                                           commit latency and batch histograms, process metrics,
                                           and the latest estimate of each mean or proportion
                                           (``ldp_estimate_*``, the period ``/estimate`` shows;
                                           ``collector.export``)
``/healthz``                               liveness: broker connections, checkpoint age; 503 while
                                           the checkpoint store cannot take commits; "degraded"
                                           (200) while one of several brokers is unreachable
``/api/v1/status``                         registry hashes, the definitions of every use case with
                                           their periods, lifetime counters, live ingest metrics
                                           and transport state
``/api/v1/use-cases``                      the use cases with their mechanism and release rules
``/api/v1/use-cases/{name}``               one use case, its definitions and their periods
``/api/v1/use-cases/{name}/estimate``      the estimate (``?period=P``; default the latest period;
                                           ``&withheld=1`` also lists withheld entries, flagged)
``/api/v1/use-cases/{name}/series``        per-period values (means, proportions) and report counts
``/api/v1/use-cases/{name}/export``        the estimate as rows (``?period=P``, default the latest;
                                           ``&format=csv`` or ``jsonl``): every entry, withheld
                                           ones flagged with their reason (``collector.export``)
``/api/v1/schema``                         the JSON Schema of the estimate, series and status
                                           answers (generated from ``collector/results.py``)

``{name}`` is a use case's name (its current definition) or one definition's ref
(``emoji@5338c1d1``, as the status lists them): while a registry change rolls out, each
definition has its own reports and estimates.
=========================================  ==========================================================

Estimates come from aggregates kept materialised in memory and current as commits land
(``collector.live``), computed in threads (``estimation.workers``) so a dictionary query or a
RAPPOR decode never stalls ingest on the event loop. An estimate is computed once per version
of its aggregate; a repeated request for an unchanged aggregate reuses the encoded answer.

What a hostile client meets: any method but ``GET``/``HEAD`` is 405 (one the parser does
not know, 400); a request line or header field over 8 KiB, or more than 32 header fields,
is 431; a request body is never read (and capped at 1 KiB should a route ever read one);
an HTTP/1.1 request without ``Host`` is 400 (RFC 9112 §3.2); a connection that has not sent a complete request head
within 10 s of connecting is closed, however slowly it trickles bytes; one request per
connection; errors are JSON ``{"error": ...}`` that never carry an exception's class, message or
traceback (those go to the log). No route reads a file, so no path reaches the file system.
The server binds to loopback by default; put a reverse proxy with authentication in front of
it to expose it.

This module knows the running service only through :class:`ServiceView` (what it reads of
it), so ``collector.service`` imports it and not the other way round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Protocol

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from msgspec.structs import replace as struct_replace
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from collector.config import CollectorConfig
from collector.dashboard import DASHBOARD_HTML
from collector.definitions import catalog_of_config
from collector.errors import CollectorError, StoreDamaged, StoreError, StoreUnavailable
from collector.export import EXPORT_FORMATS, EstimateGauges, export_text, latest_estimates
from collector.live import LiveAggregates
from collector.metrics import IngestMetrics, metrics_registry
from collector.results import Health, ServiceStatus, UseCaseBrief, json_schema, named, to_json
from collector.transport import TransportStatistics
from protocol.registry import Period
from runtime.accept_errors import ACCEPT_ERROR_INTERVAL_S, AcceptErrorLog
from runtime.closing import close_in_thread

__all__ = [
    "ACCEPT_ERROR_INTERVAL_S",
    "HEAD_TIMEOUT_S",
    "AcceptErrorLog",
    "HttpApi",
    "ServiceView",
    "StatisticsSource",
    "serve_http",
]

log = logging.getLogger(__name__)

HEAD_TIMEOUT_S = 10.0
"""Seconds a connection has to deliver a complete request head (one request per connection)."""

_MAX_LINE = 8190  # the request line (method, target, version) and each header field, in bytes
_MAX_HEADERS = 32  # a browser sends about 15; bounds a head at about 270 KiB
_MAX_BODY = 1024  # nothing is uploaded: every route is GET
_MAX_PERIOD = max(p.max_index for p in Period)  # larger indices overflowed SQLite's integers (HTTP 500)
_CACHED_BODIES = 1024
_ACCEPT_RETRY_S = 1.0  # asyncio's delay before it listens again after a failed accept (constants.ACCEPT_RETRY_DELAY)
# Server: the name only; aiohttp would announce its version and Python's.
_SECURITY_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "Server": "ldp-collector"}


class StatisticsSource(Protocol):
    """Anything with the transport's counters (``collector.mqtt.MqttTransport``)."""

    def statistics(self) -> TransportStatistics:
        """A snapshot of the counters."""
        ...


class ServiceView(Protocol):
    """What the HTTP layer reads of a running service (``collector.service.Service`` is one)."""

    @property
    def config(self) -> CollectorConfig:
        """The collector configuration."""
        ...

    @property
    def live(self) -> LiveAggregates:
        """The materialised aggregates estimates are computed from."""
        ...

    @property
    def metrics(self) -> IngestMetrics:
        """Ingest's counters (health and status)."""
        ...

    @property
    def transport(self) -> StatisticsSource:
        """The broker connection (its statistics)."""
        ...

    @property
    def prometheus(self) -> CollectorRegistry:
        """The service's own Prometheus registry."""
        ...


def _json(status: int, data: object) -> web.Response:
    # The edge: a typed result (collector.results) or plain data becomes JSON here, keys sorted.
    return web.Response(status=status, body=to_json(data), content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json(status, {"error": message})


_SCHEMA = json_schema()


class _Protocol(web.RequestHandler):
    """aiohttp's connection handler, with the collector's answers to requests it cannot parse.

    aiohttp answers a malformed request itself, as text that quotes the offending bytes, and
    every over-long line as 400; here a line over the limit is 431 (RFC 6585 §5) and every
    answer is the API's JSON error, naming the limit and never echoing the input.
    """

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The response to a request that failed before or outside the application's handlers."""
        if request.writer.output_size > 0:
            raise ConnectionError("the response has begun; no error response can follow")
        if exc is not None and status < 500:
            # A scanner or a client speaking something else: routine, logged quietly.
            log.debug("refused an unparsable HTTP request from %s: %s", request.remote, exc)
        if isinstance(exc, LineTooLong):
            response = _error(431, f"the request line and each header field are limited to {_MAX_LINE} bytes")
        elif isinstance(exc, BadHttpMessage) and exc.message.startswith("Too many headers"):
            response = _error(431, f"a request may carry at most {_MAX_HEADERS} header fields")
        elif status < 500:
            response = _error(status, "malformed HTTP/1.1 request")
        else:
            log.error("HTTP request failed outside its handler", exc_info=exc)
            response = _error(500, "internal error (the collector's log has the details)")
        response.headers.update(_SECURITY_HEADERS)
        response.force_close()
        return response


class _Joined(Collector):
    """The metrics of a registry followed by those of another collector."""

    def __init__(self, registry: CollectorRegistry, more: Collector) -> None:
        self._registry = registry
        self._more = more

    def collect(self) -> Iterable[Metric]:
        """Every family of both."""
        yield from self._registry.collect()
        yield from self._more.collect()

    def describe(self) -> Iterable[Metric]:
        """Nothing up front (a collector made per scrape)."""
        return []


class HttpApi:
    """The HTTP endpoints over a checkpoint store, optionally attached to a running service.

    Args:
        config: the collector configuration (store path, registry, estimation settings, ``http``).
        service: the running service, for live metrics and health; None serves a store read-only.
        live: the materialised aggregates to read (default: the service's, or new ones this API owns).
        head_timeout: seconds a connection has to send its request head (tests shorten it).
    """

    def __init__(
        self,
        config: CollectorConfig,
        *,
        service: ServiceView | None = None,
        live: LiveAggregates | None = None,
        head_timeout: float = HEAD_TIMEOUT_S,
    ) -> None:
        self.config = config
        self.head_timeout = head_timeout
        self.service = service
        if live is None and service is not None:
            live = service.live
        self._owns_live = live is None
        self.live = live or LiveAggregates(config, catalog_of_config(config))
        if service is not None:
            self.prometheus = service.prometheus
        else:
            self.prometheus = metrics_registry(
                IngestMetrics(),
                transport=lambda: None,
                instance=config.instance,
                registry_hash=self.live.catalog.hash_hex,
            )
        self._gauges = EstimateGauges()
        # The encoded estimate per request, with the version it was computed for.
        self._bodies: dict[tuple[str, int | None, bool], tuple[tuple[str, int, int], bytes]] = {}
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._accept_errors: AcceptErrorLog | None = None

    @property
    def port(self) -> int:
        """The bound port (useful when configured as 0)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def application(self) -> web.Application:
        """The aiohttp application: the routes and the middleware that shapes every answer."""
        # A trailing slash redirects to the path without it (the old server ignored it).
        normalize = web.normalize_path_middleware(append_slash=False, remove_slash=True)
        app = web.Application(middlewares=[self._guard, normalize], client_max_size=_MAX_BODY)
        get: list[tuple[str, Callable[[web.Request], Awaitable[web.StreamResponse]]]] = [
            ("/", self._dashboard),
            ("/metrics", self._metrics),
            ("/healthz", self._health),
            ("/api/v1/status", self._status),
            ("/api/v1/schema", self._schema),
            ("/api/v1/use-cases", self._use_cases),
            ("/api/v1/use-cases/{name}", self._use_case),
            ("/api/v1/use-cases/{name}/estimate", self._estimate),
            ("/api/v1/use-cases/{name}/series", self._series),
            ("/api/v1/use-cases/{name}/export", self._export),
        ]
        app.add_routes([web.get(path, handler) for path, handler in get])  # HEAD too (allow_head)
        return app

    async def start(self) -> int:
        """Bind and start accepting; returns the port."""
        http = self.config.http
        runner = web.AppRunner(self.application(), handle_signals=False, access_log=None, shutdown_timeout=5.0)
        await runner.setup()
        self._runner = runner
        manager = runner.server
        assert manager is not None
        loop = asyncio.get_running_loop()

        def protocol() -> _Protocol:
            # aiohttp arms this timeout when a connection opens and closes the connection if
            # no complete request has arrived by then; bytes of a partial head do not reset
            # it, so it also bounds a client that trickles them (slowloris).
            return _Protocol(
                manager,
                loop=loop,
                keepalive_timeout=self.head_timeout,
                # None: no access log (aiohttp's own runners accept it; the signature says Logger).
                access_log=None,  # type: ignore[arg-type]
                max_line_size=_MAX_LINE,
                max_field_size=_MAX_LINE,
                max_headers=_MAX_HEADERS,
                lingering_time=1.0,
            )

        self._accept_errors = AcceptErrorLog(
            loop,
            logger=log,
            server="HTTP API",
            unit="deploy/ldp-collector.service",
            operation="http-accept",
            resources=None if self.service is None else self.service.metrics.resources,
        )
        self._accept_errors.install()
        self._server = await loop.create_server(protocol, http.host, http.port, reuse_address=True)
        log.info("HTTP API and dashboard on http://%s:%d/", http.host, self.port)
        if http.exposure_warning is not None:
            log.warning("%s", http.exposure_warning)
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
        """Stop accepting, end the connections; release the materialised aggregates if this API made them."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._accept_errors is not None:
            self._accept_errors.uninstall(linger=_ACCEPT_RETRY_S * 2)
            self._accept_errors = None
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._owns_live:
            self._owns_live = False
            await close_in_thread(self.live.close)

    # -- the middleware: methods, error bodies, headers ----------------------------------------

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            response: web.StreamResponse = _error(405, "only GET and HEAD are served")
            response.headers["Allow"] = "GET, HEAD"
        else:
            try:
                response = await handler(request)
            except web.HTTPNotFound:
                response = _error(404, f"no such resource: {request.path[:200]}")
            except web.HTTPMove as exc:
                location = str(exc.location)
                response = _json(exc.status, {"location": location})
                response.headers["Location"] = location
            except web.HTTPException as exc:
                response = _error(exc.status, exc.reason)
            except StoreUnavailable as exc:
                # The store's state is public (healthz says the same); its file name is not.
                log.warning("HTTP %s %s: checkpoint store unavailable: %s", request.method, request.path, exc)
                response = _error(503, f"the checkpoint store is unavailable ({exc.cause}); try again later")
            except StoreDamaged as exc:
                # A known state with its own message (the file, what is wrong, what to do): no traceback.
                log.error("HTTP %s %s: %s", request.method, request.path, exc)
                response = _error(500, "the checkpoint store is damaged (the collector's log has the details)")
            except (StoreError, CollectorError):
                log.exception("HTTP %s %s failed", request.method, request.path)
                response = _error(500, "the checkpoint store could not be read (the collector's log has the details)")
            except Exception:
                # One failing request must not take ingest down with it: answer 500, keep the
                # traceback in the log, and leave the root task group alone. An internal
                # KeyError lands here too: it is our fault, not a missing resource.
                log.exception("HTTP %s %s failed", request.method, request.path)
                response = _error(500, "internal error (the collector's log has the details)")
        response.headers.update(_SECURITY_HEADERS)
        # One request per connection, as clients of this API expect (they read to the end of
        # the stream): the head deadline then bounds every connection's idle time.
        response.force_close()
        return response

    # -- the routes -----------------------------------------------------------------------------

    def _unknown(self, name: str) -> web.Response | None:
        """404 for a name or ref no accepted definition has (checked here, never by catching KeyError)."""
        catalog = self.live.catalog
        if catalog.resolve(name) is not None:
            return None
        known = ", ".join(catalog.names())
        return _error(404, f"unknown use case or definition {name[:80]!r}; the use cases are {known}")

    async def _dashboard(self, request: web.Request) -> web.Response:
        return web.Response(text=DASHBOARD_HTML, content_type="text/html", charset="utf-8")

    async def _metrics(self, request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        try:
            self._gauges.update(await latest_estimates(self.live))
        except (StoreError, CollectorError) as exc:
            # /metrics is how a store outage is seen: it answers without the estimates (and
            # without stale ones) rather than failing with the store.
            log.warning("HTTP /metrics without estimates: the checkpoint store could not be read: %s", exc)
            self._gauges.update(())
        # One scrape of both: the service's registry is shared, so the gauges join it here
        # rather than being registered in it.
        scrape = CollectorRegistry(auto_describe=False)
        scrape.register(_Joined(self.prometheus, self._gauges))
        response = web.Response(body=encoder(scrape))
        response.headers["Content-Type"] = content_type
        return response

    async def _health(self, request: web.Request) -> web.Response:
        instance = self.config.instance
        if self.service is None:
            return _json(200, Health(status="ok", instance=instance))
        metrics = self.service.metrics
        transport = self.service.transport.statistics()
        health = Health(
            status="ok",
            instance=instance,
            connected=transport.connected,
            checkpoint_age_seconds=metrics.snapshot().checkpoint_age_seconds,
            brokers=transport.brokers,
        )
        if metrics.store_error:
            # Up, but not counting: reports wait at the broker until the store takes commits again.
            detail = metrics.store_error_detail
            return _json(503, struct_replace(health, status="unhealthy", cause=metrics.store_error, detail=detail))
        if len(transport.brokers) > 1 and not transport.connected:
            # Alive and serving the brokers it reaches (or waiting for all, reconnecting):
            # restarting cannot bring a broker back, so this is not a failure (docs/deploy.md).
            return _json(200, struct_replace(health, status="degraded"))
        return _json(200, health)

    async def _schema(self, request: web.Request) -> web.Response:
        return _json(200, _SCHEMA)

    async def _status(self, request: web.Request) -> web.Response:
        status = await self.live.status()
        service = self.service
        return _json(
            200,
            ServiceStatus.of(
                status,
                instance=self.config.instance,
                materialised=self.live.statistics(),
                live=None if service is None else service.metrics.snapshot(),
                transport=None if service is None else service.transport.statistics(),
            ),
        )

    async def _use_cases(self, request: web.Request) -> web.Response:
        status = await self.live.status()
        return _json(200, [UseCaseBrief.of(name, info) for name, info in status.use_cases.items()])

    async def _use_case(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if (unknown := self._unknown(name)) is not None:
            return unknown
        uc = self.live.catalog.resolve(name)
        assert uc is not None
        status = await self.live.status()
        info = status.use_cases[uc.name]
        if "@" in name:  # one definition: its own fields and periods
            return _json(200, named(uc.name, next(d for d in info.definitions if d.definition == uc.ref)))
        return _json(200, named(uc.name, info))

    async def _series(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if (unknown := self._unknown(name)) is not None:
            return unknown
        return _json(200, await self.live.series(name))

    @staticmethod
    def _period(request: web.Request) -> int | web.Response | None:
        """The ``period`` parameter: None (the default period), an index, or the 400 answer."""
        # A blank value is no value, as urllib.parse.parse_qs reads it.
        raw = request.query.get("period") or None
        try:
            period = None if raw is None else int(raw)
        except ValueError:
            return _error(400, f"period must be an integer; got {str(raw)[:40]!r}")
        if period is not None and not 0 <= period <= _MAX_PERIOD:
            return _error(400, f"period must be a slot index in [0, {_MAX_PERIOD}]; got {str(raw)[:40]}")
        return period

    def _asked(
        self, request: web.Request, option: str, allowed: Collection[str], says: str
    ) -> tuple[str, int | None, str] | web.Response:
        """The use case, the period and the ``option`` parameter a request names (blank: the first
        of ``allowed``), or the error that answers it (``says`` what the option may be)."""
        name = request.match_info["name"]
        if (unknown := self._unknown(name)) is not None:
            return unknown
        period = self._period(request)
        if isinstance(period, web.Response):
            return period
        value = request.query.get(option) or next(iter(allowed))
        if value not in allowed:
            return _error(400, f"{option} must be {says}; got {value[:40]!r}")
        return name, period, value

    async def _export(self, request: web.Request) -> web.Response:
        asked = self._asked(request, "format", EXPORT_FORMATS, f"one of {', '.join(EXPORT_FORMATS)}")
        if isinstance(asked, web.Response):
            return asked
        name, period, fmt = asked
        # The same computation (and cached result) as /estimate?withheld=1 for this period.
        _, result = await self.live.estimate(name, period, withheld=True)
        response = web.Response(text=export_text(result, fmt), content_type=EXPORT_FORMATS[fmt], charset="utf-8")
        filename = f"{result.use_case}-{result.period}.{fmt}"
        response.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
        return response

    async def _estimate(self, request: web.Request) -> web.Response:
        asked = self._asked(request, "withheld", ("0", "1"), "0 or 1")
        if isinstance(asked, web.Response):
            return asked
        name, period, flag = asked
        withheld = flag == "1"
        version, result = await self.live.estimate(name, period, withheld=withheld)
        cached = self._bodies.get((name, period, withheld))
        if cached is not None and cached[0] == version:
            return web.Response(body=cached[1], content_type="application/json")
        response = _json(200, result)
        if len(self._bodies) >= _CACHED_BODIES:
            self._bodies.clear()  # requests name arbitrary periods; keep this bounded
        assert isinstance(response.body, bytes)
        self._bodies[(name, period, withheld)] = (version, response.body)
        return response


async def serve_http(service: ServiceView) -> None:
    """Serve the HTTP API of a running service until cancelled."""
    await HttpApi(service.config, service=service).serve()
