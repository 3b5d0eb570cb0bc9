#!/usr/bin/env bash
# Latency of the many-to-many endpoints on an index the scale benchmark left: serves DATA (no
# ingest), asks getManyToMany and getManyToManyCounts for each post among TARGETS (the scale
# run's targets.txt: replies to threads rooted at the post, with their parents), twice, and prints
# p50 / p99 / max per pass (curl's own time included) and how many items or groups were found.
#
#   scripts/many_to_many.sh BACKLINKS DATA TARGETS [COUNT]
#
# e.g. scripts/many_to_many.sh target/release/backlinks $SCALE_DIR/10000000/data \
#          $SCALE_DIR/10000000/targets.txt 500
# Needs curl and jq.
set -euo pipefail
BIN=$(realpath "$1") data=$(realpath "$2") targets=$(realpath "$3") count=${4:-500}
cd "$(dirname "$0")/.."
work=$(mktemp -d -t backlinks-m2m.XXXXXX)
source scripts/lib/serve.sh
start_serve "$work/serve.out" --no-ingest --data-dir "$data"
trap 'kill $SERVE_PID 2>/dev/null; rm -rf "$work"' EXIT
addr=$ADDR
{ grep "/app.bsky.feed.post/" "$targets" || true; } | head -n "$count" >"$work/posts"
for endpoint in getManyToMany getManyToManyCounts; do
    for pass in first second; do
        : >"$work/times"
        found=0
        while read -r post; do
            curl -s -o "$work/body" -w '%{time_total}\n' -G "http://$addr/xrpc/blue.microcosm.links.$endpoint" \
                --data-urlencode "subject=$post" --data-urlencode "source=app.bsky.feed.post:reply.root.uri" \
                --data-urlencode "pathToOther=reply.parent.uri" --data-urlencode "limit=100" >>"$work/times"
            found=$((found + $(jq '(.items // .counts_by_other_subject) | length' "$work/body")))
        done <"$work/posts"
        sort -n "$work/times" | awk -v e="$endpoint" -v p="$pass" -v found="$found" '{ t[NR] = $1 }
            END { printf "%s, %s pass: %d requests, p50 %.2f ms, p99 %.2f ms, max %.2f ms; %d items or groups\n",
                  e, p, NR, t[int(NR * 0.5)] * 1000, t[int(NR * 0.99)] * 1000, t[NR] * 1000, found }'
    done
done
