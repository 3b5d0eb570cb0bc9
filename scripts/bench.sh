#!/usr/bin/env bash
# The benchmarks of issue 7, side by side on ONE generated workload (see BENCHMARKS.md).
#
#   scripts/bench.sh [LINKS]        (default 10000000: a 10 M-link index)
#
# Environment: BENCH_DIR (work directory, default a fresh one under $TMPDIR or /tmp; it holds the
# workload, the index and the SQLite baseline: about 1 KiB per link), SEED (1), CONNECTIONS (32,
# the throughput phases), LATENCY_CONNECTIONS (2, the HTTP latency phase),
# LOAD_SECONDS (20, per load phase), WARMUP (5), RTT_MS (20, injected per object-store request),
# COLD_QUERIES (200), KEEP_BASELINE (1: reuse the workload and SQLite baseline already in
# BENCH_DIR, made by an earlier run with the same LINKS and SEED), BENCH_BINARIES (a directory
# holding backlinks, backlinks-workload and suite from an earlier run's BENCH_DIR/bin: measure
# those instead of building this tree, to compare two versions on one workload).
#
# Steps: generate the workload (backlinks-workload), time a bare serde_json parse of it, import it
# with the real binary under /usr/bin/time -v (events/s, peak RSS, bytes written), load the same
# file into SQLite, pick query targets with 1..=100 live backlinks, check that both give the same
# answers, measure the bucket and the filters, then warm load over HTTP against `backlinks serve`,
# the same load in-process and on SQLite, and cold queries from the bucket with injected latency.
# Every figure lands in $BENCH_DIR/*.json and a summary in $BENCH_DIR/summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."

LINKS=${1:-10000000}
SEED=${SEED:-1}
CONNECTIONS=${CONNECTIONS:-32}
LATENCY_CONNECTIONS=${LATENCY_CONNECTIONS:-2}
SECONDS_PER_PHASE=${LOAD_SECONDS:-20}
WARMUP=${WARMUP:-5}
RTT_MS=${RTT_MS:-20}
COLD_QUERIES=${COLD_QUERIES:-200}
BENCH_DIR=${BENCH_DIR:-$(mktemp -d -t backlinks-bench.XXXXXX)}
mkdir -p "$BENCH_DIR"
echo "bench: $LINKS links in $BENCH_DIR" >&2

scripts/private-binaries.sh "$BENCH_DIR/bin" "${BENCH_BINARIES:-}"
SUITE="$BENCH_DIR/bin/suite"
BIN="$BENCH_DIR/bin/backlinks"
WORKLOAD="$BENCH_DIR/workload.jsonl"
DATA="$BENCH_DIR/data"
DB="$BENCH_DIR/baseline.db"
TARGETS="$BENCH_DIR/targets.txt"

step() { echo "bench: $*" >&2; }

reuse() { [ "${KEEP_BASELINE:-0}" = 1 ] && [ -s "$BENCH_DIR/sqlite_load.json" ]; }

if reuse; then
    step "reusing the workload and the SQLite baseline in $BENCH_DIR"
else
    step "generating the workload"
    "$BENCH_DIR/bin/backlinks-workload" --seed "$SEED" --links "$LINKS" --out "$WORKLOAD" 2>"$BENCH_DIR/workload.json"
fi

# CPU seconds (user + system) from a /usr/bin/time -v report.
cpu_seconds() { awk -F': ' '/User time|System time/ { s += $2 } END { print s }' "$1"; }

step "bare serde_json parse"
/usr/bin/time -v "$SUITE" parse "$WORKLOAD" >"$BENCH_DIR/parse.json" 2>"$BENCH_DIR/parse.time"
jq --argjson cpu "$(cpu_seconds "$BENCH_DIR/parse.time")" '. + {cpu_seconds: $cpu, events_per_cpu_sec: (.events / $cpu)}' \
    "$BENCH_DIR/parse.json" >"$BENCH_DIR/parse.tmp" && mv "$BENCH_DIR/parse.tmp" "$BENCH_DIR/parse.json"

step "backlinks import (the real binary, under /usr/bin/time -v)"
rm -rf "$DATA"
/usr/bin/time -v "$BIN" import --data-dir "$DATA" "$WORKLOAD" >"$BENCH_DIR/import.json" 2>"$BENCH_DIR/import.time"
wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$BENCH_DIR/import.time" |
    awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; print s }')
rss_kib=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$BENCH_DIR/import.time")
fs_blocks=$(sed -n 's/.*File system outputs: //p' "$BENCH_DIR/import.time")
jq -n --argjson wall "$wall" --argjson rss "$rss_kib" --argjson blocks "$fs_blocks" \
    --argjson cpu "$(cpu_seconds "$BENCH_DIR/import.time")" --argjson load "$(cut -d' ' -f1 /proc/loadavg)" \
    --slurpfile report "$BENCH_DIR/import.json" \
    '{seconds: $wall, lines: $report[0].lines, events_per_sec: ($report[0].lines / $wall),
      cpu_seconds: $cpu, events_per_cpu_sec: ($report[0].lines / $cpu), load_average_after: $load,
      peak_rss_mib: ($rss / 1024), fs_bytes_written: ($blocks * 512), compactions: $report[0].compactions}' \
    >"$BENCH_DIR/import_figures.json"

