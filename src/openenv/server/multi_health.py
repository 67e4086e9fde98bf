"""``GET /health`` at the root of a server of several environments.

Load balancers, ``docker HEALTHCHECK`` and Kubernetes probes ask the root's
``/health``; each environment answers its own at ``/envs/{name}/health``. The
root's sums them up and is only as well as its worst environment: "draining"
if one drains, "degraded" if one is (its ``reason`` names which, and why),
"healthy" only when all are. As in ``GET /envs``, only the environments the
caller's key opens are named; the others count in the sums and the status.
"""

from __future__ import annotations

from collections.abc import Container, Mapping

from fastapi import Request
from fastapi.routing import APIRoute

from openenv.protocol import MultiHealth
from openenv.server.routes import head_of, health_of
from openenv.server.security import AccessGuard
from openenv.server.service import EnvService

__all__ = ["health_routes", "multi_health"]


def multi_health(services: Mapping[str, EnvService], shown: Container[str]) -> MultiHealth:
    """The root's ``/health`` for environments ``services``, by name; those in
    ``shown`` are named in it, the others only counted."""
    envs = {name: health_of(service) for name, service in services.items()}
    unwell = {name: h for name, h in envs.items() if h.status != "healthy"}
    if any(h.status == "draining" for h in unwell.values()):
        status = "draining"
    else:
        status = "degraded" if unwell else "healthy"
    reasons = [
        f"{name}: {h.status}" + (f" ({h.reason})" if h.reason else "")
        for name, h in unwell.items()
        if name in shown
    ]
    if hidden := sum(name not in shown for name in unwell):
        reasons.append(f"{hidden} environment(s) that need another key: not healthy")
    return MultiHealth(
        status=status,
        reason="; ".join(reasons) or None,
        active_sessions=sum(h.active_sessions for h in envs.values()),
        max_sessions=sum(h.max_sessions for h in envs.values()),
        queued_sessions=sum(h.queued_sessions for h in envs.values()),
        protocol_version=max(h.protocol_version for h in envs.values()),
        workers=max(h.workers for h in envs.values()),
        envs={name: h for name, h in envs.items() if name in shown},
    )


async def _health(request: Request) -> MultiHealth:
    """Liveness of every environment, and their session counts: the sums, and each one's."""
    services: dict[str, EnvService] = request.app.state.openenv_envs
    guards: dict[str, AccessGuard] = request.app.state.openenv_guards
    shown = {name for name in services if guards[name].refusal(request.scope, "/envs") is None}
    return multi_health(services, shown)


def health_routes() -> list[APIRoute]:
    """``GET /health`` and ``HEAD /health`` (uptime monitors ask so)."""
    route = APIRoute(
        "/health",
        _health,
        methods=["GET"],
        response_model=MultiHealth,
        response_model_exclude_none=True,  # "reason" only when one is unwell
    )
    return [route, head_of(route)]
