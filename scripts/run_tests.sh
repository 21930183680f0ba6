#!/usr/bin/env bash
# Run the test suite in the given virtualenv.  pytest's exit code 5 ("no
# tests collected") is an error here: a suite that ran nothing proves nothing.
set -euo pipefail
venv="$1"
export PYTHONDONTWRITEBYTECODE=1
set +e
# README.md and docs/ are named so that conftest.py (Sybil) runs their examples.
"$venv/bin/python" -m pytest -ra -v tests docs README.md
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
