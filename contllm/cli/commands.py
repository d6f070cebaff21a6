"""The command line's application: every top-level command is registered from :data:`COMMANDS`.

``contllm run`` and ``contllm generate`` are click commands handed every argument
(:mod:`contllm.cli.run`, :mod:`contllm.cli.generate`); ``models``, ``report``, ``figures``
(:mod:`contllm.cli.reading`) and ``audit`` (:mod:`contllm.cli.audit`) are Typer command
functions. Errors a user can cause print one line and exit with status 2
(:func:`contllm.cli.errors.guarded`).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click
import typer

from contllm import __version__, logs
from contllm.cli.errors import OneLineTyperCommand, OneLineTyperGroup, guarded
from contllm.cli.errors import fail as _fail
from contllm.errors import ContllmError

# Help pages answer at once: this module and the ones it imports at the top load neither
# torch, transformers nor matplotlib (tests/unit/test_cli_startup.py holds it to that).
# The commands read the experiments' declarations from contllm.cli.index; a run imports them
# once every value the command line alone decides has been checked (usage errors stay fast too).

app = typer.Typer(
    cls=OneLineTyperGroup,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help, like `contllm run NAME --help`; rich's formatter costs a third of a second
    # The top level declares its own --help (see _toolkit): Typer's builds a pydantic
    # adapter (half a second of imports) for its help flag whenever the flag is absent.
    context_settings={"help_option_names": []},
    help="Probe the implicit continuity of pretrained language models.",
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"contllm {__version__}")
        raise typer.Exit()


def _print_help(ctx: typer.Context, value: bool) -> None:
    if value:
        typer.echo(ctx.get_help())
        raise typer.Exit()


#: Sub-commands take --help as usual (the top level turns the default off for its own).
HELP = {"help_option_names": ["--help"]}


@app.callback()
def _toolkit(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print contllm's version and exit."
    ),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="Warnings and errors only on stderr: no news, no progress bars."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Details too (DEBUG on the contllm logger)."),
    _help: bool = typer.Option(
        False, "--help", callback=_print_help, is_eager=True, expose_value=False, help="Show this message and exit."
    ),
) -> None:
    """Probe the implicit continuity of pretrained language models."""
    if quiet and verbose:
        _fail("--quiet and --verbose exclude each other; give one", exit_with=typer.Exit)
    logs.configure(-1 if quiet else 1 if verbose else 0)


#: Every top-level command, in the order ``contllm --help`` lists them: "name":
#: "module:attribute". The attribute is a Typer command function, or a click command
#: (``run``, ``generate``) that is handed every argument after its name. Adding a command
#: is its module and one line here; the module imports nothing heavy at its top (its
#: function imports what its work needs), so that --help stays fast.
COMMANDS: dict[str, str] = {
    "run": "contllm.cli.run:RUN_GROUP",
    "generate": "contllm.cli.generate:COMMAND",
    "models": "contllm.cli.reading:models",
    "report": "contllm.cli.reading:report",
    "figures": "contllm.cli.reading:figures",
    "audit": "contllm.cli.audit:audit",
}


def _handed_every_argument(name: str, command: click.Command) -> Any:
    """A Typer command that hands ``command`` every argument after ``contllm NAME``, under the one guard."""

    def pass_through(ctx: typer.Context) -> None:
        args = list(ctx.args)
        guarded(lambda: command.main(args=args, prog_name=f"contllm {name}", standalone_mode=True), typer.Exit)

    pass_through.__doc__ = f"{command.short_help}; `contllm {name} --help` lists the options."
    return pass_through


def _register(commands: dict[str, str]) -> None:
    for name, target in commands.items():
        module, _, attribute = target.partition(":")
        found = getattr(importlib.import_module(module), attribute)
        if isinstance(found, click.Command):
            app.command(
                name,
                context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
                add_help_option=False,
                short_help=found.short_help,
            )(_handed_every_argument(name, found))
        else:
            app.command(name, context_settings=HELP, cls=OneLineTyperCommand)(found)


_register(COMMANDS)


def main() -> None:
    """Entry point of the ``contllm`` command."""
    try:
        app()
    except ContllmError as exc:  # raised outside a command body (should not happen)
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
