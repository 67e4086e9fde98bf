"""RemoteVectorEnv past what one v2 frame may carry: more environments than a
server takes requests in a frame (4,096 by default), and a server set lower."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from servers import slots_free

from openenv import ConcurrencyConfig, SessionClosedError
from openenv.adapters.gymnasium import RemoteVectorEnv, create_gymnasium_app
from openenv.testing import run_server


async def test_more_environments_than_a_frame_may_carry_go_out_in_several() -> None:
    count = 4096 + 8  # one frame of them all is refused by a default server
    app = create_gymnasium_app("CartPole-v1", ConcurrencyConfig(max_concurrent_envs=count))
    with run_server(app) as url:
        envs = RemoteVectorEnv(url, num_envs=count, timeout=60)
        try:
            observations, _ = envs.reset(seed=0)
            for i in (0, 4095, 4096, count - 1):  # either side of the frames' border
                alone, _ = gymnasium.make("CartPole-v1").reset(seed=i)
                assert observations[i].tolist() == alone.tolist()
            _, rewards, terminations, _, _ = envs.step(np.ones(count, dtype=np.int64))
            assert rewards.tolist() == [1.0] * count
            assert not terminations.any()
        finally:
            envs.close()
        await slots_free(url)


async def test_a_frame_the_server_refuses_whole_fails_at_once_with_its_reason() -> None:
    # Which requests the refused frame held is not said, and none of them ran:
    # no reply will come, and waiting out the timeout would only hide why.
    app = create_gymnasium_app(
        "CartPole-v1", ConcurrencyConfig(max_concurrent_envs=32), max_requests_in_flight=16
    )
    with run_server(app) as url:
        with pytest.raises(SessionClosedError, match="at most 16 requests, this one has 20"):
            RemoteVectorEnv(url, num_envs=20, timeout=60)
        await slots_free(url)
        envs = RemoteVectorEnv(url, num_envs=16, timeout=60)  # as many as it takes: served
        try:
            observations, _ = envs.reset(seed=0)
            assert observations.shape == (16, 4)
        finally:
            envs.close()
        await slots_free(url)
