"""How every command says it cannot go on: one plain line on stderr, then its exit code."""

from __future__ import annotations

from typing import NoReturn

import typer

__all__ = ["fail"]


def fail(problem: BaseException | str, code: int = 1) -> NoReturn:
    """Print ``error: PROBLEM`` on one line and exit with ``code``.

    Plain text, not rich markup: rich would wrap a long message at 80 columns
    when stderr is not a terminal (a CI log, a pipe), and would swallow any
    ``[word]`` in it (a URL's path, a list, an IPv6 address) as a style tag.
    """
    text = " ".join(str(problem).split()) or type(problem).__name__
    typer.echo(f"error: {text}", err=True)
    raise typer.Exit(code)
