"""Load time of the embedded models: first load (GGUF conversion) versus cached load.

    python benchmarks/load_time.py [--models smollm2-135m gemma3-270m] [--repeat 3]

For each alias, with an empty temporary cache: the first ``load_model`` (dequantize the
GGUF, write the cache entry, read it back), then cached loads in the same process
(imports already paid) and in a fresh process (``import contllm.models`` included), and
what verifying the entry costs within a cached load: the check every load runs (full
sha256 of small files, sampled fingerprint of the weights) and the deep check (full
sha256 of every file, also what a load pays once after a file's stat changed).
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
    from contllm.models import RECORD_NAME, cache_entry_problems, load_model

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
        verify = []
        for _ in range(max(repeat, 5)):
            t0 = time.perf_counter()
            cache_entry_problems(cache_dir / alias)
            verify.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        cache_entry_problems(cache_dir / alias, deep=True)
        verify_deep = time.perf_counter() - t0
    return {
        "first_s": first,
        "gguf_tokenizer_s": record["conversion"]["tokenizer_s"],
        "gguf_model_s": record["conversion"]["model_s"],
        "cached_s": statistics.median(cached),
        "fresh_import_s": fresh["import_s"],
        "fresh_load_s": fresh["load_s"],
        "verify_s": statistics.median(verify),
        "verify_deep_s": verify_deep,
    }


def main(argv: list[str] | None = None) -> None:
    from contllm.models import REGISTRY

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(REGISTRY), choices=list(REGISTRY))
    parser.add_argument("--repeat", type=int, default=3, help="cached loads per model (median reported)")
    args = parser.parse_args(argv)

    from contllm.hardware import cpu_capability, describe

    columns = [
        "first_s",
        "gguf_tokenizer_s",
        "gguf_model_s",
        "cached_s",
        "fresh_import_s",
        "fresh_load_s",
        "verify_s",
        "verify_deep_s",
    ]
    print(describe(cpu_capability()))
    print(f"{'model':<14}" + "".join(f"{c:>18}" for c in columns))
    for alias in args.models:
        result = measure(alias, args.repeat)
        print(f"{alias:<14}" + "".join(f"{result[c]:>18.3f}" for c in columns), flush=True)
    print(
        "first_s: empty cache (GGUF dequantized by transformers, entry written, read back); "
        "gguf_*: parts of that conversion; cached_s: cached load in the same process; "
        "fresh_*: a new interpreter importing contllm.models, then loading from the cache; "
        "verify_s: the content check inside every cached load (included in cached_s); verify_deep_s: "
        "full sha256 of every file (cache_entry_problems(deep=True), and what one load pays after a "
        "file's size, mtime, ctime or inode changed)."
    )


if __name__ == "__main__":
    main()
