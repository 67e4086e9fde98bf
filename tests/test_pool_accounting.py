"""A ``ServerPool``'s own count of the sessions it holds on each server, through failures."""

from __future__ import annotations

import pytest
from servers import Ping, PingEnvironment, Pong

from openenv import ConcurrencyConfig, RunConfig, Runners, ServerPool, Task, create_app
from openenv.testing import run_server


def no_environment() -> PingEnvironment:
    raise RuntimeError("no environment today")


async def agent(session: object) -> None:
    await session.step(Ping(message="go"))  # type: ignore[attr-defined]


@pytest.mark.parametrize("multiplex", [True, False], ids=["v2", "v1"])
def test_sessions_whose_factory_fails_are_not_counted_as_held_by_the_pool(
    multiplex: bool,
) -> None:
    # Runners over a pool opened each v2 session with the pool's slot taken,
    # and a session the server could not make (its factory raised) kept it:
    # the pool went on counting sessions it did not hold.
    app = create_app(no_environment, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=4))
    with run_server(app) as url:
        pool = ServerPool([url])
        tasks = [Task(id=f"t{i}", env=pool, agent=agent) for i in range(5)]
        config = RunConfig(engine_name="local", worker_num=1, multiplex=multiplex)
        results = Runners.sync_run_task(tasks, config)
    assert [r.status.value for r in results] == ["error"] * 5
    assert all(r.error is not None and r.error.type == "FactoryError" for r in results)
    (server,) = pool.servers()
    assert server.placed == 0  # "sessions this pool holds there now": none
