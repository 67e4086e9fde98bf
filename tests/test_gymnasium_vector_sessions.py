"""Vector sessions (create_gymnasium_vector_app) on a real server: one session steps
every environment of a RemoteVectorEnv, and gives the episodes of an in-process
SyncVectorEnv, in every autoreset mode."""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterator
from typing import Any

import gymnasium
import numpy as np
import orjson
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_space
from pydantic import ValidationError
from servers import health, slots_free
from test_gymnasium_vector import NUM_ENVS, assert_same_training, checker_warnings, train
from websockets.asyncio.client import connect

from openenv import (
    CapacityError,
    ConcurrencyConfig,
    EnvError,
    EnvExecutionError,
    EnvTimeoutError,
    EnvValidationError,
)
from openenv.adapters.gymnasium import (
    GymnasiumVectorEnvironment,
    RemoteGymnasiumEnv,
    RemoteVectorEnv,
    VectorAction,
    create_gymnasium_vector_app,
)
from openenv.adapters.gymnasium.batched import vector_action_model
from openenv.client import ws_url
from openenv.protocol_v2 import SUBPROTOCOL
from openenv.testing import run_server

MAX_ENVS = 16


@pytest.fixture(scope="module")
def vector_url() -> Iterator[str]:
    app = create_gymnasium_vector_app(
        "CartPole-v1", ConcurrencyConfig(max_concurrent_envs=4), max_envs=MAX_ENVS
    )
    with run_server(app) as url:
        yield url


def local(num_envs: int, mode: AutoresetMode = AutoresetMode.NEXT_STEP) -> SyncVectorEnv:
    return SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * num_envs, autoreset_mode=mode)


async def test_a_training_loop_for_sync_vector_env_runs_unchanged_on_one_session(
    vector_url: str,
) -> None:
    here = local(NUM_ENVS)
    remote = RemoteVectorEnv(vector_url, num_envs=NUM_ENVS)
    try:
        assert (remote.single_observation_space, remote.single_action_space) == (
            here.single_observation_space,
            here.single_action_space,
        )
        assert (await health(vector_url))["active_sessions"] == 1  # one session, 8 envs
        expected, got = train(here, 300), train(remote, 300)
    finally:
        here.close()
        remote.close()
    assert_same_training(expected, got)
    await slots_free(vector_url)


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
def test_every_autoreset_mode_gives_the_episodes_of_sync_vector_env(
    vector_url: str, mode: AutoresetMode
) -> None:
    here, remote = local(4, mode), RemoteVectorEnv(vector_url, num_envs=4, autoreset_mode=mode)
    rng = np.random.default_rng(1)
    ended = 0
    try:
        np.testing.assert_allclose(remote.reset(seed=3)[0], here.reset(seed=3)[0], rtol=1e-6)
        for _ in range(150):
            actions = rng.integers(0, 2, 4)
            obs_l, rew_l, term_l, trunc_l, info_l = here.step(actions)
            obs_r, rew_r, term_r, trunc_r, info_r = remote.step(actions)
            np.testing.assert_allclose(obs_r, obs_l, rtol=1e-6)
            np.testing.assert_array_equal(rew_r, rew_l)
            np.testing.assert_array_equal(term_r, term_l)
            np.testing.assert_array_equal(trunc_r, trunc_l)
            assert sorted(info_r) == sorted(info_l)
            done = term_l | trunc_l
            ended += int(done.sum())
            if "final_obs" in info_l:  # SAME_STEP: the finished episodes' last observations
                np.testing.assert_array_equal(info_r["_final_obs"], info_l["_final_obs"])
                for i in np.flatnonzero(info_l["_final_obs"]):
                    np.testing.assert_allclose(info_r["final_obs"][i], info_l["final_obs"][i])
            if mode is AutoresetMode.DISABLED and done.any():
                mask = {"reset_mask": done}
                np.testing.assert_allclose(
                    remote.reset(options=mask)[0], here.reset(options=mask)[0], rtol=1e-6
                )
    finally:
        here.close()
        remote.close()
    assert ended > 4


def test_a_seed_per_environment_seeds_each(vector_url: str) -> None:
    seeds = [11, 5, 11, 2]
    here, remote = local(4), RemoteVectorEnv(vector_url, num_envs=4)
    try:
        observations, _ = remote.reset(seed=seeds)
        np.testing.assert_allclose(observations, here.reset(seed=seeds)[0], rtol=1e-6)
        np.testing.assert_array_equal(observations[0], observations[2])  # same seed, same start
    finally:
        here.close()
        remote.close()


