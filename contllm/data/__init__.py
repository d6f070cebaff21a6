"""The project's datasets: the built-in files next to this package, a user's ``--data`` files and the paper's shapes.

The item types, the one reader per dataset schema and the built-in loaders live in
:mod:`contllm.data.items`; rows of a file in :mod:`contllm.data.user`; the paper's row
shapes in :mod:`contllm.data.paper`. This module only re-exports.
"""

from __future__ import annotations

from contllm.data import items as _items
from contllm.data.items import *  # noqa: F403  (the names of items.__all__)

__all__ = list(_items.__all__)