if ! reuse; then
    step "SQLite baseline load"
    rm -f "$DB" "$DB-wal" "$DB-shm" "$BENCH_DIR/sqlite_load.json"
    "$SUITE" sqlite-load "$WORKLOAD" "$DB" >"$BENCH_DIR/sqlite_load.tmp"
    mv "$BENCH_DIR/sqlite_load.tmp" "$BENCH_DIR/sqlite_load.json"
fi

step "query targets, answer check, bucket, filters"
"$SUITE" targets "$DB" "$TARGETS" --seed "$SEED" >"$BENCH_DIR/targets.json"
"$SUITE" check "$DATA" "$DB" "$TARGETS" >"$BENCH_DIR/check.json"
"$SUITE" bucket "$DATA" "$DB" --fs-written "$(jq .fs_bytes_written "$BENCH_DIR/import_figures.json")" \
    >"$BENCH_DIR/bucket.json"
"$SUITE" filter "$DATA" >"$BENCH_DIR/filter.json"

step "warm load over HTTP against backlinks serve"
source scripts/lib/serve.sh
start_serve "$BENCH_DIR/serve.out" --no-ingest --data-dir "$DATA"
trap 'kill "$SERVE_PID" 2>/dev/null || true' EXIT
LOAD=(--connections "$CONNECTIONS" --seconds "$SECONDS_PER_PHASE" --warmup "$WARMUP")
"$SUITE" http "$ADDR" "$TARGETS" "${LOAD[@]}" --server-pid "$SERVE_PID" >"$BENCH_DIR/http.json"
# Latency without a queue: at 32 connections on 2 cores a query mostly waits for the others, so
# its p99 measures the queue; with LATENCY_CONNECTIONS it measures the query.
"$SUITE" http "$ADDR" "$TARGETS" --connections "$LATENCY_CONNECTIONS" --seconds "$SECONDS_PER_PHASE" \
    --warmup "$WARMUP" --server-pid "$SERVE_PID" >"$BENCH_DIR/http_latency.json"
kill "$SERVE_PID"
wait "$SERVE_PID" 2>/dev/null || true
trap - EXIT

step "the same load in-process and on SQLite"
"$SUITE" inproc "$DATA" "$TARGETS" "${LOAD[@]}" >"$BENCH_DIR/inproc.json"
"$SUITE" sqlite-query "$DB" "$TARGETS" "${LOAD[@]}" >"$BENCH_DIR/sqlite_query.json"

step "cold queries from the bucket, ${RTT_MS} ms per request"
"$SUITE" cold "$DATA" "$TARGETS" --rtt-ms "$RTT_MS" --queries "$COLD_QUERIES" >"$BENCH_DIR/cold.json"