async def test_bad_actions_are_refused_and_the_session_goes_on(vector_url: str) -> None:
    remote = RemoteVectorEnv(vector_url, num_envs=4)
    try:
        remote.reset(seed=0)
        with pytest.raises(EnvValidationError, match="not all in the action space"):
            remote.step(np.array([0, 1, 5, 0]))  # 5 is not in Discrete(2)
        with pytest.raises(EnvValidationError, match="not values of Discrete"):
            remote.step(np.array([0, 1, 0.5, 0]))  # nor is 0.5 (not taken as 0)
        with pytest.raises(EnvExecutionError, match="3 actions for 4 environments"):
            remote.step(np.array([0, 1, 1]))
        observations, rewards, *_ = remote.step(np.zeros(4, dtype=np.int64))
        assert observations.shape == (4, 4)
        assert rewards.tolist() == [1.0] * 4
        remote.step(observations[:, 2] > 0)  # booleans: Python's 0 and 1
    finally:
        remote.close()
    await slots_free(vector_url)


async def test_more_envs_than_a_session_may_hold_is_refused_before_connecting(
    vector_url: str,
) -> None:
    with pytest.raises(ValueError, match=f"at most {MAX_ENVS}"):
        RemoteVectorEnv(vector_url, num_envs=MAX_ENVS + 1)
    assert (await health(vector_url))["active_sessions"] == 0


async def test_each_vector_takes_one_slot_and_a_full_server_refuses_the_next() -> None:
    app = create_gymnasium_vector_app("CartPole-v1", ConcurrencyConfig(max_concurrent_envs=1))
    with run_server(app) as url:
        first = RemoteVectorEnv(url, num_envs=8)
        try:
            with pytest.raises(CapacityError):
                RemoteVectorEnv(url, num_envs=2)
            first.reset(seed=0)
        finally:
            first.close()
        await slots_free(url)
        RemoteVectorEnv(url, num_envs=2).close()  # its slot is free again
        await slots_free(url)


def test_one_remote_environment_passes_gymnasiums_env_checker(vector_url: str) -> None:
    env = RemoteGymnasiumEnv(vector_url)  # a vector session of one, without autoreset
    here = gymnasium.make("CartPole-v1").unwrapped
    try:
        # CartPole's own space draws warnings (infinite bounds), and nothing else may.
        assert checker_warnings(env) <= checker_warnings(here)
    finally:
        env.close()
        here.close()


def test_only_array_spaces_can_be_served_as_vectors() -> None:
    with pytest.raises(TypeError, match="array spaces"):
        create_gymnasium_vector_app("Blackjack-v1")  # a Tuple observation space


def test_the_environment_checks_actions_that_no_model_checked() -> None:
    # Served, the app's action model refuses values outside the space (above);
    # used directly with the plain VectorAction, the environment does.
    env = GymnasiumVectorEnvironment("CartPole-v1")
    try:
        env.reset(seed=0, num_envs=2)
        with pytest.raises(EnvError, match="outside the action space"):
            env.step(VectorAction(actions=[0, 5]))
        assert env.step(VectorAction(actions=[0, 1])).rewards.tolist() == [1.0, 1.0]
    finally:
        env.close()


async def test_steps_sent_ahead_each_get_their_own_float32_observations(vector_url: str) -> None:
    # A v2 client may send a session's next steps before their replies come: each
    # reply still holds its own step's observations (not a later step's, written
    # into a shared buffer meanwhile), bit for bit, as float32 numbers.
    here = local(4)
    actions = np.random.default_rng(2).integers(0, 2, (30, 4))
    here.reset(seed=0)
    expected = [here.step(a)[0] for a in actions]
    here.close()
    reset = {"seed": 0, "num_envs": 4, "autoreset_mode": "NextStep"}
    async with connect(ws_url(vector_url), subprotocols=[SUBPROTOCOL]) as ws:  # type: ignore[list-item]
        await ws.send('[{"session": 0, "type": "open"}]')
        await ws.recv()
        await ws.send(orjson.dumps([{"session": 0, "type": "reset", "data": reset}]).decode())
        await ws.recv()
        steps = [
            {"session": 0, "type": "step", "data": {"actions": a.tolist()}, "id": i}
            for i, a in enumerate(actions)
        ]
        await ws.send(orjson.dumps(steps).decode())
        texts: list[str] = []
        got: dict[int, Any] = {}
        while len(got) < len(steps):
            text = await ws.recv()
            assert isinstance(text, str)
            texts.append(text)
            for reply in orjson.loads(text):
                assert reply["type"] == "observation", reply
                got[reply["id"]] = reply["data"]["observation"]["observations"]
    for i, observations in got.items():
        np.testing.assert_array_equal(np.asarray(observations, dtype=np.float32), expected[i])
    # Written as float32 (at most 9 significant digits), not as the float64 of each.
    numbers = re.findall(r"-?\d+\.\d+", re.sub(r'"infos":\{.*?\}', "", "".join(texts)))
    assert numbers
    assert max(len(n.lstrip("-0.").replace(".", "")) for n in numbers) <= 9
    await slots_free(vector_url)


