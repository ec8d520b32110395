#!/usr/bin/env bash
# pgwake benchmark for branches, snapshots and reset (issue 13, "Performance
# to report"): on one project of about 1 GB (pgbench -i -s 70), in one run
# and on the same data, the time of
#
#   - pgwake branch of a sleeping source (a file copy in a helper container),
#   - pgwake branch of a busy source (pgbench -c 4 writing on it meanwhile:
#     pg_basebackup while it serves),
#   - pgwake snapshot of a sleeping project and pgwake reset to it,
#
# next to the two ways without pgwake:
#
#   - pg_dump -Fc | pg_restore into a fresh, empty project (same image and
#     settings: a new server, like a branch; created and started, initdb
#     done, before the clock starts),
#   - CREATE DATABASE ... TEMPLATE inside the source's server (both
#     strategies of Postgres 15: WAL_LOG, the default, and FILE_COPY).
#
# Every copy is checked after it is timed: the row count of pgbench_accounts
# on every copy; for the busy branch that the balances add up (accounts =
# history = tellers = branches: no torn transaction); for reset that all
# table sums are exactly the snapshot's.
#
# Usage: bench/branch.sh   (as root or a user in the docker group)
# Tunables (environment): BENCH_SCALE (pgbench scale, 70 = ~1 GB),
# BENCH_ROUNDS (3), BENCH_BUDGET (seconds, 900: when the first round shows
# that all rounds would take the run past it, only one is run), BENCH_BUSY_CLIENTS
# (4), BENCH_BUSY_BEFORE (seconds of load before the busy branch starts, 15),
# PGWAKETEST_IMAGE (pgwake-test/postgres:15), BENCH_KEEP=1 keeps the work
# directory.
#
# Prints a markdown section and writes it to bench/results-branch.md.
# Everything it starts (pgwake, its containers and volumes, pgbench) is
# removed on exit, also on failure or Ctrl-C.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

SCALE="${BENCH_SCALE:-70}"
ROUNDS="${BENCH_ROUNDS:-3}"
BUDGET="${BENCH_BUDGET:-900}"
BUSY_CLIENTS="${BENCH_BUSY_CLIENTS:-4}"
BUSY_BEFORE="${BENCH_BUSY_BEFORE:-15}"
IMAGE="${PGWAKETEST_IMAGE:-pgwake-test/postgres:15}"
SRC=src
ROWS=$((SCALE * 100000))

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b-a}'; }
script_start="$(now)"

# shellcheck source=bench/lib.sh
source "$here/lib.sh"
[[ -n "$pgbin" && -x "$pgbin/pg_dump" && -x "$pgbin/pg_restore" ]] ||
	die "no /usr/lib/postgresql/*/bin with pgbench, psql, pg_dump and pg_restore (apt-get install postgresql-client)"
PGDUMP="$pgbin/pg_dump" PGRESTORE="$pgbin/pg_restore"
need_tools docker go jq
DOWN_FLAGS=(--volumes)

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_range N prints LOW-HIGH, N ports on 127.0.0.1 nobody listens on
# (below Docker's ephemeral range, which it uses for published ports).
free_range() {
	local n="$1" lo p i ok
	for i in $(seq 100); do
		lo=$((30000 + RANDOM % 2000 * 10))
		ok=1
		for p in $(seq "$lo" $((lo + n - 1))); do
			port_free "$p" || { ok=""; break; }
		done
		[[ -n "$ok" ]] && { echo "$lo-$((lo + n - 1))"; return; }
	done
	die "no free port range"
}

