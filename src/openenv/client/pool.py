"""``ServerPool``: several servers (or a fleet) behind one client-side address.

A client given a pool instead of a URL opens its session on the server with
the most free room, as the servers advertise it on ``GET /health`` (or a
fleet's directory on ``GET /replicas``). A server that refuses for capacity,
or cannot be reached, is passed over and the next one tried; the caller sees
a refusal only when every server is full for longer than ``wait`` seconds. A
server whose health check takes longer than ``health_timeout`` seconds in all,
or answers something that is not ``protocol.Health`` (another service on that
port, a proxy's error page), counts as down until a later check says otherwise.
A "degraded" server (its event loop was blocked lately) still gets sessions,
but only when no healthy server has room.

The pool keeps its own count between health checks: each session it places
takes one slot from its estimate at once, so a burst of clients spreads over
the servers instead of all choosing the one that looked emptiest.

Everything that takes a URL takes a pool: the typed clients, ``RemoteEnv``,
``Task(env=...)`` on every engine (a pool pickles as its URLs; each process
keeps its own estimates) and ``openenv run --env`` (several ``--env``, or
URLs separated by commas).
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from openenv import protocol
from openenv.client._base import auth_headers, http_url, url_key, ws_url
from openenv.errors import CapacityError, ConnectionFailedError

__all__ = ["ServerPool", "ServerView", "as_pool"]

_LOOK_AGAIN = 0.02  # seconds between looks for room while every server is full
_TAKES_SESSIONS = frozenset({"healthy", "degraded"})
_JOINED: dict[str, ServerPool] = {}  # URLs joined by commas -> their shared pool


@dataclass
class ServerView:
    """What the pool believes about one server."""

    url: str  # http(s)://host:port
    free: int = 0  # slots the pool may still use there
    max_sessions: int = 0
    up: bool = False  # answers, and takes sessions ("healthy" or "degraded")
    degraded: bool = False  # slowed (its loop was blocked lately): used when no other has room
    placed: int = 0  # sessions this pool holds there now
    why: str = ""  # why it takes no session though it answers (no /ws of its own)


class ServerPool:
    """Place sessions on whichever of several servers has room.

    >>> pool = ServerPool(["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
    >>> pool.urls
    ('http://10.0.0.1:8000', 'http://10.0.0.2:8000')
    >>> async def play() -> None:
    ...     async with WebSocketEnvClient(pool) as env:  # on the server with most room
    ...         await env.reset()

    A URL may also name a fleet's directory (``openenv serve --ray``): the
    pool then places sessions on the replicas it lists.

    Args:
        urls: Server (or fleet directory) URLs: an iterable, or one string
            with URLs separated by commas.
        refresh: Seconds between health checks of the servers.
        wait: Seconds to wait for room when every server is full.
        api_key: Sent to the servers' HTTP routes, and in the handshake of every
            session placed through the pool by a client given no key of its
            own (default: ``$OPENENV_API_KEY``).
        health_timeout: Seconds each server has to answer its health check, in
            all (a server that trickles its answer is cut off too).
    """

    _shared: ClassVar[dict[tuple[Any, ...], ServerPool]] = {}
    _shared_lock: ClassVar = threading.Lock()

    def __init__(
        self,
        urls: str | Iterable[str],
        *,
        refresh: float = 1.0,
        wait: float = 60.0,
        api_key: str | None = None,
        health_timeout: float = 5.0,
    ) -> None:
        items = urls.split(",") if isinstance(urls, str) else list(urls)
        self.urls = tuple(http_url(url.strip()) for url in items if url.strip())
        if not self.urls:
            raise ValueError("a ServerPool needs at least one URL")
        self.refresh = refresh
        self.wait = wait
        # The URLs lose their query here: a key in one (?api_key=) is the pool's.
        self._api_key = api_key or next(filter(None, map(url_key, items)), None)
        self.health_timeout = health_timeout
        self._servers: dict[str, ServerView] = {}
        self._checked = -float("inf")
        self.waiting = 0  # placements waiting for room, in this process
        # The round of health checks under way in each event loop: a future
        # belongs to one loop, and one pool serves several (``shared`` makes one
        # per process; sync clients, Runners and threads each run their own).
        self._refreshing: dict[asyncio.AbstractEventLoop, asyncio.Future[None]] = {}
        self._background: set[asyncio.Task[None]] = set()

    @classmethod
    def shared(cls, urls: Iterable[str], **options: Any) -> ServerPool:
        """One pool per process for these URLs and options, so every client shares its counts.

        The options are part of what is shared: a pool with another key or
        wait (a later run's, in a Ray worker that ran an earlier one) is
        another pool, not the first one's settings passed off as its own.
        """
        urls = tuple(urls)
        key = (urls, *sorted({**_DEFAULTS, **options}.items()))
        with cls._shared_lock:
            pool = cls._shared.get(key)
            if pool is None:
                pool = cls._shared[key] = cls(urls, **options)
            return pool

    def __reduce__(self) -> tuple[Any, ...]:
        # Another process (a Ray or Spark worker) gets its own pool for the same
        # servers, shared by every task it runs there.
        return (
            _shared_pool,
            (self.urls, self.refresh, self.wait, self._api_key, self.health_timeout),
        )

    def __repr__(self) -> str:
        return f"ServerPool({list(self.urls)!r})"

    @property
    def api_key(self) -> str | None:
        """The key given to the pool (``None``: ``$OPENENV_API_KEY``, if set, is sent)."""
        return self._api_key

    def servers(self) -> list[ServerView]:
        """The servers as last seen (empty before the first health check)."""
        return list(self._servers.values())

    async def place(self) -> str:
        """A server's ``ws://`` URL with room for one more session, its slot taken.

        Raises:
            CapacityError: every server stayed full (or down) for ``wait`` seconds;
                its ``active_sessions`` and ``max_sessions`` sum the servers up.
            ConnectionFailedError: no server answers its health check: at
                once on the first look, else once they have all been down
                for ``wait`` seconds (a restart is waited for).
        """
        deadline = time.monotonic() + self.wait
        while True:
            if not self._servers:  # the first look: nothing to go on until it answers
                await self._refresh()
                if not any(view.up for view in self._servers.values()):
                    raise ConnectionFailedError(str(self), self._none_answered())
            elif time.monotonic() - self._checked >= self.refresh:
                self._refresh_soon()  # meanwhile, place by the pool's own count
            chosen = self._take()
            if chosen is not None:
                return ws_url(chosen.url)
            left = deadline - time.monotonic()
            if left <= 0:
                if not any(view.up for view in self._servers.values()):
                    # Not one is full: a refusal for capacity would say "retry later" wrongly.
                    raise ConnectionFailedError(
                        str(self), f"no server answered on /health for {self.wait}s"
                    )
                up = [view for view in self._servers.values() if view.up]
                raise CapacityError(
                    protocol.ErrorCode.CAPACITY_REACHED,
                    f"all {len(self._servers)} servers of {self!r} full or down for {self.wait}s",
                    {
                        "servers": [view.url for view in up],
                        # As a fleet's refusal sums its replicas: the slots taken
                        # as this pool counts them (every one, or it would place).
                        "active_sessions": sum(view.max_sessions - view.free for view in up),
                        "max_sessions": sum(view.max_sessions for view in up),
                    },
                )
            # A session of ours that ends frees a slot at once; look again soon.
            self.waiting += 1
            try:
                await asyncio.sleep(min(_LOOK_AGAIN, left))
            finally:
                self.waiting -= 1

    def _none_answered(self) -> str:
        reasons = [view.why for view in self._servers.values() if view.why]
        return "; ".join(reasons) or "no server answered on /health"

    def refused(self, ws: str) -> None:
        """The server at ``ws`` was full after all: no room there until the next check."""
        view = self._view(ws)
        if view is not None:
            view.free = 0
            view.placed -= 1

    def failed(self, ws: str) -> None:
        """The server at ``ws`` could not be reached: skip it until it answers again."""
        view = self._view(ws)
        if view is not None:
            view.up, view.free = False, 0
            view.placed -= 1

    def ended(self, ws: str) -> None:
        """A session placed on ``ws`` ended: its slot is free again."""
        view = self._view(ws)
        if view is not None:
            view.placed -= 1
            view.free = min(view.free + 1, view.max_sessions)

    def _take(self) -> ServerView | None:
        candidates = [view for view in self._servers.values() if view.up and view.free > 0]
        if not candidates:
            return None
        # A degraded server still serves, only slower: the last resort, not refused.
        candidates = [view for view in candidates if not view.degraded] or candidates
        most = max(view.free for view in candidates)
        chosen = random.choice([view for view in candidates if view.free == most])
        chosen.free -= 1
        chosen.placed += 1
        return chosen

    def _view(self, ws: str) -> ServerView | None:
        return self._servers.get(http_url(ws))

    def _refresh_soon(self) -> None:
        loop = asyncio.get_running_loop()
        if loop not in self._refreshing:
            task = loop.create_task(self._refresh())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _refresh(self) -> None:
        # Concurrent placements in one loop share one round of health checks;
        # another loop's round is no future this one may await or settle.
        loop = asyncio.get_running_loop()
        under_way = self._refreshing.get(loop)
        if under_way is not None:
            await asyncio.shield(under_way)
            return
        done = self._refreshing[loop] = loop.create_future()
        try:
            await self._check_all()
        finally:
            self._checked = time.monotonic()
            del self._refreshing[loop]
            done.set_result(None)

    async def _check_all(self) -> None:
        import httpx  # the pool's only HTTP; imported when a pool is first used

        headers = auth_headers(api_key=self._api_key)  # its default: $OPENENV_API_KEY
        # Loading the CA bundle costs tens of milliseconds: only for https.
        verify = any(url.startswith("https:") for url in self.urls)
        bound = self.health_timeout
        async with httpx.AsyncClient(timeout=bound, headers=headers, verify=verify) as http:
            found = await asyncio.gather(*(_describe(http, url, bound) for url in self.urls))
        seen: dict[str, ServerView] = {}
        for servers in found:
            for url, health in servers:
                view = self._servers.get(url) or ServerView(url)
                view.why = ""
                if health is None:
                    view.up, view.free = False, 0
                elif isinstance(health, protocol.MultiHealth):
                    view.up, view.free = False, 0
                    view.why = _several(url, health)
                else:
                    view.up = health.status in _TAKES_SESSIONS
                    view.degraded = health.status == "degraded"
                    view.max_sessions = health.max_sessions
                    taken = health.active_sessions + health.queued_sessions
                    view.free = max(view.max_sessions - taken, 0) if view.up else 0
                seen[url] = view
        self._servers = seen


async def _describe(http: Any, url: str, bound: float) -> list[tuple[str, protocol.Health | None]]:
    """``[(server URL, its health or None if down)]``: one server, or a fleet's replicas."""
    import httpx

    try:
        async with asyncio.timeout(bound):
            listing = await http.get(f"{url}/replicas")
            if listing.status_code == 200:
                replicas = protocol.ReplicaList.model_validate_json(listing.content).replicas
                return [(http_url(replica.url), replica) for replica in replicas]
            health = await http.get(f"{url}/health")
            if health.status_code == 200:
                reply = protocol.MultiHealth.model_validate_json(health.content)
                # The root of a server of several environments has no /ws of its own.
                if "envs" not in reply.model_fields_set:
                    return [(url, protocol.Health.model_validate(reply.model_dump()))]
                return [(url, reply)]
    except (httpx.HTTPError, OSError, ValueError):  # TimeoutError and ValidationError too
        pass
    return [(url, None)]


# The options of ``ServerPool`` as it is made without them, for ``shared``'s keys.
_DEFAULTS: dict[str, Any] = {
    name: parameter.default
    for name, parameter in inspect.signature(ServerPool.__init__).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY
}


def _shared_pool(
    urls: tuple[str, ...], refresh: float, wait: float, api_key: str | None, health_timeout: float
) -> Any:
    return ServerPool.shared(
        urls, refresh=refresh, wait=wait, api_key=api_key, health_timeout=health_timeout
    )


def as_pool(target: str | ServerPool) -> ServerPool | None:
    """The pool a client should place its session with, or ``None`` for one plain URL.

    >>> as_pool("http://a:8000") is None
    True
    >>> as_pool("http://a:8000,http://b:8000")
    ServerPool(['http://a:8000', 'http://b:8000'])
    >>> as_pool("http://a:8000,")  # a trailing comma: a pool of one
    ServerPool(['http://a:8000'])
    """
    if isinstance(target, ServerPool):
        return target
    if "," in target:
        # Asked once per session (and per episode by Runners): parse each text once.
        pool = _JOINED.get(target)
        if pool is None:
            parsed = ServerPool(target)
            pool = _JOINED[target] = ServerPool.shared(parsed.urls, api_key=parsed.api_key)
        return pool
    return None


def _several(url: str, health: protocol.MultiHealth) -> str:
    """Why the root of a server of several environments takes no session."""
    names = [f"{url}/envs/{name}" for name in health.envs] or [f"{url}/envs/NAME"]
    return (
        f"{url} is the root of a server of several environments, with no /ws of its "
        f"own: give the pool an environment's URL ({', '.join(names)})"
    )
