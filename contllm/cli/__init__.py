"""The command line: ``contllm run``, ``generate``, ``models``, ``report``, ``figures``, ``audit``.

* :mod:`~contllm.cli.commands`: the Typer application and the table every command is
  registered from;
* :mod:`~contllm.cli.index`: the experiments' declarations read by ``--help`` without
  importing torch (``index.json``, derived);
* :mod:`~contllm.cli.errors`: the one error guard (one line, exit status 2);
* :mod:`~contllm.cli.generate`, :mod:`~contllm.cli.audit`: the ``generate`` and ``audit``
  commands.

``contllm.cli.app`` and ``contllm.cli.main`` stay importable from here, lazily.
"""

from __future__ import annotations

from contllm.exports import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {"contllm.cli.commands": ("app", "main")})
