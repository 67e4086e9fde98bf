"""The HTTP routes: introspection, and OpenEnv's stateless calls. Episodes run over WebSocket."""

from __future__ import annotations

from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.routing import BaseRoute, Route, WebSocketRoute

from openenv.json_schema import model_schema
from openenv.protocol import PROTOCOL_VERSION, Health
from openenv.server.catalog import catalog_routes
from openenv.server.endpoint import SessionEndpoint
from openenv.server.metrics import CONTENT_TYPE
from openenv.server.service import EnvService
from openenv.server.simulation import environment_metadata, simulation_routes
from openenv.server.webpage import asset, page
from openenv.types import EnvironmentMetadata

__all__ = ["SchemaResponse", "head_of", "health_of", "routes", "web_routes"]


class SchemaResponse(BaseModel):
    action: dict[str, Any]
    observation: dict[str, Any]
    state: dict[str, Any]


def _service(request: Request) -> EnvService:
    service: EnvService = request.app.state.openenv
    return service


async def health(request: Request) -> Health:
    """Liveness, and how many session slots are taken (in the whole server)."""
    return health_of(_service(request))


def health_of(service: EnvService) -> Health:
    """What ``/health`` says of ``service``."""
    active, queued = service.registry.totals()
    problems = service.health_problems()
    status = "draining" if service.draining else "degraded" if problems else "healthy"
    return Health(
        status=status,
        reason="; ".join(problems) or None,
        active_sessions=active,
        max_sessions=service.registry.max_sessions,
        queued_sessions=queued,
        protocol_version=PROTOCOL_VERSION,
        workers=service.registry.workers(),
    )


async def metrics(request: Request) -> Response:
    """Prometheus metrics: sessions, queue, steps, step latency, errors by code."""
    return Response(_service(request).metrics.render(), media_type=CONTENT_TYPE)


async def metadata(request: Request) -> EnvironmentMetadata:
    """The environment's name, description and concurrency support."""
    return await environment_metadata(_service(request))


async def schema(request: Request) -> SchemaResponse:
    """JSON Schemas of the action, the observation and the state."""
    service = _service(request)
    return SchemaResponse(
        action=model_schema(service.action_cls),
        observation=model_schema(service.observation_cls),
        state=model_schema(service.state_cls),
    )


def routes() -> list[BaseRoute]:
    introspection = [
        APIRoute(
            "/health",
            health,
            methods=["GET"],
            response_model=Health,
            response_model_exclude_none=True,  # "reason" only when degraded
        ),
        APIRoute("/metadata", metadata, methods=["GET"], response_model=EnvironmentMetadata),
        APIRoute("/schema", schema, methods=["GET"], response_model=SchemaResponse),
        APIRoute("/metrics", metrics, methods=["GET"], response_class=Response),
    ]
    catalog = catalog_routes()
    return [
        *introspection,
        *(head_of(route) for route in introspection),
        WebSocketRoute("/ws", SessionEndpoint()),
        *simulation_routes(),
        *catalog,
        *(head_of(route) for route in catalog),
    ]


def head_of(route: APIRoute) -> APIRoute:
    """HEAD beside a GET route (uptime monitors ask so, and read a 405 as down):
    the GET's status and headers, whose body the HTTP layer leaves out. Not in
    the OpenAPI page, where it would list each route twice."""
    return APIRoute(
        route.path,
        route.endpoint,
        methods=["HEAD"],
        response_model=route.response_model,
        response_class=route.response_class,
        response_model_exclude_none=route.response_model_exclude_none,
        include_in_schema=False,
    )


def web_routes() -> list[BaseRoute]:
    """The page at ``/web``, its files, and its session route ``/web/ws``.

    ``/web/ws`` is the same endpoint as ``/ws``: same protocol, same session cap.
    """
    return [
        Route("/web", page, methods=["GET"]),
        WebSocketRoute("/web/ws", SessionEndpoint()),
        Route("/web/{name}", asset, methods=["GET"]),
    ]
