"""EnvClient called the way OpenEnv and TRL users call it: plain synchronous code.

With no event loop running in the calling thread, ``reset``/``step``/``state``/
``close`` block and return their result; inside a running loop they stay
awaitable. A connection belongs to the loop that opened it, so a client used
both ways carries each call over to that loop.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import multiprocessing
import threading
import warnings
from typing import Any

import pytest
from servers import slots_free

from echo_env import EchoAction, EchoEnv
from echo_env.models import EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import (
    AuthenticationError,
    ConnectionFailedError,
    SessionClosedError,
    StepResult,
    create_app,
)
from openenv.testing import run_server

KEY = "sesame-sesame-sesame"


def test_methods_block_and_return_results_without_an_event_loop(echo_url: str) -> None:
    env = EchoEnv(base_url=echo_url)
    try:
        reset = env.reset()
        assert isinstance(reset, StepResult)
        assert not reset.done
        result = env.step(EchoAction(message="hello"))
        assert result.observation.echoed_message == "hello"
        assert result.reward == pytest.approx(0.5)
        assert env.state().step_count == 1
    finally:
        assert env.close() is None
    with pytest.raises(SessionClosedError):
        env.step(EchoAction(message="after close"))


def test_with_block_and_base_url(echo_url: str) -> None:
    with EchoEnv(base_url=echo_url) as env:
        assert env.base_url == echo_url
        env.reset()
        assert env.step(EchoAction(message="hey")).observation.message_length == 3


async def test_methods_stay_awaitable_inside_an_event_loop(echo_url: str) -> None:
    async with EchoEnv(echo_url) as env:
        pending = env.step(EchoAction(message="hi"))
        assert inspect.isawaitable(pending)
        assert (await pending).observation.echoed_message == "hi"


def test_a_client_used_synchronously_then_awaited_on_another_loop(echo_url: str) -> None:
    # TRL resets environments from plain code and may await async tools on
    # its own daemon loop: both reach the one connection.
    env = EchoEnv(echo_url)
    env.reset()

    async def on_a_trainer_loop() -> str:
        result = await env.step(EchoAction(message="from a loop"))
        return result.observation.echoed_message

    assert asyncio.run(on_a_trainer_loop()) == "from a loop"
    assert env.step(EchoAction(message="back to sync")).observation.echoed_message == (
        "back to sync"
    )
    assert env.state().step_count == 2
    env.close()


def test_a_client_opened_on_a_loop_that_stopped_says_so(echo_url: str) -> None:
    clients = [EchoEnv(echo_url)]

    async def open_it() -> None:
        await clients[0].reset()

    asyncio.run(open_it())
    with pytest.raises(SessionClosedError, match="event loop that has stopped"):
        clients[0].step(EchoAction(message="hi"))
    # The socket went down with its loop, unclosed: the caller's doing, not ours.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        clients.clear()
        gc.collect()


def test_closing_a_client_whose_loop_has_stopped_frees_its_slot() -> None:
    # A script's pattern: the client made at the top, an episode under
    # asyncio.run, and close() at the end (or in a finally).
    echo = create_app(EchoEnvironment, EchoAction, EchoObservation)  # one slot
    with run_server(echo) as url:
        clients = [EchoEnv(url), EchoEnv(url)]

        async def play(env: EchoEnv) -> None:
            await env.reset()

        asyncio.run(play(clients[0]))
        assert clients[0].close() is None  # from plain code: cut, not refused
        clients[0].close()  # idempotent
        asyncio.run(slots_free(url))
        with pytest.raises(SessionClosedError, match="closed"):
            clients[0].step(EchoAction(message="after close"))

        asyncio.run(play(clients[1]))  # the slot was free to take

        async def close_later(env: EchoEnv) -> None:
            await env.close()

        asyncio.run(close_later(clients[1]))  # from another loop
        asyncio.run(slots_free(url))
        # Their sockets' file descriptors went with their loops, which never closed them.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            clients.clear()
            gc.collect()


def test_a_client_whose_first_connect_failed_connects_from_a_new_loop() -> None:
    # The server not up yet, then retried under a new asyncio.run: no connection
    # was opened on the first loop, so nothing ties the client to it; not even
    # the first loop's calls that waited for one another to connect.
    refused: list[object] = []
    echo = create_app(EchoEnvironment, EchoAction, EchoObservation)

    async def refusing_the_first_two_handshakes(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and len(refused) < 2:
            refused.append(scope)
            await receive()  # the handshake's request
            await send({"type": "websocket.close"})  # refused: HTTP 403
            return
        await echo(scope, receive, send)

    with run_server(refusing_the_first_two_handshakes) as url:
        env = EchoEnv(url)

        async def too_soon() -> list[Any]:
            return await asyncio.gather(env.reset(), env.reset(), return_exceptions=True)

        async def play() -> str:
            try:
                await asyncio.gather(env.reset(), env.state())
                return (await env.step(EchoAction(message="again"))).observation.echoed_message
            finally:
                await env.close()

        assert [type(failure) for failure in asyncio.run(too_soon())] == [ConnectionFailedError] * 2
        assert asyncio.run(play()) == "again"


def test_each_thread_of_a_thread_pool_drives_its_own_client(echo_url: str) -> None:
    rewards: list[float | None] = []

    def play(message: str) -> None:
        with EchoEnv(echo_url) as env:
            env.reset()
            rewards.append(env.step(EchoAction(message=message)).reward)

    threads = [threading.Thread(target=play, args=("x" * n,)) for n in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r or 0.0 for r in rewards) == pytest.approx([n / 10 for n in range(1, 9)])


def test_openenv_client_options() -> None:
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, api_key=KEY)
    with run_server(app) as url:
        # OpenEnv users pass the key (for a private Space, say) as headers=.
        with EchoEnv(url, headers={"Authorization": f"Bearer {KEY}"}, message_timeout_s=7.5) as env:
            assert env.message_timeout == 7.5
            env.reset()
        with pytest.raises(AuthenticationError):
            EchoEnv(url, headers={"Authorization": "Bearer wrong"}).reset()


def test_max_message_size_mb_bounds_the_replies(echo_url: str) -> None:
    # 200 bytes: the reply to a 1,000-character echo cannot fit.
    env = EchoEnv(echo_url, max_message_size_mb=200 / 2**20)
    env.reset()
    with pytest.raises(SessionClosedError):
        env.step(EchoAction(message="x" * 1000))
    env.close()


def _in_forked_child(url: str, inherited: EchoEnv, results: Any) -> None:
    fresh = EchoEnv(url)
    fresh.reset()
    results.put(fresh.step(EchoAction(message="child")).observation.echoed_message)
    fresh.close()
    try:
        inherited.step(EchoAction(message="parent's session"))
    except SessionClosedError as exc:
        results.put(str(exc))
    inherited.close()  # forgotten here; the connection stays the parent's
    results.put("closed")


def test_a_forked_child_gets_its_own_loop_instead_of_waiting_for_ever(echo_url: str) -> None:
    # A process forked after the parent's blocking calls (datasets' map with
    # num_proc, a fork pool building prompts) inherits the shared loop without
    # the thread that ran it: a call put on it would never be answered.
    parent = EchoEnv(echo_url)
    parent.reset()
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_in_forked_child, args=(echo_url, parent, results))
    child.start()
    try:
        assert results.get(timeout=60) == "child"
        # The parent's connection is not the child's to use.
        assert "forked" in results.get(timeout=60)
        assert results.get(timeout=60) == "closed"
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert parent.step(EchoAction(message="still mine")).observation.echoed_message == "still mine"
    parent.close()


def test_calls_cancelled_before_they_start_leave_no_coroutine_never_awaited(
    echo_url: str,
) -> None:
    # A gather of steps cancelled at once (a load loop stopped, a timeout): its
    # calls never start. None may leave a coroutine behind, which Python reports
    # as "never awaited" when it is collected (an error under -W error).
    async def scenario() -> None:
        async with EchoEnv(echo_url) as env:
            await env.reset()
            steps = asyncio.gather(*(env.step(EchoAction(message="x")) for _ in range(4)))
            steps.cancel()
            with pytest.raises(asyncio.CancelledError):
                await steps
            assert (
                await env.step(EchoAction(message="after"))
            ).observation.echoed_message == "after"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(scenario())
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
