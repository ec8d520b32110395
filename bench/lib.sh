# bench/lib.sh: what the benchmark scripts share, sourced by them (run.sh,
# scale.sh): the real client binaries, a work directory with its own
# pgwake state, the clean-up on exit (pgwake down, every container and
# volume of this pgwake's instance label, helpers killed), and small
# helpers (free ports, medians, formatting, project state). Expects $here
# and $root set, and sets $work, $PGWAKE (to build there), $instance.
# shellcheck shell=bash

log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# --- tools ------------------------------------------------------------------

# Debian's /usr/bin/psql and pgbench are a Perl wrapper (pg_wrapper) that
# costs ~100 ms per start; call the real binaries.
pgbin=""
for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
	if [[ -x "$d/pgbench" && -x "$d/psql" ]]; then pgbin="$d"; break; fi
done
PSQL="${pgbin:+$pgbin/}psql"
PGBENCH="${pgbin:+$pgbin/}pgbench"
# need_tools T...: dies naming the first of them that is missing.
need_tools() {
	local t
	for t in "$@"; do
		command -v "$t" >/dev/null || die "$t not found (apt-get install postgresql-client pgbouncer jq curl tmux; docker; go)"
	done
}

# --- state and clean-up -------------------------------------------------------

work="$(mktemp -d "${TMPDIR:-/tmp}/pgwake-bench.XXXXXX")" || exit 1
chmod 755 "$work" # pgbouncer runs as nobody when we are root
# pgwake reads ./pgwake.yaml and every PGWAKE_* variable: run it from the
# work directory with only the settings below.
cd "$work"
for v in $(compgen -e | grep '^PGWAKE_' || true); do unset "$v"; done
export PGWAKE_STATE_DIR="$work/state"
export PGWAKE_IMAGE="$IMAGE"
PGWAKE="$work/pgwake"
instance=""
daemon_pid=""
# Background helpers to stop on exit, before pgwake goes down: scripts set
# these (empty when none runs; holder_pid may list several), and
# tmux_session; DOWN_FLAGS are pgwake down's extra flags.
bouncer_pid="" holder_pid="" load_pid="" events_pid=""
DOWN_FLAGS=()

cleanup() {
	local rc=$? p
	set +e
	trap - EXIT INT TERM
	if [[ -n "$holder_pid" ]]; then
		{ exec 7>&-; } 2>/dev/null
	fi
	if [[ -n "${tmux_session:-}" ]]; then
		tmux kill-session -t "$tmux_session" 2>/dev/null
	fi
	for p in $holder_pid $bouncer_pid $load_pid; do
		kill "$p" 2>/dev/null
		wait "$p" 2>/dev/null
	done
	if [[ -x "$PGWAKE" && -S "$PGWAKE_STATE_DIR/pgwake.sock" ]]; then
		timeout 180 "$PGWAKE" down "${DOWN_FLAGS[@]}" --timeout 150s >/dev/null 2>&1
	fi
	if [[ -n "$daemon_pid" ]] && kill -0 "$daemon_pid" 2>/dev/null; then
		kill "$daemon_pid" 2>/dev/null
	fi
	if [[ -z "$instance" && -f "$PGWAKE_STATE_DIR/state.json" ]]; then
		instance="$(jq -r '.instance // empty' "$PGWAKE_STATE_DIR/state.json" 2>/dev/null)"
	fi
	if [[ -n "$instance" ]]; then
		local ids vols
		ids="$(docker ps -aq --filter "label=dev.pgwake.instance=$instance")"
		[[ -n "$ids" ]] && docker rm -f -v $ids >/dev/null
		vols="$(docker volume ls -q --filter "label=dev.pgwake.instance=$instance")"
		[[ -n "$vols" ]] && docker volume rm -f $vols >/dev/null
	fi
	if [[ -n "$events_pid" ]]; then
		kill "$events_pid" 2>/dev/null
		wait "$events_pid" 2>/dev/null
	fi
	if [[ $rc -ne 0 || -n "${BENCH_KEEP:-}" ]]; then
		log "work directory kept: $work (pgwake.log under state/)"
	else
		rm -rf "$work"
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- helpers ------------------------------------------------------------------

# free_port prints a TCP port on 127.0.0.1 nobody listens on (below Docker's
# ephemeral range, which it uses for published ports).
free_port() {
	local p i
	for i in $(seq 200); do
		p=$((20000 + RANDOM % 10000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
	die "no free port"
}

# median and p95 (nearest rank) of the numbers on stdin.
median() { { grep -E '^[0-9.]+$' || true; } | sort -g | awk '{a[NR]=$1} END{if(NR==0){print "nan"; exit} if(NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
p95() { { grep -E '^[0-9.]+$' || true; } | sort -g | awk '{a[NR]=$1} END{if(NR==0){print "nan"; exit} i=int(NR*0.95); if(i<NR*0.95) i++; if(i<1) i=1; print a[i]}'; }
stat_of() { echo $1 | tr ' ' '\n' | $2; }
num() { [[ "$1" =~ ^-?[0-9]+(\.[0-9]+)?$ ]]; }
fmt0() { if num "$1"; then awk -v x="$1" 'BEGIN{printf "%.0f", x}'; else echo n/a; fi; }
fmt1() { if num "$1"; then awk -v x="$1" 'BEGIN{printf "%.1f", x}'; else echo n/a; fi; }
ratio() { if num "$1" && num "$2"; then awk -v a="$1" -v b="$2" 'BEGIN{if(b>0) printf "%.2f", a/b; else print "n/a"}'; else echo n/a; fi; }
now_ms() { local t="$EPOCHREALTIME"; echo "${t/./}" | awk '{printf "%.3f", $1/1000}'; }

state_of() { "$PGWAKE" ls --json | jq -r --arg n "$1" '.[] | select(.name == $n) | .state'; }
last_wake_of() { "$PGWAKE" ls --json | jq -r --arg n "$1" '.[] | select(.name == $n) | .last_wake_ms'; }

container_of() { echo "pgwake-$instance-$1"; }
direct_port() { docker port "$(container_of "$1")" 5432/tcp | grep -m1 '^127\.0\.0\.1:' | sed 's/.*://'; }

# sleep_project NAME: put it to sleep (retrying while the last client's
# connection is still being released) and wait until ls shows sleeping.
sleep_project() {
	local i
	for i in $(seq 100); do
		if "$PGWAKE" sleep "$1" >/dev/null 2>"$work/sleep.err"; then break; fi
		[[ $i -eq 100 ]] && die "pgwake sleep $1: $(cat "$work/sleep.err")"
		sleep 0.05
	done
	for i in $(seq 600); do
		[[ "$(state_of "$1")" == sleeping ]] && return
		sleep 0.05
	done
	die "$1 did not reach state sleeping"
}

rss_kib() { awk '/^VmRSS:/{print $2}' "/proc/$1/status"; }
# anon_kib PID: the anonymous part of its RSS (heap, stacks), what the
# process itself allocated; the rest of VmRSS is the mapped binary, page
# cache the kernel can drop and every pgwake process shares.
anon_kib() { awk '/^RssAnon:/{print $2}' "/proc/$1/status"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# ctx_switches PID: voluntary + involuntary context switches of all its threads.
ctx_switches() { cat "/proc/$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/{s += $2} END{print s + 0}'; }

