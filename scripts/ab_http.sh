#!/usr/bin/env bash
# A/B of two `backlinks` binaries under the warm HTTP load of scripts/bench.sh, alternating
# A, B, A, B... so that the machine's drift (steal time, other tenants) hits both alike. One run
# of each is not enough on a shared 2-core VM: single runs of one binary spread by +-10 %.
#
#   scripts/ab_http.sh BIN_A BIN_B BENCH_DIR [ROUNDS]     (ROUNDS default 5)
#
# BENCH_DIR is a directory left by `scripts/bench.sh` (its data/ index and targets.txt).
# Environment: CONNECTIONS (32), LOAD_SECONDS (15), WARMUP (5).
# Prints one line per run and, per binary, the median q/s and server CPU µs per query.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN_A=$1
BIN_B=$2
BENCH_DIR=$3
ROUNDS=${4:-5}
CONNECTIONS=${CONNECTIONS:-32}
LOAD_SECONDS=${LOAD_SECONDS:-15}
WARMUP=${WARMUP:-5}
SUITE=$(cargo bench --bench suite --no-run --message-format=json 2>/dev/null |
    jq -r 'select(.reason == "compiler-artifact" and .target.name == "suite" and .executable != null) | .executable' |
    tail -n 1)
OUT=$(mktemp -d -t backlinks-ab.XXXXXX)
SERVE_PID=
# However the script ends, no server is left holding the index's lock.
trap '[ -n "$SERVE_PID" ] && kill "$SERVE_PID" 2>/dev/null; rm -rf "$OUT"' EXIT

# One load phase against a fresh `serve` of BIN; appends its JSON line to $OUT/LABEL.jsonl.
run_once() {
    local label=$1 bin=$2
    "$bin" serve --no-ingest --listen 127.0.0.1:0 --data-dir "$BENCH_DIR/data" >"$OUT/serve.out" 2>/dev/null &
    SERVE_PID=$!
    for _ in $(seq 1 600); do
        grep -q "listening on" "$OUT/serve.out" && break
        sleep 0.1
    done
    local addr
    addr=$(sed -n 's/^listening on http:\/\///p' "$OUT/serve.out")
    "$SUITE" http "$addr" "$BENCH_DIR/targets.txt" --connections "$CONNECTIONS" --seconds "$LOAD_SECONDS" \
        --warmup "$WARMUP" --server-pid "$SERVE_PID" |
        jq -c --arg name "$label" '{"binary": $name, qps: .queries_per_sec, p99_us: .p99_us,
            server_us_per_query: (1e6 * .server_cpu_seconds / .queries)}' | tee -a "$OUT/$label.jsonl"
    kill "$SERVE_PID"
    wait "$SERVE_PID" 2>/dev/null || true
    SERVE_PID=
}

for round in $(seq 1 "$ROUNDS"); do
    echo "round $round of $ROUNDS" >&2
    run_once A "$BIN_A"
    run_once B "$BIN_B"
done
for label in A B; do
    jq -s --arg name "$label" '
        def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
        {"binary": $name, runs: length, median_qps: (map(.qps) | median | round),
         median_server_us_per_query: (map(.server_us_per_query) | median * 10 | round / 10)}' "$OUT/$label.jsonl"
done
