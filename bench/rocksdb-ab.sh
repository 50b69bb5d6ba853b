#!/usr/bin/env bash
# `make bench-rocksdb`: the prebuilt RocksDB (rocksdbjni's library, what every build links; see
# docs/building.md) against the bundled one compiled from source (ROCKSDB_COMPILE=1), on the
# state-store work stage 1 does, in one run on one machine: stage 1's restore of a changelog
# (`likes-tools bench restore`) and the topology's drain of a backlog (`likes-tools bench
# topology`, likes alone). Rounds alternate A and B so that the box's drift falls on both;
# the ratio is prebuilt / bundled per round, reported as the median with min-max.
#
# Environment: ROUNDS (3), RESTORE_RECORDS (2000000), DRAIN_EVENTS (1000000),
# LIKES_CACHE (~/.cache/likes). Needs the stack up (make up). The bundled build lives in its
# own target dir ($LIKES_CACHE/target-rocksdb-source), so neither build undoes the other;
# its first build compiles RocksDB's C++ at -O3 (15-20 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${LIKES_CACHE:-$HOME/.cache/likes}
rounds=${ROUNDS:-3}
records=${RESTORE_RECORDS:-2000000}
events=${DRAIN_EVENTS:-1000000}
prebuilt_dir=${CARGO_TARGET_DIR:-$cache/target}
source_dir=$cache/target-rocksdb-source
out=$cache/bench-rocksdb
mkdir -p "$out"
say() { printf 'bench-rocksdb: %s\n' "$*"; }

say "building both (release): prebuilt RocksDB into $prebuilt_dir, bundled into $source_dir"
stack/rocksdb.sh
CARGO_TARGET_DIR=$prebuilt_dir cargo build --release --workspace --bins
ROCKSDB_COMPILE=1 CARGO_TARGET_DIR=$source_dir cargo build --release --workspace --bins
for d in "$prebuilt_dir" "$source_dir"; do
  say "$("$d/release/likes" --version | tail -1)"
done

run() { # run KIND BUILD ROUND
  local kind=$1 build=$2 round=$3 dir log
  if [[ $build == prebuilt ]]; then dir=$prebuilt_dir; else dir=$source_dir; fi
  log=$out/$kind-$build-$round.log
  case $kind in
    restore) "$dir/release/likes-tools" bench restore --records "$records" --repeats 1 >"$log" 2>&1 ;;
    drain) "$dir/release/likes-tools" bench topology --events "$events" --no-peer --no-recovery \
      --live-fractions 0.5 --live-seconds 2 --out "$out/json-$build-$round" >"$log" 2>&1 ;;
  esac || { tail -20 "$log"; say "$kind with the $build build failed (log: $log)"; exit 1; }
  case $kind in
    # "restore bench: repeat 1: bare read N in X s, restore N in Y s" -> Y (seconds)
    restore) sed -n 's/.*restore [0-9]* in \([0-9.]*\) s$/\1/p' "$log" | tail -1 ;;
    # "bench: topology drained N records in X s: R/s ..." -> R (events/s)
    drain) sed -n 's/.*topology drained [0-9]* records in [0-9.]* s: \([0-9]*\)\/s.*/\1/p' "$log" | tail -1 ;;
  esac
}

declare -a restore_ratio drain_ratio
for r in $(seq 1 "$rounds"); do
  # A then B in odd rounds, B then A in even ones: neither build always goes first.
  if ((r % 2)); then order=(prebuilt bundled); else order=(bundled prebuilt); fi
  declare -A rs=() dr=()
  for b in "${order[@]}"; do
    rs[$b]=$(run restore "$b" "$r")
    dr[$b]=$(run drain "$b" "$r")
    say "round $r, $b: restore of $records records ${rs[$b]} s; drain of $events events ${dr[$b]} events/s"
  done
  # Restore: time, so bundled/prebuilt (> 1: prebuilt faster). Drain: rate, prebuilt/bundled.
  restore_ratio+=("$(python3 -c "print(${rs[bundled]} / ${rs[prebuilt]})")")
  drain_ratio+=("$(python3 -c "print(${dr[prebuilt]} / ${dr[bundled]})")")
done

summary() {
  python3 - "$@" <<'EOF'
import statistics, sys
v = sorted(float(x) for x in sys.argv[2:])
print(f"{sys.argv[1]}: {statistics.median(v):.2f} ({v[0]:.2f}-{v[-1]:.2f}), {len(v)} rounds")
EOF
}
say "prebuilt over bundled, > 1 means the prebuilt library is faster (median, min-max):"
summary "  restore speed (bundled s / prebuilt s)" "${restore_ratio[@]}" | tee "$out/summary.txt"
summary "  drain rate (prebuilt /s / bundled /s) " "${drain_ratio[@]}" | tee -a "$out/summary.txt"
