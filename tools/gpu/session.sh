#!/usr/bin/env bash
# One device session for issue 17, in phases that fit the device tool's 10-minute calls. Call
# them back to back (the machine stays warm 30 s; the build survives between warm calls):
#
#   run(command="bash tools/gpu/session.sh build", carry=[".whl", ".gpu", ".gl"], timeout_s=600)
#   run(command="bash tools/gpu/session.sh checks", carry=[".whl", ".gpu", ".gl"])
#   run(command="bash tools/gpu/session.sh suite1", carry=[".whl", ".gpu", ".gl"])
#   run(command="bash tools/gpu/session.sh suite2", carry=[".whl", ".gpu", ".gl"])
#
# build   unpack the Vulkan loader (.gl), copy the trimmed trees (.gpu/vendor, made here by
#         `python tools/gpu/pack_trees.py 0.25.3 0.26.0`), build RELEASE (default 0.26.0) with
#         BACKENDS (default cpu,rpc,cuda,vulkan); list devices
# checks  the event mutation check on CUDA0/CUDA1 and Vulkan0; the multi-device tests with
#         GGML_CUDA_DEVICES=4; event RSS attribution (event_rss.c); the generator on every
#         device (GEN_SECONDS, default 120)
# vkpair  two Vulkan devices on the one GPU (GGML_VK_VISIBLE_DEVICES=0,0): the device list,
#         then the event mutation check on the Vulkan pair, every line of output kept
# bench   benchmarks/bench_graph.py --device CUDA0
# suite   suite1 (tests/*/test_[a-g]*.py) then suite2 (the other files), GGML_CUDA_DEVICES=2,
#         slow tests included; each half's log and junit in $OUT
set -u
cd "$(dirname "$0")/../.."
PHASE=${1:?build, checks, suite, suite1 or suite2}
REL=${RELEASE:-0.26.0}
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

