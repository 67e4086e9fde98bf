"""``openenv serve --workers N`` killed all at once leaves its slot board in
``/dev/shm``; the next server removes it, and never one a live server uses."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from cli_envs import write_env
from test_cli_serve import eventually, health, open_session, serving
from test_serve_supervisor import PID_RECORDING_BOARD, board_of, group, reaped, wait_until_empty


def board_of_server(url: str, folder: Path) -> Path:
    """Its board's folder, which its environment writes down as a session opens."""

    async def one_session() -> None:
        opened = await open_session(url)
        assert opened is not None
        await opened[0].close()

    asyncio.run(one_session())
    return board_of(folder)


def workers_of(supervisor: int) -> list[int]:
    """The worker processes ``supervisor`` spawned (not multiprocessing's resource tracker)."""
    return [
        pid
        for pid in group(supervisor)
        if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


@pytest.mark.timeout(180)
def test_a_board_left_by_a_server_killed_outright_is_removed_by_the_next(tmp_path: Path) -> None:
    killed, paused, later = (
        write_env(tmp_path / name, factory=PID_RECORDING_BOARD)
        for name in ("killed", "paused", "later")
    )
    with serving(killed, "--workers", "2") as (url, proc), reaped(proc):
        left = board_of_server(url, killed)
        os.killpg(proc.pid, signal.SIGKILL)  # supervisor and workers at once: nobody cleans up
        wait_until_empty(proc.pid, killed / "serve.log")
    assert left.is_dir()  # what the next server must remove

    with serving(paused, "--workers", "2") as (paused_url, paused_proc), reaped(paused_proc):
        kept = board_of_server(paused_url, paused)
        # A live server whose workers have all died, not yet replaced: no row of its
        # board is held, yet it is in use. Its supervisor alive is what keeps it.
        os.kill(paused_proc.pid, signal.SIGSTOP)
        try:
            for pid in workers_of(paused_proc.pid):
                os.kill(pid, signal.SIGKILL)
            with serving(later, "--workers", "2") as (later_url, later_proc), reaped(later_proc):
                assert not left.exists(), "the killed server's board is still there"
                assert kept.is_dir(), "a live server's board was removed"
                assert board_of_server(later_url, later).is_dir()
        finally:
            os.kill(paused_proc.pid, signal.SIGCONT)
        # Its workers replaced, it serves on with the board it had.
        log = paused / "serve.log"
        asyncio.run(eventually(lambda: health(paused_url).get("workers") == 2, "replaced", log))
        assert board_of_server(paused_url, paused) == kept