jq -n -r \
    --slurpfile w "$BENCH_DIR/workload.json" --slurpfile p "$BENCH_DIR/parse.json" \
    --slurpfile i "$BENCH_DIR/import_figures.json" --slurpfile sl "$BENCH_DIR/sqlite_load.json" \
    --slurpfile t "$BENCH_DIR/targets.json" --slurpfile c "$BENCH_DIR/check.json" \
    --slurpfile b "$BENCH_DIR/bucket.json" --slurpfile f "$BENCH_DIR/filter.json" \
    --slurpfile h "$BENCH_DIR/http.json" --slurpfile hl "$BENCH_DIR/http_latency.json" \
    --slurpfile ip "$BENCH_DIR/inproc.json" \
    --slurpfile sq "$BENCH_DIR/sqlite_query.json" --slurpfile cold "$BENCH_DIR/cold.json" '
  def r(x): (x * 100 | round) / 100;
  def ok(x): if x then "met" else "MISSED" end;
  [ "| figure | backlinks | SQLite baseline | ratio (backlinks / SQLite) | goal |",
    "|---|--:|--:|--:|---|",
    "| workload: events / links written / live links | \($w[0].events) / \($w[0].links) / \($b[0].live_links) | same file | | |",
    "| bare serde_json parse, events/s | \(r($p[0].events_per_sec)) | | | |",
    "| import, events/s (wall, whole command) | \(r($i[0].events_per_sec)) = \(r(100 * $i[0].events_per_sec / $p[0].events_per_sec)) % of parse | \(r($sl[0].events_per_sec)) | \(r($i[0].events_per_sec / $sl[0].events_per_sec)) | >= 50 % of parse: \(ok($i[0].events_per_sec >= 0.5 * $p[0].events_per_sec)) |",
    "| import, events per CPU-second (both threads) vs parse per CPU-second | \(r($i[0].events_per_cpu_sec)) = \(r(100 * $i[0].events_per_cpu_sec / $p[0].events_per_cpu_sec)) % of \(r($p[0].events_per_cpu_sec)) | | | |",
    "| peak RSS during import, MiB | \(r($i[0].peak_rss_mib)) | | | <= 300: \(ok($i[0].peak_rss_mib <= 300)) |",
    "| bucket bytes per live link | \(r($b[0].bytes_per_live_link)) (links \(r($b[0].link_tables_per_live_link)), revocations \(r($b[0].revocation_tables_per_live_link)), outlines \(r($b[0].outlines_per_live_link))) | \(r($sl[0].db_bytes / $sl[0].live_links)) (database file) | \(r($b[0].bytes_per_live_link / ($sl[0].db_bytes / $sl[0].live_links))) | <= 12: \(ok($b[0].bytes_per_live_link <= 12)) |",
    "| write amplification: table bytes written / live | \(r($b[0].lsm_write_amplification)) | | | |",
    "| write amplification: bytes written to disk by import / bucket bytes | \(r($b[0].fs_write_amplification)) | | | |",
    "| warm listBacklinks over HTTP, \($h[0].connections) connections: q/s | \(r($h[0].queries_per_sec)) | | | >= 20,000: \(ok($h[0].queries_per_sec >= 20000)) |",
    "| warm listBacklinks over HTTP, \($h[0].connections) connections (queued): p50 / p99 µs | \($h[0].p50_us) / \($h[0].p99_us) | | | |",
    "| warm listBacklinks over HTTP, \($hl[0].connections) connections: p50 / p99 µs, q/s | \($hl[0].p50_us) / \($hl[0].p99_us), \(r($hl[0].queries_per_sec)) | | | p99 <= 1,000: \(ok($hl[0].p99_us <= 1000)) |",
    "| warm over HTTP: CPU µs per query (server + client) and the rate 2 idle cores sustain | \(r($h[0].cpu_us_per_query)) µs, \(r($h[0].cpu_bound_queries_per_sec_2_cores)) q/s | | | |",
    "| warm, in-process, \($ip[0].connections) clients: q/s | \(r($ip[0].queries_per_sec)) | \(r($sq[0].queries_per_sec)) | \(r($ip[0].queries_per_sec / $sq[0].queries_per_sec)) | |",
    "| warm, in-process: p50 / p99 µs | \($ip[0].p50_us) / \($ip[0].p99_us) | \($sq[0].p50_us) / \($sq[0].p99_us) | \(r($ip[0].p99_us / $sq[0].p99_us)) (p99) | |",
    "| warm, in-process: CPU µs per query | \(r($ip[0].cpu_us_per_query)) | \(r($sq[0].cpu_us_per_query)) | \(r($ip[0].cpu_us_per_query / $sq[0].cpu_us_per_query)) | |",
    "| mean links per page (targets with 1..=100 backlinks) | \(r($h[0].mean_links_per_page)) | \(r($sq[0].mean_links_per_page)) | | |",
    "| cold listBacklinks, \($cold[0].rtt_ms) ms per request: p50 / p99 ms | \(r($cold[0].p50_ms)) / \(r($cold[0].p99_ms)) = \(r($cold[0].p50_over_rtt)) RTT (p50) | | | p50 <= 2.5 RTT: \(ok($cold[0].p50_over_rtt <= 2.5)) |",
    "| cold: most serial rounds (histogram 0/1/2/3/4+) | \($cold[0].max_serial_rounds) (\($cold[0].rounds_histogram_0_1_2_3_4plus | map(tostring) | join("/"))) | | | <= 2: \(ok($cold[0].max_serial_rounds <= 2)) |",
    "| filter lookup ns, wall (as queries probe: batches of \($f[0].prefetch_batch) prefetched / one at a time, hash precomputed / with xxh3-128) | \(r($f[0].ns_per_lookup_prefetched)) / \(r($f[0].ns_per_lookup_prehashed)) / \(r($f[0].ns_per_lookup_with_hash)) | | | <= 20: \(ok($f[0].ns_per_lookup_prefetched <= 20)) |",
    "| filter lookup ns, thread CPU time (the same three) | \(r($f[0].cpu_ns_per_lookup_prefetched)) / \(r($f[0].cpu_ns_per_lookup_prehashed)) / \(r($f[0].cpu_ns_per_lookup_with_hash)) | | | |",
    "| filter false-positive rate (target \($f[0].fpr_target)) | \($f[0].fpr_measured * 10000 | round / 100) % over \($f[0].tables) tables | | | within 20 %: \(ok($f[0].fpr_ratio >= 0.8 and $f[0].fpr_ratio <= 1.2)) |",
    "| answers: targets whose page differs from SQLite | \($c[0].differing) of \($c[0].compared) | | | |",
    "| machine load average (1 min) after import / during HTTP load / during filter | \($i[0].load_average_after) / \($h[0].load_average) / \($f[0].load_average) | | | |"
  ] | .[]' | tee "$BENCH_DIR/summary.md"
