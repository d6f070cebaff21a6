"""What an experiment declares, so that one runner, the CLI, specs and reports can serve it.

An experiment is a subclass of :class:`Experiment` and an instance of it (``EXPERIMENT``),
named by one ``"module:ATTR"`` line in :mod:`contllm.registry`; CONTRIBUTING.md says where
each of its parts lives. The experiment says what its options and items are and how a
model turns its items into records; its result is a :class:`Records` subclass, its
headline numbers are declared as :class:`Metric` entries, and its figures come from
:meth:`Experiment.summary_figure` and :meth:`Experiment.item_figure`. Everything else
(settings, the run directory, loading the model, the manifest, resume, shards over
processes, progress) belongs to :mod:`contllm.runner`, and every file written to
:mod:`contllm.outputs`.

Data in, data out: :meth:`Experiment.run` and :meth:`Experiment.result` write nothing;
:meth:`Experiment.figures` returns matplotlib figures and saves none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

from contllm.errors import ExperimentError
from contllm.experiments.options import Option, build_config, config_dict
from contllm.logs import note


class Item(Protocol):
    """A unit of work: the runner records, resumes and shards experiments by ``id``."""

    @property
    def id(self) -> str: ...  # read-only, so that frozen dataclasses are items too


class Result(Protocol):
    """An experiment's result: plain data that writes itself as JSON."""

    def to_dict(self) -> dict[str, Any]: ...


Table = tuple[Sequence[str], Iterable[Mapping[str, Any]]]

R = TypeVar("R")


@dataclass(frozen=True)
class Metric:
    """A headline number an experiment reports: its summary key, which direction is better, what it means.

    direction: "higher" or "lower" (is better). meaning: one line, for reports and docs.
    """

    name: str
    direction: Literal["higher", "lower"]
    meaning: str

    def __post_init__(self) -> None:
        if self.direction not in ("higher", "lower"):
            raise ExperimentError(f"metric {self.name}: direction must be 'higher' or 'lower', got {self.direction!r}")

    def rank_key(self, value: float) -> float:
        """A sort key that puts the better value first (ascending)."""
        return -value if self.direction == "higher" else value

    def to_dict(self) -> dict[str, str]:
        return {"direction": f"{self.direction} is better", "meaning": self.meaning}


@dataclass
class Records(Generic[R]):
    """A result that is every item's record of one run, in item order, with the config that made it.

    A subclass names its record type (with ``to_dict``/``from_dict`` and an ``item_id``)
    in its class line, and optionally the key of the records in results.json (also a
    read-only name for ``records``) and a name for :meth:`record`::

        class TrackResult(Records[Track], record=Track, key="tracks", one="track"): ...

    It adds views of the records (rows, a common grid, ...) and may add JSON-able fields
    after ``records`` (kept in results.json beside them).
    """

    experiment: str
    model: str
    config: dict[str, Any]
    records: list[R]

    record_type: ClassVar[type] = dict
    key: ClassVar[str] = "records"

    def __init_subclass__(
        cls, record: type | None = None, key: str = "records", one: str | None = None, **rest: Any
    ) -> None:
        super().__init_subclass__(**rest)
        if record is not None:
            cls.record_type = record
        cls.key = key
        if key != "records":
            setattr(cls, key, property(lambda self: self.records, doc=f"The records (results.json's {key!r})."))
        if one is not None:
            setattr(cls, one, Records.record)

    def record(self, item_id: str) -> R:
        """The record of one item; ExperimentError when the result has none."""
        for record in self.records:
            if getattr(record, "item_id", None) == item_id:
                return record
        raise ExperimentError(f"no item {item_id!r} in this result")

    def to_dict(self) -> dict[str, Any]:
        """experiment, model, config, the fields a subclass adds and the records under ``key``, as JSON-able data."""
        added = {name: getattr(self, name) for name in self.extra_fields()}
        return {
            "experiment": self.experiment,
            "model": self.model,
            "config": self.config,
            **added,
            self.key: [r.to_dict() for r in self.records],
        }  # type: ignore[attr-defined]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """The result from :meth:`to_dict`'s data; ExperimentError naming what is missing or malformed."""
        try:
            extra = {name: data[name] for name in cls.extra_fields() if name in data}
            return cls(
                str(data["experiment"]),
                str(data["model"]),
                dict(data["config"]),
                [cls.record_type.from_dict(r) for r in data[cls.key]],
                **extra,
            )  # type: ignore[attr-defined]
        except (KeyError, TypeError) as exc:
            raise ExperimentError(f"malformed results file: missing {exc}") from None

    @classmethod
    def extra_fields(cls) -> tuple[str, ...]:
        """The names of the fields a subclass adds after ``records``."""
        return tuple(f.name for f in fields(cls)[4:])


