"""``isolation="process"``: an environment that crashes takes only its own session down."""

from __future__ import annotations

import asyncio
import functools
import os
from pathlib import Path

import httpx
import pytest
from isolated_envs import Crash, Crashy, OpenEnvPicky, Picky, Sighting, Told, hangs_if

from openenv import (
    ConcurrencyConfig,
    DeadlineError,
    EnvClient,
    EnvExecutionError,
    EnvValidationError,
    FactoryError,
    MuxClient,
    SessionClosedError,
    State,
    create_app,
)
from openenv.testing import run_server


class CrashyClient(EnvClient[Crash, Sighting, State]):
    pass


class ToldClient(EnvClient[Crash, Told, State]):
    pass


async def active(url: str) -> int:
    async with httpx.AsyncClient() as http:
        count: int = (await http.get(f"{url}/health")).json()["active_sessions"]
        return count


def app(**settings: object) -> object:
    return create_app(Crashy, Crash, Sighting, ConcurrencyConfig(max_concurrent_envs=8), **settings)


@pytest.mark.parametrize("how", ["exit", "segfault", "kill"])
def test_a_crash_ends_its_own_session_and_no_other(how: str) -> None:
    with run_server(app(isolation="process")) as url:

        async def scenario() -> None:
            clients = [CrashyClient(url) for _ in range(4)]
            first = await asyncio.gather(*(c.reset() for c in clients))
            pids = {r.observation.pid for r in first}
            assert len(pids) == 4  # a process each
            assert os.getpid() not in pids
            victim, *others = clients
            with pytest.raises(EnvExecutionError, match="the environment's process") as caught:
                await victim.step(Crash(how=how))
            assert "session is closed" in str(caught.value)
            with pytest.raises(SessionClosedError):
                await victim.step(Crash())
            for _ in range(3):  # the others go on, each in its own process
                steps = await asyncio.gather(*(c.step(Crash()) for c in others))
                assert {s.observation.pid for s in steps} == pids - {first[0].observation.pid}
            assert await active(url) == 3
            await asyncio.gather(*(c.close() for c in clients))
            assert await active(url) == 0

        asyncio.run(scenario())


