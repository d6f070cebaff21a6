"""The toolkit's messages go through one standard logger, ``contllm``.

News of a run (the model loaded and in how long, a note on half precision, how items
are shared over processes, an experiment's progress lines) goes to the ``contllm`` logger
at INFO. The library adds no handler of its own: in Python nothing below WARNING shows
until the application configures logging, and a user silences or redirects the
toolkit's messages as any logger's::

    import logging
    logging.getLogger("contllm").setLevel(logging.WARNING)   # silence the news
    logging.getLogger("contllm").addHandler(logging.FileHandler("contllm.log"))

The ``contllm`` command shows INFO on stderr, WARNING and above with ``-q``, DEBUG with
``-v`` (:func:`configure`). A command's result (the paths it wrote, a listing) goes to
stdout and is not a log message.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

#: The logger every message of the toolkit goes through.
LOGGER = logging.getLogger("contllm")
LOGGER.addHandler(logging.NullHandler())


def note(message: str) -> None:
    """One line of news for the user: INFO on the ``contllm`` logger."""
    LOGGER.info(message)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a message comes (test runners swap it)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure(verbosity: int = 0) -> logging.Handler:
    """Show the toolkit's messages on stderr, as the command line does; returns the handler it installed.

    verbosity: -1 (quiet: warnings and errors only), 0 (news: INFO) or 1 (details:
    DEBUG). A handler installed by an earlier call is replaced, not doubled.
    """
    level = logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO
    for old in [h for h in LOGGER.handlers if isinstance(h, _Stderr)]:
        LOGGER.removeHandler(old)
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(message)s" if verbosity <= 0 else "%(levelname)s %(name)s: %(message)s"))
    LOGGER.addHandler(handler)
    LOGGER.setLevel(level)
    return handler
