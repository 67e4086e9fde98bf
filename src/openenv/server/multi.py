"""Several environments behind one server, each at ``/envs/{name}``.

Each environment is a full ``create_app`` app mounted under its name, so it
keeps its own session cap, threads and idle timeout, and every route of a
one-environment server: ``/envs/{name}/ws``, ``/envs/{name}/health``,
``/envs/{name}/tasks``, ``/envs/{name}/mcp`` (with ``mcp=True``), ...
``GET /envs`` lists them, and ``GET /health`` sums up theirs
(``server/multi_health.py``). OpenReward's SDK reaches them all from the root
(``server/openreward.py``), each session under its environment's cap.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.routing import APIRoute
from starlette.routing import Mount

from openenv.protocol import EnvInfo, EnvListing
from openenv.server.api_docs import add_docs_pages
from openenv.server.app import create_app
from openenv.server.catalog import splits_of, tool_names
from openenv.server.config import ConcurrencyConfig
from openenv.server.multi_health import health_routes
from openenv.server.openreward import OpenRewardBridge
from openenv.server.routes import head_of
from openenv.server.security import AccessGuard, AnyGuard
from openenv.server.service import EnvService
from openenv.types import Action, EnvironmentMetadata, Observation, State

__all__ = ["EnvSpec", "create_multi_app"]

_NAME = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


class EnvSpec:
    """The arguments of ``create_app`` for one environment of ``create_multi_app``.

    >>> from echo_env.models import EchoAction, EchoObservation
    >>> from echo_env.server.environment import EchoEnvironment
    >>> spec = EnvSpec(EchoEnvironment, EchoAction, EchoObservation,
    ...                ConcurrencyConfig(max_concurrent_envs=8))
    >>> spec.concurrency.max_concurrent_envs
    8
    """

    def __init__(
        self,
        env_factory: Any,
        action_cls: type[Action],
        observation_cls: type[Observation],
        concurrency: ConcurrencyConfig | None = None,
        *,
        state_cls: type[State] | None = None,
        metadata: EnvironmentMetadata | None = None,
        **settings: Any,
    ) -> None:
        self.env_factory = env_factory
        self.action_cls = action_cls
        self.observation_cls = observation_cls
        self.concurrency = concurrency or ConcurrencyConfig()
        self.state_cls = state_cls
        self.metadata = metadata
        self.settings = settings

    def build(self) -> FastAPI:
        """The one-environment app (``create_app``) this spec describes."""
        return create_app(
            self.env_factory,
            self.action_cls,
            self.observation_cls,
            self.concurrency,
            state_cls=self.state_cls,
            metadata=self.metadata,
            **self.settings,
        )


def create_multi_app(envs: Mapping[str, EnvSpec], *, title: str = "openenv") -> FastAPI:
    """Serve several environments, each at ``/envs/{name}`` with its own cap.

    Args:
        envs: Environment names (letters, digits, ``_ . -``, and ``/`` for
            namespaces like ``ns/counter``) and what to serve under each.
        title: The title of the server's API docs.

    Raises:
        ValueError: no environments, or a name that cannot be a URL path.

    >>> from echo_env.models import EchoAction, EchoObservation
    >>> from echo_env.server.environment import EchoEnvironment
    >>> app = create_multi_app({"echo": EnvSpec(EchoEnvironment, EchoAction, EchoObservation)})
    >>> sorted({r.path for r in app.routes if r.path.startswith("/envs")})
    ['/envs', '/envs/echo']
    """
    if not envs:
        raise ValueError("create_multi_app() needs at least one environment")
    for name in envs:
        if not _NAME.match(name):
            raise ValueError(
                f"environment name {name!r} must be letters, digits, '_', '.', '-', "
                f"optionally in '/'-separated parts (e.g. 'ns/counter')"
            )
    apps = {name: spec.build() for name, spec in envs.items()}
    for name, sub in apps.items():
        # Not by the environment's name, which two of them may share: one cap each.
        sub.state.openenv.board_name = name.replace("/", "+")
    # OpenReward's SDK reaches every environment from the root: /create, /call and
    # the rest name theirs in X-Deployment or as /{name}/call (server/openreward.py).
    bridge = OpenRewardBridge({name: sub.state.openenv for name, sub in apps.items()})
    openreward_root, openreward_env = bridge.routes()
    listing = APIRoute("/envs", list_envs, methods=["GET"], response_model=EnvListing)
    app = FastAPI(
        title=title,
        routes=[
            listing,
            head_of(listing),  # as a one-environment server's /health (uptime monitors)
            *health_routes(),  # where load balancers and HEALTHCHECKs look
            *(Mount(f"/envs/{name}", app=sub) for name, sub in apps.items()),
            *openreward_root,
            *openreward_env,
        ],
        lifespan=_MountedLifespans(list(apps.values())),
        docs_url=None,
        redoc_url=None,
    )
    add_docs_pages(app, keyed=any(s.state.openenv.settings.api_key for s in apps.values()))
    app.state.openenv_envs = {name: sub.state.openenv for name, sub in apps.items()}
    app.state.openenv_guards = bridge.guards
    # Only the mounts' own paths skip the root's check: another /envs/x/... path
    # reaches the root's routes (OpenReward's /{env}/tools), which need a key.
    mounts = [f"/envs/{name}/" for name in apps]
    app.add_middleware(AnyGuard, guards=bridge.guards.values(), mounted=mounts)
    return app


class _MountedLifespans:
    """Starlette does not run the lifespans of mounted apps, so the parent runs them."""

    def __init__(self, apps: list[FastAPI]) -> None:
        self.apps = apps

    @contextlib.asynccontextmanager
    async def __call__(self, app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for sub in self.apps:
                await stack.enter_async_context(sub.router.lifespan_context(sub))
            yield


async def list_envs(request: Request) -> EnvListing:
    """The environments this server hosts, their session counts, splits and tools:
    those the request's key (and host) may reach."""
    services: dict[str, EnvService] = request.app.state.openenv_envs
    guards: dict[str, AccessGuard] = request.app.state.openenv_guards
    return EnvListing(
        envs=[
            EnvInfo(
                name=name,
                path=f"/envs/{name}",
                metadata=service.metadata,
                active_sessions=service.registry.totals()[0],
                max_sessions=service.registry.max_sessions,
                splits=await _splits_or_none(service),
                tools=tool_names(service),
            )
            for name, service in services.items()
            if guards[name].refusal(request.scope, "/envs") is None
        ]
    )


async def _splits_or_none(service: EnvService) -> list[str]:
    # One environment whose list_splits raises (logged) must not hide the others.
    try:
        return await splits_of(service)
    except HTTPException:
        return []
