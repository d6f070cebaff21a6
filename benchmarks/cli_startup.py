"""How long the command line takes to answer: best of N wall-clock times of help pages, beside `import torch`.

Usage: python benchmarks/cli_startup.py [--repeat 5] [--target 1.0]

Each command runs in a fresh interpreter, as a user's shell would start it (the
``contllm`` script beside this Python, else ``python -m contllm``). The script itself
imports nothing heavy, so it can time the machine's cold paths; ``import torch`` is
timed the same way, for scale. The exit status is 1 when a help page misses the target.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from contllm.hardware import cpu_name


def contllm_command() -> list[str]:
    """The ``contllm`` console script of this interpreter's environment, else ``python -m contllm``."""
    script = Path(sys.executable).with_name("contllm")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    found = shutil.which("contllm")
    return [found] if found else [sys.executable, "-m", "contllm"]


def best_of(command: list[str], repeat: int) -> float:
    """The shortest wall-clock time of ``repeat`` runs of ``command`` (output discarded; a failure stops the benchmark)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} exited with {done.returncode}: {done.stderr.strip()}")
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per command; the best counts [default: 5]")
    parser.add_argument("--target", type=float, default=1.0, help="seconds a help page may take [default: 1.0]")
    args = parser.parse_args()

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {cpu_name()}, {os.cpu_count()} CPUs, load average {load:.1f}; Python {platform.python_version()}")
    print(f"best of {args.repeat}, wall clock, each in a fresh interpreter")
    contllm = contllm_command()
    pages = [["--help"], ["run", "counting", "--help"]]
    rows = [(" ".join(["contllm", *page]), best_of([*contllm, *page], args.repeat), True) for page in pages]
    rows.append(('python -c "import torch"', best_of([sys.executable, "-c", "import torch"], args.repeat), False))
    rows.append(('python -c "pass"', best_of([sys.executable, "-c", "pass"], args.repeat), False))
    width = max(len(name) for name, _, _ in rows)
    missed = False
    for name, seconds, judged in rows:
        verdict = (
            ("ok" if seconds < args.target else "over") + f" (target < {args.target:g} s)" if judged else "for scale"
        )
        missed |= judged and seconds >= args.target
        print(f"  {name:<{width}}  {seconds:6.2f} s  {verdict}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
