#!/usr/bin/env bash
# A throwaway single-node Garage (an S3-compatible object store) for the tests.
#
#   scripts/garage.sh start DIR   start Garage with its config, data and log under DIR, create the
#                                 bucket and key "backlinks-test", and write DIR/env: export lines
#                                 for AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
#                                 AWS_REGION and BACKLINKS_TEST_S3_BUCKET.
#   scripts/garage.sh stop DIR    stop the Garage started in DIR.
#
# Installs Garage with `cargo install garage --locked` when it is not on PATH or in ~/.cargo/bin
# (waiting for an install already running instead of starting a second one). Every step that fails
# says which one and shows the end of the Garage log; a Garage that cannot start fails the caller.
set -euo pipefail

readonly NAME=backlinks-test              # the bucket and the key
readonly START_TIMEOUT_SECS=60            # for the server to answer, and for the bucket to be usable
readonly INSTALL_WAIT_SECS=7200           # for someone else's `cargo install garage`

DIR=""

die() {
    echo "garage.sh: $*" >&2
    if [[ -n "$DIR" && -s "$DIR/garage.log" ]]; then
        echo "garage.sh: --- last lines of $DIR/garage.log ---" >&2
        tail -n 30 "$DIR/garage.log" >&2
    fi
    exit 1
}

usage() {
    echo "usage: $0 start DIR | stop DIR" >&2
    exit 2
}

find_garage() {
    if command -v garage >/dev/null 2>&1; then
        GARAGE=$(command -v garage)
    elif [[ -x "$HOME/.cargo/bin/garage" ]]; then
        GARAGE="$HOME/.cargo/bin/garage"
    else
        return 1
    fi
}

ensure_garage() {
    if find_garage; then return; fi
    local waited=0
    while pgrep -f "cargo install garage" >/dev/null; do
        if ((waited >= INSTALL_WAIT_SECS)); then
            die "a running 'cargo install garage' did not finish within ${INSTALL_WAIT_SECS}s"
        fi
        if ((waited % 60 == 0)); then
            echo "garage.sh: waiting for a running 'cargo install garage' to finish" >&2
        fi
        sleep 5
        waited=$((waited + 5))
    done
    if find_garage; then return; fi
    echo "garage.sh: installing Garage: cargo install garage --locked (slow, once)" >&2
    cargo install garage --locked >&2 || die "'cargo install garage --locked' failed"
    find_garage || die "garage is neither on PATH nor in ~/.cargo/bin after installing it"
}

# Three free loopback ports (bound at once, so they differ; released just before Garage binds them).
free_ports() {
    python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
'
}

# run STEP COMMAND...: runs a garage CLI command; on failure says which step failed and why.
run() {
    local step=$1 output
    shift
    if ! output=$("$@" 2>&1); then
        echo "$output" >&2
        die "step '$step' failed: $*"
    fi
    printf '%s\n' "$output"
}

