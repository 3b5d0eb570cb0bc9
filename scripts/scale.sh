#!/usr/bin/env bash
# The scale benchmark (issue 22): for each SIZE (links), pipe the seeded workload at the network's
# density (one account per ACCOUNT_LINKS links; ACCOUNTS=N overrides) into `backlinks import -`
# with a fresh data directory and a local-directory bucket, then measure the import, the bytes it
# left (bucket and local), a warm and a cold query load, and a fresh replica. Prints one markdown
# table row per size and keeps every figure in $SCALE_DIR/<size>/*.json (each tree's current
# tables, their entries and bytes, in trees.tsv).
#
#   scripts/scale.sh 10000000 100000000 1000000000
#
# Environment: SCALE_DIR (default a temporary directory), SEED (1), ACCOUNT_LINKS (500),
# ACCOUNTS (fixed account count, e.g. 40000000), TARGETS (3000 query targets), LOAD_SECONDS (20),
# RTT_MS (20, the cold phase), RSS_EVERY (2, seconds between the import's memory samples),
# BINARIES (a directory holding backlinks, backlinks-workload and suite; default: build them).
#
# Write amplification is the bytes the import wrote to the file system (local tables, state and,
# with a local-directory bucket, the uploads) over the live bucket bytes it left.
# Needs jq, zstd, sqlite3, bc, curl, shuf and GNU time.
set -euo pipefail
cd "$(dirname "$0")/.."

SCALE_DIR=${SCALE_DIR:-$(mktemp -d -t backlinks-scale.XXXXXX)}
SEED=${SEED:-1}
ACCOUNT_LINKS=${ACCOUNT_LINKS:-500}
TARGET_COUNT=${TARGETS:-3000}
SECONDS_PER_PHASE=${LOAD_SECONDS:-20}
RTT_MS=${RTT_MS:-20}
RSS_EVERY=${RSS_EVERY:-2}
step() { echo "scale: $*" >&2; }

scripts/private-binaries.sh "$SCALE_DIR/bin" "${BINARIES:-}"
BIN="$SCALE_DIR/bin/backlinks"
WORKLOAD="$SCALE_DIR/bin/backlinks-workload"
SUITE="$SCALE_DIR/bin/suite"

