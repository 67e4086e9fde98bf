"""A client's errors cross process boundaries as they are.

Training code runs clients in worker processes (a process pool, Ray or Spark
tasks) whose exceptions come back to the caller pickled. Each error a client
raises against a real server must arrive as the same class with the same
message and fields, so ``except CapacityError`` in the caller still works.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import socket

import pytest

from echo_env.client import EchoEnv
from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import (
    CapacityError,
    ConcurrencyConfig,
    ConnectionFailedError,
    EnvValidationError,
    SessionClosedError,
    create_app,
)
from openenv.errors import OpenEnvError
from openenv.testing import run_server


def bad_action(url: str) -> None:
    with EchoEnv(url).sync() as env:
        env.reset()
        env.step({"message": 5})  # type: ignore[arg-type]


def second_session(url: str) -> None:
    with EchoEnv(url).sync() as first, EchoEnv(url).sync() as second:
        first.reset()
        second.reset()


def closed_port(port: int) -> None:
    with EchoEnv(f"http://127.0.0.1:{port}").sync() as env:
        env.reset()


def closed_session(url: str) -> None:
    env = EchoEnv(url).sync()
    env.reset()
    env.close()
    env.step(EchoAction(message="after close"))


def raised_in_a_worker(function: object, argument: object) -> OpenEnvError:
    context = multiprocessing.get_context("spawn")  # as Ray and Spark workers start
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        future = pool.submit(function, argument)  # type: ignore[arg-type]
        with pytest.raises(OpenEnvError) as caught:
            future.result(timeout=120)
    return caught.value


def test_a_servers_error_frames_arrive_from_a_worker_as_raised(echo_url: str) -> None:
    error = raised_in_a_worker(bad_action, echo_url)
    assert type(error) is EnvValidationError
    assert error.code.value == "VALIDATION_ERROR"
    assert str(error).startswith("[VALIDATION_ERROR] ")
    assert error.errors  # the details, with the fields that are wrong
    assert isinstance(error, RuntimeError)  # as OpenEnv's client raises it


def test_a_full_servers_refusal_arrives_from_a_worker_with_its_counts() -> None:
    app = create_app(
        EchoEnvironment, EchoAction, EchoObservation, ConcurrencyConfig(max_concurrent_envs=1)
    )
    with run_server(app) as url:
        error = raised_in_a_worker(second_session, url)
    assert type(error) is CapacityError
    assert (error.active_sessions, error.max_sessions) == (1, 1)


def test_a_connection_failure_arrives_from_a_worker_with_its_url() -> None:
    with socket.socket() as taken:  # bound, not listening: connecting is refused
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        error = raised_in_a_worker(closed_port, port)
    assert type(error) is ConnectionFailedError
    assert isinstance(error, ConnectionError)  # as OpenEnv's client raises it
    assert error.url == f"ws://127.0.0.1:{port}/ws"
    assert str(error).startswith(f"cannot connect to {error.url}: ")


def test_a_closed_session_arrives_from_a_worker_as_raised(echo_url: str) -> None:
    error = raised_in_a_worker(closed_session, echo_url)
    assert type(error) is SessionClosedError
    assert str(error).startswith("session closed: ")
    assert error.reason in str(error)


SECRET = "s3cret-key-in-the-url"


def refused_port() -> int:
    with socket.socket() as taken:  # bound, then closed: nothing listens there
        taken.bind(("127.0.0.1", 0))
        port: int = taken.getsockname()[1]
    return port


async def first_failure(url: str, client: str) -> Exception:
    from openenv.client import MuxClient, WebSocketEnvClient
    from openenv.runtime import RunConfig, Runners, Task

    try:
        if client == "env":
            async with WebSocketEnvClient(url, connect_timeout=5) as env:
                await env.reset()
        elif client == "mux":
            async with MuxClient(url, connect_timeout=5) as mux:
                await mux.open()
        else:

            async def agent(session: object) -> None:
                await session.reset()  # type: ignore[attr-defined]

            results = await Runners.run_task([Task(id="t", env=url, agent=agent)], RunConfig())
            assert results[0].error is not None
            return RuntimeError(results[0].error.message)
    except (OpenEnvError, ValueError) as exc:  # ValueError: a URL that cannot be one
        return exc
    raise AssertionError("no failure")


@pytest.mark.parametrize("client", ["env", "mux", "runners"])
@pytest.mark.parametrize("where", ["refused", "wrong key", "bad port"])
async def test_a_key_in_the_url_is_not_repeated_in_errors(client: str, where: str) -> None:
    # Errors go to logs, tracebacks and results files (TaskResult.error): the URL
    # in them once carried a key given as ?api_key=, as browsers give it.
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, api_key="the-right-key")
    with run_server(app) as served:
        url = {
            "refused": f"ws://127.0.0.1:{refused_port()}/ws?api_key={SECRET}",
            "wrong key": f"{served}/ws?api_key={SECRET}",
            "bad port": f"ws://127.0.0.1:port/ws?api_key={SECRET}",
        }[where]
        error = await first_failure(url, client)
    assert str(error)  # the failure is told
    assert SECRET not in str(error), error
    assert SECRET not in repr(error.__dict__), error.__dict__
