"""openenv.adapters.gymnasium with every supported kind of space, over a real server."""

from __future__ import annotations

from typing import Any

import gymnasium
import httpx
import numpy as np
import pytest
from gymnasium import spaces

from openenv import EnvExecutionError, EnvValidationError, WebSocketEnvClient
from openenv.adapters.gymnasium import (
    GymnasiumEnvironment,
    GymnasiumState,
    create_gymnasium_app,
    gymnasium_models,
)
from openenv.testing import run_server

ACTIONS = spaces.Dict(
    {
        "move": spaces.Discrete(3, start=-1),
        "force": spaces.Box(low=np.array([-1.0, 0.0]), high=np.array([1.0, 5.0]), dtype=np.float64),
        "buttons": spaces.MultiBinary(3),
        "gears": spaces.MultiDiscrete([3, 2], start=[1, 0]),
        "grid": spaces.Box(0, 9, (2, 2), dtype=np.int64),
        "pair": spaces.Tuple((spaces.Discrete(2), spaces.Box(-1.0, 1.0, (), dtype=np.float32))),
    }
)


class Mirror(gymnasium.Env[Any, Any]):
    """Observes the action it was given, re-packed into other space kinds."""

    action_space = ACTIONS
    observation_space = spaces.Tuple(
        (
            spaces.Discrete(3, start=-1),
            spaces.Dict({"grid": spaces.Box(0, 9, (2, 2), dtype=np.int64)}),
            spaces.MultiBinary(3),
        )
    )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        return (0, {"grid": np.zeros((2, 2), dtype=np.int64)}, np.zeros(3, np.int8)), {"n": 0}

    def step(self, action: Any) -> Any:
        assert self.action_space.contains(action), action  # the adapter sends real space values
        observation = (int(action["move"]), {"grid": action["grid"]}, action["buttons"])
        reward = float(action["force"].sum() + action["pair"][1])
        info = {"gears": action["gears"], "pair": action["pair"]}
        return observation, reward, bool(action["pair"][0]), False, info


def as_json(observation: Any) -> Any:
    return observation.model_dump(mode="json", by_alias=True)["observation"]


def test_every_space_kind_round_trips_through_a_server() -> None:
    models = gymnasium_models(Mirror)
    app = create_gymnasium_app(Mirror)
    action = {
        "move": -1,
        "force": [0.5, 2.0],
        "buttons": [1, 0, 1],
        "gears": [3, 1],
        "grid": [[1, 2], [3, 4]],
        "pair": [1, -0.5],
    }
    with run_server(app) as url:
        client = WebSocketEnvClient(
            url,
            action_cls=models.action_cls,
            observation_cls=models.observation_cls,
            state_cls=GymnasiumState,
        )
        with client.sync() as env:
            first: Any = env.reset(seed=1).observation
            assert as_json(first) == [0, {"grid": [[0, 0], [0, 0]]}, [0, 0, 0]]
            assert first.info == {"n": 0}
            result = env.step(models.action_cls(action=action))
            obs: Any = result.observation
            # Typed: a Tuple space is a tuple, a Dict space a model with a field per key.
            assert isinstance(obs.observation, tuple)
            assert obs.observation[1].grid == [[1, 2], [3, 4]]
            assert as_json(obs) == [-1, {"grid": [[1, 2], [3, 4]]}, [1, 0, 1]]
            assert obs.info == {"gears": [3, 1], "pair": [1, -0.5]}
            assert (result.reward, result.done, obs.terminated) == (2.0, True, True)

            env.reset()
            for field, bad, message in [
                ("move", 2, "less than or equal to 1"),
                ("buttons", [1, 2, 0], "less than or equal to 1"),
                ("gears", [4, 1], "less than or equal to 3"),
                ("grid", [[1, 2]], "at least 2 items"),
                ("pair", [1], "Field required"),
                # Within the envelope of the bounds but outside this element's own.
                ("force", [2.0, 2.0], "is not in the action space"),
                ("gears", [0, 1], "is not in the action space"),
            ]:
                with pytest.raises(EnvValidationError, match=message):
                    env.step({"action": {**action, field: bad}})
            assert env.step({"action": action}).reward == 2.0  # the session went on
        schema = httpx.get(f"{url}/schema").json()["action"]
    force = schema["$defs"]["MirrorActionValue"]["properties"]["force"]
    assert force["prefixItems"] == [
        {"type": "number", "minimum": -1.0, "maximum": 1.0},
        {"type": "number", "minimum": 0.0, "maximum": 5.0},
    ]
    assert "items" not in force


def test_unsupported_spaces_and_bad_factories_fail_at_startup() -> None:
    class Texty(Mirror):
        action_space = spaces.Text(5)  # type: ignore[assignment]

    with pytest.raises(TypeError, match="supports Discrete, Box, MultiDiscrete, MultiBinary"):
        create_gymnasium_app(Texty)
    with pytest.raises(TypeError, match=r"returned int, not a gymnasium\.Env"):
        create_gymnasium_app(lambda: 3)  # type: ignore[arg-type, return-value]
    with pytest.raises(TypeError, match="make_kwargs only apply to an environment id"):
        create_gymnasium_app(Mirror, make_kwargs={"max_episode_steps": 3})


def test_make_kwargs_reach_gymnasium_make() -> None:
    env = GymnasiumEnvironment("CartPole-v1", max_episode_steps=3)
    env.reset(seed=0)
    results = [env.step(env.models.action_cls(action=i % 2)) for i in range(3)]
    assert [r.truncated for r in results] == [False, False, True]
    assert results[-1].done is True
    env.close()


class Misbehaving(gymnasium.Env[np.ndarray, np.int64]):
    """Action 0 steps as it should; 1 returns an observation of the wrong shape, 2 and 3
    rewards that are not numbers."""

    action_space = spaces.Discrete(4)
    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action: np.int64) -> Any:
        shape, reward = [((2,), 1.0), ((3,), 1.0), ((2,), None), ((2,), np.ones(2))][int(action)]
        return np.zeros(shape, np.float32), reward, False, False, {}


async def test_what_a_gymnasium_env_returns_wrongly_is_said_to_the_client() -> None:
    models = gymnasium_models(Misbehaving())
    with run_server(create_gymnasium_app(Misbehaving)) as url:
        async with WebSocketEnvClient(
            url, action_cls=models.action_cls, observation_cls=models.observation_cls
        ) as env:
            await env.reset(seed=0)
            errors = []
            for action in (1, 2, 3):
                with pytest.raises(EnvExecutionError) as caught:
                    await env.step(models.action_cls(action=action))
                errors.append(caught.value.message)
            result = await env.step(models.action_cls(action=0))  # the session goes on
    assert result.reward == 1.0
    assert "Misbehaving returned an observation that does not fit Box(-1.0, 1.0, (2,)" in errors[0]
    assert "at most 2 items" in errors[0]
    assert errors[1].endswith("Misbehaving returned the reward None, not a number")
    assert errors[2].endswith("Misbehaving returned the reward array([1., 1.]), not a number")
