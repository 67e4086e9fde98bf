"""The CLI reference (``docs/cli.md``), generated from the typer app itself.

``python -m openenv.cli.reference > docs/cli.md`` rewrites it; a test checks
that the file matches, so the reference cannot drift from the commands.
"""

from __future__ import annotations

from typing import Any

import typer
import typer.main

__all__ = ["reference"]


def reference() -> str:
    """Every command's usage, description and options, as Markdown."""
    from openenv.cli import app

    # Typer's own command objects (it carries its click): only their public methods.
    group: Any = typer.main.get_command(app)
    # A fixed width: the same text whatever terminal (or none) runs this.
    root = typer.Context(group, info_name="openenv", terminal_width=100, max_content_width=100)
    lines = [
        "# `openenv` command reference",
        "",
        "Generated from the commands themselves by `python -m openenv.cli.reference`;",
        "`tests/test_cli_reference.py` fails when this file and the commands disagree.",
        "",
    ]
    for name in sorted(group.list_commands(root)):
        command = group.get_command(root, name)
        assert command is not None
        ctx = typer.Context(command, info_name=name, parent=root)
        lines += [f"## `openenv {name}`", "", "```", command.get_usage(ctx), "```", ""]
        if command.help:
            lines += [command.help.strip(), ""]
        params = command.get_params(ctx)
        options = [p for p in params if p.param_type_name == "option"]
        rows = [record for param in options if (record := param.get_help_record(ctx)) is not None]
        arguments = [p for p in params if p.param_type_name == "argument"]
        if arguments:
            lines += ["| argument | |", "|---|---|"]
            lines += [
                f"| `{str(a.name).upper()}` | {_cell(getattr(a, 'help', '') or '')} |"
                for a in arguments
            ]
            lines.append("")
        if rows:
            lines += ["| option | |", "|---|---|"]
            lines += [f"| `{flags}` | {_cell(text)} |" for flags, text in rows]
            lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


if __name__ == "__main__":
    print(reference(), end="")
