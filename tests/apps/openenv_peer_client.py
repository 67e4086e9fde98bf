"""Run by OpenEnv 0.10's own Python, in its own virtual environment (not ours).

Plays episodes against the URL in argv[1] with OpenEnv's real ``EnvClient``:
typed actions sent as ``action.model_dump()`` (``metadata`` included), the
async API under ``asyncio.gather``, ``.sync()``, and plain synchronous calls.
Prints one JSON line of what it saw.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import openenv
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.types import Action, Observation, State

EPISODES = int(sys.argv[2])


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed_message: str = ""
    message_length: int = 0


class EchoEnv(EnvClient[EchoAction, EchoObservation, State]):
    def _step_payload(self, action: EchoAction) -> dict[str, Any]:
        return action.model_dump()  # what OpenEnv's generic clients send

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[EchoObservation]:
        observation = EchoObservation(
            **payload.get("observation", {}),
            reward=payload.get("reward"),
            done=payload.get("done", False),
        )
        return StepResult(
            observation=observation, reward=payload.get("reward"), done=payload.get("done", False)
        )

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)


async def episode(url: str, index: int) -> dict[str, Any]:
    message = "x" * (index % 7 + 1)
    async with EchoEnv(base_url=url) as env:
        await env.reset()
        rewards = []
        for step in range(3):
            result = await env.step(EchoAction(message=message, metadata={"step": step}))
            assert result.observation.echoed_message == message, result
            rewards.append(result.reward)
        state = await env.state()
    return {"message": message, "rewards": rewards, "steps": state.step_count}


async def many(url: str) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(episode(url, i) for i in range(EPISODES))))


def main() -> None:
    url = sys.argv[1]
    episodes = asyncio.run(many(url))
    with EchoEnv(base_url=url).sync() as env:
        env.reset()
        sync_reward = env.step(EchoAction(message="sync")).reward
    plain = EchoEnv(base_url=url)
    plain.reset()
    plain_result = plain.step(EchoAction(message="plain!"))
    plain.close()
    print(
        json.dumps(
            {
                "module": openenv.__file__,
                "episodes": episodes,
                "sync_reward": sync_reward,
                "plain_reward": plain_result.reward,
                # Where OpenEnv's env clients read it: among the observation's fields.
                "plain_metadata": plain_result.observation.metadata,
            }
        )
    )


if __name__ == "__main__":
    main()
