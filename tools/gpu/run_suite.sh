#!/usr/bin/env bash
# Build ggml with CUDA on the GPU machine (the device tool's nvidia-h200) and run the test
# suite on virtual CUDA devices; every log lands in $OUT.
#
#   bash tools/gpu/run_suite.sh [RELEASE] [PYTEST_ARGS...]
#
# RELEASE defaults to vendor/releases.toml's default. The machine reaches no package index,
# so the device call carries what the build and the tests need (`carry`):
#   .whl             cp312 wheels missing from the machine's image (cffi, pycparser, nbclient,
#                    nbformat, ipykernel and their needs; tools/gpu/README.md says how)
#   vendor/RELEASE   the extracted, stamped tree (`python build_ggml.py fetch --ggml RELEASE`
#                    here first), which build_ggml.py takes as verified
# e.g. run(command="bash tools/gpu/run_suite.sh", carry=[".whl", "vendor/0.25.3"])
#
# Environment:
#   GGML_CUDA_DEVICES  virtual CUDA devices ggml makes of the GPUs (default 2: CUDA0, CUDA1)
#   STEPS              any of bench, suite (default "suite"); bench runs bench_cuda.py
#                      (mul_mat 8192^3 rows) and bench_multi_gpu.py. The build always runs:
#                      on a warm machine it is ninja finding nothing to do
#   BACKENDS           build_ggml.py --backends (default cpu,rpc,cuda)
#   CUDA_ARCH          --cuda-arch (default 90, the H200); CUDA_ARCH=native passes none, which
#                      is build_ggml.py's default configuration there (ggml-<rel>-cpu-rpc-cuda):
#                      then test_build_cli's plain `build_ggml.py` finds it built instead of
#                      compiling CUDA a second time (about 200 s)
#   JOBS               ninja -j (default: all cores)
#   OUT                where logs go (set by the device tool; default /tmp/gpu-out)
# Files in $OUT: build.log, ninja_times.txt, bench.log, pytest.log, junit.xml, env.txt.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
REL=${1:-$(python3 -c 'import tomllib; print(tomllib.load(open("vendor/releases.toml", "rb"))["default"])')}
[ $# -gt 0 ] && shift
STEPS=${STEPS:-suite}
JOBS=${JOBS:-$(nproc)}
BACKENDS=${BACKENDS:-cpu,rpc,cuda}
CUDA_ARCH=${CUDA_ARCH:-90}
ARCH=(); [[ ",$BACKENDS," == *,cuda,* && $CUDA_ARCH != native ]] && ARCH=(--cuda-arch "$CUDA_ARCH")
export GGML_CUDA_DEVICES=${GGML_CUDA_DEVICES:-2}
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}     # ggml_py from this checkout

WHEELS=${WHEELS:-.whl}                               # WHEELS=none: install nothing
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$WHEELS"/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
{
    date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nvcc --version | tail -1; python3 --version; nproc
    python3 -c 'import torch, cffi; print("torch", torch.__version__, "cffi", cffi.__version__)'
    echo "release $REL, backends $BACKENDS, GGML_CUDA_DEVICES=$GGML_CUDA_DEVICES, steps: $STEPS"
} 2>&1 | tee "$OUT/env.txt"

rc=0
t0=$(date +%s%N)
python3 build_ggml.py --ggml "$REL" --backends "$BACKENDS" "${ARCH[@]}" -j "$JOBS" \
    > "$OUT/build.out" 2> >(tee -a "$OUT/build.log" >&2)
brc=$?
t1=$(date +%s%N)
folder=$(tail -n 1 "$OUT/build.out")
cat "$OUT/build.out" >> "$OUT/build.log"; rm -f "$OUT/build.out"
echo "build_ggml.py: exit $brc, $(( (t1 - t0) / 1000000 )) ms wall, -j $JOBS" | tee -a "$OUT/build.log"
[ $brc -eq 0 ] || exit $brc
export GGML_PY_BUILD=$folder
ninja_log=build/$(basename "$folder")/cmake/.ninja_log
[ -f "$ninja_log" ] && python3 tools/gpu/ninja_times.py "$ninja_log" > "$OUT/ninja_times.txt"
python3 -m ggml_py 2>&1 | tee -a "$OUT/env.txt"

if [[ " $STEPS " == *" bench "* ]]; then
    (cd benchmarks &&
     python3 bench_cuda.py --sizes 8192 --pairs f16xf32,f16xf16,bf16xbf16 --only matmul --reps 20
     python3 bench_multi_gpu.py --reps 20) 2>&1 | tee "$OUT/bench.log"
    rc=$((rc | PIPESTATUS[0]))
fi

if [[ " $STEPS " == *" suite "* ]]; then
    set -o pipefail
    TIMEOUT=(); python3 -c 'import pytest_timeout' 2>/dev/null && TIMEOUT=(--timeout=600)
    # ggml_py is not pip-installed here, so pyproject's pytest11 entry point is not registered
    PLUGIN=(); [ -f ggml_py/pytest_plugin.py ] && PLUGIN=(-p ggml_py.pytest_plugin)
    python3 -m pytest -ra --durations=15 "${TIMEOUT[@]}" "${PLUGIN[@]}" -p no:cacheprovider \
        --junitxml="$OUT/junit.xml" "$@" 2>&1 | tee "$OUT/pytest.log"
    rc=$((rc | $?))
fi
exit $rc