bytes_of() { find "$@" -type f -printf '%s\n' 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'; }
seconds_of() { awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; print s }'; }
# Peak RSS (VmHWM, KiB) of a running process.
peak_kib() { awk '/VmHWM/ { print $2 }' "/proc/$1/status"; }

# The import's memory every RSS_EVERY seconds, to set its peak beside the progress lines and
# merges in import.log: seconds, anonymous and file-backed resident KiB, and the high-water mark
# so far (VmHWM), whose rises place the short spikes that samples of the RSS miss.
sample_rss() {
    local pid="" started
    started=$(date +%s)
    until pid=$(pgrep -n -f -- "^$BIN import - --data-dir $1"); do sleep 0.2; done
    echo -e "seconds\tanon_kib\tfile_kib\thwm_kib"
    while [ -r "/proc/$pid/status" ]; do
        awk -v s="$(( $(date +%s) - started ))" '/RssAnon/ { a = $2 } /RssFile/ { f = $2 } /VmHWM/ { h = $2 }
            END { if (a) printf "%d\t%d\t%d\t%d\n", s, a, f, h }' "/proc/$pid/status" 2>/dev/null || true
        sleep "$RSS_EVERY"
    done
}

source scripts/lib/serve.sh

for size in "$@"; do
    dir="$SCALE_DIR/$size"
    rm -rf "$dir"
    mkdir -p "$dir"
    accounts=${ACCOUNTS:-$(( size / ACCOUNT_LINKS > 1000 ? size / ACCOUNT_LINKS : 1000 ))}
    generate=("$WORKLOAD" --seed "$SEED" --links "$size" --accounts "$accounts")
    data="$dir/data"

    step "$size links, $accounts accounts: import"
    sample_rss "$data" >"$dir/rss.tsv" &
    sampler=$!
    # Progress lines (every 30 s) give the rate over the run's last tenth. The timer wraps the
    # import alone: around the whole pipeline its peak RSS would be the larger of the two, and
    # the generator's filter of pairs is larger than the import from a few hundred million links.
    "${generate[@]}" 2>"$dir/workload.json" |
        RUST_LOG=info NO_COLOR=1 /usr/bin/time -v -o "$dir/import.time" "$BIN" import - --data-dir "$data" \
            >"$dir/import.json" 2>"$dir/import.log"
    # The import has exited: a sampler still looking for it (an import that failed at once) or
    # between samples stops here.
    kill "$sampler" 2>/dev/null || true
    wait "$sampler" 2>/dev/null || true
    wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$dir/import.time" | seconds_of)
    rss_kib=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$dir/import.time")
    fs_blocks=$(sed -n 's/.*File system outputs: //p' "$dir/import.time")
    # `events=N elapsed_ms=M` from the progress lines (every 30 s): the rate between the last
    # line at or before 90 % of the events and the last line (the whole run's rate when the
    # import took less than a minute). The time after the last event read (the final flush,
    # merges and uploads) is in the whole run's rate only.
    lines=$(jq .lines "$dir/import.json")
    last_tenth=$(sed 's/\x1b\[[0-9;]*m//g' "$dir/import.log" | sed -n 's/.*events=\([0-9]*\) elapsed_ms=\([0-9]*\).*/\1 \2/p' |
        awk -v lines="$lines" -v wall="$wall" '
            $1 <= 0.9 * lines { e = $1; t = $2 } { last_e = $1; last_t = $2 }
            END { if (last_t > t) printf "%.0f", (last_e - e) * 1000 / (last_t - t); else printf "%.0f", lines / wall }')
    runs=$(jq .runs "$dir/import.json")

    step "$size: bytes"
    # Live bytes: the tables the catalog holds as current (retired ones wait out the GC grace
    # period in the bucket, counted in bucket_total), the outline ranges and the manifest.
    tables_live=$(sqlite3 "$data/state/state.db" "select coalesce(sum(data_len + meta_len), 0) from tables where obsolete_at is null")
    manifest=$(find "$data/bucket/manifests" -name "$(cat "$data/bucket/CURRENT")" -printf '%s')
    # The account log objects the current manifest names (a snapshot, then ranges of changes).
    account_keys=$(zstd -dc "$data/bucket/manifests/$(cat "$data/bucket/CURRENT")" |
        jq -r '.accounts // empty | [("snapshot-\(.snapshot.through)"), (.changes[] | "changes-\(.after)-\(.through)")][]' |
        awk -F- '{ if ($1 == "snapshot") printf "snapshot-%016x\n", $2; else printf "changes-%016x-%016x\n", $2, $3 }')
    account_log=0
    for key in $account_keys; do account_log=$((account_log + $(stat -c %s "$data/bucket/accounts/$key"))); done
    account_ranges=$(echo "$account_keys" | grep -c '^changes-' || true)
    manifests_kept=$(find "$data/bucket/manifests" -type f | wc -l)
    bucket=$((tables_live + $(bytes_of "$data/bucket/outlines") + manifest + account_log))
    bucket_total=$(bytes_of "$data/bucket")
    metas=$(bytes_of "$data"/state/tables/*/*.meta)
    cache=$(bytes_of "$data"/state/tables/*/*.data)
    outlines=$(bytes_of "$data"/outlines.*) # outlines.db with its WAL, and the fingerprint table
    state=$(bytes_of "$data"/state/state.db*)
    links=$(jq .links "$dir/workload.json")
    # Each tree's current tables: what the bucket's bytes are made of, and its bytes per entry.
    sqlite3 -header -separator $'\t' "$data/state/state.db" \
        "select tree, count(distinct run_id) as runs, count(*) as tables, sum(entries) as entries,
                sum(data_len) as data_bytes, sum(meta_len) as meta_bytes,
                round(1.0 * sum(data_len + meta_len) / max(sum(entries), 1), 2) as bytes_per_entry
         from tables where obsolete_at is null group by tree" >"$dir/trees.tsv"

    step "$size: query targets"
    # Targets of every popularity: the subjects of the workload's first events (regenerated: the
    # same flags give the same bytes), distinct, shuffled with the seed.
    "${generate[@]}" 2>/dev/null | head -n 400000 |
        jq -r 'select(.kind == "commit") | .commit.record.subject | if type == "object" then .uri else . end // empty' 2>/dev/null |
        awk 'NF && !seen[$0]++' | shuf --random-source=<(yes "$SEED") -n "$TARGET_COUNT" >"$dir/targets.txt" || true

    step "$size: warm load over HTTP"
    start_serve "$dir/serve.out" --no-ingest --data-dir "$data"
    "$SUITE" http "$ADDR" "$dir/targets.txt" --connections 32 --seconds "$SECONDS_PER_PHASE" --warmup 5 \
        --server-pid "$SERVE_PID" >"$dir/http.json"
    "$SUITE" http "$ADDR" "$dir/targets.txt" --connections 2 --seconds "$SECONDS_PER_PHASE" --warmup 5 \
        --server-pid "$SERVE_PID" >"$dir/http_latency.json"
    serve_peak=$(peak_kib "$SERVE_PID")
    kill "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null || true

    step "$size: cold queries from the bucket, $RTT_MS ms per request"
    "$SUITE" cold "$data" "$dir/targets.txt" --rtt-ms "$RTT_MS" --queries 200 >"$dir/cold.json"

    step "$size: a fresh replica"
    replica="$dir/replica"
    rm -rf "$replica"
    started=$(date +%s.%N)
    start_serve "$dir/replica.out" --read-only --data-dir "$replica" --store "file://$data/bucket"
    first_target=$(head -n 1 "$dir/targets.txt")
    query="/xrpc/blue.cerulea.backlinks.listBacklinks?target=$(jq -rn --arg t "$first_target" '$t | @uri')"
    until curl -fsS "http://$ADDR$query" >"$dir/replica_first.json" 2>/dev/null; do sleep 0.05; done
    first_answer=$(echo "$(date +%s.%N) - $started" | bc)
    "$SUITE" http "$ADDR" "$dir/targets.txt" --connections 2 --seconds 5 --warmup 0 --server-pid "$SERVE_PID" \
        >"$dir/replica_http.json"
    replica_peak=$(peak_kib "$SERVE_PID")
    kill "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null || true
    start_serve "$dir/writer_again.out" --no-ingest --data-dir "$data"
    curl -fsS "http://$ADDR$query" >"$dir/writer_first.json"
    kill "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null || true
    same=$(cmp -s "$dir/replica_first.json" "$dir/writer_first.json" && echo yes || echo NO)

    jq -n --argjson size "$size" --argjson accounts "$accounts" --argjson links "$links" --argjson wall "$wall" \
        --argjson lines "$lines" --argjson last "$last_tenth" --argjson rss "$rss_kib" \
        --argjson manifest "$manifest" --argjson manifests_kept "$manifests_kept" --argjson manifests_all "$(bytes_of "$data/bucket/manifests")" \
        --argjson account_log "$account_log" --argjson account_ranges "$account_ranges" \
        --argjson fs "$((fs_blocks * 512))" --argjson runs "$runs" --argjson bucket "$bucket" --argjson bucket_total "$bucket_total" --argjson metas "$metas" \
        --argjson cache "$cache" --argjson outlines "$outlines" --argjson state "$state" \
        --argjson serve_peak "$serve_peak" --argjson first "$first_answer" --argjson replica_peak "$replica_peak" \
        --arg same "$same" --slurpfile h "$dir/http.json" --slurpfile hl "$dir/http_latency.json" \
        --slurpfile cold "$dir/cold.json" '
        {size: $size, accounts: $accounts, links_written: $links,
         import_events_per_sec: ($lines / $wall), import_last_tenth_events_per_sec: $last,
         import_peak_rss_mib: ($rss / 1024), write_amplification: ($fs / $bucket), runs_at_end: $runs,
         bucket_bytes_per_link: ($bucket / $links), bucket_total_bytes_per_link: ($bucket_total / $links),
         manifest_bytes: $manifest, manifests_kept: $manifests_kept, manifests_kept_bytes: $manifests_all,
         account_log_bytes: $account_log, account_log_ranges: $account_ranges,
         local_bytes_per_link: {metas: ($metas / $links), outlines: ($outlines / $links), state: ($state / $links),
                                data_cache: ($cache / $links)},
         serve_peak_rss_mib: ($serve_peak / 1024),
         warm_32_qps: $h[0].queries_per_sec, warm_2_p50_us: $hl[0].p50_us, warm_2_p99_us: $hl[0].p99_us,
         cold: $cold[0], replica_first_answer_secs: $first, replica_peak_rss_mib: ($replica_peak / 1024),
         replica_first_answer_correct: $same}' >"$dir/figures.json"
    jq -r '"| \(.size) | \(.accounts) | \(.import_events_per_sec | round) (last tenth \(.import_last_tenth_events_per_sec)) | \(.import_peak_rss_mib | round) MiB | \(.bucket_bytes_per_link * 100 | round / 100) | \(.local_bytes_per_link.metas + .local_bytes_per_link.outlines + .local_bytes_per_link.state | . * 100 | round / 100) | \(.serve_peak_rss_mib | round) MiB | \(.warm_32_qps | round) | \(.warm_2_p50_us) / \(.warm_2_p99_us) µs | \(.replica_first_answer_secs * 10 | round / 10) s, \(.replica_peak_rss_mib | round) MiB, \(.replica_first_answer_correct) |"' \
        "$dir/figures.json"
done