def running(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def test_a_step_past_its_deadline_kills_its_process_and_ends_only_its_session() -> None:
    # Only killing the process stops an isolated call; left running, its late
    # reply would be read as the answer to the session's next call.
    with run_server(app(isolation="process", step_timeout=0.5)) as url:

        async def scenario() -> None:
            victim, other = CrashyClient(url), CrashyClient(url)
            pid = (await victim.reset()).observation.pid
            await other.reset()
            with pytest.raises(DeadlineError, match="killed") as caught:
                await victim.step(Crash(how="hang"))
            assert "session is closed" in str(caught.value)
            with pytest.raises(SessionClosedError):
                await victim.step(Crash())
            deadline = asyncio.get_running_loop().time() + 30
            while running(pid):
                assert asyncio.get_running_loop().time() < deadline, f"{pid} still runs"
                await asyncio.sleep(0.05)
            assert (await other.step(Crash())).observation.steps == 1
            assert await active(url) == 1
            await asyncio.gather(victim.close(), other.close())
            assert await active(url) == 0

        asyncio.run(scenario())


def test_a_factory_past_its_deadline_is_killed_and_its_slot_freed(tmp_path: Path) -> None:
    flag = tmp_path / "hang"
    factory = functools.partial(hangs_if, str(flag))
    settings = ConcurrencyConfig(max_concurrent_envs=1)
    with run_server(
        create_app(factory, Crash, Sighting, settings, isolation="process", factory_timeout=2)
    ) as url:

        async def scenario() -> None:
            async with CrashyClient(url) as env:  # the fork server is up: the next starts at once
                await env.reset()
            flag.touch()
            with pytest.raises(FactoryError, match=r"did not return within 2s"):
                async with CrashyClient(url) as env:
                    await env.reset()
            pid = int(await asyncio.to_thread(flag.read_text))
            flag.unlink()
            async with CrashyClient(url) as env:  # the one slot is free again
                assert (await env.reset()).observation.pid != pid
            deadline = asyncio.get_running_loop().time() + 30
            while running(pid):
                assert asyncio.get_running_loop().time() < deadline, f"{pid} still runs"
                await asyncio.sleep(0.05)

        asyncio.run(scenario())


def test_state_and_errors_cross_the_process_boundary() -> None:
    with run_server(app(isolation="process")) as url:

        async def scenario() -> None:
            async with CrashyClient(url) as env:
                await env.reset()
                await env.step(Crash())
                await env.step(Crash())
                assert (await env.state()).step_count == 2
                with pytest.raises(EnvExecutionError, match="ValueError"):
                    await env.step(Crash(how="raise"))
                assert (await env.step(Crash())).observation.steps == 3  # it goes on
                # An unfit return value is named with the environment's own class,
                # as without isolation (it said "step() of ProcessEnvironment").
                with pytest.raises(EnvExecutionError) as unfit:
                    await env.step(Crash(how="unfit"))
                assert unfit.value.message == (
                    "step() of Crashy returned dict, expected Observation"
                )
                assert (await env.step(Crash())).observation.steps == 4

        asyncio.run(scenario())


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_an_env_errors_message_crosses_the_process_boundary_as_raised(isolation: str) -> None:
    """Pickle rebuilt the exception by calling its class with its message, which an
    ``EnvError`` whose ``__init__`` takes something else misread: the client got
    "move "move 'refuse' is not allowed" is not allowed"."""
    with run_server(app(isolation=isolation)) as url:

        async def scenario() -> None:
            async with CrashyClient(url) as env:
                await env.reset()
                with pytest.raises(EnvExecutionError) as refused:
                    await env.step(Crash(how="refuse"))
                assert refused.value.message == (
                    "step() raised Refused: move 'refuse' is not allowed"
                )
                assert (await env.step(Crash())).observation.steps == 1  # it goes on

        asyncio.run(scenario())


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_reset_arguments_are_checked_as_the_environments_own_reset_takes_them(
    isolation: str,
) -> None:
    # The proxy's reset takes anything; what reaches the child's environment must
    # be what reaches it in process: its task class, and only arguments it takes.
    picky = create_app(
        Picky, Crash, Told, ConcurrencyConfig(max_concurrent_envs=2), isolation=isolation
    )
    openenv_picky = create_app(OpenEnvPicky, Crash, Told, isolation=isolation)
    with run_server(picky) as url, run_server(openenv_picky) as openenv_url:

        async def scenario() -> None:
            async with ToldClient(url) as env:
                told = (await env.reset(seed=3, task={"id": "t"})).observation
                assert (told.task_class, told.target, told.seed) == ("Goal", 7, 3)
                with pytest.raises(EnvValidationError, match="does not accept 'level'") as error:
                    await env.reset(level=2)
                assert error.value.details["errors"][0]["loc"] == ["data", "level"]
                with pytest.raises(EnvValidationError, match="invalid task: target"):
                    await env.reset(task={"id": "t", "target": "high"})
                told = (await env.reset(task={"id": "t", "target": 9})).observation
                assert told.target == 9  # the session goes on
            async with ToldClient(openenv_url) as env:
                told = (await env.reset(seed=5, level=2)).observation
                assert told.seed == 5  # level dropped, as OpenEnv's server drops it

        asyncio.run(scenario())


def test_without_isolation_a_crash_is_the_servers_business() -> None:
    # The baseline the option exists for: same app, same process, no proxy.
    with run_server(app()) as url:

        async def scenario() -> None:
            async with CrashyClient(url) as env:
                reply = await env.reset()
                assert reply.observation.pid == os.getpid()

        asyncio.run(scenario())


def test_an_environment_with_tools_cannot_be_isolated() -> None:
    from counter_env.models import CounterAction, CounterObservation
    from counter_env.server.environment import CounterEnvironment

    with pytest.raises(ValueError, match="has @tool methods"):
        create_app(
            CounterEnvironment,
            CounterAction,
            CounterObservation,
            isolation="process",
        )


def test_over_protocol_v2_a_crash_closes_only_its_own_session() -> None:
    with run_server(app(isolation="process")) as url:

        async def scenario() -> None:
            async with MuxClient(url, action_cls=Crash, observation_cls=Sighting) as mux:
                sessions = await mux.open(4)
                first = await mux.reset(sessions)
                assert len({r.observation.pid for r in first}) == 4
                actions = [Crash(how="segfault"), Crash(), Crash(how="raise"), Crash()]
                results = await mux.step(sessions, actions, return_exceptions=True)
                assert isinstance(results[0], EnvExecutionError)
                assert "session is closed" in str(results[0])
                assert isinstance(results[2], EnvExecutionError)  # raised: the session goes on
                assert sessions[0].closed
                assert not any(s.closed for s in sessions[1:])
                again = await mux.step(sessions[1:], [Crash()] * 3)
                assert [r.observation.steps for r in again] == [2, 1, 2]
                assert await active(url) == 3
            assert await active(url) == 0

        asyncio.run(scenario())
