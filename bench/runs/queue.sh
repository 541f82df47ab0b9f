#!/bin/bash
# Runs the tiny-world variants over seeds 0-2 with the code of commit $REV (a worktree at $SRC), workdirs under
# $OUT, and copies each finished run's records into this directory; a run whose records are here is skipped.
#   REV=a55b3ca SRC=/tmp/b17/src OUT=/tmp/b17 nohup bench/runs/queue.sh > /tmp/queue.out 2>&1 &
set -u
RECORDS=$(cd "$(dirname "$0")" && pwd)
REV=${REV:-a55b3ca}; SRC=${SRC:-/tmp/b17/src}; OUT=${OUT:-/tmp/b17}
[ -d "$SRC" ] || git -C "$RECORDS/../.." worktree add -q "$SRC" "$REV"
cd "$SRC"
save() {  # OUTNAME CFGNAME SEED
  local src=$OUT/$1/$2/seed$3 dst=$RECORDS/$1/$2/seed$3
  mkdir -p "$dst"
  for d in sft grpo ppo; do
    if [ -f "$src/$d/metrics.jsonl" ]; then mkdir -p "$dst/$d"; cp "$src/$d/metrics.jsonl" "$dst/$d/"; fi
  done
  cp "$src/wall_s.json" "$src/config.json" "$dst/" 2>/dev/null
}
one() {  # OUTNAME CONFIG SEED [-- overrides]
  local out=$1 cfg=$2 seed=$3; shift 3
  local name; name=$(basename "$cfg" .py)
  [ -f "$RECORDS/$out/$name/seed$seed/wall_s.json" ] && return
  echo "$(date +%T) start $out $name seed$seed" >> "$OUT/queue.log"
  python bench/tiny_world.py --configs "$cfg" --seeds "$seed" --out "$OUT/$out" "$@" > "$OUT/log.$out.$name.$seed" 2>&1
  echo "$(date +%T) end rc=$? $out $name seed$seed" >> "$OUT/queue.log"
  save "$out" "$name" "$seed"
}
mkdir -p "$OUT"
for cfg in tiny_cpu tiny_cpu_eka; do for seed in 0 1 2; do one papers_settings configs/$cfg.py $seed; done; done
for seed in 0 1 2; do one papers_settings_p0 configs/tiny_cpu_eka.py $seed -- --config.sft.use_p0=True; done
for cfg in tiny_cpu_rsearch tiny_cpu_ppo tiny_cpu_soar; do
  for seed in 0 1 2; do one papers_settings configs/$cfg.py $seed; done
done
echo "$(date +%T) all done" >> "$OUT/queue.log"
