#!/usr/bin/env bash
# Run the test suite with the lscore that the given virtualenv has installed:
#   run_tests.sh VENV [PATH...] [-- PYTEST_OPTION...]
# PATHs relative to the checkout; default: tests docs README.md.  The options after `--` go
# to pytest (the Makefile's tiers: -m "not slow", -n 2 ...).
# (README.md and docs/ are named so that conftest.py, Sybil, runs their examples).
# pytest runs from an empty folder outside the checkout and imports test modules with
# --import-mode=importlib, which puts no test folder on sys.path: the only checkout folder
# there is tests/ itself (pyproject's pythonpath, for `helpers`), so `import lscore` finds the
# installed package, never the checkout's lscore/, which lacks the compiled lscore._ext.
# LSCORE_TEST_INSTALLED=1 (make test, cibuildwheel) turns on the tests that check this
# (tests/packaging/test_installed.py).  pytest's exit code 5 ("no tests collected") is an
# error here: a suite that ran nothing proves nothing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$(cd "$1" && pwd)"
shift
paths=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
    paths+=("$1")
    shift
done
[ "$#" -gt 0 ] && shift  # the --
[ "${#paths[@]}" -gt 0 ] || paths=(tests docs README.md)
export PYTHONDONTWRITEBYTECODE=1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
set +e
"$venv/bin/python" -m pytest -ra --import-mode=importlib "$@" "${paths[@]/#/$root/}"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
