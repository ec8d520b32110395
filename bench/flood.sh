#!/usr/bin/env bash
# Floods a pgwake of its own with silent sockets (connections that never
# send a startup packet) and reports a real client's connect latency and
# pgwake's memory before, during and after, and how many log lines the flood
# cost. Local backend: no Docker needed. See bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${FLOOD_N:-19000}"
tmp="$(mktemp -d /tmp/pgwake-flood.XXXXXX)"
chmod 755 "$tmp" # the postgres user must reach its data directory when run as root
pid=""
cleanup() {
	if [[ -n "$pid" ]]; then
		PGWAKE_STATE_DIR="$tmp/state" "$tmp/pgwake" down --volumes >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
	fi
	if [[ "${BENCH_KEEP:-0}" != 1 ]]; then rm -rf "$tmp"; else echo "kept $tmp" >&2; fi
}
trap cleanup EXIT

go build -o "$tmp/pgwake" ./cmd/pgwake
go build -o "$tmp/flood" ./bench/flood
export PGWAKE_STATE_DIR="$tmp/state"
port=$((20000 + RANDOM % 20000))
"$tmp/pgwake" up --backend local --listen "127.0.0.1:$port" --sleep-after 0 >"$tmp/pgwake.log" 2>&1 &
pid=$!
for _ in $(seq 1 200); do
	"$tmp/pgwake" ls >/dev/null 2>&1 && break
	sleep 0.1
done
"$tmp/pgwake" create flood >/dev/null
url="$("$tmp/pgwake" url flood)"
"$tmp/pgwake" wake flood >/dev/null

rss() { awk '/VmRSS/{print $2}' "/proc/$pid/status"; }
fds() { ls "/proc/$pid/fd" | wc -l; }
idle="$(rss)"
lines_before="$(wc -l <"$tmp/pgwake.log")"
(while kill -0 "$pid" 2>/dev/null; do rss >>"$tmp/rss"; fds >>"$tmp/fds"; sleep 0.2; done) &
sampler=$!

echo "# pgwake flood: $n silent sockets, max_startup_connections default, $(nproc) CPUs, commit $(git rev-parse --short HEAD)"
"$tmp/flood" -addr "127.0.0.1:$port" -url "$url" -n "$n"
after="$(rss)"
sleep 30
after30="$(rss)"
kill "$sampler" 2>/dev/null || true
peak="$(sort -n "$tmp/rss" | tail -1)"
peakfds="$(sort -n "$tmp/fds" | tail -1)"
lines="$(($(wc -l <"$tmp/pgwake.log") - lines_before))"
echo "pgwake rss_kib idle=$idle peak=$peak right_after=$after after_30s=$after30 peak_fds=$peakfds log_lines_during_flood=$lines"
