"""Audits: the paper's results on one model within a time budget, as one card (``contllm audit MODEL``).

:func:`audit` plans (:mod:`contllm.audits.budget`), runs every experiment through the runner
(:mod:`contllm.audits.run`) and builds the :class:`Card` (:mod:`contllm.audits.card`) with
its page (:mod:`contllm.audits.page`); :func:`compare` sets several cards side by side.
This package only re-exports, lazily.
"""

from __future__ import annotations

from contllm.exports import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "contllm.audits.run": ("audit", "compare"),
        "contllm.audits.card": ("Card", "Finding", "Number", "bootstrap", "load_card"),
    },
)
