"""docs/cli.md is the commands' own help: regenerate it when a command changes."""

from __future__ import annotations

from pathlib import Path

from openenv.cli.reference import reference

DOC = Path(__file__).parents[1] / "docs" / "cli.md"


def test_the_cli_reference_matches_the_commands() -> None:
    assert DOC.read_text() == reference(), (
        "docs/cli.md is stale: run `python -m openenv.cli.reference > docs/cli.md`"
    )


def test_every_command_is_in_the_reference() -> None:
    text = reference()
    for name in ("bench", "demo", "init", "report", "run", "serve", "validate"):
        assert f"## `openenv {name}`" in text
