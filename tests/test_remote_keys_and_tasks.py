"""RemoteEnv against a secured server, and sessions opened on a split's n-th task."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from counter_env.models import CounterAction, CounterObservation, CounterTask
from counter_env.server.environment import SPLITS, CounterEnvironment
from openenv import (
    AuthenticationError,
    EnvSpec,
    MultiEnvClient,
    NotFoundError,
    RemoteEnv,
    RequestFailedError,
    WebSocketEnvClient,
    create_app,
    create_multi_app,
)
from openenv.testing import run_server

KEY = "open-sesame-open-sesame"


@pytest.fixture(scope="module")
def keyed_url() -> Iterator[str]:
    app = create_app(CounterEnvironment, CounterAction, CounterObservation, api_key=KEY)
    with run_server(app) as url:
        yield url


async def test_the_api_key_goes_with_every_http_call(keyed_url: str) -> None:
    env = RemoteEnv(keyed_url, api_key=KEY, task_cls=CounterTask)
    assert await env.list_splits() == ["train", "test"]
    tasks = await env.list_tasks("test", offset=2, limit=2)
    assert [t.id for t in tasks] == ["test-2", "test-3"]
    assert "increment" in {tool.name for tool in await env.list_tools()}
    async with env.session(tasks[0]) as session:
        assert session.first is not None


async def test_openenv_style_headers_carry_the_key_too(keyed_url: str) -> None:
    env = RemoteEnv(keyed_url, headers={"Authorization": f"Bearer {KEY}"})
    assert await env.list_splits() == ["train", "test"]


async def test_a_key_in_the_url_goes_with_every_call_as_it_does_for_a_client(
    keyed_url: str,
) -> None:
    # `?api_key=` in the URL, as browsers send it: EnvClient and MuxClient kept
    # it; RemoteEnv, MultiEnvClient and pools dropped it with the URL's query.
    url = f"{keyed_url}/?api_key={KEY}"
    env = RemoteEnv(url, task_cls=CounterTask)
    assert await env.list_splits() == ["train", "test"]
    async with env.session(split="test", index=1) as session:
        assert session.task is not None
        assert session.task.id == "test-1"
        assert (await session.step(CounterAction(amount=2))).observation.value == 2
    pooled = RemoteEnv(f"{url},{url}")  # a ServerPool of the two
    assert "increment" in {tool.name for tool in await pooled.list_tools()}
    async with pooled.session() as session:
        assert session.first is not None
    client = WebSocketEnvClient(f"{url},{url}")
    try:
        assert not (await client.reset()).done
    finally:
        await client.close()


async def test_a_key_in_a_multi_environment_servers_url_opens_its_environments() -> None:
    spec = EnvSpec(CounterEnvironment, CounterAction, CounterObservation, api_key=KEY)
    with run_server(create_multi_app({"counter": spec})) as root:
        client = MultiEnvClient(f"{root}/?api_key={KEY}")
        assert [env.name for env in await client.environments.list()] == ["counter"]
        env = client.environments.get("counter")
        async with env.session() as session:
            assert session.first is not None


async def test_a_wrong_key_is_refused_on_http_and_on_the_session(keyed_url: str) -> None:
    env = RemoteEnv(keyed_url, api_key="wrong")
    with pytest.raises(RequestFailedError) as refused:
        await env.list_splits()
    assert refused.value.status_code in (401, 403)
    with pytest.raises(AuthenticationError):
        async with env.session():
            pass


async def test_a_session_opens_on_the_splits_nth_task(keyed_url: str) -> None:
    env = RemoteEnv(keyed_url, api_key=KEY, observation_cls=CounterObservation)
    for split, index in [("train", 3), ("test", 7)]:
        async with env.session(split=split, index=index) as session:
            expected = SPLITS[split][index]
            assert session.task is not None
            assert session.task.id == expected.id
            assert session.first is not None
            assert session.first.observation.target == expected.target  # type: ignore[attr-defined]
    with pytest.raises(IndexError, match="no task at index 100"):
        async with env.session(split="test", index=100):
            pass
    with pytest.raises(ValueError, match="together"):
        env.session(split="train")


def test_the_sync_twin_takes_split_and_index(keyed_url: str) -> None:
    with RemoteEnv(keyed_url, api_key=KEY).sync().session(split="train", index=5) as session:
        assert session.task is not None
        assert session.task.id == "train-5"


async def test_an_unknown_environment_name_is_not_found_and_the_real_ones_named() -> None:
    app = create_multi_app(
        {"counter": EnvSpec(CounterEnvironment, CounterAction, CounterObservation)}
    )
    with run_server(app) as url:
        missing = MultiEnvClient(url).environments.get("nope")
        for attempt in (missing.list_splits(), missing.list_tools(), missing.list_tasks("train")):
            with pytest.raises(
                NotFoundError, match="no environment named 'nope'; this server has counter"
            ):
                await attempt
        with pytest.raises(NotFoundError, match="no environment named 'nope'"):
            async with missing.session():
                pass
        assert await MultiEnvClient(url).environments.get("counter").list_splits() == [
            "train",
            "test",
        ]
