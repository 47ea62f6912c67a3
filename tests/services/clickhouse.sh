#!/usr/bin/env bash
# A private ClickHouse server for tests and CI, on 127.0.0.1 only.
#
#   clickhouse.sh start DIR PORT   data, logs, config and pid file under DIR; HTTP on PORT.
#                                  Returns once the server answers `SELECT 1` (at most
#                                  CLICKHOUSE_START_TIMEOUT s, default 60); a server already
#                                  running from DIR is left as it is.
#   clickhouse.sh stop DIR         stops the server started from DIR and waits for it to exit.
#
# Only the HTTP interface is opened (the stores speak HTTP): no native, interserver or
# MySQL port, so several instances never collide. Users: `default`, and `reader`, read-only.
# CLICKHOUSE_TCP_PORT=N (a free port) also opens the native port N on 127.0.0.1 and defines
# the cluster `test_shard_localhost` (one shard: this server), for Distributed tables.
# Needs clickhouse-server (`make setup`).
set -euo pipefail

usage() { echo "usage: $0 start DIR PORT | stop DIR" >&2; exit 2; }

server_bin() {
    local bin
    for bin in clickhouse-server /usr/sbin/clickhouse-server /usr/bin/clickhouse-server; do
        if command -v "$bin" >/dev/null 2>&1; then command -v "$bin"; return; fi
    done
    echo "clickhouse.sh: clickhouse-server not found; run \`make setup\`" >&2
    exit 1
}

running() {  # the pid in DIR/server.pid names a live clickhouse-server
    local pid
    pid=$(cat "$1/server.pid" 2>/dev/null) || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q clickhouse "/proc/$pid/cmdline" 2>/dev/null
}

answers() {  # SELECT 1 over HTTP returns 1 (python3, not curl: it is always there for the venv)
    python3 - "$1" <<'PY' 2>/dev/null
import sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/?query=SELECT%201", timeout=2) as r:
    sys.exit(0 if r.read().strip() == b"1" else 1)
PY
}

cluster_config() {  # the native port and a one-shard cluster on it, when CLICKHOUSE_TCP_PORT is set
    local tcp=${CLICKHOUSE_TCP_PORT:-}
    [ -n "$tcp" ] || return 0
    cat <<XML
    <tcp_port>$tcp</tcp_port>
    <remote_servers>
        <test_shard_localhost>
            <shard><replica><host>localhost</host><port>$tcp</port></replica></shard>
        </test_shard_localhost>
    </remote_servers>
XML
}

write_config() {
    local dir=$1 port=$2
    mkdir -p "$dir/data" "$dir/tmp" "$dir/user_files" "$dir/format_schemas" "$dir/log"
    cat >"$dir/config.xml" <<XML
<?xml version="1.0"?>
<yandex>
    <logger>
        <level>warning</level>
        <log>$dir/log/clickhouse-server.log</log>
        <errorlog>$dir/log/clickhouse-server.err.log</errorlog>
        <size>10M</size>
        <count>2</count>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <http_port>$port</http_port>
    <max_concurrent_queries>100</max_concurrent_queries>
    <!-- A stop waits for idle keep-alive connections: keep it short. -->
    <keep_alive_timeout>2</keep_alive_timeout>
    <uncompressed_cache_size>67108864</uncompressed_cache_size>
    <mark_cache_size>67108864</mark_cache_size>
    <path>$dir/data/</path>
    <tmp_path>$dir/tmp/</tmp_path>
    <user_files_path>$dir/user_files/</user_files_path>
    <format_schema_path>$dir/format_schemas/</format_schema_path>
    <users_config>$dir/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mlock_executable>false</mlock_executable>
$(cluster_config)
</yandex>
XML
    cat >"$dir/users.xml" <<'XML'
<?xml version="1.0"?>
<yandex>
    <profiles>
        <default>
            <max_memory_usage>2000000000</max_memory_usage>
            <load_balancing>random</load_balancing>
        </default>
        <readonly>
            <readonly>1</readonly>
        </readonly>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks><ip>127.0.0.1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
        <!-- A read-only user: what a monitor or an analysis is often given. -->
        <reader>
            <password></password>
            <networks><ip>127.0.0.1</ip></networks>
            <profile>readonly</profile>
            <quota>default</quota>
        </reader>
    </users>
    <quotas>
        <default>
            <interval>
                <duration>3600</duration>
                <queries>0</queries>
                <errors>0</errors>
                <result_rows>0</result_rows>
                <read_rows>0</read_rows>
                <execution_time>0</execution_time>
            </interval>
        </default>
    </quotas>
</yandex>
XML
}

start() {
    local dir port bin deadline
    [ $# -eq 2 ] || usage
    mkdir -p "$1"
    dir=$(cd "$1" && pwd)
    port=$2
    [[ $port =~ ^[0-9]+$ ]] || { echo "clickhouse.sh: PORT must be a number, got '$port'" >&2; exit 2; }
    [[ ${CLICKHOUSE_TCP_PORT:-0} =~ ^[0-9]+$ ]] || {
        echo "clickhouse.sh: CLICKHOUSE_TCP_PORT must be a number, got '$CLICKHOUSE_TCP_PORT'" >&2; exit 2; }
    if running "$dir"; then
        answers "$port" && exit 0
    else
        bin=$(server_bin)
        write_config "$dir" "$port"
        # setsid: the server outlives this script and is not hit by the caller's ^C.
        setsid "$bin" --config-file="$dir/config.xml" >"$dir/log/stdout.log" 2>&1 </dev/null &
        echo $! >"$dir/server.pid"
    fi
    deadline=$((SECONDS + ${CLICKHOUSE_START_TIMEOUT:-60}))
    until answers "$port"; do
        if ! running "$dir"; then
            echo "clickhouse.sh: server exited during start; last log lines:" >&2
            tail -n 20 "$dir/log/clickhouse-server.err.log" "$dir/log/stdout.log" 2>/dev/null >&2 || true
            exit 1
        fi
        if [ $SECONDS -ge $deadline ]; then
            echo "clickhouse.sh: no answer on 127.0.0.1:$port within ${CLICKHOUSE_START_TIMEOUT:-60} s" >&2
            exit 1
        fi
        sleep 0.2
    done
}

stop() {
    local dir pid i
    [ $# -eq 1 ] || usage
    [ -d "$1" ] || exit 0
    dir=$(cd "$1" && pwd)
    running "$dir" || { rm -f "$dir/server.pid"; exit 0; }
    pid=$(cat "$dir/server.pid")
    kill -TERM "$pid"
    for i in $(seq 1 150); do  # up to 30 s for a clean shutdown, then force
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" && sleep 0.2
    rm -f "$dir/server.pid"
}

cmd=${1:-}
shift || true
case "$cmd" in
    start) start "$@" ;;
    stop) stop "$@" ;;
    *) usage ;;
esac
