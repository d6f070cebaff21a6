"""One-line errors of the command line: what ``contllm`` and ``contllm generate`` share.

Light on purpose (click only), so help pages stay fast; :mod:`contllm.cli` and
:mod:`contllm.generate_cli` both import it, and it imports neither.
"""

from __future__ import annotations

from typing import Any, NoReturn

import click

# `run` is a click group and the other commands are Typer's, whose main loop knows its own
# exit exception: each command exits through the one its loop handles.
Exit = type[Exception]
#: Longest error line the command line prints.
MAX_ERROR = 400


def fail(message: str, code: int = 2, exit_with: Exit = click.exceptions.Exit) -> NoReturn:
    """Print ``error: message`` (cut to MAX_ERROR characters) to stderr and exit with ``code`` through ``exit_with``."""
    if len(message) > MAX_ERROR:  # a value typed at great length is quoted, not echoed whole
        message = f"{message[: MAX_ERROR - 40]}... ({len(message)} characters)"
    click.echo(f"error: {message}", err=True)
    raise exit_with(code)


class OneLineCommand(click.Command):
    """A click command whose usage errors (unknown option, bad value, missing argument) are one line.

    :meth:`usage_error` says what happens to one: here it is printed and the command exits
    with status 2; a subclass may word it otherwise or raise it as a toolkit error.
    """

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:
            self.usage_error(exc)

    def usage_error(self, exc: click.UsageError) -> NoReturn:
        fail(exc.format_message().replace("\n", " "))
