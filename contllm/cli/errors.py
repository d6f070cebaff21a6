"""One-line errors of the command line: what ``contllm`` and ``contllm generate`` share.

Light on purpose (click and Typer only), so help pages stay fast; :mod:`contllm.cli.commands` and
:mod:`contllm.cli.generate` both import it, and it imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import click
import typer
import typer.core

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


def guarded(work: Callable[[], Any], exit_with: Exit = click.exceptions.Exit, resume: str | None = None) -> Any:
    """``work()``, with the toolkit's errors and OSErrors as one line and exit status 2, Ctrl-C as status 130.

    The one guard of every command. resume: the command that continues the interrupted work
    (said on Ctrl-C; default: "--resume").
    """
    from contllm.errors import ContllmError

    try:
        return work()
    except ContllmError as exc:
        fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, exit_with=exit_with)
    except OSError as exc:  # permission denied, a path under a file, a full disk: the file and the reason
        where = f"{exc.filename}: " if exc.filename else ""
        fail(f"{where}{exc.strerror or exc}", exit_with=exit_with)
    except KeyboardInterrupt:
        click.echo(
            f"interrupted; finished items are saved, continue with{': ' + resume if resume else ' --resume'}", err=True
        )
        raise exit_with(130) from None


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


#: The click that Typer's own commands run on (recent Typers carry a copy of their own).
_TYPER_CLICK: Any = getattr(typer.core, "_click", None) or getattr(typer.core, "click")  # noqa: B009
#: A bare group or command that shows its help: not an error to shorten.
_HELP_ASKED = tuple(
    kind
    for kind in (getattr(m.exceptions, "NoArgsIsHelpError", None) for m in (click, _TYPER_CLICK))
    if kind is not None
)


def _usage_error(exc: Exception, command: str) -> NoReturn:
    """A usage error of Typer's (missing argument, unknown option or command) as one line, exit status 2."""
    message = exc.format_message().replace("\n", " ").rstrip(". ")  # type: ignore[attr-defined]
    fail(f"{message}; see '{command} --help'", exit_with=typer.Exit)


class _OneLineUsage:
    """What a Typer command or group adds: its usage errors (not a bare call that shows help) are one line."""

    name: str | None

    def where(self) -> str:
        return f"contllm {self.name}"

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)  # type: ignore[misc]
        except _TYPER_CLICK.exceptions.UsageError as exc:
            if isinstance(exc, _HELP_ASKED):
                raise
            _usage_error(exc, self.where())


class OneLineTyperCommand(_OneLineUsage, typer.core.TyperCommand):
    """``contllm report``, ``figures``, ``models``: a usage error is one line, as everywhere else."""


class OneLineTyperGroup(_OneLineUsage, typer.core.TyperGroup):
    """``contllm`` itself: an unknown option or command is one line."""

    def where(self) -> str:
        return "contllm"

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except _TYPER_CLICK.exceptions.UsageError as exc:
            _usage_error(exc, self.where())
