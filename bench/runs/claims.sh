#!/bin/bash
# The claims' runs (bench/claims.py): the six configs of its comparisons over seeds 0-2, by two
# workers each pinned to one core (the tiny model's steps are mostly XLA:CPU per-op overhead: a tiny_cpu run took
# 14-17 min on one core beside another, 16-18 min alone on both in earlier sets). Each runs the code of REV in a
# worktree under $OUT, and the run records REV (wall_s.json) for the record; a run finished
# under $OUT or recorded in bench/runs/claims/seeds.csv is skipped and a stopped one resumes, so a stopped queue,
# or another machine's, continues where the last one was:
#   REV=$(git rev-parse --short HEAD) OUT=/tmp/claims setsid nohup bench/runs/claims.sh > /tmp/claims.out 2>&1 &
# (CONFIGS="tiny_cpu tiny_cpu_eka" SEEDS="3 4" CORES=1: other configs, seeds or cores)
# then fold the finished runs into the record git keeps (what other machines ran is kept):
#   python bench/claims.py --runs $OUT/out --record bench/runs/claims
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/claims}
REV=${REV:-$(git -C "$ROOT" rev-parse --short HEAD)}
SRC=$OUT/src_$REV
RECORD=$ROOT/bench/runs/claims/seeds.csv
# config by config, cheapest comparisons first: EKA and R-Search against Search-R1 (14-23 min a run on one core,
# AMD EPYC), then SOAR (57-59 min) and the Graph-R1 setting (1.5-3 h a run on shared cores, earlier sets)
CONFIGS=${CONFIGS:-tiny_cpu tiny_cpu_eka tiny_cpu_rsearch tiny_cpu_soar tiny_cpu_graphr1 tiny_cpu_eka_graphr1}
SEEDS=${SEEDS:-0 1 2}
CORES=${CORES:-0 1}  # one worker per core
mkdir -p "$OUT/out"
[ -d "$SRC" ] || git -C "$ROOT" worktree add -q "$SRC" "$REV"
worker() {  # CORE
  for cfg in $CONFIGS; do
    for seed in $SEEDS; do
      (  # a run held by the other worker is skipped; the lock dies with its holder
        flock -n 9 || exit 0
        [ -d "$OUT/out/$cfg/seed$seed/grpo/params" ] && exit 0
        grep -q "^$cfg,$seed," "$RECORD" 2>/dev/null && exit 0  # recorded by an earlier machine
        echo "$(date +%T) core$1 start $cfg seed$seed" >> "$OUT/queue.log"
        (cd "$SRC" && PYTHONPATH=$SRC taskset -c "$1" python bench/tiny_world.py --configs "configs/$cfg.py" \
          --seeds "$seed" --out "$OUT/out") > "$OUT/log.$cfg.$seed" 2>&1
        echo "$(date +%T) core$1 end rc=$? $cfg seed$seed" >> "$OUT/queue.log"
      ) 9> "$OUT/lock.$cfg.$seed"
    done
  done
}
for core in $CORES; do worker "$core" & done
wait
echo "$(date +%T) all done" >> "$OUT/queue.log"
