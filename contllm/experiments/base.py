"""What an experiment declares, so that one runner, the CLI, specs and reports can serve it.

An experiment is a subclass of :class:`Experiment` and an instance of it (``EXPERIMENT``),
named by one ``"module:ATTR"`` line in :mod:`contllm.registry`; CONTRIBUTING.md says where
each of its parts lives. The experiment says what its options and items are and how a
model turns its items into records; its records are :class:`~contllm.experiments.records.Record`
dataclasses and its result a :class:`~contllm.experiments.records.Records` subclass (JSON
by their type hints), its options and headline numbers are declared as tables
(:func:`option_table`, :meth:`Metric.table`), and its figures come from
:meth:`Experiment.summary_figure` and :meth:`Experiment.item_figure`. Everything else
(settings, the run directory, loading the model, the manifest, resume, shards over
processes, progress) belongs to :mod:`contllm.rundir.runner`, and every file written to
:mod:`contllm.rundir.outputs`.

Data in, data out: :meth:`Experiment.run` and :meth:`Experiment.result` write nothing;
:meth:`Experiment.figures` returns matplotlib figures and saves none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, Protocol, TypeVar, get_args

from contllm.errors import ExperimentError
from contllm.experiments.options import Kind, Option, build_config, config_dict
from contllm.experiments.records import Records, plain
from contllm.logs import note

if TYPE_CHECKING:
    from contllm.audits.study import Study

#: The kinds of an option, by name (:func:`option_table`).
KINDS: dict[str, Kind] = {kind: kind for kind in get_args(Kind)}


class Item(Protocol):
    """A unit of work: the runner records, resumes and shards experiments by ``id``."""

    @property
    def id(self) -> str: ...  # read-only, so that frozen dataclasses are items too


class Result(Protocol):
    """An experiment's result: plain data that writes itself as JSON."""

    def to_dict(self) -> dict[str, Any]: ...


Table = tuple[Sequence[str], Iterable[Mapping[str, Any]]]

R = TypeVar("R")
RecordT = TypeVar("RecordT")
ResultT = TypeVar("ResultT")


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

    @classmethod
    def table(cls, text: str) -> tuple[Metric, ...]:
        """Metrics from a table, one a line: the name, the direction (higher or lower) and the meaning (the rest of
        the line), apart by spaces; blank lines are passed over::

            metrics = Metric.table(
                '''
                accuracy_at_1  higher  share of items whose most probable digit at factor 1 is the true count
                mean_tv        lower   total variation of P(1) over the sweep, mean over items
                '''
            )
        """
        out = []
        for name, direction, meaning in _rows(text, "a name, a direction and a meaning"):
            if direction not in ("higher", "lower"):
                raise ExperimentError(f"metric {name}: direction must be 'higher' or 'lower', got {direction!r}")
            out.append(cls(name, "higher" if direction == "higher" else "lower", meaning))
        return tuple(out)