write_config() {
    local rpc_port=$1 s3_port=$2 admin_port=$3 rpc_secret
    rpc_secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
    [[ ${#rpc_secret} -eq 64 ]] || die "could not draw a 64-hex-digit rpc_secret"
    # Written 0600: it holds the rpc secret.
    (
        umask 077
        cat >"$CONF" <<EOF
metadata_dir = "$DIR/meta"
data_dir = "$DIR/data"
db_engine = "sqlite"
replication_factor = 1
metadata_fsync = false
data_fsync = false
rpc_bind_addr = "127.0.0.1:$rpc_port"
rpc_public_addr = "127.0.0.1:$rpc_port"
rpc_secret = "$rpc_secret"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$s3_port"

[admin]
api_bind_addr = "127.0.0.1:$admin_port"
EOF
    )
}

server_alive() {
    kill -0 "$(cat "$DIR/garage.pid")" 2>/dev/null
}

wait_for_node_id() {
    local deadline=$((SECONDS + START_TIMEOUT_SECS))
    until NODE=$("$GARAGE" -c "$CONF" node id -q 2>>"$DIR/cli.log"); do
        server_alive || die "the garage server exited during startup"
        ((SECONDS < deadline)) || die "garage did not answer 'node id' within ${START_TIMEOUT_SECS}s"
        sleep 0.2
    done
}

# Waits until an endpoint of the server (named `$2`: "S3 API", "RPC") accepts TCP connections.
wait_for_port() {
    local port=$1 name=$2 deadline=$((SECONDS + START_TIMEOUT_SECS))
    until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
        server_alive || die "the garage server exited before its $name came up"
        ((SECONDS < deadline)) || die "the $name on port $port did not come up within ${START_TIMEOUT_SECS}s"
        sleep 0.2
    done
}

start() {
    local begun=$SECONDS ports rpc_port s3_port admin_port node_id key_id secret_key
    ensure_garage
    if [[ -f "$DIR/garage.pid" ]] && server_alive; then
        die "a garage server started from $DIR is already running (pid $(cat "$DIR/garage.pid"))"
    fi
    mkdir -p "$DIR/meta" "$DIR/data" || die "cannot create $DIR/meta and $DIR/data"
    ports=$(free_ports) || die "could not find free loopback ports (python3 needed)"
    read -r rpc_port s3_port admin_port <<<"$ports"
    CONF="$DIR/garage.toml"
    write_config "$rpc_port" "$s3_port" "$admin_port"

    NO_COLOR=1 "$GARAGE" -c "$CONF" server >"$DIR/garage.log" 2>&1 &
    echo $! >"$DIR/garage.pid"
    wait_for_node_id
    node_id=${NODE%%@*}
    [[ -n "$node_id" ]] || die "'garage node id -q' printed no node id: $NODE"
    # `node id` reads the node's key file; the layout commands need the RPC listener, which may
    # come up after it.
    wait_for_port "$rpc_port" RPC

    run "layout assign" "$GARAGE" -c "$CONF" layout assign -z dc1 -c 1G "$node_id" >/dev/null
    run "layout apply" "$GARAGE" -c "$CONF" layout apply --version 1 >/dev/null
    run "key create" "$GARAGE" -c "$CONF" key create "$NAME" >/dev/null
    key_id=$(run "key info (id)" "$GARAGE" -c "$CONF" key info "$NAME" --key-id)
    secret_key=$(run "key info (secret)" "$GARAGE" -c "$CONF" key info "$NAME" --secret-key)
    [[ "$key_id" =~ ^GK[0-9a-f]+$ ]] || die "unexpected key id from 'garage key info': $key_id"
    [[ "$secret_key" =~ ^[0-9a-f]+$ ]] || die "unexpected secret key from 'garage key info'"
    run "bucket create" "$GARAGE" -c "$CONF" bucket create "$NAME" >/dev/null
    run "bucket allow" "$GARAGE" -c "$CONF" bucket allow --read --write --owner "$NAME" --key "$NAME" >/dev/null
    wait_for_port "$s3_port" "S3 API"

    (
        umask 077
        cat >"$DIR/env" <<EOF
export AWS_ENDPOINT_URL=http://127.0.0.1:$s3_port
export AWS_ACCESS_KEY_ID=$key_id
export AWS_SECRET_ACCESS_KEY=$secret_key
export AWS_REGION=garage
export BACKLINKS_TEST_S3_BUCKET=$NAME
EOF
    )
    echo "garage.sh: Garage is up on http://127.0.0.1:$s3_port (started in $((SECONDS - begun))s); env in $DIR/env" >&2
}

stop() {
    local pid waited=0
    [[ -f "$DIR/garage.pid" ]] || return 0
    pid=$(cat "$DIR/garage.pid")
    # Only signal the process if it is still our garage (the pid may have been reused).
    if [[ "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" == *"garage"*"server"* ]]; then
        kill "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null && ((waited < 50)); do
            sleep 0.2
            waited=$((waited + 1))
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -9 "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$DIR/garage.pid"
}

[[ $# -eq 2 ]] || usage
DIR=$(realpath -m "$2")
case "$1" in
start) start ;;
stop) stop ;;
*) usage ;;
esac
