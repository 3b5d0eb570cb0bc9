# Sourced by the benchmark scripts: start_serve OUT ARGS... runs `$BIN serve --listen
# 127.0.0.1:0 ARGS...` in the background with its standard output in OUT, waits (up to five
# minutes) for its `listening on` line, and sets SERVE_PID and ADDR (host:port).
start_serve() {
    local out="$1"; shift
    "$BIN" serve --listen 127.0.0.1:0 "$@" >"$out" 2>/dev/null &
    SERVE_PID=$!
    for _ in $(seq 1 3000); do
        grep -q "listening on" "$out" 2>/dev/null && break
        sleep 0.1
    done
    ADDR=$(sed -n 's/^listening on http:\/\///p' "$out")
}
