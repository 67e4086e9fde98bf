"""RemoteVectorEnv under hostile conditions: bad actions, a server killed mid-step,
a step that gets no reply, sessions reaped while idle; and infos that are not
CartPole's empty ones."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import orjson
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from servers import slots_free
from test_gymnasium_vector_sessions import LateFailure
from test_shutdown import free_port, wait_healthy
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from openenv import (
    AuthenticationError,
    CapacityError,
    ConcurrencyConfig,
    ConnectionFailedError,
    EnvExecutionError,
    EnvTimeoutError,
    EnvValidationError,
    OpenEnvError,
    SessionClosedError,
)
from openenv.adapters.gymnasium import (
    RemoteVectorEnv,
    create_gymnasium_app,
    create_gymnasium_vector_app,
)
from openenv.adapters.gymnasium.environment import SPACES_ROUTE
from openenv.adapters.gymnasium.spaces import describe
from openenv.protocol_v2 import SUBPROTOCOL
from openenv.testing import run_server

APPS = Path(__file__).parent / "apps"


@pytest.fixture(scope="module")
def cartpole_url() -> Iterator[str]:
    app = create_gymnasium_app("CartPole-v1", ConcurrencyConfig(max_concurrent_envs=8))
    with run_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def pendulum_url() -> Iterator[str]:
    app = create_gymnasium_app("Pendulum-v1", ConcurrencyConfig(max_concurrent_envs=8))
    with run_server(app) as url:
        yield url


def assert_in_step(here: SyncVectorEnv, remote: RemoteVectorEnv, steps: int) -> None:
    """``steps`` more steps of the same random actions give the same results in both."""
    here.action_space.seed(4)
    for _ in range(steps):
        actions = here.action_space.sample()
        expected, got = here.step(actions), remote.step(actions)
        for want, have in zip(expected[:4], got[:4], strict=True):
            np.testing.assert_allclose(have, want, rtol=1e-6)


@pytest.mark.parametrize(
    ("env_id", "bad", "culprit"),
    [
        ("CartPole-v1", [0, 1, 5, 0], 2),  # 5 is not in Discrete(2)
        ("CartPole-v1", [0, 1, 1, 0.5], 3),  # nor is 0.5 (not taken as 0)
        ("CartPole-v1", [1.7, 1, 1, 1], 0),  # nor 1.7 (not taken as 1)
        ("Pendulum-v1", [[0.0], [2.5], [0.0], [0.0]], 1),  # above the Box's high
    ],
)
async def test_a_bad_action_is_refused_before_any_environment_steps(
    request: pytest.FixtureRequest, env_id: str, bad: list[Any], culprit: int
) -> None:
    url = request.getfixturevalue("cartpole_url" if env_id == "CartPole-v1" else "pendulum_url")
    here = SyncVectorEnv([lambda: gymnasium.make(env_id)] * 4)
    remote = RemoteVectorEnv(url, num_envs=4)
    try:
        np.testing.assert_allclose(remote.reset(seed=9)[0], here.reset(seed=9)[0], rtol=1e-6)
        with pytest.raises(EnvValidationError) as refused:
            remote.step(np.array(bad))
        assert refused.value.errors[0]["loc"][0] == culprit  # it names the environment
        # No environment stepped: the next steps (over episode ends) are the
        # in-process ones, as if the bad call had never been made.
        assert_in_step(here, remote, 40 if env_id == "CartPole-v1" else 5)
    finally:
        here.close()
        remote.close()
    await slots_free(url)


def test_the_action_of_an_environment_being_autoreset_is_ignored_as_sync_vector_env_does(
    cartpole_url: str,
) -> None:
    # NEXT_STEP: the step after an episode ends resets that environment and
    # ignores its action, whatever it is; the others' actions are still checked.
    here = SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * 4)
    remote = RemoteVectorEnv(cartpole_url, num_envs=4)
    try:
        np.testing.assert_allclose(remote.reset(seed=3)[0], here.reset(seed=3)[0], rtol=1e-6)
        resets = 0
        ended = np.zeros(4, dtype=np.bool_)  # the environments the next step resets
        for step in range(80):
            actions = np.full(4, step % 2)
            actions[ended] = 5  # not in Discrete(2), and nobody looks at it
            if ended.any() and not ended.all():
                with pytest.raises(EnvValidationError):  # the stepping ones are checked
                    remote.step(np.where(ended, actions, 7))
            want, got = here.step(actions), remote.step(actions)
            resets += int(ended.sum())
            for mine, theirs in zip(got[:4], want[:4], strict=True):
                np.testing.assert_allclose(mine, theirs, rtol=1e-6)
            ended = want[2] | want[3]
        assert resets > 0
    finally:
        here.close()
        remote.close()


@pytest.mark.parametrize("count", [3, 5])
async def test_a_wrong_number_of_actions_is_refused_before_any_environment_steps(
    cartpole_url: str, count: int
) -> None:
    here = SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * 4)
    remote = RemoteVectorEnv(cartpole_url, num_envs=4)
    try:
        np.testing.assert_allclose(remote.reset(seed=2)[0], here.reset(seed=2)[0], rtol=1e-6)
        with pytest.raises(ValueError, match=f"^{count} actions for num_envs=4$"):
            remote.step(np.ones(count, dtype=np.int64))
        assert_in_step(here, remote, 40)
    finally:
        here.close()
        remote.close()
    await slots_free(cartpole_url)


@pytest.mark.parametrize("app", ["app", "vector_app"])
def test_a_server_killed_mid_step_is_a_closed_session_and_close_still_works(
    tmp_path: Path, app: str
) -> None:
    stepping = tmp_path / "stepping"
    port = free_port()
    code = (
        "from openenv import serve; "
        f"serve('gymnasium_stall_app:{app}', app_dir={str(APPS)!r}, port={port}, "
        "log_level='warning')"
    )
    environ = {**os.environ, "OPENENV_TEST_STEPPING": str(stepping)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=environ)
    try:
        asyncio.run(wait_healthy(port, proc))
        envs = RemoteVectorEnv(f"http://127.0.0.1:{port}", num_envs=2)
        envs.reset(seed=0)

        def kill_once_stepping() -> None:
            # The environment touches the file as its step begins, then never returns
            # (killed anyway after 30 s, should the step never get there).
            for _ in range(3000):
                if stepping.exists() or proc.poll() is not None:
                    break
                threading.Event().wait(0.01)
            proc.kill()

        killer = threading.Thread(target=kill_once_stepping)
        killer.start()
        try:
            with pytest.raises(SessionClosedError):
                envs.step(np.array([1, 0]))
        finally:
            killer.join()
        with pytest.raises(SessionClosedError):
            envs.step(np.array([0, 0]))
        envs.close()  # nothing to close any more, and no error for it
        envs.close()
        with pytest.raises(SessionClosedError):
            envs.step(np.array([0, 0]))
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


class Gated(LateFailure):
    """Action 1 waits for ``gate``, then steps as usual; action 0 steps at once."""

    def step(self, action: np.int64) -> Any:
        if action == 1:
            self.gate.wait(30)
        return np.zeros(1, np.float32), 1.0, False, False, {}


async def test_closing_after_a_step_got_no_reply_returns_and_frees_the_slots() -> None:
    gate = threading.Event()
    app = create_gymnasium_app(lambda: Gated(gate), ConcurrencyConfig(max_concurrent_envs=4))
    with run_server(app) as url:
        # The blocked step must time out before the gate opens; the other calls
        # must not, however loaded the machine: a bound that suits both.
        envs = RemoteVectorEnv(url, num_envs=2, timeout=2.0)
        try:
            envs.reset(seed=0)
            with pytest.raises(EnvTimeoutError):
                envs.step(np.array([1, 0]))
            envs.close()  # returns without waiting on the stuck session, and raises nothing
            with pytest.raises(SessionClosedError):
                envs.step(np.array([0, 0]))
        finally:
            gate.set()
        await slots_free(url)


async def test_closing_sessions_the_server_reaped_while_idle_raises_nothing() -> None:
    app = create_gymnasium_app(
        "CartPole-v1", ConcurrencyConfig(max_concurrent_envs=4, session_timeout=0.2)
    )
    with run_server(app) as url:
        envs = RemoteVectorEnv(url, num_envs=2)
        envs.reset(seed=0)
        await slots_free(url)  # both sessions idled out
        with pytest.raises(SessionClosedError, match="idle"):
            envs.step(np.array([0, 0]))
        envs.close()


def assert_same_infos(got: dict[str, Any], want: dict[str, Any], where: str = "infos") -> None:
    """Batched infos as ``SyncVectorEnv`` makes them: the same keys and masks, arrays of
    the same shapes and values (an info's numpy array batched into one array), and
    ``final_obs`` an object array of observations."""
    assert sorted(got) == sorted(want), where
    for key, value in want.items():
        if isinstance(value, dict):
            assert_same_infos(got[key], value, f"{where}.{key}")
            continue
        mine = got[key]
        assert isinstance(mine, np.ndarray), (where, key)
        assert (mine.shape, mine.dtype == object) == (value.shape, value.dtype == object), (
            where,
            key,
            mine,
            value,
        )
        if key == "final_obs":
            for i in np.flatnonzero(want[f"_{key}"]):
                np.testing.assert_array_equal(mine[i], value[i], err_msg=f"{where}[{i}]")
                assert np.asarray(mine[i]).dtype == np.asarray(value[i]).dtype, (where, i)
        else:
            np.testing.assert_array_equal(mine, value, err_msg=f"{where}.{key}")


# Taxi-v4 from Gymnasium 1.2; the dependency floor (1.1) has Taxi-v3.
TAXI = "Taxi-v4" if "Taxi-v4" in gymnasium.registry else "Taxi-v3"


@pytest.mark.parametrize("server", [create_gymnasium_app, create_gymnasium_vector_app])
@pytest.mark.parametrize("env_id", [TAXI, "Pendulum-v1"])
def test_infos_are_batched_as_sync_vector_env_batches_them(server: Any, env_id: str) -> None:
    # Taxi's info holds a numpy action mask, and its episodes end at different
    # times; Pendulum's are all cut at 200 steps, at once. SAME_STEP puts their
    # final observations in the info.
    mode = AutoresetMode.SAME_STEP
    here = SyncVectorEnv([lambda: gymnasium.make(env_id)] * 3, autoreset_mode=mode)
    with run_server(server(env_id, ConcurrencyConfig(max_concurrent_envs=4))) as url:
        remote = RemoteVectorEnv(url, num_envs=3, autoreset_mode=mode)
        try:
            observations, infos = remote.reset(seed=5)
            expected, expected_infos = here.reset(seed=5)
            np.testing.assert_array_equal(observations, expected)
            assert_same_infos(infos, expected_infos)
            here.action_space.seed(5)
            finals = 0
            for _ in range(205):
                actions = here.action_space.sample()
                want, got = here.step(actions), remote.step(actions)
                for mine, theirs in zip(got[:4], want[:4], strict=True):
                    np.testing.assert_array_equal(mine, theirs)
                assert_same_infos(got[4], want[4])
                finals += "final_obs" in want[4]
            assert finals > 0
        finally:
            here.close()
            remote.close()


@pytest.fixture(scope="module")
def cartpole_vector_url() -> Iterator[str]:
    app = create_gymnasium_vector_app("CartPole-v1", ConcurrencyConfig(max_concurrent_envs=2))
    with run_server(app) as url:
        yield url


# Each with what Gymnasium 1.4's SyncVectorEnv raises (1.1, the floor, asserts).
BAD_MASKS: dict[str, tuple[Any, type[Exception], str]] = {
    "a list": ([True, False, True, False], TypeError, "must be a numpy array"),
    # As indices, these would reset environments 1 and 0.
    "ints": (np.array([1, 0, 1, 0]), TypeError, "must have `dtype=np.bool_`, got int64"),
    "too short": (np.array([True, False, True]), ValueError, "must have shape `(4,)`, got (3,)"),
    "all False": (np.zeros(4, dtype=np.bool_), ValueError, "at least one True value"),
}


@pytest.mark.parametrize("served", ["one session per environment", "a vector session"])
@pytest.mark.parametrize("mask", list(BAD_MASKS))
def test_a_bad_reset_mask_is_refused_as_sync_vector_env_refuses_it_and_nothing_resets(
    request: pytest.FixtureRequest, served: str, mask: str
) -> None:
    url = request.getfixturevalue(
        "cartpole_url" if served.startswith("one") else "cartpole_vector_url"
    )
    here = SyncVectorEnv(
        [lambda: gymnasium.make("CartPole-v1")] * 4, autoreset_mode=AutoresetMode.DISABLED
    )
    remote = RemoteVectorEnv(url, num_envs=4, autoreset_mode=AutoresetMode.DISABLED)
    try:
        np.testing.assert_allclose(remote.reset(seed=5)[0], here.reset(seed=5)[0], rtol=1e-6)
        assert_in_step(here, remote, 3)
        bad, error, message = BAD_MASKS[mask]
        with pytest.raises((AssertionError, TypeError, ValueError)):
            here.reset(options={"reset_mask": bad})
        with pytest.raises(error, match=re.escape(message)):
            remote.reset(options={"reset_mask": bad})
        assert_in_step(here, remote, 3)  # no environment was reset by the refused call
    finally:
        here.close()
        remote.close()


@pytest.mark.parametrize("server", [create_gymnasium_app, create_gymnasium_vector_app])
def test_a_reset_that_raises_leaves_the_environments_playable(server: Any) -> None:
    # Gymnasium's checker wrapper breaks for good when the first reset raises;
    # the environments after it must play as if it had never been made.
    here = SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * 2)
    with run_server(server("CartPole-v1", ConcurrencyConfig(max_concurrent_envs=4))) as url:
        remote = RemoteVectorEnv(url, num_envs=2)
        try:
            with pytest.raises(EnvExecutionError, match="must be 0 or more"):
                remote.reset(seed=-1)
            with pytest.raises(EnvExecutionError):
                remote.reset(seed=3, options={"low": 5})  # CartPole refuses low > high
            np.testing.assert_allclose(remote.reset(seed=3)[0], here.reset(seed=3)[0], rtol=1e-6)
            assert_in_step(here, remote, 30)
        finally:
            here.close()
            remote.close()


# -- servers that are not openenv's, for what openenv's never does ------------------

Handler = Callable[[ServerConnection], Awaitable[None]]
Handshake = Callable[[ServerConnection], Response | None]


def json_response(status: int, body: Any) -> Response:
    content = orjson.dumps(body)
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(content)))]
    return Response(status, "", Headers(headers), content)


async def reads_on(ws: ServerConnection) -> None:
    async for _ in ws:
        pass


@asynccontextmanager
async def fake_gymnasium_server(
    vector: bool, handler: Handler = reads_on, handshake: Handshake | None = None
) -> AsyncIterator[str]:
    """A server that describes CartPole's spaces (a ``create_gymnasium_vector_app``'s
    with ``vector``, else a ``create_gymnasium_app``'s), answers a WebSocket
    handshake with ``handshake(connection)`` (``None``: accepted), and runs
    ``handler`` on each connection."""
    cartpole = gymnasium.make("CartPole-v1")
    described = {
        "name": "CartPole-v1",
        "action_space": describe(cartpole.action_space),
        "observation_space": describe(cartpole.observation_space),
        **({"vector": {"max_envs": 64}} if vector else {}),
    }
    cartpole.close()

    def process_request(connection: ServerConnection, request: Request) -> Response | None:
        if request.path == SPACES_ROUTE:
            return json_response(200, described)
        return None if handshake is None else handshake(connection)

    subprotocols = None if vector else [SUBPROTOCOL]
    async with serve(
        handler,
        "127.0.0.1",
        0,
        subprotocols=subprotocols,  # type: ignore[arg-type]
        process_request=process_request,
    ) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"http://127.0.0.1:{port}"


def cut(connection: ServerConnection) -> Response:
    connection.transport.abort()  # the handshake's answer never comes
    return connection.respond(500, "")


REFUSALS: dict[str, tuple[Handshake, type[OpenEnvError], str]] = {
    "a refused key": (
        lambda _: json_response(401, {"detail": "invalid API key"}),
        AuthenticationError,
        "invalid API key",
    ),
    "a full server": (
        lambda _: json_response(503, {"detail": "full", "code": "CAPACITY_REACHED"}),
        CapacityError,
        "full",
    ),
    "a proxy's error": (lambda c: c.respond(502, "Bad Gateway"), ConnectionFailedError, "502"),
    "a cut handshake": (cut, ConnectionFailedError, "did not receive a valid HTTP response"),
}


@pytest.mark.parametrize("vector", [False, True], ids=["sessions", "vector"])
@pytest.mark.parametrize("refusal", REFUSALS.values(), ids=REFUSALS.keys())
async def test_a_refused_handshake_is_openenvs_error_as_for_the_other_clients(
    vector: bool, refusal: tuple[Handshake, type[OpenEnvError], str]
) -> None:
    handshake, error, said = refusal
    async with fake_gymnasium_server(vector, handshake=handshake) as url:
        with pytest.raises(error, match=said) as refused:
            await asyncio.to_thread(RemoteVectorEnv, url, num_envs=2, timeout=30)
    if error is not CapacityError:  # a capacity error is the server's, for no URL in particular
        assert url.removeprefix("http://") in str(refused.value)


def observation(vector: bool) -> dict[str, Any]:
    """A reply's ``data`` to a reset or step of two CartPoles (or one, without ``vector``)."""
    if vector:
        batch = {
            "observations": [[0.0] * 4] * 2,
            "rewards": [1.0] * 2,
            "terminations": [False] * 2,
            "truncations": [False] * 2,
            "infos": {},
        }
        return {"observation": batch, "reward": None, "done": False}
    one = {"observation": [0.0] * 4, "terminated": False, "truncated": False, "info": {}}
    return {"observation": one, "reward": 1.0, "done": False}


Answer = Callable[[ServerConnection, list[dict[str, Any]]], Awaitable[None]]


def serves_until_a_step(vector: bool, step: Answer) -> Handler:
    """A handler that opens, resets and closes as openenv's servers do, and answers
    a frame with a step in it by ``step(connection, its requests)``."""

    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:
            requests = orjson.loads(frame)
            requests = [requests] if vector else requests
            if any(r["type"] == "step" for r in requests):
                await step(ws, requests)
                continue
            if vector and requests[0]["type"] == "close":
                return  # a vector session's close has no reply: the server hangs up
            replies = []
            for r in requests:
                kind = {"open": "opened", "close": "closed", "state": "state"}.get(r["type"])
                data = {"session_id": "s", "reason": "closed"} if kind else observation(vector)
                replies.append({**r, "type": kind or "observation", "data": data})
            await ws.send(orjson.dumps(replies[0] if vector else replies).decode())

    return handler


@pytest.mark.parametrize("vector", [False, True], ids=["sessions", "vector"])
async def test_frames_for_nobody_do_not_put_off_a_calls_timeout(vector: bool) -> None:
    # Late replies of calls given up on (ids before this one) come more often
    # than the timeout; the step's own never comes.
    async def late_replies_only(ws: ServerConnection, requests: list[dict[str, Any]]) -> None:
        late = [
            {**r, "id": -1, "type": "observation", "data": observation(vector)} for r in requests
        ]
        frame = orjson.dumps(late[0] if vector else late).decode()
        with contextlib.suppress(ConnectionClosed):  # the client hung up
            for _ in range(300):
                await ws.send(frame)
                await asyncio.sleep(0.1)  # the server's pace: well within the timeout
            # Thirty times the timeout: a client still waiting would wait for ever.
            await ws.close()

    async with fake_gymnasium_server(vector, serves_until_a_step(vector, late_replies_only)) as url:
        envs = await asyncio.to_thread(RemoteVectorEnv, url, num_envs=2, timeout=1.0)
        try:
            await asyncio.to_thread(envs.reset, seed=0)
            with pytest.raises(EnvTimeoutError):
                await asyncio.to_thread(envs.step, np.array([0, 1]))
        finally:
            await asyncio.to_thread(envs.close)


def sessions_reply(
    change: Callable[[list[dict[str, Any]]], Any],
) -> Callable[[list[dict[str, Any]]], str]:
    """A v2 frame of replies to a step's requests, as ``change`` makes it of the right ones."""

    def frame(requests: list[dict[str, Any]]) -> str:
        right = [{**r, "type": "observation", "data": observation(False)} for r in requests]
        return orjson.dumps(change(right)).decode()

    return frame


def vector_reply(change: Callable[[dict[str, Any]], Any]) -> Callable[[list[dict[str, Any]]], str]:
    """A vector session's reply to a step, as ``change`` makes it of the right one."""

    def frame(requests: list[dict[str, Any]]) -> str:
        right = {"id": requests[0]["id"], "type": "observation", "data": observation(True)}
        return orjson.dumps(change(right)).decode()

    return frame


def without(reply: dict[str, Any], field: str) -> dict[str, Any]:
    """``reply`` with ``field`` gone from its observation (its data's, if there)."""
    data = reply["data"]
    payload = {k: v for k, v in data["observation"].items() if k != field}
    rest = {k: v for k, v in data.items() if k != field}
    return {**reply, "data": {**rest, "observation": payload}}


UNKNOWN = {"code": "RATE_LIMITED", "message": "slow down"}  # an error code it does not know
NOT_THE_PROTOCOL: dict[str, tuple[bool, Callable[[list[dict[str, Any]]], str]]] = {
    "sessions: not JSON": (False, lambda _: "not json"),
    "sessions: an object": (False, sessions_reply(lambda right: right[0])),
    "sessions: items that are not replies": (False, lambda _: "[1, 2]"),
    "sessions: a session out of range": (
        False,
        sessions_reply(lambda right: [{**right[0], "session": 7}, right[1]]),
    ),
    "sessions: a session before the first": (
        False,
        sessions_reply(lambda right: [{**right[0], "session": -1}, right[1]]),
    ),
    "sessions: one session twice": (False, sessions_reply(lambda right: [right[0], right[0]])),
    "sessions: a session that is a flag": (
        False,
        sessions_reply(lambda right: [right[0], {**right[1], "session": True}]),
    ),
    "sessions: an observation without its flags": (
        False,
        sessions_reply(lambda right: [right[0], without(right[1], "terminated")]),
    ),
    "sessions: a step without its reward": (
        False,
        sessions_reply(lambda right: [right[0], without(right[1], "reward")]),
    ),
    "sessions: an opened for a step": (
        False,
        sessions_reply(lambda right: [right[0], {**right[1], "type": "opened"}]),
    ),
    "sessions: an error code it does not know": (
        False,
        sessions_reply(lambda right: [right[0], {**right[1], "type": "error", "data": UNKNOWN}]),
    ),
    "vector: not JSON": (True, lambda _: "not json"),
    "vector: a list": (True, lambda _: "[1]"),
    "vector: a batch without rewards": (
        True,
        vector_reply(lambda right: without(right, "rewards")),
    ),
    "vector: an error code it does not know": (
        True,
        vector_reply(lambda right: {**right, "type": "error", "data": UNKNOWN}),
    ),
}


@pytest.mark.parametrize(
    ("vector", "reply"), NOT_THE_PROTOCOL.values(), ids=NOT_THE_PROTOCOL.keys()
)
async def test_a_reply_that_is_not_the_protocol_is_a_failed_connection(
    vector: bool, reply: Callable[[list[dict[str, Any]]], str]
) -> None:
    # As MuxClient reads such a reply: the call fails at once, and so does every
    # later one, since nothing more the server says can be trusted.
    async def answer(ws: ServerConnection, requests: list[dict[str, Any]]) -> None:
        await ws.send(reply(requests))

    async with fake_gymnasium_server(vector, serves_until_a_step(vector, answer)) as url:
        envs = await asyncio.to_thread(RemoteVectorEnv, url, num_envs=2, timeout=30)
        try:
            await asyncio.to_thread(envs.reset, seed=0)
            with pytest.raises(SessionClosedError, match="the connection failed"):
                await asyncio.to_thread(envs.step, np.array([0, 1]))
            with pytest.raises(SessionClosedError):
                await asyncio.to_thread(envs.step, np.array([0, 1]))
        finally:
            await asyncio.to_thread(envs.close)  # and raises nothing
