#!/usr/bin/env bash
# pgwake soak: random clients across many projects for a long time, each
# project falling asleep and being woken over and over; then every row is
# counted and the daemon's goroutines, file descriptors and RSS are held
# against what they were before. See bench/README.md ("Soak").
#
# Usage: bench/soak.sh         (as root or a user in the docker group)
# Tunables (environment): BENCH_SOAK (seconds, 1800), BENCH_SOAK_PROJECTS
# (20), BENCH_SOAK_CLIENTS (8), BENCH_SOAK_PAUSE (a client's longest pause
# between connections, 8s), PGWAKETEST_IMAGE, BENCH_KEEP=1.
#
# Writes bench/results-soak.md; exits non-zero when a row is missing, a
# client failed, or goroutines or descriptors did not come back.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

SOAK="${BENCH_SOAK:-1800}"
NPROJ="${BENCH_SOAK_PROJECTS:-20}"
CLIENTS="${BENCH_SOAK_CLIENTS:-8}"
PAUSE="${BENCH_SOAK_PAUSE:-8s}"
IMAGE="${PGWAKETEST_IMAGE:-pgwake-test/postgres:15}"

# shellcheck source=bench/lib.sh
source "$here/lib.sh"
need_tools "$PSQL" docker go jq curl

api() { curl -sf --unix-socket "$PGWAKE_STATE_DIR/pgwake.sock" "http://pgwake$1"; }
goroutines() { api /metrics | awk '$1 == "go_goroutines" {print $2}'; }
fds_of() { ls "/proc/$1/fd" | wc -l; }
awake_count() { "$PGWAKE" ls --json | jq '[.[] | select(.state != "sleeping")] | length'; }
# all_asleep: waits until no project is awake and none has a connection.
all_asleep() {
	local i
	for i in $(seq 1200); do
		[[ "$(awake_count)" -eq 0 ]] && return 0
		sleep 0.1
	done
	die "projects still awake after 120 s: $("$PGWAKE" ls)"
}
# fd_kinds PID: the daemon's descriptors by kind (socket, pipe, anon_inode
# for epoll, files), "kind count" per line.
fd_kinds() { find "/proc/$1/fd" -mindepth 1 -printf '%l\n' | sed -E 's/:\[.*//; s@^/.*@file@' | sort | uniq -c | awk '{printf "%s %s, ", $2, $1}'; }
pipes_of() { find "/proc/$1/fd" -mindepth 1 -printf '%l\n' | grep -c '^pipe:' || true; }
# snapshot: goroutines, descriptors other than pipes, RSS KiB, pipes. The
# relay keeps up to 64 empty pipes (128 descriptors) on a free list for
# the next message, however many connections come and go, so pipes are
# counted apart and held against that bound.
snapshot() {
	local p
	p="$(pipes_of "$daemon_pid")"
	echo "$(goroutines) $(($(fds_of "$daemon_pid") - p)) $(rss_kib "$daemon_pid") $p"
}

log "building pgwake and soak"
(cd "$root" && go build -o "$work/pgwake" ./cmd/pgwake && go build -o "$work/soak" ./bench/soak)
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
	"$root/testdata/postgres-image/build.sh" "$IMAGE" >/dev/null
fi
port="$(free_port)"
"$PGWAKE" up -d --wait --listen "127.0.0.1:$port" 2>/dev/null
daemon_pid="$(api /v1/info | jq -r .pid)"
instance="$(jq -r .instance "$PGWAKE_STATE_DIR/state.json")"

log "creating $NPROJ projects (sleep after 3 s; stop, pause and tiered in turn)"
: >"$work/urls.txt"
modes=(stop pause tiered)
for i in $(seq "$NPROJ"); do
	name="$(printf 's%02d' "$i")"
	"$PGWAKE" create "$name" --no-port --sleep-after 3s --sleep-mode "${modes[$((i % 3))]}" --stop-after 5s >/dev/null
	u="$("$PGWAKE" url "$name")"
	"$PSQL" "$u" -qAtc 'create table soak(id bigserial primary key, at timestamptz default now())' >/dev/null
	echo "$u" >>"$work/urls.txt"
done
all_asleep
read -r g0 f0 r0 p0 < <(snapshot)
log "baseline, all asleep: $g0 goroutines, $f0 fds and $p0 pipe fds, RSS $r0 KiB ($(fd_kinds "$daemon_pid"))"

log "soak: $CLIENTS clients for ${SOAK}s"
s="$(now_ms)"
"$work/soak" -urls "$work/urls.txt" -duration "${SOAK}s" -clients "$CLIENTS" -max-pause "$PAUSE" >"$work/soak.out" 2>"$work/soak.err" && soak_rc=0 || soak_rc=$?
took="$(awk -v a="$s" -v b="$(now_ms)" 'BEGIN{printf "%.0f", (b-a)/1000}')"
cat "$work/soak.out"
[[ -s "$work/soak.err" ]] && cat "$work/soak.err" >&2
wakes="$("$PGWAKE" ls --json | jq '[.[].wakes] | add')"
fails="$("$PGWAKE" ls --json | jq '[.[].wake_failures] | add')"
all_asleep
# The goroutines of the last connections end just after their clients do;
# the Docker client closes connections it pooled after 30 s idle (each a
# descriptor and two goroutines), so this waits up to a minute.
for _ in $(seq 120); do
	read -r g1 f1 r1 p1 < <(snapshot)
	[[ "$g1" -le "$g0" && "$f1" -le "$f0" ]] && break
	sleep 0.5
done
log "after, all asleep again: $g1 goroutines, $f1 fds and $p1 pipe fds, RSS $r1 KiB; $wakes wakes ($(fd_kinds "$daemon_pid"))"

commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
{
	echo "# pgwake soak: $NPROJ projects, $CLIENTS random clients, ${took} s"
	echo
	echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit $commit; $(nproc) CPUs; Docker $(docker version -f '{{.Server.Version}}'); image $IMAGE"
	echo "- projects sleep after 3 s idle, in turn stop, pause and tiered (stop after 5 s paused); each client connects to a random project, inserts a row, reads the count, disconnects, and pauses up to $PAUSE"
	echo
	echo "$(sed 's/^soak: //' "$work/soak.out")"
	echo
	echo "| | goroutines | file descriptors (no pipes) | pipe descriptors (relay free list, at most 128) | RSS |"
	echo "|:--|---:|---:|---:|---:|"
	echo "| before (all asleep) | $g0 | $f0 | $p0 | $(fmt1 "$(awk -v k="$r0" 'BEGIN{print k/1024}')") MiB |"
	echo "| after (all asleep again) | $g1 | $f1 | $p1 | $(fmt1 "$(awk -v k="$r1" 'BEGIN{print k/1024}')") MiB |"
	echo
	echo "pgwake counted $wakes wakes ($fails failed)."
} >"$work/report.md"
cat "$work/report.md"
cp "$work/report.md" "$here/results-soak.md"
[[ $soak_rc -eq 0 ]] || die "soak failed"
[[ "$g1" -le "$g0" && "$f1" -le "$f0" ]] || die "goroutines or descriptors did not come back: $g0 -> $g1, $f0 -> $f1"
[[ "$p1" -le 128 ]] || die "$p1 pipe descriptors: more than the relay's free list holds"
log "written to bench/results-soak.md"