def test_a_vector_observation_dumps_to_json_lists() -> None:
    # Reply frames take its arrays as they are; every other dump gets JSON lists.
    env = GymnasiumVectorEnvironment("CartPole-v1")
    try:
        observation = env.reset(seed=0, num_envs=2)
        dumped = observation.model_dump(mode="json")
        assert dumped["observations"] == observation.observations.tolist()
        assert orjson.loads(observation.model_dump_json())["observations"] == dumped["observations"]
        assert env.step(VectorAction(actions=[0, 1])).model_dump(mode="json")["rewards"] == [
            1.0,
            1.0,
        ]
    finally:
        env.close()


@pytest.mark.parametrize(
    "space",
    [
        gymnasium.spaces.Discrete(3, start=-1),
        gymnasium.spaces.MultiDiscrete([2, 5]),
        gymnasium.spaces.MultiBinary(3),
        gymnasium.spaces.Box(-1.0, 2.0, (2,)),
        gymnasium.spaces.Box(0, 4, (2,), dtype=np.int64),
    ],
    ids=repr,
)
def test_the_action_model_takes_exactly_the_batches_gymnasium_would(
    space: gymnasium.Space[Any],
) -> None:
    model = vector_action_model(space, "Probe")
    rng = np.random.default_rng(0)
    batched = batch_space(space, 4)
    for _ in range(200):
        values = batched.sample()
        if rng.random() < 0.5:  # nudge one value, perhaps out of the space
            flat = values.reshape(-1)
            flat[rng.integers(flat.size)] += rng.choice([-2, -1, 1, 2])
        expected = batched.contains(values.astype(space.dtype))
        try:
            model(actions=values.tolist())
        except ValidationError:
            assert not expected, values
        else:
            assert expected, values
    # Not values of the space at all: text, too deep, ragged, and halves for integers.
    sample = batched.sample()
    wrong = [["1"] * 4, [[[[1]]]] * 4, [*sample.tolist()[:3], [0] * 7]]
    if np.issubdtype(space.dtype, np.integer):
        wrong.append((sample + 0.5).tolist())
    for values in wrong:
        with pytest.raises(ValidationError, match="not values of"):
            model(actions=values)


class LateFailure(gymnasium.Env[np.ndarray, np.int64]):
    """Action 1 waits for ``gate``, then raises; action 0 steps as usual."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate
        self.action_space = gymnasium.spaces.Discrete(2)
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: np.int64) -> Any:
        if action == 1:
            self.gate.wait(30)
            raise RuntimeError("a late failure")
        return np.zeros(1, np.float32), 1.0, False, False, {}


async def test_the_late_error_of_a_step_given_up_on_is_not_the_next_steps() -> None:
    gate = threading.Event()
    app = create_gymnasium_vector_app(functools.partial(LateFailure, gate))
    with run_server(app) as url:
        # The blocked step must time out before the gate opens; the other calls
        # must not, however loaded the machine: a bound that suits both.
        envs = RemoteVectorEnv(url, num_envs=2, timeout=2.0)
        envs.reset(seed=0)
        with pytest.raises(EnvTimeoutError):
            envs.step(np.array([1, 0]))
        gate.set()  # its EXECUTION_ERROR comes now, for a request nobody waits for
        _, rewards, *_ = envs.step(np.array([0, 0]))
        assert rewards.tolist() == [1.0, 1.0]
        envs.close()
        await slots_free(url)
