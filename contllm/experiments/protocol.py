"""The two protocols of the experiments: the toolkit's own ("contllm") and the paper's ("paper").

An experiment that can follow the paper takes ``--protocol``; under "paper" its prompts,
token selection, read-out sets and sampling density are those of the paper's scripts
(docs/paper.md lists every setting and where contllm differs). A config field whose
default depends on the protocol is declared None and filled in once, in the config's
``__post_init__``, by :func:`resolve_defaults` from a table {field: (the toolkit's
default, the paper's)}; a value given explicitly always wins.

The paper selects the tokens to scale by searching the decoded tokens
(:func:`paper_search`), and interpolates whole prompts position by position, so its
code cannot run some items at all. Every record keeps under :data:`PAPER_RUNS` whether
the paper's own code could have run its item; :func:`with_paper_coverage` adds the
paper's coverage and the summary over the items it covers to a run's summary.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from contllm.errors import ExperimentError
from contllm.experiments.options import Option

#: How an experiment builds its prompts, selects its tokens, reads out and samples its knob:
#: "contllm" (the toolkit's own defaults) or "paper" (as the paper's scripts do; docs/paper.md).
PROTOCOLS = ("contllm", "paper")

PROTOCOL = Option(
    "protocol",
    "str",
    "contllm (the toolkit's prompts and exact read-outs) or paper (the paper's prompts, token selection, "
    "read-out sets and sampling density; see docs/paper.md). [default: contllm]",
    choices=PROTOCOLS,
)

#: How a duration experiment finds the tokens to scale: "contllm" (the tokens that overlap
#: the characters of the filled-in text) or "paper" (the paper's search, :func:`paper_search`).
SELECTIONS = ("contllm", "paper")

SELECTION = Option(
    "selection",
    "str",
    "contllm (the tokens overlapping the characters of the filled-in text) or paper (the paper's search of the "
    "decoded tokens, from the first token containing the word to the last; see docs/paper.md). "
    "[default: paper under --protocol paper, else contllm]",
    choices=SELECTIONS,
)

#: The key of a record's meta that says whether the paper's own code could have run its item.
PAPER_RUNS = "paper_runs"


def check_protocol(protocol: str) -> None:
    """ExperimentError unless ``protocol`` is one of :data:`PROTOCOLS`."""
    if protocol not in PROTOCOLS:
        raise ExperimentError(f"protocol must be {' or '.join(map(repr, PROTOCOLS))}, got {protocol!r}")


def resolved_samples(samples: int | None, protocol: str, default: int, paper: int) -> int:
    """``samples`` when given, else the protocol's own number of values per item."""
    check_protocol(protocol)
    if samples is not None:
        return samples
    return paper if protocol == "paper" else default


def resolve_defaults(config: Any, table: Mapping[str, tuple[Any, Any]]) -> None:
    """Fill every field of ``config`` named in ``table`` that is None with its protocol's default.

    table: field -> (the toolkit's default, the paper's); ``config.protocol`` picks one.
    """
    check_protocol(config.protocol)
    for name, (ours, papers) in table.items():
        if getattr(config, name) is None:
            setattr(config, name, papers if config.protocol == "paper" else ours)


def check_selection(selection: str) -> None:
    """ExperimentError unless ``selection`` is one of :data:`SELECTIONS`."""
    if selection not in SELECTIONS:
        raise ExperimentError(f"selection must be {' or '.join(map(repr, SELECTIONS))}, got {selection!r}")


@dataclass(frozen=True)
class PaperSearch:
    """What the paper's token search looks for (its ``shrink_start``, ``shrink_end``, ``select_start``, ``select_end``).

    first: the scaled tokens start at the first token containing it; last: they end at the
    last token containing it. after: the search starts at the first token containing it
    (None: at the first token); before: it stops after the first token containing it
    (None: at the last token).
    """

    first: str
    last: str
    after: str | None = None
    before: str | None = None


def _first(tokens: Sequence[str], piece: str, indices: range) -> int | None:
    return next((i for i in indices if piece in tokens[i]), None)


def paper_search(tokens: Sequence[str], search: PaperSearch) -> list[int] | None:
    """The indices of the tokens the paper scales, or None where its code raises (and so never ran the item).

    tokens: each token of the prompt decoded on its own, special tokens as "" (the paper
    decodes with ``skip_special_tokens``). Containment is plain substring search, so a word
    glued to a quote (``"mall`` -> ``"m``, ``all``) is not found there.
    """
    start = 0
    if search.after is not None:
        found = _first(tokens, search.after, range(len(tokens)))
        if found is None:
            return None
        start = found
    stop = len(tokens)
    if search.before is not None:
        found = _first(tokens, search.before, range(len(tokens)))
        if found is None or found < start:
            return None
        stop = found + 1
    first = _first(tokens, search.first, range(start, stop))
    last = _first(tokens, search.last, range(stop - 1, start - 1, -1))
    if first is None or last is None or last < first:
        return None
    return list(range(first, last + 1))


def decoded_tokens(tokenizer: Any, token_ids: Sequence[int]) -> list[str]:
    """Each token of a prompt decoded on its own, as the paper's search reads it (special tokens as "")."""
    return [tokenizer.decode([int(i)], skip_special_tokens=True) for i in token_ids]


def with_paper_coverage(result: Any, summarize: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """``summarize(result)`` plus, when every record says whether the paper could run it (:data:`PAPER_RUNS`):

    paper_coverage: the share of items the paper's own code could have run; paper_items:
    ``summarize`` over those items alone (absent when there are none). ``result`` is a
    :class:`~contllm.experiments.records.Records` dataclass whose records have a ``meta``.
    """
    out = summarize(result)
    flags = [getattr(r, "meta", {}).get(PAPER_RUNS) for r in result.records]
    if not flags or any(not isinstance(f, bool) for f in flags):
        return out  # records of a run made before coverage was recorded, or of items the paper has no script for
    out["paper_coverage"] = sum(1 for f in flags if f) / len(flags)
    covered = [r for r, ok in zip(result.records, flags) if ok]
    if covered:
        inner = summarize(replace(result, records=covered))
        out["paper_items"] = {k: v for k, v in inner.items() if k not in ("experiment", "model")}
    return out
