import pytest

import openenv
import openenv.adapters.gymnasium
import openenv.client
import openenv.server
from echo_env.server.environment import EchoEnvironment
from openenv.runtime import EpisodeSession, Runners, Task


def test_all_is_complete_and_sorted() -> None:
    for module in (openenv, openenv.client, openenv.server, openenv.adapters.gymnasium):
        public = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_") and getattr(value, "__module__", "").startswith("openenv")
        }
        assert public <= set(module.__all__), (module.__name__, public - set(module.__all__))
        assert module.__all__ == sorted(module.__all__, key=str.lower) or module.__all__ == sorted(
            module.__all__
        )


def test_every_exported_name_resolves() -> None:
    for name in openenv.__all__:
        assert getattr(openenv, name) is not None, name


def test_every_public_exception_is_in_the_one_tree() -> None:
    import importlib
    import inspect
    import pkgutil

    import openenv
    from openenv.errors import OpenEnvError

    outside = []
    for info in pkgutil.walk_packages(openenv.__path__, "openenv."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
                and not name.startswith("_")
                and not issubclass(obj, OpenEnvError)
            ):
                outside.append(f"{module.__name__}.{name}")
    assert outside == []


def test_renamed_names_still_work_for_a_release_and_say_the_new_name() -> None:

    for module in (openenv, openenv.client):
        with pytest.warns(DeprecationWarning, match="OpenEnvClient is now MultiEnvClient"):
            assert module.OpenEnvClient is openenv.MultiEnvClient
        with pytest.warns(DeprecationWarning, match="SyncOpenEnvClient is now SyncMultiEnvClient"):
            assert module.SyncOpenEnvClient is openenv.SyncMultiEnvClient
    with pytest.raises(AttributeError, match="no attribute 'NoSuchClient'"):
        _ = openenv.client.NoSuchClient


def test_episode_session_reward_is_total_reward_under_its_old_name() -> None:

    async def both(session: EpisodeSession) -> tuple[float, float]:
        await session.reset()
        await session.step({"message": "hey"})
        with pytest.warns(DeprecationWarning, match="now total_reward"):
            old = session.reward
        return old, session.total_reward

    [result] = Runners.sync_run_task([Task(id="t0", env=EchoEnvironment, agent=both)])
    old, new = result.value
    assert old == new == result.reward > 0
