#!/usr/bin/env bash
# Build the compiled core with AddressSanitizer + UndefinedBehaviorSanitizer at -O1 (what
# most projects sanitize at: the checks see the code as written, and the build takes a
# fraction of -O3's time) in its own virtualenv (from a copy of the sources, so the normal in-place build
# is untouched) and run the compiled core's tests (tests/core, tests/kernels) under it.
# CPython itself is not instrumented: libasan is preloaded and leak detection
# is off (CPython's arenas look like leaks to LeakSanitizer).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv-asan"
src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
PYTHON="${PYTHON:-python3}"

[ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "setuptools>=77" "cython>=3.0" "numpy>=2.0" \
    "tomli>=1.1; python_version < '3.11'" wheel pytest pytest-xdist hypothesis ml_dtypes

# copy the tracked sources only (no in-place .so or generated .c)
(cd "$root" && git ls-files -z --cached --others --exclude-standard | \
    xargs -0 -I{} cp --parents {} "$src")
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
LSCORE_OPT=-O1 CFLAGS="$san" LDFLAGS="$san" "$venv/bin/pip" install -q --disable-pip-version-check \
    --no-build-isolation --force-reinstall --no-deps "$src"

export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
cd "$src"
# A build that silently lost the flags would pass everything below: check that
# both extension modules call into the sanitizer runtimes.
for so in "$venv"/lib/python*/site-packages/lscore/_ext/*.so; do
    # (not `nm | grep -q`: under pipefail grep's early exit gives nm a SIGPIPE)
    syms="$(nm -D "$so")"
    if ! grep -q __asan_report <<<"$syms" || ! grep -q __ubsan_handle <<<"$syms"; then
        echo "sanitize: $so is not instrumented" >&2
        exit 1
    fi
done
# ... and that the preloaded runtime really catches a bad read from the
# extension: a scan told to read one element past a heap buffer must die.
set +e
canary="$("$venv/bin/python" -P - 2>&1 <<'PY'
import numpy as np
from lscore._ext import _scan
a = np.ones(4096, np.float32)     # big enough to come from malloc, not numpy's cache
_scan.all_finite_raw(np.array([a.ctypes.data], np.uint64), np.array([a.size + 1], np.int64),
                     np.array([4], np.int64), np.array([3], np.int32))
PY
)"
rc=$?
set -e
if [ "$rc" -eq 0 ] || ! grep -q heap-buffer-overflow <<<"$canary"; then
    echo "sanitize: AddressSanitizer did not catch an out-of-bounds read (rc=$rc)" >&2
    echo "$canary" | tail -20 >&2
    exit 1
fi
echo "sanitize: instrumented build; ASan caught the deliberate out-of-bounds read"
# The compiled core's tests, by folder: tests/core and tests/kernels.  What needs
# torch, cupy or a GPU skips here (importorskip, the gpu marker); the NVRTC and kernel-cache
# tests, and the NVRTC compiles of test_fp8_cuda, test_mx_formats, test_mx_cuda (with
# its ptxas check) and test_nvfp4_te_cuda, compile CUDA text
# only (no compiled-core code) and need cupy, which this venv does not have (under CI
# those fail instead of skipping).
# -P: the copy's lscore/ folder must not shadow the instrumented installed package; nor may
# pytest's rootdir insertion for the root conftest.py (the docs' examples, not run here)
rm -f "$src/conftest.py"
"$venv/bin/python" -P -m pytest -q -p no:cacheprovider -m "not slow and not gpu" -rs -n 2 \
    --ignore=tests/kernels/test_cuda_nvrtc.py --ignore=tests/kernels/test_cuda_compile_options.py \
    --ignore=tests/kernels/test_kernel_cache.py \
    --deselect tests/kernels/test_fp8_cuda.py::test_compiles_with_nvrtc \
    --deselect tests/kernels/test_mx_formats.py::test_header_compiles_with_nvrtc \
    --deselect tests/kernels/test_mx_cuda.py::test_compiles_with_nvrtc \
    --deselect tests/kernels/test_mx_cuda.py::test_ptxas_assembles_the_sm100a_instructions \
    --deselect tests/kernels/test_nvfp4_te_cuda.py::test_compiles_with_nvrtc \
    tests/core tests/kernels
