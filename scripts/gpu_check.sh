#!/usr/bin/env bash
# The GPU checks in one call, for a machine with a CUDA device, torch, CuPy, pytest-xdist
# and pytest-timeout already installed (no network needed): build the compiled core in
# place, run the doc pages (their GPU examples; one process, as the pages share a
# namespace in page order), the `gpu` tests, `lscore bench --suite fp8`'s GPU rows at 1e7
# and 1e8 (per-tensor and block-scaled, with issue 34's and 35's GPU targets), then
# `lscore bench --suite gpu` and `--suite gpu-tune`.  Logs and JSON go to $OUT (default
# ./out); each step has its own time limit, so one that hangs leaves time for the others.
# A short summary is printed last.
#
#   OUT=/tmp/gpu bash scripts/gpu_check.sh [pytest arguments...]
#
# STEPS="docs pytest fp8 gpu tune" picks the steps (all five by default); the doc pages
# need sybil (carry its wheel where the machine has none); the CPU core is built with
# LSCORE_OPT=-O1 unless it is set (minutes less than -O3 for _mx; no step times the CPU
# kernels, but set -O3 where the gpu suite's host costs are reported); AB_LAUNCH=block=512 runs
# the gpu suite again under that LSCORE_CUDA_LAUNCH, for a comparison in the same run;
# PYTHON, PYTEST_ARGS and the limits DOCS_S, PYTEST_S, FP8_S, GPU_S, TUNE_S (seconds) can
# be set too.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
t0=$(date +%s)
step() { echo "== $1 ($(($(date +%s) - t0)) s)"; }
# limited SECONDS CMD...: CMD in a process group of its own, the whole group ended after
# SECONDS and again when CMD returns, so no pytest-xdist worker outlives its step to load
# the GPU under the next one's timings; the exit status is CMD's (124 past the limit)
limited() {
    local limit=$1 pid watch rc
    shift
    setsid "$@" &
    pid=$!
    (sleep "$limit" && kill -TERM -- "-$pid" && sleep 5 && kill -KILL -- "-$pid") 2>/dev/null &
    watch=$!
    wait "$pid"
    rc=$?
    kill -KILL -- "-$pid" "$watch" 2>/dev/null
    wait "$watch" 2>/dev/null
    [ "$rc" -eq 143 ] || [ "$rc" -eq 137 ] && rc=124
    return "$rc"
}

export LSCORE_OPT=${LSCORE_OPT:--O1}
step "build ($LSCORE_OPT)"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    $PY -c 'import sys, numpy, cupy, torch; print(sys.version.split()[0], "numpy", numpy.__version__,
"cupy", cupy.__version__, "torch", torch.__version__, "cuda", torch.version.cuda,
torch.cuda.get_device_name(0))'
    timeout 240 $PY setup.py -q build_ext --inplace -j "$(nproc)"
} >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
head -3 "$OUT/build.log"
# pyproject's package-dir maps lscore._ext to _ext/ (where the in-place build leaves the
# modules), lscore.adapters to adapters/ and lscore.bench to benchmarks/: links make them
# importable from the checkout without an install
links=()
for pair in _ext:_ext adapters:adapters bench:benchmarks; do
    pkg=${pair%%:*} folder=${pair#*:}
    [ -e "lscore/$pkg" ] || { ln -s "../$folder" "lscore/$pkg" && links+=("lscore/$pkg"); }
done
trap 'rm -f "${links[@]}"' EXIT
$PY -c 'import lscore' || exit 1

# STEPS: which of the five to run (all by default)
STEPS=${STEPS:-docs pytest fp8 gpu tune}
run_step() { [[ " $STEPS " == *" $1 "* ]]; }

if run_step docs; then
    step "pytest README.md docs"
    timeout "${DOCS_S:-150}" $PY -m pytest -q -p no:cacheprovider -rfEs --tb=short \
        README.md docs >"$OUT/docs.log" 2>&1
    echo "docs exit $?"
fi
if run_step pytest; then
    step "pytest -m gpu"
    # PYTEST_ARGS: xdist workers and a per-test limit by default (empty without those
    # plugins); a worker's first kernels compile with NVRTC, which a short limit can cut.
    # -v: each outcome is logged as it comes, so a run cut by its limit still names its
    # failures (xdist prints the summary only at the end)
    limited "${PYTEST_S:-240}" $PY -m pytest -m gpu -v -p no:cacheprovider \
        ${PYTEST_ARGS--n 8 --timeout 150} -rfEs --tb=short "${@:-tests}" >"$OUT/pytest.log" 2>&1
    echo "pytest exit $?"
fi
if run_step fp8; then
    step "bench --suite fp8 --only gpu"
    timeout "${FP8_S:-150}" $PY -m lscore bench --suite fp8 --only gpu --sizes 1e7,1e8 \
        --repeat 5 --no-progress --json "$OUT/fp8.json" >"$OUT/fp8.txt" 2>&1
    echo "bench fp8 exit $?"
fi
if run_step gpu; then
    step "bench --suite gpu"
    timeout "${GPU_S:-110}" $PY -m lscore bench --suite gpu --json "$OUT/gpu.json" \
        >"$OUT/gpu.txt" 2>"$OUT/gpu.err"
    echo "bench gpu exit $?"
fi
if [ -n "${AB_LAUNCH:-}" ]; then  # the gpu suite again under another launch configuration
    step "bench --suite gpu, LSCORE_CUDA_LAUNCH=$AB_LAUNCH"
    LSCORE_CUDA_LAUNCH=$AB_LAUNCH timeout "${GPU_S:-110}" $PY -m lscore bench --suite gpu \
        --no-progress --json "$OUT/gpu_ab.json" >"$OUT/gpu_ab.txt" 2>&1
    echo "bench gpu ($AB_LAUNCH) exit $?"
fi
if run_step tune; then
    step "bench --suite gpu-tune"
    timeout "${TUNE_S:-110}" $PY -m lscore bench --suite gpu-tune --json "$OUT/tune.json" \
        >"$OUT/tune.txt" 2>&1
    echo "bench gpu-tune exit $?"
fi

step summary
for log in docs pytest; do
    [ -f "$OUT/$log.log" ] && grep -E "passed|failed|error|skipped" "$OUT/$log.log" | tail -1
    [ -f "$OUT/$log.log" ] && grep -E "^(FAILED|ERROR)|\] (FAILED|ERROR) " "$OUT/$log.log" | head -30
done
for f in fp8 gpu gpu_ab tune; do
    [ -f "$OUT/$f.json" ] && echo "$f:" && $PY - "$OUT/$f.json" <<'EOF'
import json, sys
for t in json.load(open(sys.argv[1]))["targets"]:
    m = t["measured"]
    met = {True: "ok  ", False: "MISS", None: "--  "}[t["met"]]
    print(" ", met, f"{m:.3f}" if isinstance(m, float) else m, "need", t.get("required"),
          t["target"], t.get("skipped", ""))
EOF
done
step done
