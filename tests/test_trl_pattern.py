"""TRL's ``GRPOTrainer(environment_factory=...)`` calls, mirrored from trl 1.16.0.

TRL needs torch, too heavy here, so ``Trainer`` below repeats, in order, what
``trl/trainer/grpo_trainer.py`` does with an environment: probe one instance
for ``reset``/``get_reward`` and its public methods (the tools), draw one
instance per rollout from a pool, ``reset(**row)`` per dataset row, call each
tool the model asked for from plain synchronous code (an exception becomes an
``{"error": ...}`` tool reply, as in TRL), then read ``get_reward()``. The model
is replaced by fixed tool calls; everything else is a real server and client.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import multiprocessing
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from servers import Ping, PingEnvironment, Pong, slots_free
from tcp_proxy import TcpProxy

from echo_env import EchoAction, EchoEnv, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import ConcurrencyConfig, ConnectionFailedError, EnvClient, State, TRLEnv, create_app
from openenv.testing import run_server

ROWS = [
    {"prompt": [{"role": "user", "content": content}]}
    for content in [
        "Try to echo 'Hello World!' in the environment.",
        "Make the environment echo 'Goodbye World!'",
        "Can you ask the environment to echo 'TRL is great!'?",
    ]
]
MESSAGES = ["Hello World!", "Goodbye World!", "TRL is great!"]


class Trainer:
    """The environment half of ``GRPOTrainer``, call for call."""

    def __init__(self, environment_factory: Callable[[], Any]) -> None:
        instance = environment_factory()
        has_reset, has_reward, methods = False, False, []
        for member_name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction):
            if member_name == "reset":
                has_reset = True
            elif member_name == "get_reward":
                has_reward = True
            elif not member_name.startswith("_"):
                methods.append(getattr(instance, member_name))
        assert has_reset
        assert has_reward
        self.factory = environment_factory
        self.tool_names = sorted(method.__name__ for method in methods)
        self.pool = [instance]
        self.env_type = type(instance)

    def rollouts(
        self,
        rows: list[dict[str, Any]],
        calls: list[list[dict[str, Any]]],
        after_reset: Callable[[], object] = lambda: None,
    ) -> Any:
        """One batch; ``after_reset`` runs where the model would generate."""
        environments = []
        for index in range(len(rows)):
            if index == len(self.pool):
                self.pool.append(self.factory())
            environments.append(self.pool[index])
        tool_dicts = []
        for environment in environments:
            methods = [
                getattr(environment, member_name)
                for member_name, _ in inspect.getmembers(
                    type(environment), predicate=inspect.isfunction
                )
                if member_name not in ("reset", "get_reward") and not member_name.startswith("_")
            ]
            sync_tool_dict = {}
            for tool in methods:
                assert not inspect.iscoroutinefunction(tool)
                sync_tool_dict[tool.__name__] = tool
            tool_dicts.append(sync_tool_dict)
        for environment, row in zip(environments, rows, strict=True):
            environment.reset(**row)
        after_reset()
        replies: list[list[str]] = []
        for sync_tool_dict, tool_call_list in zip(tool_dicts, calls, strict=True):
            replies.append([])
            for tool_call in tool_call_list:
                function = tool_call["function"]
                try:
                    result = sync_tool_dict[function["name"]](**function["arguments"])
                except Exception as e:
                    result = {"error": str(e)}
                replies[-1].append(result if isinstance(result, list) else str(result))
        rewards = [e.get_reward() if type(e) is self.env_type else None for e in environments]
        return replies, rewards


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def test_trls_own_echo_example_class_gets_real_rewards(echo_url: str) -> None:
    # trl's examples/scripts/openenv/echo_env_factory.py, with this server's URL.
    class MyEchoEnv:
        def __init__(self) -> None:
            self.env = EchoEnv(base_url=echo_url)

        def reset(self, **kwargs: Any) -> None:
            self._reward = None

        def step(self, message: str) -> str:
            """
            Echo the message back from the environment.

            Args:
                message: The message to echo

            Returns:
                The echoed message.
            """
            observation = self.env.step(EchoAction(message=message))
            self._reward = observation.observation.reward
            return observation.observation.echoed_message

        def get_reward(self) -> float:
            """
            Get the reward from the last step.

            Returns:
                The reward value.
            """
            return self._reward  # type: ignore[return-value]

    trainer = Trainer(MyEchoEnv)
    assert trainer.tool_names == ["step"]
    for _ in range(2):  # instances are pooled and reset for the next batch
        replies, rewards = trainer.rollouts(ROWS, [[call("step", message=m)] for m in MESSAGES])
        assert replies == [[m] for m in MESSAGES]
        assert rewards == pytest.approx([len(m) / 10 for m in MESSAGES])
    for environment in trainer.pool:
        environment.env.close()  # TRL never does; the shared test server would keep them


def echo_tool_env(url: str) -> type[TRLEnv]:
    """A ``TRLEnv`` of the echo server at ``url`` whose one tool is ``echo``."""

    class Echo(TRLEnv):
        client_cls = EchoEnv
        base_url = url

        def echo(self, message: str) -> str:
            """Echo a message back from the environment.

            Args:
                message: The message to echo.
            """
            return str(self._step(EchoAction(message=message)).echoed_message)

    return Echo


def test_trlenv_helper_sums_rewards_and_exposes_only_the_tools(echo_url: str) -> None:
    trainer = Trainer(echo_tool_env(echo_url))
    assert trainer.tool_names == ["echo"]
    calls = [[call("echo", message=m), call("echo", message="ab")] for m in MESSAGES]
    replies, rewards = trainer.rollouts(ROWS, calls)
    assert replies == [[m, "ab"] for m in MESSAGES]
    assert rewards == pytest.approx([len(m) / 10 + 0.2 for m in MESSAGES])
    # A bad call comes back to the model as an error reply, as TRL words it.
    replies, rewards = trainer.rollouts(ROWS[:1], [[call("echo", text="wrong argument")]])
    assert replies[0][0].startswith("{'error':")
    assert rewards == [0.0]
    for environment in trainer.pool:
        environment._close()


def test_pooled_instances_whose_sessions_were_reaped_between_steps_reset_anew() -> None:
    # A training step (generation, then backprop) can outlast the server's idle
    # timeout; TRL resets the same pooled instances for the next batch.
    reaping = ConcurrencyConfig(max_concurrent_envs=4, session_timeout=1.0)
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, reaping)
    with run_server(app) as url:
        trainer = Trainer(echo_tool_env(url))
        calls = [[call("echo", message=m)] for m in MESSAGES]
        assert trainer.rollouts(ROWS, calls)[0] == [[m] for m in MESSAGES]
        asyncio.run(slots_free(url))  # every session idle too long: reaped by the server
        replies, rewards = trainer.rollouts(ROWS, calls)
        assert replies == [[m] for m in MESSAGES]
        assert rewards == pytest.approx([len(m) / 10 for m in MESSAGES])
        for environment in trainer.pool:
            environment._close()
        asyncio.run(slots_free(url))


def test_a_rollout_whose_session_dropped_mid_episode_is_unscorable_not_zero(echo_url: str) -> None:
    # A server restart (or a network drop) in the middle of rollouts: the
    # steps after it never reached the environment, and the one in flight may
    # have been applied and rewarded unseen. TRL (grpo_trainer.py, lines
    # 1630 and 2756-2764 in 1.16.0) turns a ``None`` reward into NaN and gives
    # the rollout no advantage; a 0.0 (or the sum so far) would teach the
    # model that its moves were bad.
    with TcpProxy(echo_url) as proxy:
        trainer = Trainer(echo_tool_env(proxy.url))
        calls = [[call("echo", message=m)] for m in MESSAGES]
        assert trainer.rollouts(ROWS, calls)[1] == pytest.approx([len(m) / 10 for m in MESSAGES])
        replies, rewards = trainer.rollouts(ROWS, [[call("echo", message="ab")]] * 3, proxy.cut)
        assert all(reply[0].startswith("{'error': 'session closed") for reply in replies)
        assert rewards == [None, None, None]
        # The next batch starts new sessions, and is scored again.
        replies, rewards = trainer.rollouts(ROWS, calls)
        assert replies == [[m] for m in MESSAGES]
        assert rewards == pytest.approx([len(m) / 10 for m in MESSAGES])
        for environment in trainer.pool:
            environment._close()


def _play_in_child(environment: TRLEnv, results: Any) -> None:
    environment.reset()
    results.put(environment.echo(message="child"))  # type: ignore[attr-defined]
    results.put(environment.get_reward())
    environment._close()


def test_an_instance_inherited_by_a_forked_child_resets_anew_there(echo_url: str) -> None:
    # A fork (a process pool, datasets' map with num_proc) copies the
    # instance, not its connection's loop: the copy's session is the parent's.
    environment = echo_tool_env(echo_url)()
    environment.reset()
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_play_in_child, args=(environment, results))
    child.start()
    try:
        assert results.get(timeout=60) == "child"
        assert results.get(timeout=60) == pytest.approx(0.5)
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert environment.echo(message="parent") == "parent"  # type: ignore[attr-defined]
    assert environment.get_reward() == pytest.approx(0.6)
    environment._close()


def test_reset_waits_for_a_server_that_is_restarting(echo_url: str) -> None:
    # A server restart between training steps: reset keeps trying for
    # connect_wait seconds instead of raising, which would stop the training run.
    with socket.socket() as down, TcpProxy(f"http://127.0.0.1:{_bound_port(down)}") as proxy:
        environment = echo_tool_env(proxy.url)()
        started: list[str | None] = []
        resetting = threading.Thread(target=lambda: started.append(environment.reset()))
        resetting.start()
        try:
            deadline = time.monotonic() + 60
            while proxy.accepted < 2:  # refused twice, and trying again
                assert time.monotonic() < deadline, "reset tried again within 60 s"
                time.sleep(0.05)
            proxy.retarget(echo_url)  # the server is back
        finally:
            resetting.join(60)
        assert started == [None]
        assert environment.echo(message="back") == "back"  # type: ignore[attr-defined]
        assert environment.get_reward() == pytest.approx(0.4)
        environment._close()


def test_reset_gives_up_at_once_with_no_connect_wait() -> None:
    with socket.socket() as down:
        port = _bound_port(down)

        class Impatient(echo_tool_env(f"http://127.0.0.1:{port}")):  # type: ignore[misc]
            connect_wait = 0.0

        with pytest.raises(ConnectionFailedError):
            Impatient().reset()


def _bound_port(sock: socket.socket) -> int:
    """A port that refuses connections: bound, never listening."""
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    return port


class PingClient(EnvClient[Ping, Pong, State]):
    pass


class CutShort(PingEnvironment):
    """An ``async def`` step that hangs when asked to, until the server cancels it."""

    async def step(self, action: Ping, **kwargs: Any) -> Pong:  # type: ignore[override]
        if action.block:
            await asyncio.Event().wait()
        return PingEnvironment.step(self, action)


@pytest.mark.parametrize("environment", [PingEnvironment, CutShort])
def test_a_step_the_server_timed_out_leaves_the_rollout_unscorable(environment: type) -> None:
    """A step past the server's ``step_timeout`` may have been applied and rewarded
    unseen (a blocking one runs on, its session ended; an async one was cut short
    part-way), so the rollout's reward is unknown, as when its reply never came."""
    gate = threading.Event()
    factory = functools.partial(environment, None, gate)
    # Room for the next episode's session while the overrun step holds its slot.
    config = ConcurrencyConfig(max_concurrent_envs=2)
    app = create_app(factory, Ping, Pong, config, step_timeout=0.2)
    with run_server(app) as url:

        class Pinger(TRLEnv):
            client_cls = PingClient
            base_url = url

            def ping(self, block: bool = False) -> str:
                """Ping the environment.

                Args:
                    block: Whether the step should hang.
                """
                return str(self._step(Ping(block=block)).message)

        trainer = Trainer(Pinger)
        try:
            calls = [[call("ping"), call("ping", block=True)]]
            replies, rewards = trainer.rollouts(ROWS[:1], calls)
            assert replies[0][0] == "ping"
            assert "did not return within 0.2s" in replies[0][1]
            assert rewards == [None]
            replies, rewards = trainer.rollouts(ROWS[:1], [[call("ping")]])  # a new episode
            assert (replies, rewards) == ([["ping"]], [1.0])
        finally:
            trainer.pool[0]._close()
            gate.set()  # the blocked step's thread ends, and the server with it
