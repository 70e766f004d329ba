#!/usr/bin/env bash
# The round-3 GPU checks (event/copy mutations on the CUDA pair, tensor parallelism, the
# GPU-relevant tests, the copy_async no-op mutant), in phases that fit the device tool's
# 10-minute calls. Made here by tools/gpu/pack_wt.sh, run there from the session checkout:
#
#   run(command="bash .gpu-wt/repo/tools/gpu/round3.sh build mutate", carry=[".gpu-wt"])
#   run(command="bash .gpu-wt/repo/tools/gpu/round3.sh meta gpu copymut", carry=[".gpu-wt"])
#
# The packed tree is copied to /root/wt (cp -a keeps mtimes: a warm machine's build in
# /root/wt/build and /root/wt/ggml_py/lib is kept and ninja finds nothing to do).
#
# build    build_ggml.py --backends cpu,rpc,cuda --cuda-arch 90, device list
# mutate   tests/accel/test_metal.py under tools/mutate_events.py's modes (none record wait
#          synchronize copy) on CUDA0/CUDA1
# meta     metatests, then bench
# metatests tests/rpc/test_meta.py, test_meta_combos.py, test_meta_release.py, notebook 07
# bench    benchmarks/bench_meta.py --cuda over 2 and 4 virtual devices (512 tokens), and 2
#          devices at 4096 tokens
# mutcuda  tools/mutants.py: the async/event mutants against the CUDA tests
# census   round 9: the census' group C (tools/gpu/census_c.txt) against the accelerator tests
# gpu      test_accelerators, test_multi_gpu, test_copy, test_event, test_dlpack,
#          test_crash_classes (-m "not slow")
# copymut  the copy_async no-op mutant of tools/mutants.py on the copy tests
# cpubuild build_ggml.py --backends cpu,rpc (the CPU + RPC build the mutant census runs on)
# mapcpu   tools/mutants.py's test map of the non-slow suite on that build, in 8 map workers
#          at once (one per group of test files), merged by --map
# mutall   every mutant of tools/mutants.py --list (or of a carried list and map, see below)
#          on CPU + RPC (-j 14, fork runner), within
#          MUTALL_S seconds (default 540); a later call runs only the mutants not yet judged
#          (the .partial lines), so the census spans several 10-minute calls
#
# $OUT gets one log per phase (env.txt, build.log, mutate.txt, meta.log, bench.txt, gpu.log,
# copymut.log, mutcuda.log/.md/.json).
set -u
PACK=$(cd "$(dirname "$0")/../.." && pwd)          # .gpu-wt/repo of the carried folder
NBWHL=$(dirname "$PACK")/nbwhl
W=/root/wt
OUT=${OUT:-/tmp/gpu-out}
REL=${RELEASE:-0.26.0}
mkdir -p "$OUT" "$W"
cp -a "$PACK/." "$W/"
cd "$W"
export PYTHONUNBUFFERED=1 GGML_CUDA_DEVICES=${GGML_CUDA_DEVICES:-2}
if [ ! -e /tmp/site/cffi ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$W
# the notebook's needs, behind the image's packages: a .pth appends to sys.path
if [ -d "$NBWHL" ] && [ ! -e /tmp/nbsite ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target /tmp/nbsite "$NBWHL"/*.whl >/dev/null 2>&1
    sp=$(python3 -c 'import site; print(site.getsitepackages()[0])')
    echo /tmp/nbsite > "$sp/zz_ggml_py_nbsite.pth"
fi
PY=(python3 -m pytest -p ggml_py.pytest_plugin -p no:cacheprovider -p no:randomly)
python3 -c 'import pytest_timeout' 2>/dev/null && PY+=(--timeout=300)
folder() { ls -d "$W"/ggml_py/lib/ggml-"$REL"-cpu-rpc-cuda90* 2>/dev/null | head -1; }

for PHASE in "$@"; do
t0=$SECONDS
case $PHASE in
build)
    {
        date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        nvcc --version | tail -1; python3 --version; nproc
        python3 -c 'import cffi, numpy; print("cffi", cffi.__version__, "numpy", numpy.__version__)'
        python3 -c 'import nbclient, ipykernel, matplotlib; print("notebook deps ok", matplotlib.__version__)'
        python3 -c 'import pytest, pytest_timeout; print("pytest", pytest.__version__, "timeout ok")'
    } > "$OUT/env.txt" 2>&1
    python3 build_ggml.py --ggml "$REL" --backends cpu,rpc,cuda --cuda-arch 90 -j "$(nproc)" \
        > "$OUT/build.log" 2>&1
    echo "build_ggml.py exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/build.log"
    GGML_PY_BUILD=$(folder) python3 -m ggml_py >> "$OUT/env.txt" 2>&1
    cat "$OUT/env.txt"
    ;;
mutate)
    export GGML_PY_BUILD=$(folder)
    for m in "" record wait synchronize copy; do
        echo "== mutation: ${m:-none}"
        GGML_PY_MUTATE=$m timeout 150 "${PY[@]}" -p tools.mutate_events -q -rA \
            tests/accel/test_metal.py 2>&1 | grep -E '^(PASSED|FAILED|ERROR)| in [0-9.]+s|rror' \
            | cut -c1-220
    done > "$OUT/mutate.txt" 2>&1
    cat "$OUT/mutate.txt"
    ;;
meta|metatests)
    export GGML_PY_BUILD=$(folder)
    {
        echo "== tests/rpc/test_meta.py test_meta_combos.py test_meta_release.py"
        timeout 300 "${PY[@]}" -q -rfEs --durations=8 tests/rpc/test_meta.py \
            tests/core/test_meta_combos.py tests/core/test_meta_release.py 2>&1 | tail -40
        echo "== notebook 07"
        timeout 200 "${PY[@]}" -q -rfEs tests/tools/test_notebook.py -k 07 2>&1 | tail -30
    } > "$OUT/meta.log" 2>&1
    cat "$OUT/meta.log"
    [ "$PHASE" = meta ] && bash "$0" bench
    ;;
bench)
    export GGML_PY_BUILD=$(folder)
    (cd benchmarks && nvidia-smi --query-gpu=name --format=csv,noheader &&
        for n in 2 4; do
            echo "== GGML_CUDA_DEVICES=$n, 512 tokens"
            GGML_CUDA_DEVICES=$n timeout 240 python3 bench_meta.py --cuda
            echo "exit $?"
        done
        echo "== GGML_CUDA_DEVICES=2, 4096 tokens"
        GGML_CUDA_DEVICES=2 timeout 240 python3 bench_meta.py --cuda --tokens 4096 --repeat 3
        echo "exit $?"
        for n in 2 4; do     # CUDA graphs off (read once per process): the all-reduce's
            echo "== GGML_CUDA_DEVICES=$n, 512 tokens, GGML_CUDA_DISABLE_GRAPHS=1"
            GGML_CUDA_DISABLE_GRAPHS=1 GGML_CUDA_DEVICES=$n timeout 240 python3 bench_meta.py --cuda
            echo "exit $?"
        done) > "$OUT/bench.txt" 2>&1
    cat "$OUT/bench.txt"
    ;;
mutcuda)
    # the async/event mutants (tools/gpu/async_mutants.txt, docs/mutation.md's table) against
    # the non-slow tests whose id names a CUDA device
    export GGML_PY_BUILD=$(folder)
    timeout 120 "${PY[@]}" --collect-only -q -m "not slow" tests 2>/dev/null \
        | grep -E '^tests/.*CUDA' > "$OUT/cuda_ids.txt"
    echo "$(wc -l < "$OUT/cuda_ids.txt") CUDA test ids"
    mapfile -t IDS < "$OUT/cuda_ids.txt"         # ids hold spaces ("mul_mat f32")
    timeout "${MUT_TIMEOUT:-330}" python3 tools/mutants.py --names tools/gpu/async_mutants.txt \
        --tests "${IDS[@]}" --fresh-map --cap "${MUT_CAP:-0}" --cap2 0 -j "${MUT_JOBS:-6}" \
        --timeout 200 --json "$OUT/mutcuda.json" --report "$OUT/mutcuda.md" \
        > "$OUT/mutcuda.log" 2>&1
    echo "mutants.py exit $?" >> "$OUT/mutcuda.log"
    tail -45 "$OUT/mutcuda.log"
    # then the fork runner, whose control must fail here (CUDA does not survive fork())
    timeout 90 python3 tools/mutants.py --names tools/gpu/async_mutants.txt --runner fork \
        --tests "${IDS[@]}" --cap 20 --cap2 0 -j 6 --timeout 60 > "$OUT/mutfork.log" 2>&1
    echo "fork runner: exit $?; $(grep -E '^control|control run failed' "$OUT/mutfork.log")"
    ;;
census)
    # round 9: the census' group C (mutants no CPU or RPC test can observe, tools/gpu/census_c.txt)
    # against the accelerator tests, after those tests pass unmutated
    export GGML_PY_BUILD=$(folder)
    CT=(tests/accel/test_accel_census.py tests/accel/test_metal.py tests/accel/test_accelerators.py
        tests/rpc/test_dlpack.py)
    timeout 200 "${PY[@]}" -q -rfEs -m "not slow" "${CT[@]}" > "$OUT/census_tests.log" 2>&1
    echo "exit $?" >> "$OUT/census_tests.log"
    tail -25 "$OUT/census_tests.log"
    timeout "${MUT_TIMEOUT:-330}" python3 tools/mutants.py --names "${CENSUS_NAMES:-tools/gpu/census_c.txt}" \
        --tests "${CT[@]}" --fresh-map --cap 0 --cap2 0 -j "${MUT_JOBS:-6}" --timeout 200 \
        --runner spawn --json "$OUT/census_c.json" --report "$OUT/census_c.md" \
        > "$OUT/census_c.log" 2>&1
    echo "mutants.py exit $?" >> "$OUT/census_c.log"
    tail -30 "$OUT/census_c.log"
    ;;
gpu)
    export GGML_PY_BUILD=$(folder)
    timeout "${GPU_TIMEOUT:-420}" "${PY[@]}" -q -rfEs -m "not slow" --durations=10 tests/accel/test_accelerators.py \
        tests/accel/test_multi_gpu.py tests/rpc/test_copy.py tests/rpc/test_event.py tests/rpc/test_dlpack.py \
        tests/rpc/test_crash_classes.py > "$OUT/gpu.log" 2>&1
    echo "exit $?" >> "$OUT/gpu.log"
    tail -40 "$OUT/gpu.log"
    ;;
copymut)
    export GGML_PY_BUILD=$(folder)
    M=ggml_py._transfer:copy_async:skip:ggml_backend_tensor_copy_async#1
    {
        python3 -c 'import sys; sys.path.insert(0, "tools"); import mutants; mutants._write_site()'
        echo "== unmutated, then GGML_PY_MUTANT=$M"
        for mut in "" "$M"; do
            echo "-- mutant: ${mut:-none}"
            GGML_PY_MUTANT=$mut GGML_PY_MUTANT_TOOL=$W/tools/mutants.py \
                PYTHONPATH=$W/.mutants/site:$PYTHONPATH timeout 200 "${PY[@]}" -q -rfE \
                tests/rpc/test_copy.py tests/accel/test_accelerators.py tests/accel/test_metal.py \
                -k "copy" 2>&1 | grep -Ev '^\s*$' | tail -30
        done
    } > "$OUT/copymut.log" 2>&1
    cat "$OUT/copymut.log"
    ;;
cpubuild)
    python3 build_ggml.py --ggml "$REL" --backends cpu,rpc -j "$(nproc)" > "$OUT/cpubuild.log" 2>&1
    echo "build_ggml.py exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/cpubuild.log"
    GGML_PY_BUILD=$W/ggml_py/lib/ggml-$REL-cpu-rpc python3 -m ggml_py 2>&1 | tail -5
    ;;
mapcpu)
    export GGML_PY_BUILD=$W/ggml_py/lib/ggml-$REL-cpu-rpc
    M=/root/mutstate; mkdir -p $M
    python3 tools/mutants.py --list > $M/all.txt 2> $M/list.err; tail -1 $M/list.err
    # the test files of the map (tools/mutants.py's EXCLUDE_TESTS left out), 8 groups by size
    python3 - <<'PY' > $M/groups.txt
import sys; sys.path.insert(0, "tools"); import mutants, pathlib
fs = sorted((p for p in pathlib.Path("tests").rglob("test_*.py") if p.name not in mutants.EXCLUDE_TESTS),
            key=lambda p: -p.stat().st_size)
g = [[] for _ in range(8)]
for i, f in enumerate(fs):
    g[i % 8].append(str(f))
for x in g:
    print(" ".join(x))
PY
    i=0
    while read -r files; do
        i=$((i + 1))
        python3 tools/mutants.py --map-worker $M/map$i.json $files > $OUT/map$i.log 2>&1 &
    done < $M/groups.txt
    wait
    for f in $M/map*.json; do python3 -c "import json,sys; d=json.load(open('$f')); print('$f', len(d['durations']), 'tests,', len(d['failed']), 'failed unmutated')"; done
    cp $M/map*.json $M/all.txt "$OUT/"
    ;;
mutall)
    export GGML_PY_BUILD=$W/ggml_py/lib/ggml-$REL-cpu-rpc
    # idle OpenMP threads sleep: -j jobs of ggml's CPU backend on these cores otherwise spin
    # against each other, and tests time out from load alone
    export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
    M=/root/mutstate; mkdir -p $M
    # a map and a list carried in .gpu-wt/mutstate (made on the session's machine: saves the
    # 551 s mapcpu call): map*.json.gz and all.txt, the mutants this machine is to judge
    C=$(dirname "$PACK")/mutstate
    if [ -d "$C" ] && [ ! -e $M/.carried ]; then
        for f in "$C"/map*.json.gz; do gunzip -c "$f" > "$M/$(basename "${f%.gz}")"; done
        cp "$C/all.txt" $M/all.txt && touch $M/.carried
        echo "carried: $(ls $M/map*.json | wc -l) maps, $(wc -l < $M/all.txt) mutants"
    fi
    touch $M/full.json.partial
    python3 - <<'PY'
import json
done = {json.loads(l)["name"] for l in open("/root/mutstate/full.json.partial") if l.strip()}
names = [n.strip() for n in open("/root/mutstate/all.txt") if n.strip()]
left = [n for n in names if n not in done]
open("/root/mutstate/left.txt", "w").write("\n".join(left) + "\n")
print(len(done), "judged,", len(left), "left")
PY
    maps=(); for f in $M/map*.json; do maps+=(--map "$f"); done
    timeout "${MUTALL_S:-540}" python3 tools/mutants.py "${maps[@]}" --names $M/left.txt \
        --cap 30 --cap2 100 -j "${MUT_JOBS:-14}" --timeout 120 --json $M/full.json \
        > $M/mutall.log 2>&1
    echo "mutants.py exit $?"
    grep -E "^control|^\[" $M/mutall.log | tail -3
    cp $M/full.json.partial "$OUT/full.json.partial"; cp $M/mutall.log "$OUT/mutall-$(date +%s).log"
    wc -l < $M/full.json.partial
    ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
echo "## phase $PHASE: $((SECONDS - t0)) s (total ${SECONDS} s)"
done
