# SPDX-License-Identifier: BSD-3-Clause

"""Oe Echo Environment."""

from .client import OeEchoEnv
from .models import OeEchoAction, OeEchoObservation

__all__ = [
    "OeEchoAction",
    "OeEchoObservation",
    "OeEchoEnv",
]
