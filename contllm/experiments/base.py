"""What an experiment declares, so that one runner, the CLI, specs and reports can serve it.

An experiment is one module that defines a subclass of :class:`Experiment` and an
instance of it named ``EXPERIMENT``; one line in :mod:`contllm.registry` names the
module. The experiment says what its options and items are and how a model turns its
items into records, a record list into a result, and a result into a summary and
figures. Everything else (the run directory, loading the model, the manifest, resume,
shards over processes, progress, writing files) belongs to :mod:`contllm.runner`.

Data in, data out: :meth:`Experiment.run` and :meth:`Experiment.result` write nothing;
:meth:`Experiment.figures` returns matplotlib figures and saves none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from contllm.errors import ExperimentError
from contllm.experiments.options import Option, build_config, config_dict


class Item(Protocol):
    """A unit of work: the runner records, resumes and shards experiments by ``id``."""

    id: str


class Result(Protocol):
    """An experiment's result: plain data that writes itself as JSON."""

    def to_dict(self) -> dict[str, Any]: ...


Table = tuple[Sequence[str], Iterable[Mapping[str, Any]]]


@dataclass
class Context:
    """What the runner hands an experiment's :meth:`Experiment.run`.

    evaluate: signals -> next-token distributions [S, vocab] through the batched engine
        (set for experiments with ``engine = True``; None otherwise).
    seed: the run's seed. say: one line of news for the user (stderr; nothing when quiet).
    model_name: how the run names the model (alias, hub id or directory).
    """

    evaluate: Callable[[list[Any]], Any] | None = None
    seed: int = 0
    say: Callable[[str], None] = field(default=lambda message: None)
    model_name: str = "model"


class Experiment:
    """The declaration of one experiment (subclass it; see the module docstring).

    Class attributes:
        name: what ``contllm run NAME`` and a spec's ``name`` call it.
        help: one line for ``contllm run --help``; description: a paragraph for
            ``contllm run NAME --help`` (what it does, what it reads out, item ids).
        Config: a dataclass whose fields have defaults and whose ``__post_init__``
            raises ExperimentError for values that make no sense.
        options: the :class:`Option` entries that set Config fields.
        engine: True when the experiment evaluates signals through the batched engine
            (it then takes --max-batch-tokens and --device-map).
        shardable: True when items are independent, so that the processes of an
            ``accelerate launch`` can share them.
        unit: what one record is called in messages ("item", "prompt", "point").
        x_label: the knob of its sweeps, for tables and axes.
    """

    name: ClassVar[str] = ""
    help: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Config: ClassVar[type]
    options: ClassVar[tuple[Option, ...]] = ()
    engine: ClassVar[bool] = False
    shardable: ClassVar[bool] = False
    unit: ClassVar[str] = "item"

    # ------------------------------------------------------------------ configuration
    def config(self, given: Mapping[str, Any] | None = None) -> Any:
        """The config from option values (None: every default); ExperimentError for bad values."""
        return build_config(self.Config, self.options, dict(given or {}), what=self.name)

    def config_dict(self, config: Any) -> dict[str, Any]:
        """The config as JSON-able data (what config.json records and --resume compares)."""
        return config_dict(config)

    def check_config(self, config: Any) -> Any:
        """``config`` itself when it is this experiment's Config, else ExperimentError."""
        if not isinstance(config, self.Config):
            raise ExperimentError(f"{self.name} takes a {self.Config.__name__}, got {type(config).__name__}")
        return config

    # ------------------------------------------------------------------ work
    def items(self, config: Any) -> Sequence[Item]:
        """Every unit of work for ``config``, in order (``--items`` selects among them)."""
        raise NotImplementedError

    def check(self, lm: Any, config: Any) -> None:
        """Checks that need the loaded model (layer numbers, ...); raise ExperimentError. Nothing is written yet."""

    def groups(self, lm: Any, config: Any, items: Sequence[Item]) -> list[list[Item]] | None:
        """The items that :meth:`run` computes together, in order; None when every record is independent of the others.

        An experiment that batches several items into one computation (sharing a prompt
        prefix across them) returns the batches here, fixed by ``items`` (every item the
        run selected, finished or not). The runner then always hands :meth:`run` a whole
        group, also when some of its records exist already (a resumed run) and drops those
        records: float summation order depends on the batch, so a record must not depend
        on which of its neighbours happened to be finished. None (the default): :meth:`run`
        gets exactly the unfinished items.
        """
        return None

    def run(self, lm: Any, config: Any, items: Sequence[Item], context: Context) -> Iterator[tuple[str, Any]]:
        """Compute ``items`` on ``lm``: yields (item id, record) for each item, in order."""
        raise NotImplementedError

    def encode(self, record: Any) -> dict[str, Any]:
        """A record as JSON-able data (items/<id>.json)."""
        return record.to_dict()

    def decode(self, data: dict[str, Any]) -> Any:
        """A record from :meth:`encode`'s data; raise ExperimentError (or ValueError) when malformed."""
        raise NotImplementedError

    # ------------------------------------------------------------------ results
    def result(self, model: str, config: Any, records: Sequence[Any]) -> Result:
        """The whole result from every item's record (in item order)."""
        raise NotImplementedError

    def load_result(self, data: dict[str, Any]) -> Result:
        """A result from its ``to_dict()`` data (results.json)."""
        raise NotImplementedError

    def tables(self, result: Any) -> dict[str, Table]:
        """CSV tables to write beside results.json: file stem -> (columns, rows)."""
        return {}

    def summary(self, result: Any) -> dict[str, Any]:
        """Headline numbers (summary.json; ``contllm report`` compares the numeric ones)."""
        raise NotImplementedError

    def figures(self, result: Any, *, per_item: bool = True) -> Iterator[tuple[str, Any]]:
        """(name, matplotlib figure) pairs: "summary" first, then e.g. "items/<id>" (none saved)."""
        return iter(())

    def documents(self, result: Any, *, per_item: bool = True) -> Iterator[tuple[str, str]]:
        """(relative path, text) pairs of extra files to write beside the figures (e.g. "figures/items/<id>.html")."""
        return iter(())

    def report_columns(self, result: Any) -> dict[str, Any]:
        """Columns that describe a run in ``contllm report``'s table (e.g. a sweep's range), beside its summary."""
        return {}

    def comparison(self, results: Sequence[tuple[str, Any]]) -> Any:
        """One figure comparing labelled results of this experiment (``contllm report``), or None."""
        return None
