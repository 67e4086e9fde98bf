"""Build and start a Dockerfile's image without Docker: its steps, run in a virtual environment.

No Docker engine runs on these machines, so ``build`` plays the Dockerfile in a
folder that stands in for the image's ``/``: ``COPY`` copies from the build
context (minus ``.dockerignore``), ``WORKDIR`` moves within that folder,
``RUN`` runs its shell command there with the virtual environment first on
``PATH`` (it stands in for the image's Python), and ``CMD`` / ``HEALTHCHECK``
are kept to be started later, with the image's ``ENV``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from dockerfile_parse import DockerfileParser
from dockerfile_parse.util import WordSplitter


@dataclass
class Image:
    """What ``build`` made: the filesystem, and how the image starts."""

    root: Path
    venv: Path
    base: str = ""
    workdir: Path = Path()
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    exposed: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)

    def environ(self, **extra: str) -> dict[str, str]:
        """The process environment of a container: the image's ENV, its Python first on PATH."""
        environ = {k: v for k, v in os.environ.items() if k not in _HOST_ONLY}
        environ.update(self.env)
        environ["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{os.environ['PATH']}"
        environ.update(extra)
        return environ

    @contextlib.contextmanager
    def running(self, log: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
        """Start ``CMD`` on a free loopback port, wait until /health answers, yield the URL.

        ``UVICORN_HOST``/``UVICORN_PORT`` are set the way ``docker run -e`` would set them.
        """
        port = free_port()
        environ = self.environ(UVICORN_HOST="127.0.0.1", UVICORN_PORT=str(port))
        with log.open("wb") as out:
            proc = subprocess.Popen(
                self.cmd,
                cwd=self.workdir,
                env=environ,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc, log)
            yield url, proc
        finally:
            stop(proc)

    def run_healthcheck(self, url: str) -> int:
        """Run ``HEALTHCHECK``'s command the way Docker would inside the container."""
        port = url.rsplit(":", 1)[1]
        environ = self.environ(UVICORN_PORT=port)
        done = subprocess.run(self.healthcheck, env=environ, cwd=self.workdir, check=False)
        return done.returncode


# Variables of the test process that a container would not inherit.
_HOST_ONLY = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "UVICORN_HOST", "UVICORN_PORT"}


def parse(dockerfile: Path, build_args: dict[str, str] | None = None) -> DockerfileParser:
    return DockerfileParser(str(dockerfile), build_args=build_args or {})


def expanded(dockerfile: Path, kind: str, build_args: dict[str, str] | None = None) -> list[str]:
    """Every ``kind`` instruction's value, with ARG and ENV values substituted."""
    parser = parse(dockerfile, build_args)
    return [
        " ".join(_words(instruction["value"], ctx))
        for instruction, ctx in zip(parser.structure, parser.context_structure, strict=True)
        if instruction["instruction"] == kind
    ]


def _words(value: str, ctx: Any) -> list[str]:
    args, envs = ctx.get_values(context_type="ARG"), ctx.get_values(context_type="ENV")
    return list(WordSplitter(value, args=args, envs=envs).split())


def build(
    dockerfile: Path,
    context: Path,
    root: Path,
    venv: Path,
    build_args: dict[str, str] | None = None,
) -> Image:
    """Play ``dockerfile``'s steps with ``context`` as build context and ``root`` as ``/``."""
    parser = parse(dockerfile, build_args)
    image = Image(root=root, venv=venv, workdir=root)
    ignored = _dockerignore(context)
    for instruction, ctx in zip(parser.structure, parser.context_structure, strict=True):
        kind, value = instruction["instruction"], instruction["value"]
        args, envs = ctx.get_values(context_type="ARG"), ctx.get_values(context_type="ENV")
        words = _words(value, ctx)
        if kind == "FROM":
            image.base = value
        elif kind in ("ARG", "LABEL", "COMMENT"):
            pass  # dockerfile-parse tracks ARG values per instruction
        elif kind == "ENV":
            image.env = dict(envs)
        elif kind == "WORKDIR":
            image.workdir = _inside(root, image.workdir, words[0])
            image.workdir.mkdir(parents=True, exist_ok=True)
        elif kind == "COPY":
            *sources, target = words
            for source in sources:
                _copy(context, source, _inside(root, image.workdir, target), ignored)
        elif kind == "RUN":
            environ = image.environ(**{k: v for k, v in args.items() if k not in envs})
            subprocess.run(["/bin/sh", "-c", value], cwd=image.workdir, env=environ, check=True)
        elif kind == "USER":
            image.user = value
        elif kind == "EXPOSE":
            image.exposed = words
        elif kind == "HEALTHCHECK":
            image.healthcheck = _exec_form(value.split(" CMD ", 1)[1], kind)
        elif kind == "CMD":
            image.cmd = _exec_form(value, kind)
        else:
            raise ValueError(f"{dockerfile}: no emulation for {kind}")
    return image


def _exec_form(value: str, kind: str) -> list[str]:
    if not value.lstrip().startswith("["):
        raise ValueError(f"{kind} is in shell form: {value}")
    command: list[str] = json.loads(value)
    return command


def _inside(root: Path, workdir: Path, path: str) -> Path:
    if path.startswith("/"):
        return root / path.lstrip("/")
    return workdir / path


def _dockerignore(context: Path) -> list[str]:
    path = context / ".dockerignore"
    if not path.is_file():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line.rstrip("/") for line in lines if line and not line.startswith("#")]


def _is_ignored(relative: PurePosixPath, patterns: list[str]) -> bool:
    for candidate in (relative, *relative.parents):
        text = candidate.as_posix()
        for pattern in patterns:
            if fnmatch.fnmatchcase(text, pattern):
                return True
            if pattern.startswith("**/"):
                parts = candidate.parts
                tails = ("/".join(parts[i:]) for i in range(len(parts)))
                if any(fnmatch.fnmatchcase(tail, pattern[3:]) for tail in tails):
                    return True
    return False


def _copy(context: Path, source: str, target: Path, ignored: list[str]) -> None:
    origin = (context / source).resolve()
    if origin.is_file():
        target = target / origin.name if target.is_dir() or str(target).endswith("/") else target
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(origin, target)
        return
    for path in sorted(origin.rglob("*")):
        relative = PurePosixPath(path.relative_to(context.resolve()).as_posix())
        if path.is_dir() or _is_ignored(relative, ignored):
            continue
        destination = target / path.relative_to(origin)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"no /health within {timeout}s:\n{log.read_text()}")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGTERM) -> int:
    """Stop a server started in its own session; kill its group if it does not stop."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode
