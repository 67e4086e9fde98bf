"""Each OpenEnv environment on one thread of its own, as OpenEnv's server runs it.

OpenEnv's server gives every session a one-thread executor: the environment
is made there, and its plain ``def`` ``reset``/``step`` (and ``close``) run
there. Environments written for it may hold what belongs to the thread that
made it (an ``sqlite3`` connection, a greenlet-based browser, thread-local
state), which openenv's worker threads, shared by all sessions, would break.
``create_app`` of ``openenv.core`` serves OpenEnv environments through
``OnItsOwnThread`` so they keep that thread; one that sets
``REQUIRES_SINGLE_THREAD_EXECUTOR = True`` shares one thread with every other
session of its app, as on OpenEnv. ``async def`` methods stay on the event
loop, as there.

>>> import threading
>>> from openenv.core.env_server.interfaces import Environment
>>> class Where(Environment):
...     def __init__(self):
...         super().__init__()
...         self.made_on = threading.get_ident()
...     def reset(self, seed=None, episode_id=None, **kwargs): ...
...     def step(self, action, timeout_s=None, **kwargs): ...
...     @property
...     def state(self): ...
>>> env = OnItsOwnThread(Where)()
>>> env.made_on != threading.get_ident(), env._server_reset
(True, '_reset_on_its_thread')
"""

from __future__ import annotations

import functools
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from openenv.environment import server_method
from openenv.server.calls import is_async

__all__ = ["OnItsOwnThread"]

_Job = tuple[Callable[[], Any], "Future[Any]"]


class _Thread:
    """One daemon thread that runs the calls handed to it, one at a time, in order.

    A daemon, so an environment call that never returns cannot keep the server
    process from exiting (a ``ThreadPoolExecutor``'s thread would).
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((functools.partial(fn, *args, **kwargs), future))
        return future

    def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn`` on this thread and wait for it."""
        return self.submit(fn, *args, **kwargs).result()

    def stop(self) -> None:
        """End the thread once the calls already handed to it have run."""
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            call, future = job
            if not future.set_running_or_notify_cancel():
                continue  # its awaiter gave up before it started
            try:
                future.set_result(call())
            except BaseException as exc:  # SystemExit too: it is the caller's to see
                future.set_exception(exc)
            del call, future, job  # hold nothing of a finished call while idle


class OnItsOwnThread(functools.partial[Any]):
    """An environment factory whose environments each live on one thread of their own.

    A ``functools.partial`` of the factory, so ``create_app`` still sees which
    class it makes.
    """

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        from openenv.core.env_server.interfaces import Environment

        shared = self._shared_thread()
        thread = shared or _Thread("openenv-session")
        try:
            env = thread.run(super().__call__, *args, **kwargs)
        except BaseException:
            if shared is None:
                thread.stop()
            raise
        if isinstance(env, Environment):
            _pin(env, thread, own=shared is None)
        elif shared is None:
            thread.stop()
        return env

    def _shared_thread(self) -> _Thread | None:
        made = self.func
        while isinstance(made, functools.partial):
            made = made.func
        if not getattr(made, "REQUIRES_SINGLE_THREAD_EXECUTOR", False):
            return None
        with _SHARED_LOCK:
            thread = _SHARED.get(self)
            if thread is None:
                thread = _SHARED[self] = _Thread("openenv-single-thread")
                # Ended with its app (this factory): each app served made one for good.
                weakref.finalize(self, thread.stop)
        return thread


_SHARED: weakref.WeakKeyDictionary[OnItsOwnThread, _Thread] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def _pin(env: Any, thread: _Thread, own: bool) -> None:
    """Route ``env``'s plain ``def`` reset, step and close to ``thread``.

    They stay plain functions, run from the server's worker threads as before,
    which each wait for ``thread``: so a call that overruns its deadline still
    holds its slot until it returns, and ``close()`` still waits for it.
    """
    for name in ("reset", "step"):
        method = server_method(env, name)
        if not is_async(method):  # an overridden reset_async/step_async stays on the loop
            setattr(env, f"_{name}_on_its_thread", _on(thread, method))
            setattr(env, f"_server_{name}", f"_{name}_on_its_thread")
    if own:  # a session left without close() (a shutdown abandons one stuck in a call)
        weakref.finalize(env, thread.stop)
    close = env.close
    if is_async(close):

        async def close_async() -> None:
            try:
                await close()
            finally:
                if own:
                    thread.stop()

        env.close = close_async
        return

    def close_on_its_thread() -> None:
        try:
            thread.run(close)
        finally:
            if own:
                thread.stop()

    env.close = close_on_its_thread


def _on(thread: _Thread, method: Callable[..., Any]) -> Callable[..., Any]:
    # wraps: the server reads the reset arguments it takes from its signature.
    @functools.wraps(method)
    def on_its_thread(*args: Any, **kwargs: Any) -> Any:
        return thread.run(method, *args, **kwargs)

    return on_its_thread
