"""Reading a GGUF during a conversion: once, and without numpy's per-slice overhead.

transformers converts an embedded model's GGUF through the ``gguf`` package. Before the
weights, most of the first conversion of Qwen2.5-Coder-0.5B on a 2-core CPU went into
reading its header:

- the header is parsed three times (the tokenizer's config, the model's config, the
  weights), and ``gguf.GGUFReader`` parses every metadata value - 151,936 tokens and as
  many merges - by slicing an ``np.memmap``, whose every slice runs a Python-level
  ``__array_finalize__`` (15-21 s per parse under load; 4 s from a plain ndarray view);
- ``gguf.get_tensor_name_map`` builds the same name table once per module of the model.

:func:`fast_reading` replaces those two names of the ``gguf`` package while a conversion
runs: one shared :func:`plain_reader` per file and a memoised name table. Their results
are the stock ones value for value (tests/unit/test_gguf_read.py; the converted weights
and tokenizer of Qwen2.5-Coder-0.5B came out identical). The tensors' values are still
unpacked by ``gguf.dequantize`` (a torch version was no faster on a 2-core CPU). On exit,
also on an exception, the stock names are back.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np


def _plain_reader_class(stock: Any) -> Any:
    """A subclass of ``stock`` (the installed ``gguf.GGUFReader``) whose metadata slices are plain ndarrays."""

    class PlainArrayReader(stock):  # type: ignore[misc, valid-type]
        """``gguf.GGUFReader`` reading its header through a plain ndarray view of its memory map."""

        def _get(
            self, offset: int, dtype: Any, count: int = 1, override_order: str | None = None
        ) -> np.ndarray[Any, Any]:
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self.__dict__["_plain"] = self.data.view(np.ndarray)
            dtype = np.dtype(dtype)
            count = int(count)
            arr = plain[offset : offset + dtype.itemsize * count].view(dtype)[:count]
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    return PlainArrayReader


def plain_reader(path: str | os.PathLike[str], stock: Any = None) -> Any:
    """A reader of ``path`` built by ``PlainArrayReader``, a subclass of ``stock`` (None: ``gguf.GGUFReader``).

    Where the installed gguf has no ``_get`` to override, the stock reader itself.
    """
    if stock is None:
        import gguf

        stock = gguf.GGUFReader
    cls = _plain_reader_class(stock) if callable(getattr(stock, "_get", None)) else stock
    return cls(os.fspath(path))


@contextmanager
def fast_reading() -> Iterator[None]:
    """While the context lasts, the ``gguf`` package reads as the module docstring says.

    ``gguf.GGUFReader(path)`` returns one shared :func:`plain_reader` per file and
    ``gguf.get_tensor_name_map`` is memoised. The readers are dropped on exit (their
    memory maps with them) and the stock names are back, also when the body raises.
    """
    import gguf as package

    gguf: Any = package  # its names are replaced below, which its type hints do not foresee
    stock_reader, stock_names = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def shared(path: str | os.PathLike[str], mode: str = "r") -> Any:
        key = (os.path.realpath(os.fspath(path)), mode)
        if key not in readers:
            readers[key] = plain_reader(path, stock_reader) if mode == "r" else stock_reader(path, mode)
        return readers[key]

    gguf.GGUFReader = shared
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(stock_names)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = stock_reader, stock_names
        readers.clear()
