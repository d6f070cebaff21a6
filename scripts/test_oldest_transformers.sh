#!/usr/bin/env bash
# The unit tier against the oldest transformers the project claims: the lower bound of
# "transformers>=X" in pyproject.toml. The code follows changes inside transformers 5.x
# (the attention interface, the cache keyword, the rotary forward); a claim it no longer
# meets fails here instead of on a user's machine.
#
# .venv-oldest is a venv that sees .venv's packages (the same torch, the same everything)
# through a .pth file and holds only that transformers, with whatever dependencies of it
# .venv's versions do not satisfy, in its own site-packages, which come first on sys.path.
# pip never touches .venv from there (it leaves packages outside its environment alone).
# Run after scripts/setup.sh; prints how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
oldest=$(sed -n 's/^ *"transformers>=\([0-9][0-9.]*\).*/\1/p' pyproject.toml)
if [ -z "$oldest" ]; then
    echo "no \"transformers>=X\" requirement in pyproject.toml" >&2
    exit 1
fi
if [ ! -x .venv-oldest/bin/python ]; then
    .venv/bin/python -m venv .venv-oldest
fi
main_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
oldest_site=$(.venv-oldest/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$main_site" > "$oldest_site/contllm-main-venv.pth"
.venv-oldest/bin/python -m pip install -q --disable-pip-version-check "transformers==$oldest"
# "5.3" and "5.3.0" are one version: compare them as versions, not as text.
if ! .venv-oldest/bin/python -c 'import sys, transformers; from packaging.version import Version
sys.exit(Version(transformers.__version__) != Version(sys.argv[1]))' "$oldest"; then
    echo ".venv-oldest does not import transformers $oldest" >&2
    exit 1
fi
echo "unit tier against transformers $oldest (torch $(.venv-oldest/bin/python -c 'import torch; print(torch.__version__)'))"
.venv-oldest/bin/python -m pytest -q -m unit -p no:cacheprovider
echo "unit tier against transformers $oldest: $((SECONDS - started)) s including the venv"
