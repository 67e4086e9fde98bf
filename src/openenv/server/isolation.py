"""Crash isolation: each session's environment in a process of its own.

``create_app(..., isolation="process")`` makes every session's environment in
a child process and forwards ``reset``, ``step``, ``state`` and ``close`` to it
over a pipe. An environment that segfaults, calls ``os._exit`` or is killed
by the kernel for its memory takes only its own session down: that client
gets a precise error (and the session ends); every other session goes on, and
the server keeps its close frames, its slots and its other children.

It costs a process per session (started by a fork server that has already
imported the environment's module, so a few milliseconds each) and a pipe
round trip per call. Environments with ``@tool`` methods are not isolated
this way: tools are looked up on the environment object itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import multiprocessing
import multiprocessing.connection
import pickle
import signal
from dataclasses import replace
from typing import Any

from openenv.environment import Environment, server_method
from openenv.errors import ServerSideError
from openenv.server.reset_args import ResetArgs
from openenv.tasks import TaskSpec

__all__ = ["EnvProcessDied", "ProcessEnvironment", "isolated_factory"]

_CLOSE_WAIT = 5.0  # seconds a child has to close its environment before it is killed


class EnvProcessDied(ServerSideError):
    """The process holding a session's environment ended while it was in use."""


class ProcessEnvironment(Environment[Any, Any, Any]):
    """An environment living in a child process; this object forwards calls to it.

    Made by ``isolated_factory``: the constructor starts the child (in a
    thread: the first start also starts the fork server), and ``ready`` waits
    on the event loop for it to build its environment, so a factory that
    raises is the session's ``FACTORY_ERROR`` as usual, and one that overruns
    ``factory_timeout`` is killed with its process.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, factory: Any) -> None:
        context = _context(factory)
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(factory, child), daemon=True)
        self._process.start()
        child.close()
        self._state: Any = None
        self._dead = False
        self.killed = False  # its process was killed to stop a call that overran
        # What the child's reset takes, as it reported: a session checks reset's
        # arguments and parses its task here, as for an environment in process.
        self.child_reset_args: ResetArgs | None = None

    async def ready(self) -> None:
        """Wait for the child's environment; raise what its factory raised."""
        try:
            await _readable(self._conn)
            kind, value, state = self._conn.recv()
        except (EOFError, OSError):
            await asyncio.to_thread(self._process.join, _CLOSE_WAIT)
            self._conn.close()
            raise EnvProcessDied(f"the environment's process {self._ended()}") from None
        except BaseException:
            self.kill()
            raise
        if kind == "error":
            await asyncio.to_thread(self._process.join, _CLOSE_WAIT)
            self._conn.close()
            raise value
        self.child_reset_args = value
        self._state = state

    def kill(self) -> None:
        """Stop the child at once, whatever it is doing (nothing may wait on its pipe)."""
        self.killed = self._dead = True
        self._process.kill()
        self._conn.close()

    async def reset(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("reset", args, kwargs)

    async def step(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("step", args, kwargs)

    @property
    def state(self) -> Any:
        return self._state  # as of the last call: the child sends it with every reply

    async def close(self) -> None:
        if not self._dead and self._process.is_alive():
            with contextlib.suppress(EnvProcessDied, OSError, EOFError):
                async with asyncio.timeout(_CLOSE_WAIT):
                    await self._call("close", (), {})
        if self._process.is_alive():
            self._process.kill()
        await asyncio.to_thread(self._process.join, _CLOSE_WAIT)
        self._conn.close()

    async def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._dead:
            raise EnvProcessDied(f"the environment's process {self._ended()}")
        try:
            self._conn.send((method, args, kwargs))
            await _readable(self._conn)
            kind, value, state = self._conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            self._dead = True
            await asyncio.to_thread(self._process.join, _CLOSE_WAIT)
            raise EnvProcessDied(f"the environment's process {self._ended()}") from None
        except BaseException:
            # Cancelled (a deadline, the session ending) with the call still running
            # in the child: only killing the process stops it, and a child left
            # running would answer this call when asked the next.
            self.kill()
            raise
        if kind == "error":
            raise value
        self._state = state
        return value

    def _ended(self) -> str:
        code = self._process.exitcode
        if code is None:
            return "stopped answering"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"


def isolated_factory(factory: Any) -> Any:
    """A factory of ``ProcessEnvironment`` proxies around ``factory``'s environments."""

    async def make() -> ProcessEnvironment:
        starting = asyncio.ensure_future(asyncio.to_thread(ProcessEnvironment, factory))
        try:
            env = await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(_kill_late)  # its thread starts the child regardless
            raise
        await env.ready()
        return env

    return make


def _kill_late(started: asyncio.Future[ProcessEnvironment]) -> None:
    if not started.cancelled() and started.exception() is None:
        started.result().kill()


async def _readable(conn: multiprocessing.connection.Connection) -> None:
    # Waiting on the pipe in the event loop, not in a thread: a thousand
    # sessions in slow steps hold no thread each.
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fd = conn.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


_CONTEXTS: dict[str, Any] = {}


def _context(factory: Any) -> Any:
    """A fork server that has imported the factory's module: children start in milliseconds."""
    module = getattr(factory, "__module__", None) or getattr(
        getattr(factory, "func", None), "__module__", None
    )
    key = module or ""
    if key not in _CONTEXTS:
        context = multiprocessing.get_context("forkserver")
        if module and module != "__main__":
            context.set_forkserver_preload(["openenv", module])
        _CONTEXTS[key] = context
    return _CONTEXTS[key]


def _serve(factory: Any, conn: multiprocessing.connection.Connection) -> None:
    """The child: build the environment, then answer calls until closed or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the server's to handle
    loop = asyncio.new_event_loop()

    def settle(value: Any) -> Any:
        return loop.run_until_complete(value) if inspect.isawaitable(value) else value

    try:
        env = settle(factory())
    except BaseException as exc:
        conn.send(("error", _portable(exc), None))
        return
    conn.send(("ok", _portable_reset_args(env), _portable_state(env)))
    while True:
        try:
            method, args, kwargs = conn.recv()
        except (EOFError, OSError):
            return  # the server is gone
        try:
            call = (
                server_method(env, method) if method in ("reset", "step") else getattr(env, method)
            )
            value = settle(call(*args, **kwargs))
            conn.send(("ok", value, _portable_state(env)))
        except BaseException as exc:
            conn.send(("error", _portable(exc), None))
        if method == "close":
            return


def _portable_reset_args(env: Environment[Any, Any, Any]) -> ResetArgs:
    """What the server checks a reset against, for the proxy to check it there."""
    args = ResetArgs.of(env)
    try:
        pickle.dumps(args.task_cls)
    except Exception:  # a class the server cannot import (defined in a function)
        return replace(args, task_cls=TaskSpec)  # tasks then arrive untyped, fields kept
    return args


def _portable_state(env: Environment[Any, Any, Any]) -> Any:
    try:
        return env.state
    except Exception:  # a state that cannot be read yet (before reset)
        return None


def _portable(exc: BaseException) -> Any:
    """The exception, pickled to come back as it is; a RuntimeError naming it if it cannot.

    Not pickled as is: pickle rebuilds an exception by calling its class with
    its ``args``, which one taking other arguments misreads (an ``EnvError``
    whose ``__init__(move)`` makes its message from ``move`` came back as
    ``"move move x is not allowed is not allowed"``)."""
    portable = _Raised(exc)
    try:
        pickle.loads(pickle.dumps(portable))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return portable


class _Raised:
    """Pickles as the exception it holds, rebuilt without its ``__init__``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __reduce__(self) -> tuple[Any, ...]:
        exc = self.exc
        return _rebuilt, (type(exc), exc.args, dict(vars(exc)))


def _rebuilt(cls: type[BaseException], args: tuple[Any, ...], attrs: dict[str, Any]) -> Any:
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(attrs)
    return exc
