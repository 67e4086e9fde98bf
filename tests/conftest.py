from __future__ import annotations

import gc
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

sys.path.insert(0, str(Path(__file__).parent))


from echo_env.server.app import app as echo_app
from openenv.testing import run_server

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

# Apps that the tests start in their own processes, with their own settings.
collect_ignore = ["apps"]


@pytest.fixture(scope="session")
def echo_url() -> Iterator[str]:
    """One echo server for the whole test session."""
    with run_server(echo_app) as url:
        yield url


@pytest.fixture(scope="module", autouse=True)
def _collect_garbage_of_the_module() -> Iterator[None]:
    """Collect cycles after each module, so an object it left unclosed (a socket,
    a transport) is reported against that module rather than wherever the
    garbage collector happens to run next."""
    yield
    gc.collect()


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace: dict[str, object]) -> None:
    doctest_namespace["ECHO_URL"] = "http://127.0.0.1:8000"


@pytest.fixture(scope="session")
def _ray_temp_dirs() -> Iterator[list[str]]:
    """The local Ray clusters' temp dirs, removed (and Ray shut down) at the end."""
    dirs: list[str] = []
    try:
        yield dirs
    finally:
        import ray

        ray.shutdown()
        for temp_dir in dirs:
            shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def ray_cluster(_ray_temp_dirs: list[str]) -> None:
    """A local Ray cluster, in its own temp dir, quiet: one for the session, started
    again if a module's own cluster (``fleet_kit.two_node_cluster``) replaced it."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    temp_dir = tempfile.mkdtemp(prefix="oe-ray-")
    _ray_temp_dirs.append(temp_dir)
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=128 * 2**20,
        _temp_dir=temp_dir,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )


@pytest.fixture(scope="session")
def spark_context() -> Iterator[None]:
    """One Spark local[2] context for the session (the runtime's own local setup)."""
    from openenv.runtime.spark import local_context

    sc = local_context(2)
    try:
        yield
    finally:
        sc.stop()


# The browser of the web page's tests (test_web_page.py, test_web_connection.py),
# on the session's event loop; modules with a loop of their own define their own.
@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    """One headless Chromium (Debian's), shared by the tests that ask for it."""
    from web_page_kit import chromium

    async with chromium() as browser:
        yield browser


@pytest_asyncio.fixture(loop_scope="session")
async def new_page(browser: Browser) -> AsyncIterator[Callable[..., Awaitable[Page]]]:
    """Opens pages on ``browser``, each in a context of its own, closed after the test."""
    from web_page_kit import page_opener

    async with page_opener(browser) as open_page:
        yield open_page


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[list[str]]:
    """A two-node Ray cluster (``fleet_kit.two_node_cluster``) for the fleet tests
    of one module; its node ids."""
    import ray
    from fleet_kit import two_node_cluster

    with two_node_cluster():
        yield [node["NodeID"] for node in ray.nodes() if node["Alive"]]
