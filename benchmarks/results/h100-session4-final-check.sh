#!/usr/bin/env bash
# The lead's final GPU check, session 4 (one call): GPU suites with and without numba, bench_pipeline three times (stream), the
# batch stream's host cost on the VM's CPU, benchmarks/run (single-request figures), the demo, the examples.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
o=/tmp/fc4; mkdir -p $o; t0=$SECONDS
step() { echo; echo "== [$((SECONDS - t0))s] $*"; }
step "GPU suite, numba-cuda installed"
timeout 220 python3 -m pytest -m gpu tests/gpu tests/contract tests/reliability/test_gpu.py -q -rs -p no:cacheprovider > $o/pytest.txt 2>&1; tail -n 2 $o/pytest.txt
step "GPU suite, numba hidden"
PYTHONPATH=$PWD/scripts/no_numba:$PYTHONPATH timeout 120 python3 -m pytest -m gpu tests/gpu tests/contract tests/reliability/test_gpu.py -q -rs -p no:cacheprovider > $o/pytest-nonumba.txt 2>&1; tail -n 1 $o/pytest-nonumba.txt
step "bench_pipeline (all jobs)"
timeout 150 python3 benchmarks/bench_pipeline.py --backend cuda --out $o --name pipeline 2>&1 | tail -24
step "bench_pipeline, stream and pageable again"
timeout 120 python3 benchmarks/bench_pipeline.py --backend cuda --only pageable --only stream --out $o --name pipeline2 2>&1 | tail -18
step "bench_pipeline, stream a third time"
timeout 100 python3 benchmarks/bench_pipeline.py --backend cuda --only stream --out $o --name pipeline3 2>&1 | tail -14
step "bench_stream_host (the VM's CPU, no GPU work)"
timeout 100 python3 benchmarks/bench_stream_host.py --rounds 2 --out $o/stream-host.json 2>&1 | tail -8
step "benchmarks/run (core, latency)"
timeout 120 python3 benchmarks/run --backend cuda --only core --only latency --name run --out $o 2>&1 | tail -24
step "demo, default size"
timeout 90 python3 -m aiocubie demo --backend cuda --no-progress 2>&1 | tail -3
step "examples"
for ex in examples/*.py; do case "$ex" in */test_*|*/cubie_pipeline.py) continue ;; esac
  timeout 60 python3 "$ex" $o/x.png >> $o/ex.txt 2>&1; echo "$ex rc=$?"; done
step "done"; rm -f $o/x.png; tar czf $OUT/final.tgz -C /tmp fc4
