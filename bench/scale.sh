#!/usr/bin/env bash
# pgwake at scale: one daemon with many Docker projects, most asleep. See
# bench/README.md ("Scale of one daemon").
#
# Usage: bench/scale.sh        (as root or a user in the docker group)
# Tunables (environment): BENCH_PROJECTS (1000), BENCH_AWAKE (projects woken
# and kept awake, 10), BENCH_IDLE (seconds the idle daemon's CPU is
# measured over, 60), BENCH_CONNS_PER (connections held per awake project,
# 90; above 90 each server is given max_connections of that plus 10: 20
# awake projects of 500 make the 10,000-connection run), PGWAKETEST_IMAGE,
# BENCH_KEEP=1 keeps the work directory, BENCH_OUT (bench/results-scale.md)
# is where the report goes.
#
# Prints a markdown table and writes it to $BENCH_OUT.
# Everything it starts is removed on exit, also on failure or Ctrl-C.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

NPROJ="${BENCH_PROJECTS:-1000}"
NAWAKE="${BENCH_AWAKE:-10}"
IDLE="${BENCH_IDLE:-60}"
PER="${BENCH_CONNS_PER:-90}"
IMAGE="${PGWAKETEST_IMAGE:-pgwake-test/postgres:15}"
OUT="${BENCH_OUT:-$here/results-scale.md}"

# shellcheck source=bench/lib.sh
source "$here/lib.sh"
need_tools "$PSQL" docker go jq curl tmux

name_of() { printf 'p%04d' "$1"; }
ms_of() { # ms_of CMD...: the command's wall time in ms, its output dropped
	local s e
	s="$(now_ms)"
	"$@" >/dev/null
	e="$(now_ms)"
	awk -v a="$s" -v b="$e" 'BEGIN{printf "%.1f", b-a}'
}
api() { curl -sf --unix-socket "$PGWAKE_STATE_DIR/pgwake.sock" "http://pgwake$1"; }
count_projects() { "$PGWAKE" ls --json | jq length; }

log "building pgwake and the bench helpers"
(cd "$root" && go build -o "$work/pgwake" ./cmd/pgwake && go build -o "$work/conns" ./bench/conns && go build -o "$work/firstrow" ./bench/firstrow)
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
	log "building $IMAGE"
	"$root/testdata/postgres-image/build.sh" "$IMAGE" >/dev/null
fi

# pgwake raises its soft open-files limit to the hard one; each client
# connection takes two descriptors (client and server), so the hard limit
# must leave room for them. Raised here when allowed (CAP_SYS_RESOURCE).
want_fds=$((NAWAKE * PER * 2 + 1024))
if [[ "$(ulimit -Hn)" != unlimited && "$(ulimit -Hn)" -lt "$want_fds" ]]; then
	ulimit -Hn "$want_fds" 2>/dev/null && ulimit -Sn "$want_fds" ||
		log "warning: open-files hard limit $(ulimit -Hn) < $want_fds; connections beyond it will fail"
fi

port="$(free_port)"
start_daemon() {
	"$PGWAKE" up -d --wait --listen "127.0.0.1:$port" --sleep-after 0 \
		--max-connections 20000 --max-project-connections 1000 2>/dev/null
	daemon_pid="$(api /v1/info | jq -r .pid)"
	[[ "$daemon_pid" =~ ^[0-9]+$ ]] || die "no pgwake process"
}
start_daemon
instance="$(jq -r .instance "$PGWAKE_STATE_DIR/state.json")"
rss0="$(rss_kib "$daemon_pid")" anon0="$(anon_kib "$daemon_pid")"
log "pgwake $daemon_pid on 127.0.0.1:$port, RSS $rss0 KiB with no project"

# --- projects -------------------------------------------------------------------

log "creating $NPROJ projects (no own port each: --no-port)"
s="$(now_ms)"
# Postgres's default max_connections is 100: more connections per project
# need a server that takes them (and one for psql and the probes).
maxconn=$((PER + 10 > 100 ? PER + 10 : 100))
seq "$NPROJ" | xargs -P 4 -I{} sh -c '"$0" create "$(printf p%04d {})" --no-port --sleep-mode stop --set "max_connections=$2" >/dev/null 2>>"$1/create.err"' "$PGWAKE" "$work" "$maxconn" ||
	die "create failed: $(tail -n 3 "$work/create.err")"
