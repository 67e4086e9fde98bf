"""``openenv.core.containers.runtime``: OpenEnv 0.10's container providers, by name.

openenv does not start containers. Scripts written for OpenEnv import
``LocalDockerProvider`` at the top and use it in one mode of several (TRL's
``catch.py`` and ``sudoku.py``, ``--env-mode docker-image``), and OpenEnv's
clients name ``ContainerProvider`` in type hints: both import here, so the
other modes run; making a provider raises ``RuntimeError`` saying what to run
instead.

>>> from openenv.core.containers.runtime import LocalDockerProvider
>>> LocalDockerProvider()  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
RuntimeError: openenv does not start containers (LocalDockerProvider): start the ...
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Any, NoReturn, Self

__all__ = ["ContainerProvider", "DockerSwarmProvider", "KubernetesProvider", "LocalDockerProvider"]


class ContainerProvider(ABC):
    """OpenEnv's interface of a provider that starts one environment container."""

    @abstractmethod
    def start_container(
        self,
        image: str,
        port: int | None = None,
        env_vars: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> str:
        """Start a container of ``image``; its server's base URL."""

    @abstractmethod
    def stop_container(self) -> None:
        """Stop and remove the container."""

    @abstractmethod
    def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
        """Return once the server at ``base_url`` answers."""

    def close(self) -> None:
        """Release what the provider holds besides the container (nothing by default)."""
        return

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _NotStarted(ContainerProvider):
    """A provider of OpenEnv's that openenv does not have: making one raises."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            f"openenv does not start containers ({type(self).__name__}): start the "
            "environment's server yourself (`docker run -p 8000:8000 IMAGE`, or "
            "`openenv serve` in the environment's directory) and give the client its "
            "URL (TRL's examples: --env-mode docker-local or local)"
        )

    def start_container(self, image: str, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError  # never reached: __init__ raises

    def stop_container(self) -> None:
        raise NotImplementedError

    def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
        raise NotImplementedError


class LocalDockerProvider(_NotStarted):
    """OpenEnv's provider of local Docker containers; making one raises (see above)."""


class DockerSwarmProvider(_NotStarted):
    """OpenEnv's provider of Docker Swarm services; making one raises (see above)."""


class KubernetesProvider(_NotStarted):
    """OpenEnv's provider of Kubernetes pods; making one raises (see above)."""
