#!/usr/bin/env bash
# The lead's final GPU check (one call): tests with and without numba, benchmarks, pipeline, demo, examples.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl-dask/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
o=/tmp/fc; mkdir -p $o; t0=$SECONDS
step() { echo; echo "== [$((SECONDS - t0))s] $*"; }
step "GPU suite, numba-cuda installed"
timeout 150 python3 -m pytest -m gpu tests/gpu tests/contract tests/reliability/test_gpu.py -q -rs -p no:cacheprovider > $o/pytest.txt 2>&1; tail -4 $o/pytest.txt
step "GPU suite, numba hidden"
PYTHONPATH=$PWD/scripts/no_numba:$PYTHONPATH timeout 120 python3 -m pytest -m gpu tests/gpu tests/contract tests/reliability/test_gpu.py -q -rs -p no:cacheprovider > $o/pytest-nonumba.txt 2>&1; tail -2 $o/pytest-nonumba.txt
step "bench_pipeline (all jobs)"
timeout 150 python3 benchmarks/bench_pipeline.py --backend cuda --profile --out $o --name pipeline 2>&1 | tail -32
step "benchmarks/run (core, latency, throughput...)"
timeout 150 python3 benchmarks/run --backend cuda --name run --out $o 2>&1 | tail -30
step "bench_rmm"
timeout 60 python3 benchmarks/bench_rmm.py 5 2>&1 | tee $o/rmm.md | tail -20
step "demo, default size"
timeout 90 python3 -m aiocubie demo --backend cuda --no-progress 2>&1 | tail -3
step "demo, 640 MiB budget, 8 Mi runs"
timeout 90 python3 -m aiocubie demo --backend cuda --no-progress --budget 671088640 --runs 8388608 2>&1 | tail -3
step "examples"
for ex in examples/*.py; do case "$ex" in */test_*|*/cubie_pipeline.py) continue ;; esac
  timeout 60 python3 "$ex" $o/x.png >> $o/ex.txt 2>&1; echo "$ex rc=$?"; done
step "done"; rm -f $o/x.png; tar czf $OUT/final.tgz -C /tmp fc