create_s="$(awk -v a="$s" -v b="$(now_ms)" 'BEGIN{printf "%.1f", (b-a)/1000}')"
[[ "$(count_projects)" -eq "$NPROJ" ]] || die "ls shows $(count_projects) projects, want $NPROJ"
log "created in ${create_s}s"

log "waking $NAWAKE of them"
URLS=()
for i in $(seq "$NAWAKE"); do
	u="$("$PGWAKE" url "$(name_of "$i")")"
	URLS+=("$u")
	"$PSQL" "$u" -Atc 'select 1' >/dev/null || die "psql $(name_of "$i") failed"
done
awake="$("$PGWAKE" ls --json | jq '[.[] | select(.state == "running")] | length')"
sleep 2
rss_n="$(rss_kib "$daemon_pid")" anon_n="$(anon_kib "$daemon_pid")"
per_proj="$(awk -v a="$rss_n" -v b="$rss0" -v n="$NPROJ" 'BEGIN{printf "%.1f", (a-b)/n}')"
log "$awake awake: RSS $rss_n KiB, $per_proj KiB per project"

# --- idle daemon --------------------------------------------------------------------

log "idle CPU over ${IDLE}s"
t0="$(cpu_ticks "$daemon_pid")"
sleep "$IDLE"
t1="$(cpu_ticks "$daemon_pid")"
hz="$(getconf CLK_TCK)"
idle_cpu="$(awk -v a="$t0" -v b="$t1" -v hz="$hz" -v s="$IDLE" 'BEGIN{printf "%.2f", 100 * (b-a) / hz / s}')"
log "idle: ${idle_cpu}% of one CPU"

# --- API and ls -----------------------------------------------------------------------

LS="" ONE="" ALL=""
for _ in $(seq 10); do
	LS+="$(ms_of "$PGWAKE" ls) "
	ALL+="$(ms_of api /v1/projects) "
	ONE+="$(ms_of api "/v1/projects/$(name_of "$NPROJ")") "
done
log "ls $(stat_of "$LS" median) ms, GET /v1/projects $(stat_of "$ALL" median) ms, one project $(stat_of "$ONE" median) ms"

# --- TUI --------------------------------------------------------------------------------

# The time from a key to the frame that shows its effect: the filter (/)
# narrowed to the last project, which is off the first screen.
sess="pgwake-scale-$$"
tmux_session="$sess" # killed by the clean-up on failure
tmux new-session -d -s "$sess" -x 160 -y 50 "PGWAKE_STATE_DIR='$PGWAKE_STATE_DIR' '$PGWAKE' status"
trap_tmux() { tmux kill-session -t "$sess" 2>/dev/null || true; }
pane_has() { tmux capture-pane -p -t "$sess" | grep -q -- "$1"; }
wait_pane() {
	local i
	for i in $(seq 3000); do
		pane_has "$1" && return 0
		sleep 0.01
	done
	trap_tmux
	die "TUI never showed $1"
}
s="$(now_ms)"
wait_pane "$(name_of 1)"
tui_first="$(awk -v a="$s" -v b="$(now_ms)" 'BEGIN{printf "%.0f", b-a}')"
last="$(name_of "$NPROJ")"
s="$(now_ms)"
tmux send-keys -t "$sess" / "$last" Enter
wait_pane "$last"
tui_filter="$(awk -v a="$s" -v b="$(now_ms)" 'BEGIN{printf "%.0f", b-a}')"
trap_tmux
tmux_session=""
log "TUI: first frame ${tui_first} ms, filter to the last project ${tui_filter} ms"

# --- connections --------------------------------------------------------------------------

nconns=$((NAWAKE * PER))
log "opening $nconns connections ($PER to each awake project)"
fd0="$(ls "/proc/$daemon_pid/fd" | wc -l)"
rss_c0="$(rss_kib "$daemon_pid")"
mkfifo "$work/holder.in"
holder_pids=()
for u in "${URLS[@]}"; do
	"$work/conns" -url "$u" -n "$PER" -parallel 4 <"$work/holder.in" >>"$work/holder.out" 2>>"$work/holder.err" &
	holder_pids+=($!)
	holder_pid="${holder_pids[*]}" # for the clean-up on failure
