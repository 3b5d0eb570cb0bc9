#!/usr/bin/env bash
# Where an import's peak memory goes (issue 22): pipes the seeded workload of LINKS links (one
# account per 500) into `backlinks import -` under `perf record` of its mapping calls only (mmap
# and mremap with DWARF stacks; munmap, brk and the mprotect/madvise that grow and shrink glibc's
# arenas), reads VmHWM every 0.1 s beside it, then replays the calls (scripts/memtrace.py): the
# mapped total at its peak, by allocating stack. The binary sets MALLOC_MMAP_THRESHOLD_ to 1 MiB,
# so every block of 1 MiB or more is a mapping of its own; smaller ones show as arena growth.
# Unlike heaptrack it leaves the import's rate alone, so the moments that set the peak still come.
#
#   scripts/memtrace.sh 250000000
#
# Environment: OUT (default a temporary directory), SEED (1), BINARIES (a directory holding
# backlinks and backlinks-workload; default: build them), TOP (25 stacks).
# Needs perf (with access to syscall tracepoints) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
LINKS=${1:?usage: scripts/memtrace.sh LINKS}
OUT=${OUT:-$(mktemp -d -t backlinks-memtrace.XXXXXX)}
SEED=${SEED:-1}
if [ -z "${BINARIES:-}" ]; then
  cargo build --release --bins >&2
  BINARIES=target/release
fi
BIN=$(cd "$BINARIES" && pwd)
rm -rf "$OUT/data"
mkdir -p "$OUT"

sample_peak() {
  local pid
  until pid=$(pgrep -n -f -- "^$BIN/backlinks import - --data-dir $OUT/data"); do sleep 0.1; done
  while [ -r "/proc/$pid/status" ]; do
    awk -v now="$(date +%s.%N)" '/VmHWM/ { printf "%.1f\t%d\n", now, $2 }' "/proc/$pid/status" 2>/dev/null || true
    sleep 0.1
  done
}
sample_peak > "$OUT/vmhwm.tsv" &
sampler=$!

"$BIN/backlinks-workload" --seed "$SEED" --links "$LINKS" --accounts $((LINKS / 500)) |
  RUST_LOG=info NO_COLOR=1 perf record -q -o "$OUT/maps.data" \
    -e 'syscalls:sys_enter_mmap/call-graph=dwarf,stack-size=32768/' -e syscalls:sys_exit_mmap \
    -e 'syscalls:sys_enter_mremap/call-graph=dwarf,stack-size=32768/' -e syscalls:sys_exit_mremap \
    -e syscalls:sys_enter_munmap -e syscalls:sys_exit_brk -e syscalls:sys_enter_mprotect \
    -e syscalls:sys_enter_madvise \
    -- "$BIN/backlinks" import - --data-dir "$OUT/data" > "$OUT/import.json" 2> "$OUT/import.log"
wait "$sampler" || true

awk 'NR == 1 { start = $1 } $2 > peak { peak = $2; at = $1 - start }
     END { printf "VmHWM %.1f MiB, last risen at +%.1f s\n", peak / 1024, at }' "$OUT/vmhwm.tsv"
perf script -i "$OUT/maps.data" -F tid,time,event,trace,ip,sym 2> /dev/null > "$OUT/maps.txt"
python3 scripts/memtrace.py "$OUT/maps.txt" "${TOP:-25}"
echo "memtrace: files in $OUT" >&2
