#!/bin/bash
# Runs the tiny-world variants over seeds 0-2, each set with the code of its commit (a worktree per commit under
# $OUT), workdirs under $OUT, and copies each finished run's logs into this directory (SET/CONFIG/seedS/, ignored
# by git); a run whose logs are here is skipped, so a new machine continues where the last one stopped. At the end
# it writes each set's seeds.csv and table.md (the files git keeps) from those logs:
#   OUT=/tmp/b17 setsid nohup bench/runs/queue.sh > /tmp/queue.out 2>&1 < /dev/null &
# Started twice, two workers share the queue (each run is locked by the worker that runs it).
set -u
RECORDS=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/b17}
PAPERS_REV=a55b3ca  # papers_settings/, papers_settings_p0/: issues 14 and 16
GRAPH_REV=8704de9   # graph_r1/: issue 18's Graph-R1 and EKA-on-Graph-R1 miniatures (graph_r1_21f7e9a/: the
#                     runs before EKA's SFT start took its Graph-R1 tags); 1f75269's fixes plus SFT checkpoints,
#                     so a run stopped with the machine continues where it was
ENGINE_REV=de36fb8  # engine/: the main job with issue 17's engine as on main (decode slots sharing a group's
#                     prefill) against papers_settings/tiny_cpu
worktree() {  # REV DIR
  git -C "$RECORDS/../.." worktree prune
  [ -d "$2" ] || git -C "$RECORDS/../.." worktree add -q "$2" "$1"
}
save() {  # OUTNAME CFGNAME SEED
  local src=$OUT/$1/$2/seed$3 dst=$RECORDS/$1/$2/seed$3
  mkdir -p "$dst"
  for d in sft grpo ppo; do
    if [ -f "$src/$d/metrics.jsonl" ]; then mkdir -p "$dst/$d"; cp "$src/$d/metrics.jsonl" "$dst/$d/"; fi
  done
  cp "$src/wall_s.json" "$src/config.json" "$dst/" 2>/dev/null
}
one() {  # SRC OUTNAME CONFIG SEED [-- overrides]
  local src=$1 out=$2 cfg=$3 seed=$4; shift 4
  local name; name=$(basename "$cfg" .py)
  [ -f "$RECORDS/$out/$name/seed$seed/wall_s.json" ] && return
  (  # a run held by another worker is skipped; the lock dies with its holder
    flock -n 9 || exit 0
    echo "$(date +%T) start $out $name seed$seed" >> "$OUT/queue.log"
    (cd "$src" && python bench/tiny_world.py --configs "$cfg" --seeds "$seed" --out "$OUT/$out" "$@") \
      > "$OUT/log.$out.$name.$seed" 2>&1
    local rc=$?  # before $(date) resets it
    echo "$(date +%T) end rc=$rc $out $name seed$seed" >> "$OUT/queue.log"
    [ $rc -eq 0 ] && save "$out" "$name" "$seed"
  ) 9> "$OUT/lock.$out.$name.$seed"
}
mkdir -p "$OUT"
PAPERS=$OUT/src GRAPH=$OUT/src_$GRAPH_REV ENGINE=$OUT/src_$ENGINE_REV
worktree $PAPERS_REV "$PAPERS"
worktree $GRAPH_REV "$GRAPH"
worktree $ENGINE_REV "$ENGINE"
# what closes an issue first: the papers' settings (14, 16), the Graph-R1 miniatures (18), the engine's curves
# (17), then the P0 study's seeds (seed 0 of an earlier commit is in RESULTS)
for cfg in tiny_cpu tiny_cpu_eka tiny_cpu_rsearch tiny_cpu_ppo tiny_cpu_soar; do
  for seed in 0 1 2; do one "$PAPERS" papers_settings configs/$cfg.py $seed; done
done
for cfg in tiny_cpu_graphr1 tiny_cpu_eka_graphr1; do
  for seed in 0 1 2; do one "$GRAPH" graph_r1 configs/$cfg.py $seed; done
done
for seed in 0 1 2; do one "$ENGINE" engine configs/tiny_cpu.py $seed; done
for seed in 0 1 2; do one "$PAPERS" papers_settings_p0 configs/tiny_cpu_eka.py $seed -- --config.sft.use_p0=True; done
# the per-seed summaries and tables that git keeps (seeds.csv, table.md), by this checkout's bench/tiny_world.py
TAB="python $RECORDS/../tiny_world.py --no-run --seeds 0 1 2"
(cd "$RECORDS/../.." &&
  $TAB --commit $PAPERS_REV --out bench/runs/papers_settings --configs configs/tiny_cpu.py configs/tiny_cpu_eka.py \
    configs/tiny_cpu_rsearch.py configs/tiny_cpu_ppo.py configs/tiny_cpu_soar.py &&
  $TAB --commit $PAPERS_REV --out bench/runs/papers_settings_p0 --configs configs/tiny_cpu_eka.py &&
  $TAB --commit $GRAPH_REV --out bench/runs/graph_r1 --configs configs/tiny_cpu_graphr1.py configs/tiny_cpu_eka_graphr1.py &&
  $TAB --commit $ENGINE_REV --out bench/runs/engine --configs configs/tiny_cpu.py) > "$OUT/tables.log" 2>&1
echo "$(date +%T) all done" >> "$OUT/queue.log"