done
exec 7>"$work/holder.in"
for i in $(seq 3000); do
	[[ "$(grep -c '^ready' "$work/holder.out" 2>/dev/null || true)" -eq "$NAWAKE" ]] && break
	[[ -s "$work/holder.err" ]] && die "conns failed: $(tail -n 3 "$work/holder.err")"
	[[ $i -eq 3000 ]] && die "connections not open after 300 s"
	sleep 0.1
done
sleep 2
rss_c="$(rss_kib "$daemon_pid")"
fds="$(ls "/proc/$daemon_pid/fd" | wc -l)"
per_conn="$(awk -v a="$rss_c" -v b="$rss_c0" -v n="$nconns" 'BEGIN{printf "%.1f", (a-b)/n}')"
# A new client's connect to the first row while they are open.
ACC=""
for _ in $(seq 10); do
	ACC+="$("$work/firstrow" -url "${URLS[0]}" 2>/dev/null || true) "
done
exec 7>&-
for p in "${holder_pids[@]}"; do wait "$p" || die "conns exited with an error"; done
holder_pid=""
log "$nconns open: RSS +$((rss_c - rss_c0)) KiB ($per_conn KiB each), fds $fd0 -> $fds, new client $(stat_of "$ACC" median) ms"

# --- restart: adoption ------------------------------------------------------------------------

log "restart: pgwake down, then up, until ls shows every project"
"$PGWAKE" down >/dev/null 2>&1
s="$(now_ms)"
start_daemon
for i in $(seq 6000); do
	[[ "$(count_projects)" -eq "$NPROJ" ]] && break
	[[ $i -eq 6000 ]] && die "after a restart ls shows $(count_projects) projects"
	sleep 0.05
done
adopt_s="$(awk -v a="$s" -v b="$(now_ms)" 'BEGIN{printf "%.2f", (b-a)/1000}')"
log "up again with $NPROJ projects in ${adopt_s}s"

# --- report -------------------------------------------------------------------------------------

commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
report="$work/report.md"
{
	echo "# pgwake at scale: one daemon, $NPROJ Docker projects"
	echo
	echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo "- machine: $(nproc) CPUs, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, kernel $(uname -r)"
	echo "- commit: $commit; Docker $(docker version -f '{{.Server.Version}}'); image $IMAGE"
	echo
	echo "| what | value |"
	echo "|:--|---:|"
	echo "| create $NPROJ projects (4 at a time, each a container and a volume) | ${create_s} s |"
	echo "| daemon RSS with no project / with $NPROJ ($awake awake) | $(fmt1 "$(awk -v k="$rss0" 'BEGIN{print k/1024}')") / $(fmt1 "$(awk -v k="$rss_n" 'BEGIN{print k/1024}')") MiB |"
	echo "| of which anonymous (RssAnon), no project / $NPROJ | $(fmt1 "$(awk -v k="$anon0" 'BEGIN{print k/1024}')") / $(fmt1 "$(awk -v k="$anon_n" 'BEGIN{print k/1024}')") MiB |"
	echo "| RSS per project | $per_proj KiB |"
	echo "| idle daemon CPU (${IDLE} s, sweeps included) | ${idle_cpu} % of one CPU |"
	echo "| \`pgwake ls\` (median of 10) | $(stat_of "$LS" median) ms |"
	echo "| GET /v1/projects, all $NPROJ (median of 10) | $(stat_of "$ALL" median) ms |"
	echo "| GET /v1/projects/NAME (median of 10) | $(stat_of "$ONE" median) ms |"
	echo "| TUI: first frame / filter to the last project | ${tui_first} / ${tui_filter} ms |"
	echo "| $nconns open client connections: RSS per connection | $per_conn KiB |"
	echo "| file descriptors, before / with them | $fd0 / $fds |"
	echo "| a new client's connect to the first row with them open (median of 10) | $(stat_of "$ACC" median) ms |"
	echo "| restart: \`pgwake up\` until ls shows all $NPROJ | ${adopt_s} s |"
} >"$report"
cat "$report"
cp "$report" "$OUT"
log "written to $OUT"
