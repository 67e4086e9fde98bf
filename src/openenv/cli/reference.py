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
        params = command.get_params(ctx)
        arguments = [p for p in params if p.param_type_name == "argument"]
        options = [p for p in params if p.param_type_name == "option"]
        # Built from the parameters, not typer's own rendering, which changes
        # between typer releases.
        usage = f"openenv {name} [OPTIONS]" + "".join(f" {_argument(a)}" for a in arguments)
        lines += [f"## `openenv {name}`", "", "```", usage, "```", ""]
        if command.help:
            lines += [command.help.strip(), ""]
        if options:
            lines += ["| option | |", "|---|---|"]
            lines += [f"| `{_flags(o)}` | {_cell(_option_help(o))} |" for o in options]
            lines.append("")
    return "\n".join(lines)


def _argument(param: Any) -> str:
    name = str(param.name).upper()
    return name if param.required else f"[{name}]"


def _flags(param: Any) -> str:
    return ", ".join([*param.opts, *param.secondary_opts])


def _option_help(param: Any) -> str:
    text = str(param.help or "")
    default = param.default
    if default not in (None, False, ()) and not callable(default) and not param.is_flag:
        text += f" (default: {default})"
    return text


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


if __name__ == "__main__":
    print(reference(), end="")
