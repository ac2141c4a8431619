#!/usr/bin/env bash
# Issue 37, CPU: each benchmark on the tree after the change and the tree before it (aa67e83, its own
# scripts), alternating, in one run.
set -u
ROOT=/work/main
PY=$ROOT/.venv/bin/python
mkdir -p /tmp/cur/inferwatch
for d in cli common exporter instrumentation monitor bench dashboards alerts; do ln -sfn "$ROOT/$d" /tmp/cur/inferwatch/$d; done
BASE=$ROOT/.device/base
after() { (cd $ROOT && PYTHONPATH=/tmp/cur:$ROOT "$PY" "$@"); }
before() { (cd $BASE && PYTHONPATH=$BASE/pkg:$BASE "$PY" "$@"); }
for round in 1 2; do
  after tests/benchmarks/host_costs.py > /tmp/bench37/host-after-$round.txt 2>&1
  before tests/benchmarks/host_costs.py > /tmp/bench37/host-before-$round.txt 2>&1
  after tests/benchmarks/hook_cost.py --model tiny-llama --device cpu --static --repeats 10 --new-tokens 256 > /tmp/bench37/hook-static-after-$round.txt 2>&1
  before tests/benchmarks/hook_cost.py --model tiny-llama --device cpu --static --repeats 10 --new-tokens 256 > /tmp/bench37/hook-static-before-$round.txt 2>&1
  after tests/benchmarks/hook_cost.py --model tiny-llama --device cpu --repeats 10 --new-tokens 128 > /tmp/bench37/hook-dynamic-after-$round.txt 2>&1
  before tests/benchmarks/hook_cost.py --model tiny-llama --device cpu --repeats 10 --new-tokens 128 > /tmp/bench37/hook-dynamic-before-$round.txt 2>&1
  after tests/benchmarks/cpu_overhead.py --json /tmp/bench37/cpu-after-$round.json > /tmp/bench37/cpu-after-$round.txt 2>&1
  before tests/benchmarks/cpu_overhead.py --json /tmp/bench37/cpu-before-$round.json > /tmp/bench37/cpu-before-$round.txt 2>&1
done
echo done > /tmp/bench37/DONE