ratio() { if num "$1" && num "$2"; then awk -v a="$1" -v b="$2" 'BEGIN{if(b>0) printf "%.1f", a/b; else print "n/a"}'; else echo n/a; fi; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

lsj() { "$PGWAKE" ls --json | jq -r --arg n "$1" ".[] | select(.name == \$n) | $2"; }
state_of() { lsj "$1" .state; }
container_of() { echo "pgwake-$instance-$1"; }

# url_of NAME: the project's URL through pgwake, with its password.
url_of() {
	local u
	u="$("$PGWAKE" url "$1")"
	[[ "$u" == *\?* ]] && echo "$u&sslmode=disable" || echo "$u?sslmode=disable"
}

# direct_url NAME [DB]: the project's server itself, the address pgwake
# dials (the container's own address when this host is on its bridge, else
# the published port): what pg_dump, pg_restore and CREATE DATABASE use, so
# the baselines pay for no proxy hop.
direct_url() {
	local c cip cgw host port user pass db
	c="$(container_of "$1")"
	read -r cip cgw < <(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{.Gateway}}{{"\n"}}{{end}}' "$c" | head -n1)
	if [[ -n "$cip" && -n "$cgw" ]] && grep -q "inet $cgw/" <<<"$(ip -o addr)"; then
		host="$cip" port=5432
	else
		host=127.0.0.1 port="$(docker port "$c" 5432/tcp | grep -m1 '^127\.0\.0\.1:' | sed 's/.*://')"
	fi
	user="$(jq -r --arg n "$1" '.projects[] | select(.name == $n) | .user' "$PGWAKE_STATE_DIR/state.json")"
	pass="$(jq -r --arg n "$1" '.projects[] | select(.name == $n) | .password' "$PGWAKE_STATE_DIR/state.json")"
	db="${2:-$(jq -r --arg n "$1" '.projects[] | select(.name == $n) | .database' "$PGWAKE_STATE_DIR/state.json")}"
	echo "postgres://$user:$pass@$host:$port/$db?sslmode=disable"
}

q() { "$PSQL" "$1" -XAtqc "$2"; }

wait_state() {
	local i
	for i in $(seq 1200); do
		[[ "$(state_of "$1")" == "$2" ]] && return
		sleep 0.05
	done
	die "$1 did not reach state $2 (it is $(state_of "$1"))"
}

# wait_idle NAME: until pgwake counts no connection of NAME (the last
# client's close reaches it a moment after the client exits).
wait_idle() {
	local i
	for i in $(seq 200); do
		[[ "$(lsj "$1" .active)" == 0 ]] && return
		sleep 0.05
	done
	die "$1 still has $(lsj "$1" .active) connections"
}

sleep_project() {
	wait_idle "$1"
	"$PGWAKE" sleep "$1" >/dev/null 2>"$work/sleep.err" || die "pgwake sleep $1: $(cat "$work/sleep.err")"
	wait_state "$1" sleeping
}

# STATS: every sum pgbench keeps consistent, and the row counts.
STATS="select (select count(*) from pgbench_accounts) || ' ' || (select sum(abalance) from pgbench_accounts) || ' ' ||
 (select count(*) from pgbench_history) || ' ' || (select coalesce(sum(delta), 0) from pgbench_history) || ' ' ||
 (select sum(tbalance) from pgbench_tellers) || ' ' || (select sum(bbalance) from pgbench_branches)"

check_count() { # URL WHAT
	local n
	n="$(q "$1" 'select count(*) from pgbench_accounts')"
	[[ "$n" == "$ROWS" ]] || die "$2: pgbench_accounts has $n rows, not $ROWS"
}

# phases START END: where the time between START and END went, from the
# Docker events of this instance: the helper container's run (the copy,
# or pg_basebackup), and the project's server's runs (start, ALTER ROLE,
# stop for a branch's own password). Prints "before copy after" seconds and
# the server's run.
phases() {
	awk -v s="$1" -v e="$2" '
		{ t = $1 / 1e9 }
		t < s - 0.05 || t > e + 0.05 { next }
		$3 == "copy" && $2 == "start" { cs = t }
		$3 == "copy" && $2 == "die"   { cd = t }
		$3 != "copy" && $2 == "start" && !ss { ss = t }
		$3 != "copy" && $2 == "die" && ss && t > ss { sd = t }
		$3 != "copy" && $2 == "die" && !ss && !stop { stop = t }
		END {
			if (!cs || !cd) { print "n/a"; exit }
			out = sprintf("%.1f s until the copy starts", cs - s)
			if (stop) out = out sprintf(" (of which %.1f s stopping the server)", stop - s)
			out = out sprintf(", copy %.1f s", cd - cs)
			if (ss && sd) out = out sprintf(", %.1f s to the new server'"'"'s start, which with ALTER ROLE for its own password and its stop took %.1f s", ss - cd, sd - ss)
			out = out sprintf(", %.1f s to the end", e - (sd ? sd : cd))
			print out
		}' "$work/events.log"
}

# started_in START END CONTAINER: whether CONTAINER started in the window.
started_in() {
	awk -v s="$1" -v e="$2" -v c="$3" '$1 / 1e9 >= s && $1 / 1e9 <= e && $2 == "start" && $3 == c { f = 1 } END { exit !f }' "$work/events.log"
}

# --- set-up -------------------------------------------------------------------

log "building pgwake"
(cd "$root" && go build -o "$PGWAKE" ./cmd/pgwake)
# The commit the binary was built from (the tree may move on during the run).
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
dirty="$(git -C "$root" status --porcelain -- . ':!bench' 2>/dev/null | awk '{print $2}' | tr '\n' ' ')"
[[ -n "$dirty" ]] && commit+=" (built with uncommitted changes outside bench/ in: ${dirty% })"

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
	log "building $IMAGE"
	"$root/testdata/postgres-image/build.sh" "$IMAGE" >/dev/null
fi

port="$(free_range 1 | cut -d- -f1)"
range="$(free_range 20)"
export PGWAKE_LISTEN="127.0.0.1:$port" PGWAKE_PORT_RANGE="$range"
log "starting pgwake on $PGWAKE_LISTEN, project ports $range (state $PGWAKE_STATE_DIR)"
"$PGWAKE" up -d --wait --sleep-after 0 2>"$work/up.err" || { cat "$work/up.err" >&2; die "pgwake up failed"; }
instance="$(jq -r .instance "$PGWAKE_STATE_DIR/state.json")"
[[ -n "$instance" && "$instance" != null ]] || die "no instance in state.json"

# Docker events of this instance's containers, for the phases of each copy.
docker events --filter "label=dev.pgwake.instance=$instance" --filter type=container \
	--format '{{.TimeNano}} {{.Action}} {{if index .Actor.Attributes "dev.pgwake.role"}}copy{{else}}{{.Actor.Attributes.name}}{{end}}' \
	>"$work/events.log" 2>/dev/null &
events_pid=$!

"$PGWAKE" create "$SRC" --sleep-after 0 >/dev/null 2>"$work/create.err" || { cat "$work/create.err" >&2; die "create $SRC"; }
URL="$(url_of "$SRC")"
"$PGWAKE" wake "$SRC" >/dev/null 2>&1
log "pgbench -i -s $SCALE on $SRC"
t0="$(now)"
"$PGBENCH" -i -q -s "$SCALE" "$URL" >"$work/pgbench-init.log" 2>&1 || { cat "$work/pgbench-init.log" >&2; die "pgbench -i failed"; }
init_secs="$(since "$t0")"
DB="$(lsj "$SRC" .database)"
db_bytes="$(q "$URL" "select pg_database_size(current_database())")"
db_size="$(q "$URL" "select pg_size_pretty(pg_database_size(current_database()))")"
cluster_size="$(q "$URL" "select pg_size_pretty(sum(pg_database_size(oid))) from pg_database")"
log "pgbench -i took ${init_secs}s; database $DB is $db_size ($db_bytes bytes), all databases $cluster_size"
check_count "$URL" "$SRC after pgbench -i"
pgversion="$(q "$URL" 'show server_version')"

# --- rounds ---------------------------------------------------------------------

declare -A T    # operation -> "s s s"
declare -A PH   # operation -> phases of the last round
BUSY_ERR=0 BUSY_TX="" BUSY_BEFORE_TPS="" BUSY_DURING_TPS="" BUSY_NOTES=""
SRC_ASLEEP_OK=0
load_start="$(loadavg)"
LOADS=""
rounds_done=0
bench_start="$(now)"

timed() { # OP CMD...: runs CMD, adds its seconds to T[OP]; CMD's status
	local op="$1" s e rc=0
	shift
	s="$(now)"
	"$@" || rc=$?
	e="$(now)"
	((rc == 0)) || return "$rc"
	LAST_S="$s" LAST_E="$e"
	LAST="$(awk -v a="$s" -v b="$e" 'BEGIN{printf "%.2f", b-a}')"
	T[$op]+="$LAST "
}

# copy_timed OP CMD...: timed, for an operation that writes a copy: the
# page cache is flushed first (sync, not timed) so no earlier copy's
# writeback lands in this one's time, and the sync after it is timed on its
# own (T[OP_sync]): cp returns with its copy in the page cache, while
# pg_basebackup, and Postgres for its WAL, fsync before they return.
copy_timed() {
	local op="$1" l s e
	sync
	timed "$@" || return
	l="$LAST" s="$LAST_S" e="$LAST_E"
	timed "${op}_sync" sync
	LAST_SYNC="$LAST"
	T[${op}_total]+="$(awk -v a="$l" -v b="$LAST" 'BEGIN{printf "%.2f", a+b}') "
	LAST="$l" LAST_S="$s" LAST_E="$e"
}

create_db() { # STRATEGY
	local i
	for i in $(seq 100); do
		# Nothing else may be connected to the template: retry while a
		# just-closed session is still going away.
		if q "$POSTGRES_URL" "create database bench_copy template \"$DB\" strategy $1" 2>"$work/createdb.err"; then return; fi
		grep -q 'being accessed by other users' "$work/createdb.err" || { cat "$work/createdb.err" >&2; die "create database failed"; }
		sleep 0.1
	done
	die "create database: the template stays in use"
}

dump_restore() {
	set -o pipefail
	"$PGDUMP" -Fc -d "$SRC_DIRECT" | "$PGRESTORE" --no-owner -d "$DUMP_DIRECT" 2>"$work/restore.err" ||
		{ cat "$work/restore.err" >&2; die "pg_dump | pg_restore failed"; }
}

branch() { "$PGWAKE" branch "$SRC" "$1" --sleep-after 0 >/dev/null 2>>"$work/branch.err" || { cat "$work/branch.err" >&2; die "pgwake branch $SRC $1 failed"; }; }

for r in $(seq "$ROUNDS"); do
	# All rounds if they fit in the budget (judged after the first), else one.
	if ((r == 2)); then
		elapsed="$(since "$script_start")"
		if awk -v e="$elapsed" -v l="$round_secs" -v n=$((ROUNDS - 1)) -v b="$BUDGET" 'BEGIN{exit !(e + n * l > b)}'; then
			log "one round only: ${elapsed}s so far and a round takes ${round_secs}s, $ROUNDS rounds would pass the budget of ${BUDGET}s"
			break
		fi
	fi
	round_start="$(now)"
	LOADS+="$(cut -d' ' -f1 /proc/loadavg) "
	log "round $r (load $(loadavg))"
	"$PGWAKE" wake "$SRC" >/dev/null 2>&1
	read -r -a want <<<"$(q "$URL" "$STATS")"
	POSTGRES_URL="$(direct_url "$SRC" postgres)"
	SRC_DIRECT="$(direct_url "$SRC")"
	wait_idle "$SRC"

	# CREATE DATABASE ... TEMPLATE, both strategies, in the source's server.
	for st in wal_log file_copy; do
		op=template_wal
		[[ $st == file_copy ]] && op=template_copy
		copy_timed "$op" create_db "$st"
		check_count "$(direct_url "$SRC" bench_copy)" "CREATE DATABASE strategy $st"
		q "$POSTGRES_URL" "drop database bench_copy"
		log "  CREATE DATABASE TEMPLATE strategy $st: ${LAST}s (then sync ${LAST_SYNC}s)"
	done

	# pg_dump -Fc | pg_restore into a fresh project (its initdb before the clock).
	"$PGWAKE" create "dump$r" --sleep-after 0 >/dev/null 2>"$work/create.err" || { cat "$work/create.err" >&2; die "create dump$r"; }
	"$PGWAKE" wake "dump$r" >/dev/null 2>&1
	DUMP_DIRECT="$(direct_url "dump$r")"
	copy_timed dump dump_restore
	log "  pg_dump -Fc | pg_restore into a new project: ${LAST}s (then sync ${LAST_SYNC}s)"
	check_count "$(url_of "dump$r")" "pg_restore"
	"$PGWAKE" rm "dump$r" --volumes >/dev/null 2>&1

	# Branch of a sleeping source.
	sleep_project "$SRC"
	copy_timed branch_sleeping branch "bs$r"
	PH[branch_sleeping]="$(phases "$LAST_S" "$LAST_E")"
	log "  branch of the sleeping source: ${LAST}s, then sync ${LAST_SYNC}s (${PH[branch_sleeping]})"
	st="$(state_of "$SRC")"
	[[ "$st" == sleeping ]] || die "$SRC is $st after a branch of it asleep"
	started_in "$LAST_S" "$LAST_E" "$(container_of "$SRC")" && die "$SRC's server was started during the branch of it asleep"
	SRC_ASLEEP_OK=$((SRC_ASLEEP_OK + 1))
	if ((r == 1)); then
		# What a copy of the stopped files copies.
		DU="$(docker run --rm --entrypoint sh -v "$(container_of "$SRC")-data:/v:ro" "$IMAGE" -c \
			'cd /v && printf "%s MB in all: base (the databases) %s MB, pg_wal %s MB" "$(du -sm . | cut -f1)" "$(du -sm base | cut -f1)" "$(du -sm pg_wal | cut -f1)"' 2>&1)" || DU="n/a"
		log "  $SRC's stopped data directory: $DU"
	fi
	BURL="$(url_of "bs$r")"
	timed branch_first q "$BURL" "select 1" >/dev/null
	log "  its first query (the branch's first wake, select 1): ${LAST}s"
	check_count "$BURL" "branch bs$r"
	[[ "$(lsj "bs$r" .parent)" == "$SRC" ]] || die "bs$r has no parent $SRC in ls --json"
	wait_idle "bs$r"
	"$PGWAKE" rm "bs$r" --volumes >/dev/null 2>&1

	# Snapshot of the sleeping source, to reset to below.
	copy_timed snapshot "$PGWAKE" snapshot "$SRC" "r$r" >/dev/null 2>"$work/snapshot.err" ||
		{ cat "$work/snapshot.err" >&2; die "pgwake snapshot $SRC r$r failed"; }
	PH[snapshot]="$(phases "$LAST_S" "$LAST_E")"
	started_in "$LAST_S" "$LAST_E" "$(container_of "$SRC")" && die "$SRC's server was started during the snapshot of it asleep"
	SNAP_SIZE="$(grep -o '([^)]*)' "$work/snapshot.err" | tail -n1 | tr -d '()')"
	log "  snapshot of the sleeping source: ${LAST}s, then sync ${LAST_SYNC}s ($SNAP_SIZE; ${PH[snapshot]})"
	timed snapshots "$PGWAKE" snapshots "$SRC" >"$work/snapshots.out" || die "pgwake snapshots $SRC failed"
	grep -q "^r$r " "$work/snapshots.out" || { cat "$work/snapshots.out" >&2; die "pgwake snapshots $SRC does not list r$r"; }
	log "  pgwake snapshots $SRC (the list): ${LAST}s: $(grep "^r$r " "$work/snapshots.out" | tr -s ' ')"

	# Branch of a busy source: pgbench (TPC-B, writes) on it through pgwake
	# from BUSY_BEFORE seconds before the branch until after it. Its -T must
	# outlast the branch: 3x the sleeping branch in round 1, then 1.5x the
	# slowest busy branch so far; if the branch outlasts it anyway, the
	# report says so.
	"$PGWAKE" wake "$SRC" >/dev/null 2>&1
	if [[ -z "${T[branch_busy]:-}" ]]; then
		est="$(awk -v t="$(stat_of "${T[branch_sleeping]}" median)" 'BEGIN{printf "%d", (t * 3 < 20 ? 20 : t * 3)}')"
	else
		est="$(echo ${T[branch_busy]} | tr ' ' '\n' | sort -g | tail -n1 | awk '{printf "%d", $1 * 1.5 + 5}')"
	fi
	busy_t=$((BUSY_BEFORE + est + 5))
	"$PGBENCH" -n -c "$BUSY_CLIENTS" -j 2 -T "$busy_t" -P 1 --progress-timestamp "$URL" >"$work/busy$r.out" 2>"$work/busy$r.err" &
	load_pid=$!
	load_start_t="$(now)"
	sleep "$BUSY_BEFORE"
	pre_end="$(now)"
	copy_timed branch_busy branch "bb$r"
	PH[branch_busy]="$(phases "$LAST_S" "$LAST_E")"
	busy_s="$LAST_S" busy_e="$LAST_E"
	log "  branch of the busy source: ${LAST}s, then sync ${LAST_SYNC}s (${PH[branch_busy]})"
	wait "$load_pid" || { cat "$work/busy$r.err" >&2; die "pgbench on the busy source failed"; }
	load_pid=""
	if awk -v e="$busy_e" -v s="$load_start_t" -v t="$busy_t" 'BEGIN{exit !(e > s + t)}'; then
		BUSY_NOTES+="round $r: the branch outlasted pgbench's -T $busy_t; "
	fi
	failed="$(awk -F': ' '/^number of failed transactions/{split($2, a, " "); print a[1]}' "$work/busy$r.out")"
	txs="$(awk -F': ' '/^number of transactions actually processed/{print $2}' "$work/busy$r.out")"
	aborted="$(grep -c -i -E 'abort|error|FATAL' "$work/busy$r.err" || true)"
	[[ -n "$txs" ]] || { cat "$work/busy$r.out" "$work/busy$r.err" >&2; die "no pgbench summary"; }
	BUSY_ERR=$((BUSY_ERR + ${failed:-0} + aborted))
	BUSY_TX+="$txs "
	# tps from the progress lines (epoch seconds): the seconds before the
	# branch (after 3 s of warm-up) against the seconds it ran.
	# (A progress line at t counts the second before t.)
	read -r before during < <(grep -h '^progress:' "$work/busy$r.err" "$work/busy$r.out" | awk -v a="$load_start_t" -v p="$pre_end" -v s="$busy_s" -v e="$busy_e" '
		{ t = $2; tps = $4 }
		t > a + 3 && t <= p { bs += tps; bn++ }
		t > s + 0.5 && t <= e + 0.5 { ds += tps; dn++ }
		END { if (bn) printf "%.0f ", bs / bn; else printf "n/a "; if (dn) printf "%.0f\n", ds / dn; else print "n/a" }')
	BUSY_BEFORE_TPS+="$before " BUSY_DURING_TPS+="$during "
	log "  pgbench on $SRC: $txs transactions, ${failed:-?} failed, $aborted error lines; tps before $before, during the branch $during"
	BBURL="$(url_of "bb$r")"
	read -r -a got <<<"$(q "$BBURL" "$STATS")"
	[[ "${got[0]}" == "$ROWS" ]] || die "busy branch bb$r: pgbench_accounts has ${got[0]} rows"
	[[ "${got[1]}" == "${got[3]}" && "${got[1]}" == "${got[4]}" && "${got[1]}" == "${got[5]}" ]] ||
		die "busy branch bb$r is torn: sum(abalance) ${got[1]}, sum(delta) ${got[3]}, sum(tbalance) ${got[4]}, sum(bbalance) ${got[5]}"
	log "  busy branch consistent: ${got[2]} history rows, sum(abalance) = sum(delta) = sum(tbalance) = sum(bbalance) = ${got[1]}"
	wait_idle "bb$r"
	"$PGWAKE" rm "bb$r" --volumes >/dev/null 2>&1

	# Reset of the source (awake after its pgbench, no client) to r$r.
	wait_idle "$SRC"
	copy_timed reset "$PGWAKE" reset "$SRC" "r$r" 2>"$work/reset.err" || { cat "$work/reset.err" >&2; die "reset failed"; }
	PH[reset]="$(phases "$LAST_S" "$LAST_E")"
	RESET_TOOK="$(grep 'msg="project reset"' "$PGWAKE_STATE_DIR/pgwake.log" | tail -n1 | grep -o 'took=[^ ]*' | cut -d= -f2)"
	hold_at="$(grep "why=\"reset to snapshot r$r\"" "$PGWAKE_STATE_DIR/pgwake.log" | grep -m1 'holding project asleep' | sed 's/^time=\([^ ]*\) .*/\1/')"
	hold_in="$(awk -v h="$(date -d "$hold_at" +%s.%N)" -v s="$LAST_S" 'BEGIN{printf "%.1f", h - s}')"
	PH[reset]+="; pgwake's log: the reset took $RESET_TOOK from holding the project, which began ${hold_in} s after the command started (the daemon first lists the snapshots)"
	log "  reset of the (awake, idle) source: ${LAST}s, then sync ${LAST_SYNC}s (${PH[reset]})"
	timed reset_first q "$URL" "select 1" >/dev/null
	read -r -a got <<<"$(q "$URL" "$STATS")"
	[[ "${got[*]}" == "${want[*]}" ]] || die "reset: $SRC has (${got[*]}), the snapshot had (${want[*]})"
	log "  first query after the reset: ${LAST}s; its rows are the snapshot's (${got[*]})"
	"$PGWAKE" snapshots "$SRC" --delete "r$r" >/dev/null 2>&1

	rounds_done=$r
	round_secs="$(since "$round_start")"
	log "round $r took ${round_secs}s"
done
load_end="$(loadavg)"
bench_secs="$(since "$bench_start")"

# --- report ------------------------------------------------------------------------

m() { stat_of "${T[$1]}" median; }
vals() { echo "${T[$1]% }" | sed 's/ /, /g'; }
dump_m="$(m dump)"
yes_no() { awk -v x="$1" -v op="$2" -v y="$3" 'BEGIN{ok = (op == "<") ? (x < y) : (x >= y); print ok ? "yes" : "**no**"}'; }

report="$work/results-branch.md"
{
	echo "# pgwake branch, snapshot and reset: benchmark results"
	echo
	echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $commit"
	echo "- machine: $(nproc) CPUs ($(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo)), $(awk '/^MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM; Docker $(docker version --format '{{.Server.Version}}') ($(docker info --format '{{.Driver}}') storage driver), volumes on $(df -T "$(docker info --format '{{.DockerRootDir}}')" | awk 'NR==2{print $2}') (cp --reflink=auto falls back to a full copy there)"
	echo "- load average (1, 5, 15 min): $load_start at the start of the measured rounds, $load_end at the end; 1-minute load at the start of each round: ${LOADS% }. Other test suites share this machine and may have run meanwhile; the benchmark itself adds about 1-5 (pgbench, the servers, the copies)."
	echo "- data: pgbench -i -s $SCALE (took ${init_secs}s): database $DB is $db_size (pg_database_size $db_bytes bytes; all databases of the server $cluster_size), $ROWS rows in pgbench_accounts; Postgres $pgversion ($IMAGE)"
	echo "- $rounds_done round(s) of $ROUNDS in ${bench_secs}s$( ((rounds_done < ROUNDS)) && echo " (the first round showed that $ROUNDS would take the run past its budget of ${BUDGET}s)"), every operation once per round, interleaved; the whole script took $(since "$script_start")s; seconds are wall clock (date +%s.%N) around the command"
	echo
	echo "| operation | median s | values s | pg_dump\\|pg_restore / this | then \`sync\`: median s (values) |"
	echo "|:--|---:|:--|---:|:--|"
	row() {
		local sy=""
		[[ -n "${T[${2}_sync]:-}" ]] && sy="$(fmt1 "$(m "${2}_sync")") ($(vals "${2}_sync"))"
		local ra="$(ratio "$dump_m" "$(m "$2")")"
		[[ "${3:-}" == noratio ]] && ra=""
		echo "| $1 | $(fmt1 "$(m "$2")") | $(vals "$2") | $ra | $sy |"
	}
	row "\`pgwake branch\` of a sleeping source (file copy; source stays asleep)" branch_sleeping
	row "&nbsp;&nbsp;then the branch's first query (its first wake, select 1)" branch_first noratio
	row "\`pgwake branch\` of a busy source (pg_basebackup under pgbench -c $BUSY_CLIENTS)" branch_busy
	row "\`pgwake snapshot\` of the sleeping source" snapshot
	row "\`pgwake snapshots\` (list, one snapshot)" snapshots noratio
	row "\`pgwake reset\` (source awake and idle: stop, copy back)" reset
	row "&nbsp;&nbsp;then the first query (wake on the restored data, select 1)" reset_first noratio
	row "\`pg_dump -Fc \\| pg_restore\` into a new empty project" dump
	row "\`CREATE DATABASE ... TEMPLATE\` (STRATEGY WAL_LOG, 15's default)" template_wal
	row "\`CREATE DATABASE ... TEMPLATE\` (STRATEGY FILE_COPY)" template_copy
	echo
	bs="$(m branch_sleeping)" bb="$(m branch_busy)" rs="$(m reset)"
	worst="$(printf '%s\n' "$bs" "$bb" "$rs" | sort -g | tail -n1)"
	least="$(printf '%s\n' "$(ratio "$dump_m" "$bs")" "$(ratio "$dump_m" "$bb")" "$(ratio "$dump_m" "$rs")" | sort -g | head -n1)"
	echo "Ratios (median pg_dump|pg_restore / median): branch of a sleeping source **$(ratio "$dump_m" "$bs")x**, branch of a busy source **$(ratio "$dump_m" "$bb")x**, reset **$(ratio "$dump_m" "$rs")x**."
	echo
	dt="$(m dump_total)"
	echo "The same with the \`sync\` after each counted (until the copy is on disk; medians of the per-round sums, pg_dump|pg_restore $(fmt1 "$dt") s): branch of a sleeping source $(ratio "$dt" "$(m branch_sleeping_total)")x ($(fmt1 "$(m branch_sleeping_total)") s), branch of a busy source $(ratio "$dt" "$(m branch_busy_total)")x ($(fmt1 "$(m branch_busy_total)") s), reset $(ratio "$dt" "$(m reset_total)")x ($(fmt1 "$(m reset_total)") s)."
	echo
	echo "Targets: branch and reset of 1 GB well under 20 s: $(yes_no "$worst" "<" 20) (slowest median $(fmt1 "$worst") s); at least 5x faster than pg_dump | pg_restore: $(yes_no "$least" ">=" 5) (lowest ratio ${least}x)."
	echo
	echo "Where the time went (last round, from Docker's container events):"
	echo
	echo "- branch of a sleeping source: ${PH[branch_sleeping]}"
	echo "- branch of a busy source: ${PH[branch_busy]}"
	echo "- snapshot: ${PH[snapshot]}"
	echo "- reset: ${PH[reset]}"
	echo "- what a copy of the stopped files copies (the source's volume after pgbench -i): ${DU:-n/a}"
	echo "- \`sync\` after each copy: the file copies (branch of a sleeping source, snapshot, reset) return with their copy still in the page cache; pg_basebackup (busy branch) fsyncs before it returns, and Postgres has its WAL on disk at each commit. The sync column is the writeback the command left behind (every copy starts after a sync, untimed, so none pays for an earlier one)."
	echo
	echo "Checks, after every timed operation: every copy has $ROWS rows in pgbench_accounts; the source was still asleep after each branch of it asleep, its server not started meanwhile (Docker events; $SRC_ASLEEP_OK of $rounds_done); each busy branch's sums agree (sum(abalance) of accounts = sum(delta) of history = sum(tbalance) = sum(bbalance): a transaction boundary, no torn rows); after each reset the counts and sums of all four tables are exactly the snapshot's."
	echo
	echo "Busy source: pgbench -c $BUSY_CLIENTS -j 2 (TPC-B, through pgwake) on $SRC from ${BUSY_BEFORE}s before each branch until after it: $BUSY_ERR failed transactions or error lines in total (transactions per run: ${BUSY_TX% }); tps before the branch ${BUSY_BEFORE_TPS% }, during it ${BUSY_DURING_TPS% }.${BUSY_NOTES:+ Note: ${BUSY_NOTES% ; }.}"
	echo
	echo "How each is measured: the branches are \`pgwake branch src NEW\` (copy, with the new project's own password set on the copy in single-user mode while it is staged; no server starts) until the command returns; the snapshot and reset likewise. pg_dump -Fc and pg_restore run on this host (real binaries from $pgbin) against the servers' own addresses (no proxy hop), into a project created and started (initdb done) before the clock starts: a fresh database on the same kind of server, which is what a branch makes. CREATE DATABASE runs in the source's server from a session on its postgres database."
} >"$report"

cat "$report"
cp "$report" "$here/results-branch.md"
log "written to bench/results-branch.md"