# the loader and build packages, the trees, the wheels (each call: the tree is re-copied)
for f in .gl/*.deb; do dpkg -x "$f" /; done
for f in .gl/build/*.deb; do
    case "$(basename "$f")" in
        glslc*) command -v glslc >/dev/null && continue ;;
        libshaderc*) ldconfig -p | grep -q libshaderc.so.1 && continue ;;
        spirv-headers*) [ -e /usr/include/spirv/unified1/spirv.hpp ] && continue ;;
        libvulkan-dev*) grep -Eq 'VK_HEADER_VERSION (30[0-9]|3[1-9][0-9])$' \
                            /usr/include/vulkan/vulkan_core.h 2>/dev/null && continue ;;
    esac
    dpkg -x "$f" /
done
ldconfig
nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -e "$nvidia_icd" ] && export VK_DRIVER_FILES=$nvidia_icd \
    __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
cp -rp .gpu/vendor/. vendor/      # -p: mtimes kept, so a warm machine does not re-configure
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
PLUGIN=(-p ggml_py.pytest_plugin -p no:cacheprovider)

build() {
    GGML_CUDA_DEVICES=2 BACKENDS=${BACKENDS:-cpu,rpc,cuda,vulkan} STEPS=none WHEELS=none \
        bash tools/gpu/run_suite.sh "$REL"
}

case $PHASE in
build)
    build || exit $?
    echo "build phase: build done at ${SECONDS}s" | tee -a "$OUT/env.txt"
    ;;
checks)
    folder=$(ls -d ggml_py/lib/ggml-"$REL"-cpu-rpc-cuda90* | head -1)
    [ -n "$folder" ] || { echo "no build: run the build phase first (warm machine)"; exit 1; }
    export GGML_PY_BUILD=$folder
    {
        for m in none record wait; do
            echo "== GGML_PY_MUTATE=$m"
            GGML_PY_MUTATE=$([ $m = none ] || echo $m) GGML_CUDA_DEVICES=2 timeout 100 \
                python3 -m pytest -q -rA "${PLUGIN[@]}" -p tools.mutate_events \
                -k "ordered_by or events_order" tests/ 2>&1 | grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed"
        done
    } > "$OUT/mutate.txt" 2>&1
    echo "mutation done at ${SECONDS}s" | tee -a "$OUT/env.txt"
    GGML_CUDA_DEVICES=4 python3 -m ggml_py > "$OUT/cuda4.txt" 2>&1
    GGML_CUDA_DEVICES=4 timeout 90 python3 -m pytest -q -rfEs "${PLUGIN[@]}" \
        tests/accel/test_multi_gpu.py tests/accel/test_accelerators.py tests/rpc/test_event.py \
        tests/rpc/test_scheduler.py tests/rpc/test_copy.py >> "$OUT/cuda4.txt" 2>&1
    echo "cuda4 done at ${SECONDS}s" | tee -a "$OUT/env.txt"
    {
        echo "== event_rss.c: ggml events on CUDA0 and raw cudaEvent cycles"
        nvcc -O2 -x cu tools/gpu/event_rss.c -Ivendor/"$REL"/include -L"$folder" -lggml \
            -lggml-base -Xlinker -rpath="$folder" -o /tmp/event_rss &&
            GGML_CUDA_DEVICES=2 timeout 60 /tmp/event_rss 200000
    } > "$OUT/rss.txt" 2>&1
    if [ -z "${SKIP_GEN:-}" ]; then       # every device of the build, and RPC (issue 16)
        GGML_CUDA_DEVICES=2 timeout "${GEN_SECONDS:-120}" python3 tests/support/generated.py \
            --examples 100000 > "$OUT/gen.log" 2>&1
        echo "generator exit $? (124: stopped by its time limit, no failure)" >> "$OUT/gen.log"
    fi
    echo "phase total ${SECONDS}s" | tee -a "$OUT/env.txt"
    ;;
bench)         # benchmarks/bench_graph.py on CUDA0 (one device: no virtual ones)
    folder=$(ls -d ggml_py/lib/ggml-"$REL"-cpu-rpc-cuda90* | head -1)
    [ -n "$folder" ] || { echo "no build: run the build phase first (warm machine)"; exit 1; }
    export GGML_PY_BUILD=$PWD/$folder
    (cd benchmarks && timeout 500 python3 bench_graph.py --device CUDA0) > "$OUT/bench.txt" 2>&1
    echo "exit $?" >> "$OUT/bench.txt"
    cat "$OUT/bench.txt"
    ;;
vkpair)
    folder=$(ls -d ggml_py/lib/ggml-"$REL"-cpu-rpc-cuda90* | head -1)
    [ -n "$folder" ] || { echo "no build: run the build phase first (warm machine)"; exit 1; }
    export GGML_PY_BUILD=$folder GGML_VK_VISIBLE_DEVICES=0,0 GGML_CUDA_DEVICES=2
    {
        echo "== python -m ggml_py"
        timeout 60 python3 -X faulthandler -m ggml_py; echo "exit $?"
        for m in none record wait; do
            echo "== GGML_PY_MUTATE=$m (Vulkan pair)"
            GGML_PY_MUTATE=$([ $m = none ] || echo $m) timeout 60 python3 -X faulthandler \
                -m pytest -q -rA "${PLUGIN[@]}" -p tools.mutate_events \
                -k "(ordered_by or events_order) and Vulkan" tests/ 2>&1 | tail -40
            echo "exit ${PIPESTATUS[0]}"
        done
    } > "$OUT/vkpair.txt" 2>&1
    tail -60 "$OUT/vkpair.txt"
    ;;
vkprobe)       # a Vulkan-only build (about 100 s), then GGML_VK_VISIBLE_DEVICES values
    BACKENDS=cpu,rpc,vulkan build > "$OUT/vkbuild.txt" 2>&1 || { tail -30 "$OUT/vkbuild.txt"; exit 1; }
    folder=$(ls -d ggml_py/lib/ggml-"$REL"-cpu-rpc-vulkan | head -1)
    export GGML_PY_BUILD=$folder
    {
        python3 -c 'from ggml_py._vulkan import physical_device_types as t; print("loader types", t())'
        for v in 0 0,0 1 "0 0"; do
            echo "== GGML_VK_VISIBLE_DEVICES=$v"
            GGML_VK_VISIBLE_DEVICES=$v timeout 60 python3 -X faulthandler -c '
import ggml_py as gg
from ggml_py._vulkan import physical_device_types as t
print("loader types", t(), "devices", [d.name for d in gg.devices()])' 2>&1 | tail -8
            echo "exit ${PIPESTATUS[0]}"
        done
        echo "== mutation check on the Vulkan pair"
        for m in none record wait; do
            GGML_VK_VISIBLE_DEVICES=0,0 GGML_PY_MUTATE=$([ $m = none ] || echo $m) timeout 60 \
                python3 -m pytest -q -rA "${PLUGIN[@]}" -p tools.mutate_events \
                -k "(ordered_by or events_order) and Vulkan" tests/ 2>&1 | grep -E "^(PASSED|FAILED|ERROR)|passed|failed" | sed "s/^/$m: /"
        done
    } > "$OUT/vkprobe.txt" 2>&1
    cat "$OUT/vkprobe.txt"
    ;;
suite|suite1|suite2)
    folder=$(ls -d ggml_py/lib/ggml-"$REL"-cpu-rpc-cuda90* | head -1)
    [ -n "$folder" ] || { echo "no build: run the build phase first (warm machine)"; exit 1; }
    export GGML_PY_BUILD=$folder GGML_CUDA_DEVICES=2
    TIMEOUT=(); python3 -c 'import pytest_timeout' 2>/dev/null && TIMEOUT=(--timeout=300)
    part() {
        if [ "$1" = suite1 ]; then files=(tests/*/test_[a-g]*.py); else
            files=(); for f in tests/*/test_*.py; do [[ $(basename "$f") == test_[a-g]* ]] || files+=("$f"); done
        fi
        python3 -m pytest -ra --durations=15 "${TIMEOUT[@]}" "${PLUGIN[@]}" \
            --junitxml="$OUT/junit-$1.xml" "${files[@]}" > "$OUT/pytest-$1.log" 2>&1
        echo "$1: exit $? at ${SECONDS}s"
        tail -40 "$OUT/pytest-$1.log"
    }
    if [ "$PHASE" = suite ]; then part suite1; part suite2; else part "$PHASE"; fi
    ;;
esac