def option_table(text: str) -> tuple[Option, ...]:
    """Options from a table, one a line: the name, the kind (see :class:`~contllm.experiments.options.Option`),
    then the command-line spelling where it is not ``--name`` (a word that starts with "--", e.g.
    ``--chat/--no-chat``) and the help (the rest of the line), apart by spaces::

        options = option_table(
            '''
            first  int                     Items: the dataset's first N; 0 for all. [default: 8]
            chat   bool  --chat/--no-chat  Wrap prompts in the model's chat template.
            '''
        )
    """
    out = []
    for name, kind, rest in _rows(text, "a name, a kind and a help"):
        if kind not in KINDS:
            raise ExperimentError(f"option {name}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
        flag, _, help_ = rest.partition(" ") if rest.startswith("--") else (None, "", rest)
        out.append(Option(name, KINDS[kind], help_.strip(), flag=flag))
    return tuple(out)


def _rows(text: str, columns: str) -> list[list[str]]:
    """The non-blank lines of a declaration table, each split into its first two words and the rest (``columns``
    says what they are, for the error)."""
    rows = [[word.strip() for word in line.split(None, 2)] for line in text.splitlines() if line.strip()]
    for row in rows:
        if len(row) < 3:
            raise ExperimentError(f"a table's line needs {columns}, got {' '.join(row)!r}")
    return rows


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


class Experiment(Generic[RecordT, ResultT]):
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
        explorer_text: a paragraph for its ``explorer.html``, "what you are looking at":
            what an item is, what the slider moves and what the bars, curves and token
            strip show (empty: the page says :attr:`help`).
        explorer: True when its records hold a read-out over a swept knob, so that its runs
            and reports get an ``explorer.html`` (:mod:`contllm.rundir.explorer`): each record's
            ``to_dict()`` has ``item_id``, ``x`` [S] (the knob's values), ``labels`` [K] and
            the probabilities [S][K] that :meth:`explorer_probs` reads (``probs``).
        study: the :class:`~contllm.audits.study.Study` that ``contllm audit`` runs of it
            (None: the audit leaves it out); its ``experiment`` is :attr:`name`.
        result_type: the :class:`Records` subclass of its result; with it, :meth:`decode`,
            :meth:`result` and :meth:`load_result` need no code of their own.

    The type parameters are the types of its records and its result
    (``Experiment[Track, TrackResult]``).
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
    explorer_text: ClassVar[str] = ""
    explorer: ClassVar[bool] = False
    study: ClassVar[Study | None] = None

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

    def groups(self, lm: Any, config: Any, items: Sequence[Any], context: RunContext) -> list[list[Any]] | None:
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

    def run(self, lm: Any, config: Any, items: Sequence[Any], context: RunContext) -> Iterator[tuple[str, RecordT]]:
        """Compute ``items`` on ``lm``: yields (item id, record) for each item, in order (by default
        :meth:`run_item` on one item after the other)."""
        for item in items:
            yield item.id, self.run_item(lm, config, item, context)

    def run_item(self, lm: Any, config: Any, item: Any, context: RunContext) -> RecordT:
        """The record of one item, for the default :meth:`run` (an experiment overrides one of the two)."""
        raise NotImplementedError

    def encode(self, record: RecordT) -> dict[str, Any]:
        """A record as JSON-able data (items/<id>.json): its ``to_dict()``."""
        to_dict = getattr(record, "to_dict", None)
        data: dict[str, Any] = to_dict() if to_dict is not None else plain(record)
        return data

    def decode(self, data: dict[str, Any]) -> RecordT:
        """A record from :meth:`encode`'s data; raise ExperimentError (or ValueError) when malformed."""
        record: RecordT = self._result_type().record_type.from_dict(data)
        return record

    # ------------------------------------------------------------------ results
    def result(self, model: str, config: Any, records: Sequence[RecordT]) -> ResultT:
        """The whole result from every item's record (in item order)."""
        result: ResultT = self._result_type()(self.name, model, self.config_dict(config), list(records))
        return result

    def load_result(self, data: dict[str, Any]) -> ResultT:
        """A result from its ``to_dict()`` data (results.json)."""
        result: ResultT = self._result_type().from_dict(data)
        return result

    def _result_type(self) -> Any:
        if self.result_type is None:
            raise NotImplementedError(
                f"{type(self).__name__} declares no result_type; override decode, result and load_result"
            )
        return self.result_type

    def tables(self, result: ResultT) -> dict[str, Table]:
        """CSV tables to write beside results.json: file stem -> (columns, rows)."""
        return {}

    def summary(self, result: ResultT) -> dict[str, Any]:
        """Headline numbers (summary.json; ``contllm report`` compares the numeric ones)."""
        raise NotImplementedError

    def figures(self, result: ResultT, *, per_item: bool = True) -> Iterator[tuple[str, Any]]:
        """(name, matplotlib figure) pairs, none saved: "summary" (:meth:`summary_figure`), then with
        ``per_item`` "items/<name>" for each record of a :class:`Records` result (:meth:`item_figure`), the
        name made from the item id by :func:`contllm.rundir.files.data_name`."""
        from contllm.rundir.files import data_name

        fig = self.summary_figure(result)
        if fig is not None:
            yield "summary", fig
        if per_item and isinstance(result, Records):
            for record in result.records:
                fig = self.item_figure(result, record)
                if fig is not None:
                    yield f"items/{data_name(record.item_id)}", fig

    def summary_figure(self, result: ResultT) -> Any:
        """The figure across items (None: none)."""
        return None

    def item_figure(self, result: ResultT, record: RecordT) -> Any:
        """The figure of one item's record (None: none)."""
        return None

    def documents(self, result: ResultT, *, per_item: bool = True) -> Iterator[tuple[str, str]]:
        """(relative path, text) pairs of extra files to write beside the figures (e.g. "figures/items/<name>.html").

        A path made from an item id names it by :func:`contllm.rundir.files.data_name`; the writer
        refuses any path that would leave the run directory."""
        return iter(())

    def explorer_probs(self, record: dict[str, Any]) -> Any:
        """The read-out ``explorer.html`` shows of one record (its ``to_dict()``, where :attr:`explorer`): one row of
        label probabilities per value of the knob, or None for a record without one (default: its ``probs``)."""
        return record.get("probs")

    def report_columns(self, result: ResultT) -> dict[str, Any]:
        """Columns that describe a run in ``contllm report``'s table (e.g. a sweep's range), beside its summary."""
        return {}

    def comparison(self, results: Sequence[tuple[str, ResultT]]) -> Any:
        """One figure comparing labelled results of this experiment (``contllm report``), or None."""
        return None
