# SPDX-License-Identifier: BSD-3-Clause

"""Oe Echo environment server components."""

from .oe_echo_environment import OeEchoEnvironment

__all__ = ["OeEchoEnvironment"]
