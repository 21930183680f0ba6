#!/usr/bin/env bash
# Build the compiled core with AddressSanitizer + UndefinedBehaviorSanitizer in
# its own virtualenv (from a copy of the sources, so the normal in-place build
# is untouched) and run the scan and state-machine tests under it.
# CPython itself is not instrumented: libasan is preloaded and leak detection
# is off (CPython's arenas look like leaks to LeakSanitizer).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv-asan"
src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
PYTHON="${PYTHON:-python3}"

[ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "setuptools>=69" "cython>=3.0" "numpy>=2.0" \
    wheel pytest hypothesis ml_dtypes

# copy the tracked sources only (no in-place .so or generated .c)
(cd "$root" && git ls-files -z --cached --others --exclude-standard | \
    xargs -0 -I{} cp --parents {} "$src")
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
CFLAGS="$san" LDFLAGS="$san" "$venv/bin/pip" install -q --disable-pip-version-check \
    --no-build-isolation --force-reinstall --no-deps "$src"

export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
cd "$src"
# -P: the copy's lscore/ folder must not shadow the instrumented installed package
"$venv/bin/python" -P -m pytest -q -p no:cacheprovider -m "not slow" \
    tests/test_scan_vs_reference.py tests/test_state_vs_reference.py \
    tests/test_tf_api.py tests/test_params.py
