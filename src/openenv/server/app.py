"""``create_app``: an ASGI application that serves one environment."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from openenv.server.api_docs import add_docs_pages
from openenv.server.config import ConcurrencyConfig, ServerSettings
from openenv.server.endpoint import SessionEndpoint
from openenv.server.factory import check_concurrency, check_factory
from openenv.server.openreward import OpenRewardBridge
from openenv.server.routes import routes, web_routes
from openenv.server.security import AccessGuard
from openenv.server.service import EnvService
from openenv.tools import tools_of
from openenv.types import Action, EnvironmentMetadata, Observation, State

__all__ = ["EnvApp", "create_app"]


def create_app(
    env_factory: Any,
    action_cls: type[Action],
    observation_cls: type[Observation],
    concurrency: ConcurrencyConfig | None = None,
    *,
    state_cls: type[State] | None = None,
    metadata: EnvironmentMetadata | None = None,
    web: bool = True,
    env_name: str | None = None,
    max_concurrent_envs: int | None = None,
    **settings: Any,
) -> FastAPI:
    """Build a FastAPI app that serves an environment over WebSocket sessions.

    Each connection to ``/ws`` gets its own environment instance, made by
    ``env_factory``, within ``concurrency.max_concurrent_envs`` slots. HTTP
    serves ``/health``, ``/metadata``, ``/schema``, ``/metrics``, what the
    environment offers (``/tools``, ``/splits``, ``/tasks``) and ``/web``, a
    page to play it by hand. With ``mcp=True`` MCP clients reach the tools at
    ``/mcp``, one environment per MCP session, and so does OpenEnv's own
    ``MCPToolClient`` (``server/openenv_mcp.py``). OpenReward's SDK drives it over
    OpenReward's HTTP session protocol (``/create_session``, ``/create``,
    ``/call``, ...; ``server/openreward.py``), its sessions under the same cap.

    Args:
        env_factory: The environment class, or any zero-argument callable that
            returns a new instance (e.g. ``functools.partial(MyEnv, level=3)``).
        action_cls: The ``Action`` model that ``step`` accepts.
        observation_cls: The ``Observation`` model that ``reset``/``step`` return.
        concurrency: The session cap and idle timeout (default: one session).
        state_cls: The ``State`` model; read from the environment's generic
            arguments when omitted.
        metadata: What ``/metadata`` reports; derived from the class otherwise.
        web: Serve the page at ``/web`` that plays the environment by hand,
            over ``/web/ws`` (sessions there count against the same cap).
        env_name: The name ``/metadata`` reports (OpenEnv's keyword).
        max_concurrent_envs: The session cap, instead of ``concurrency``
            (OpenEnv's keyword).
        **settings: Further ``ServerSettings`` fields, e.g. ``max_threads=32``,
            ``step_timeout=30`` or ``mcp=True``.

    Raises:
        TypeError: ``env_factory`` is an instance instead of a factory.
        ConcurrencyConfigurationError: ``max_concurrent_envs > 1`` for an
            environment that does not declare ``SUPPORTS_CONCURRENT_SESSIONS``.
        TypeError: also when a ``@tool`` cannot become a JSON Schema.

    >>> from openenv import create_app, ConcurrencyConfig
    >>> from echo_env.models import EchoAction, EchoObservation
    >>> from echo_env.server.environment import EchoEnvironment
    >>> app = create_app(EchoEnvironment, EchoAction, EchoObservation,
    ...                  ConcurrencyConfig(max_concurrent_envs=64))
    >>> sorted({r.path for r in app.routes if r.path in {"/ws", "/health", "/schema"}})
    ['/health', '/schema', '/ws']
    >>> "/web" in {r.path for r in app.routes}
    True
    >>> app = create_app(EchoEnvironment, EchoAction, EchoObservation, web=False)
    >>> "/web" in {r.path for r in app.routes}
    False
    """
    check_factory(env_factory)
    if max_concurrent_envs is not None:
        if concurrency is not None:
            raise ValueError("pass concurrency or max_concurrent_envs, not both")
        concurrency = ConcurrencyConfig(max_concurrent_envs=max_concurrent_envs)
    concurrency = concurrency or ConcurrencyConfig()
    check_concurrency(env_factory, concurrency)
    service = EnvService(
        env_factory,
        action_cls,
        observation_cls,
        concurrency,
        ServerSettings(**settings),
        state_cls=state_cls,
        metadata=metadata,
    )
    if env_name is not None:
        service.metadata = service.metadata.model_copy(update={"name": env_name})
    if service.env_cls is not None:
        tools_of(service.env_cls)  # a misdeclared @tool fails here, at startup
    extra_routes = []
    if service.settings.mcp:
        from openenv.server.mcp_bridge import mcp_routes

        extra_routes = mcp_routes(service)
    # OpenReward's SDK: its root paths first (its GET /tools and /splits are told
    # apart by their session header), its /{env}/... paths after every other route.
    openreward_root, openreward_env = OpenRewardBridge({service.metadata.name: service}).routes()
    app = EnvApp(
        title=service.metadata.name,
        description=service.metadata.description,
        routes=[
            *openreward_root,
            *routes(),
            *(web_routes() if web else []),
            *extra_routes,
            *openreward_env,
        ],
        lifespan=service.lifespan,
        docs_url=None,
        redoc_url=None,
    )
    add_docs_pages(app, keyed=bool(service.settings.api_key))
    app.state.openenv = service
    key, origins, hosts = (
        service.settings.api_key,
        service.settings.allowed_origins,
        service.settings.allowed_hosts,
    )
    app.add_middleware(AccessGuard, api_key=key, allowed_origins=origins, allowed_hosts=hosts)
    app.session_paths = frozenset({"/ws", "/web/ws"} if web else {"/ws"})
    app.sessions = AccessGuard(
        SessionEndpoint(), api_key=key, allowed_origins=origins, allowed_hosts=hosts
    )
    return app


class EnvApp(FastAPI):
    """FastAPI, except that session sockets skip the HTTP middleware stack.

    A session lives as long as its socket, and the ASGI call that serves it
    holds every middleware's frame for that long: some 4 KiB per session, and
    a longer path for each connect. So while no middleware has been added
    beyond openenv's own ``AccessGuard``, ``/ws`` and ``/web/ws`` go straight
    to the guard and the endpoint; add a middleware (``app.add_middleware``)
    and they take the usual way through it.
    """

    session_paths: frozenset[str] = frozenset()
    sessions: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "websocket"
            and self.sessions is not None
            and scope["path"] in self.session_paths
            and len(self.user_middleware) == 1  # only the AccessGuard create_app added
        ):
            scope["app"] = self
            await self.sessions(scope, receive, send)
            return
        await super().__call__(scope, receive, send)
