"""Load time of the embedded models: first load (GGUF conversion) versus cached load.

    python benchmarks/load_time.py [--models smollm2-135m gemma3-270m] [--repeat 3]

For each alias, with an empty temporary cache: the first ``load_model`` (dequantize the
GGUF, write the cache entry, read it back), then cached loads in the same process
(imports already paid) and in a fresh process (``import contllm.models`` included).
Prints the CPU's capabilities (``contllm.hardware.cpu_capability``), then a table;
asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

_FRESH_PROCESS = """
import json, sys, time
t0 = time.perf_counter()
from contllm.models import load_model
t1 = time.perf_counter()
load_model(sys.argv[1], cache_dir=sys.argv[2])
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1}))
"""


def _fresh_process_load(alias: str, cache_dir: Path) -> dict[str, float]:
    """Import and cached-load times of one load in a new interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS, alias, str(cache_dir)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(alias: str, repeat: int) -> dict[str, float]:
    """Seconds for the first load, cached loads in process (median) and in a fresh process."""
    from contllm.models import RECORD_NAME, load_model

    with tempfile.TemporaryDirectory(prefix="contllm-bench-") as tmp:
        cache_dir = Path(tmp)
        t0 = time.perf_counter()
        load_model(alias, cache_dir=cache_dir)
        first = time.perf_counter() - t0
        record = json.loads((cache_dir / alias / RECORD_NAME).read_text())
        cached = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            load_model(alias, cache_dir=cache_dir)
            cached.append(time.perf_counter() - t0)
        fresh = _fresh_process_load(alias, cache_dir)
    return {
        "first_s": first,
        "gguf_tokenizer_s": record["conversion"]["tokenizer_s"],
        "gguf_model_s": record["conversion"]["model_s"],
        "cached_s": statistics.median(cached),
        "fresh_import_s": fresh["import_s"],
        "fresh_load_s": fresh["load_s"],
    }


def main(argv: list[str] | None = None) -> None:
    from contllm.models import REGISTRY

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(REGISTRY), choices=list(REGISTRY))
    parser.add_argument("--repeat", type=int, default=3, help="cached loads per model (median reported)")
    args = parser.parse_args(argv)

    from contllm.hardware import cpu_capability, describe

    columns = ["first_s", "gguf_tokenizer_s", "gguf_model_s", "cached_s", "fresh_import_s", "fresh_load_s"]
    print(describe(cpu_capability()))
    print(f"{'model':<14}" + "".join(f"{c:>18}" for c in columns))
    for alias in args.models:
        result = measure(alias, args.repeat)
        print(f"{alias:<14}" + "".join(f"{result[c]:>18.2f}" for c in columns), flush=True)
    print(
        "first_s: empty cache (GGUF dequantized by transformers, entry written, read back); "
        "gguf_*: parts of that conversion; cached_s: cached load in the same process; "
        "fresh_*: a new interpreter importing contllm.models, then loading from the cache."
    )


if __name__ == "__main__":
    main()