@dataclass
class RunContext:
    """What the runner hands an experiment's :meth:`Experiment.run`.

    evaluate: signals -> next-token distributions [S, vocab] through the run's batched
        engine (always set by the runner, with the run's token budget).
    seed: the run's seed. say: one line of news for the user (default: INFO on the
        ``contllm`` logger, :mod:`contllm.logs`).
    model_name: how the run names the model (alias, hub id or directory).
    max_batch_tokens: the run's token budget per forward (None: automatic), for
        experiments that batch the model themselves (attribution's gradients).
    group_bytes: the budget of one group of items (:meth:`Experiment.groups`).
    """

    evaluate: Callable[[list[Any]], Any]
    seed: int = 0
    say: Callable[[str], None] = field(default=note)
    model_name: str = "model"
    max_batch_tokens: int | None = None
    group_bytes: int = 0


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
        metrics: the :class:`Metric` of each headline number :meth:`summary` reports.
        result_type: the :class:`Records` subclass of its result; with it, :meth:`decode`,
            :meth:`result` and :meth:`load_result` need no code of their own.
    """

    name: ClassVar[str] = ""
    help: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Config: ClassVar[type]
    options: ClassVar[tuple[Option, ...]] = ()
    engine: ClassVar[bool] = False
    shardable: ClassVar[bool] = False
    unit: ClassVar[str] = "item"
    result_type: ClassVar[type[Records[Any]] | None] = None
    metrics: ClassVar[tuple[Metric, ...]] = ()

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

    def groups(self, lm: Any, config: Any, items: Sequence[Item], context: RunContext) -> list[list[Item]] | None:
        """The items that :meth:`run` computes together, in order; None when every record is independent of the others.

        ``context.group_bytes`` is the run's budget for one group. An experiment that batches several items into one computation (sharing a prompt
        prefix across them) returns the batches here, fixed by ``items`` (every item the
        run selected, finished or not). The runner then always hands :meth:`run` a whole
        group, also when some of its records exist already (a resumed run) and drops those
        records: float summation order depends on the batch, so a record must not depend
        on which of its neighbours happened to be finished. None (the default): :meth:`run`
        gets exactly the unfinished items.
        """
        return None

    def run(self, lm: Any, config: Any, items: Sequence[Item], context: RunContext) -> Iterator[tuple[str, Any]]:
        """Compute ``items`` on ``lm``: yields (item id, record) for each item, in order."""
        raise NotImplementedError

    def encode(self, record: Any) -> dict[str, Any]:
        """A record as JSON-able data (items/<id>.json)."""
        return record.to_dict()

    def decode(self, data: dict[str, Any]) -> Any:
        """A record from :meth:`encode`'s data; raise ExperimentError (or ValueError) when malformed."""
        return self._result_type().record_type.from_dict(data)

    # ------------------------------------------------------------------ results
    def result(self, model: str, config: Any, records: Sequence[Any]) -> Result:
        """The whole result from every item's record (in item order)."""
        return self._result_type()(self.name, model, self.config_dict(config), list(records))

    def load_result(self, data: dict[str, Any]) -> Result:
        """A result from its ``to_dict()`` data (results.json)."""
        return self._result_type().from_dict(data)

    def _result_type(self) -> type[Records[Any]]:
        if self.result_type is None:
            raise NotImplementedError(
                f"{type(self).__name__} declares no result_type; override decode, result and load_result"
            )
        return self.result_type

    def tables(self, result: Any) -> dict[str, Table]:
        """CSV tables to write beside results.json: file stem -> (columns, rows)."""
        return {}

    def summary(self, result: Any) -> dict[str, Any]:
        """Headline numbers (summary.json; ``contllm report`` compares the numeric ones)."""
        raise NotImplementedError

    def figures(self, result: Any, *, per_item: bool = True) -> Iterator[tuple[str, Any]]:
        """(name, matplotlib figure) pairs, none saved: "summary" (:meth:`summary_figure`), then with
        ``per_item`` "items/<id>" for each record of a :class:`Records` result (:meth:`item_figure`)."""
        fig = self.summary_figure(result)
        if fig is not None:
            yield "summary", fig
        if per_item and isinstance(result, Records):
            for record in result.records:
                fig = self.item_figure(result, record)
                if fig is not None:
                    yield f"items/{record.item_id}", fig  # type: ignore[attr-defined]

    def summary_figure(self, result: Any) -> Any:
        """The figure across items (None: none)."""
        return None

    def item_figure(self, result: Any, record: Any) -> Any:
        """The figure of one item's record (None: none)."""
        return None

    def documents(self, result: Any, *, per_item: bool = True) -> Iterator[tuple[str, str]]:
        """(relative path, text) pairs of extra files to write beside the figures (e.g. "figures/items/<id>.html")."""
        return iter(())

    def report_columns(self, result: Any) -> dict[str, Any]:
        """Columns that describe a run in ``contllm report``'s table (e.g. a sweep's range), beside its summary."""
        return {}

    def comparison(self, results: Sequence[tuple[str, Any]]) -> Any:
        """One figure comparing labelled results of this experiment (``contllm report``), or None."""
        return None
