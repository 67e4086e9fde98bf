"""Names renamed in this release, kept for one more: using one warns and gives the new object.

``docs/clients.md`` lists them, with why each was renamed.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["RENAMED", "old_name"]

RENAMED = {"OpenEnvClient": "MultiEnvClient", "SyncOpenEnvClient": "SyncMultiEnvClient"}


def old_name(module: str, name: str, namespace: Mapping[str, Any]) -> Any:
    """The object ``name`` was renamed to, with a ``DeprecationWarning`` (for ``__getattr__``).

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     value = old_name("m", "OpenEnvClient", {"MultiEnvClient": 42})
    >>> value, str(caught[0].message)
    (42, 'OpenEnvClient is now MultiEnvClient; the old name goes in the next release')
    """
    new = RENAMED.get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(
        f"{name} is now {new}; the old name goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return namespace[new]
