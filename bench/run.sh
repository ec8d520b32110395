#!/usr/bin/env bash
# pgwake benchmark: throughput (pgbench -S) direct vs pgwake vs PgBouncer,
# connect-per-transaction, cold-wake latency (stop and pause), the
# daemon's memory and tiered sleep's two wake paths, all in one run. See
# bench/README.md.
#
# Usage: bench/run.sh          (as root or a user in the docker group)
# Tunables (environment): BENCH_DURATION (s per pgbench run, default 8),
# BENCH_ROUNDS (3), BENCH_CLIENTS ("1 10 50"), BENCH_WAKES (psql-timed wakes
# per sleep mode, 20), BENCH_GO_WAKES (firstrow-timed wakes per mode, 20),
# BENCH_CONNS (500), BENCH_SCALE (10), PGWAKETEST_IMAGE, BENCH_KEEP=1 keeps
# the work directory.
#
# Prints a markdown table and writes it to bench/results.md. Everything it
# starts (pgwake, its containers and volumes, pgbouncer, helpers) is removed
# on exit, also on failure or Ctrl-C.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

DURATION="${BENCH_DURATION:-8}"
ROUNDS="${BENCH_ROUNDS:-3}"
CLIENTS="${BENCH_CLIENTS:-1 10 50}"
WAKES="${BENCH_WAKES:-20}"
GOWAKES="${BENCH_GO_WAKES:-20}"
NCONNS="${BENCH_CONNS:-500}"
SCALE="${BENCH_SCALE:-10}"
IMAGE="${PGWAKETEST_IMAGE:-pgwake-test/postgres:15}"
PROJECT=bench    # stop mode: throughput, connections, wake from stop
PPROJECT=benchp  # pause mode: wake from pause

# shellcheck source=bench/lib.sh
source "$here/lib.sh"
need_tools "$PSQL" "$PGBENCH" pgbouncer docker go jq curl

# --- set-up -------------------------------------------------------------------

log "building pgwake and the bench helpers"
(cd "$root" && go build -o "$work/pgwake" ./cmd/pgwake &&
	go build -o "$work/conns" ./bench/conns &&
	go build -o "$work/firstrow" ./bench/firstrow)

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
	log "building $IMAGE"
	"$root/testdata/postgres-image/build.sh" "$IMAGE" >/dev/null
fi

port="$(free_port)"
log "starting pgwake on 127.0.0.1:$port (state $PGWAKE_STATE_DIR)"
"$PGWAKE" up -d --wait --listen "127.0.0.1:$port" --sleep-after 0 --tls on \
	--max-connections 2000 --max-project-connections 1000 2>/dev/null
instance="$(jq -r .instance "$PGWAKE_STATE_DIR/state.json")"
daemon_pid="$(curl -sf --unix-socket "$PGWAKE_STATE_DIR/pgwake.sock" http://x/v1/info | jq -r .pid)"
[[ "$daemon_pid" =~ ^[0-9]+$ ]] || die "no daemon pid from the admin API"
rss_start="$(rss_kib "$daemon_pid")" anon_start="$(anon_kib "$daemon_pid")"

# create prints the URL without the password; url prints it whole.
"$PGWAKE" create "$PROJECT" --sleep-mode stop --sleep-after 0 >/dev/null 2>&1
"$PGWAKE" create "$PPROJECT" --sleep-mode pause --sleep-after 0 >/dev/null 2>&1
URL="$("$PGWAKE" url "$PROJECT")"
PURL="$("$PGWAKE" url "$PPROJECT")"
password="$(jq -r --arg n "$PROJECT" '.projects[] | select(.name == $n) | .password' "$PGWAKE_STATE_DIR/state.json")"
pguser="$(jq -r --arg n "$PROJECT" '.projects[] | select(.name == $n) | .user' "$PGWAKE_STATE_DIR/state.json")"
# TLS is on (for the TLS row); everything else measures the plaintext path.
URL="${URL%%\?*}?sslmode=disable"
PURL="${PURL%%\?*}?sslmode=disable"

log "first wake of $PROJECT and $PPROJECT (initdb)"
"$PGWAKE" wake "$PROJECT" 2>/dev/null
"$PGWAKE" wake "$PPROJECT" 2>/dev/null

log "max_connections=$((NCONNS + 100)) on $PROJECT, restart"
docker exec "$(container_of "$PROJECT")" sh -c \
	'PATH="$PATH:$(ls -d /usr/lib/postgresql/*/bin | tail -n1)"; psql -qAt -U postgres -d postgres -c "alter system set max_connections = '"$((NCONNS + 100))"'"' >/dev/null
sleep_project "$PROJECT"
"$PGWAKE" wake "$PROJECT" 2>/dev/null
got="$("$PSQL" "$URL" -Atc 'show max_connections')"
[[ "$got" == "$((NCONNS + 100))" ]] || die "max_connections is $got after restart"

dport="$(direct_port "$PROJECT")"
DURL="postgres://$pguser:$password@127.0.0.1:$dport/$PROJECT?sslmode=disable"
# pgwake runs with TLS on: the plain target asks for no TLS, the TLS one
# for sslmode=require (measuring what leaving the splice path costs).
WURL="postgres://$pguser:$password@127.0.0.1:$port/$PROJECT?sslmode=disable"
TLSURL="postgres://$pguser:$password@127.0.0.1:$port/$PROJECT?sslmode=require"
# The address pgwake dials: the container's own address when its network's
# gateway is an address of this host (the Docker backend's rule), else the
# published port. PgBouncer gets the same upstream so both proxies add
# exactly one hop. (The endpoint's gateway, not the network's IPAM config:
# the default bridge leaves the latter empty.)
read -r cip cgw < <(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{.Gateway}}{{"\n"}}{{end}}' "$(container_of "$PROJECT")" | head -n1)
upstream_host=127.0.0.1 upstream_port="$dport"
# (grep reads a variable, not a pipe: with pipefail, grep -q quitting early
# can fail the pipeline through ip's SIGPIPE.)
if [[ -n "$cip" && -n "$cgw" ]] && grep -q "inet $cgw/" <<<"$(ip -o addr)"; then
	upstream_host="$cip" upstream_port=5432
fi
log "pgwake and PgBouncer dial $upstream_host:$upstream_port; direct port is 127.0.0.1:$dport"

log "pgbench -i -s $SCALE"
"$PGBENCH" -i -q -s "$SCALE" "$DURL" >"$work/pgbench-init.log" 2>&1 || { cat "$work/pgbench-init.log" >&2; die "pgbench -i failed"; }

log "starting pgbouncer (session mode) in front of 127.0.0.1:$dport"
bport="$(free_port)"
mkdir -p "$work/pgbouncer"
chmod 755 "$work/pgbouncer"
printf '"%s" "%s"\n' "$pguser" "$password" >"$work/pgbouncer/userlist.txt"
cat >"$work/pgbouncer/pgbouncer.ini" <<EOF
[databases]
$PROJECT = host=$upstream_host port=$upstream_port dbname=$PROJECT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bport
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $work/pgbouncer/userlist.txt
pool_mode = session
max_client_conn = 2000
default_pool_size = 200
server_tls_sslmode = disable
client_tls_sslmode = disable
log_connections = 0
log_disconnections = 0
EOF
chmod 644 "$work/pgbouncer/"*
bouncer_args=()
[[ "$(id -u)" == 0 ]] && bouncer_args=(-u nobody)
pgbouncer "${bouncer_args[@]}" "$work/pgbouncer/pgbouncer.ini" >"$work/pgbouncer/pgbouncer.log" 2>&1 &
bouncer_pid=$!
BURL="postgres://$pguser:$password@127.0.0.1:$bport/$PROJECT?sslmode=disable"
for i in $(seq 100); do
	if "$PSQL" "$BURL" -Atc 'select 1' >/dev/null 2>&1; then break; fi
	kill -0 "$bouncer_pid" 2>/dev/null || { cat "$work/pgbouncer/pgbouncer.log" >&2; die "pgbouncer exited"; }
	[[ $i -eq 100 ]] && { cat "$work/pgbouncer/pgbouncer.log" >&2; die "pgbouncer does not serve"; }
	sleep 0.1
done
"$PSQL" "$URL" -Atc 'select 1' >/dev/null || die "pgwake does not serve"

# Two direct baselines: the published port (what a client without pgwake
# uses: Docker's port forwarding) and the container's own address (no hop
# at all; pgwake and PgBouncer dial it too).
IURL="postgres://$pguser:$password@$upstream_host:$upstream_port/$PROJECT?sslmode=disable"
declare -A TURL=([direct]="$DURL" [direct-ip]="$IURL" [pgwake]="$WURL" [pgbouncer]="$BURL" [pgwake-tls]="$TLSURL")
declare -A TPS_PID=([pgwake]="$daemon_pid" [pgbouncer]="$bouncer_pid" [pgwake-tls]="$daemon_pid")
hz="$(getconf CLK_TCK)"

# run_pgbench TARGET CLIENTS [extra args]: prints "tps cpu_percent
# cpu_us_per_transaction context_switches_per_transaction", the last three
# for the proxy process (nan for direct).
# pgbench's -T clock includes opening the clients' connections (SCRAM, a new
# backend each: seconds for 50 clients on a busy 2-CPU machine) while its
# tps excludes that time, so -T gets one extra second per 10 clients to keep
# about DURATION seconds of measurement. A run that completed no
# transaction at all (connecting took the whole -T) prints "nan".
run_pgbench() {
	local target="$1" c="$2"
	shift 2
	local j=$((c < 2 ? c : 2)) out tps n pid="${TPS_PID[$target]:-}" t0=0 t1=0 s0=0 s1=0 cpu="nan" us="nan" cs="nan"
	local secs=$((DURATION + (c + 9) / 10))
	[[ " $* " == *" -C "* || " $* " == *" -R "* ]] && secs="$DURATION"
	[[ -n "$pid" ]] && t0="$(cpu_ticks "$pid")" s0="$(ctx_switches "$pid")"
	out="$("$PGBENCH" -n -S -c "$c" -j "$j" -T "$secs" "$@" "${TURL[$target]}" 2>&1)" ||
		{ echo "$out" >&2; die "pgbench $target -c $c failed"; }
	[[ -n "$pid" ]] && t1="$(cpu_ticks "$pid")" s1="$(ctx_switches "$pid")"
	tps="$(echo "$out" | awk '/^tps = /{print $3; exit}')"
	n="$(echo "$out" | awk -F': ' '/^number of transactions actually processed/{print $2; exit}')"
	if [[ "$n" == 0 ]]; then
		log "warning: pgbench $target -c $c completed no transaction in ${secs}s (connecting took it all)"
		echo "nan nan nan nan"
		return
	fi
	[[ -n "$tps" && -n "$n" ]] || { echo "$out" >&2; die "no tps in pgbench output"; }
	if [[ -n "$pid" ]]; then
		cpu="$(awk -v d=$((t1 - t0)) -v hz="$hz" -v s="$secs" 'BEGIN{printf "%.0f", 100*d/hz/s}')"
		us="$(awk -v d=$((t1 - t0)) -v hz="$hz" -v n="$n" 'BEGIN{printf "%.1f", 1e6*d/hz/n}')"
		cs="$(awk -v d=$((s1 - s0)) -v n="$n" 'BEGIN{printf "%.2f", d/n}')"
	fi
	echo "$tps $cpu $us $cs"
}

# --- 1. select-only throughput --------------------------------------------------

targets=(direct direct-ip pgwake pgbouncer pgwake-tls)
declare -A TPS CPU CPUTX CSTX
loadavg() { cut -d' ' -f1 /proc/loadavg; }
load_start="$(loadavg)"
for r in $(seq "$ROUNDS"); do
	for c in $CLIENTS; do
		# Rotate the order every round and client count so no target always
		# runs first (or last) on a warm cache.
		for k in "${!targets[@]}"; do
			t="${targets[$(((k + r + c) % ${#targets[@]}))]}"
			read -r tps cpu us cs < <(run_pgbench "$t" "$c")
			log "round $r  -c $c  $t: $tps tps$([[ $t == direct* ]] || echo " ($t CPU ${cpu}%, ${us} us/tx, $cs switches/tx)"); load $(loadavg)"
			TPS[$t,$c]+="$tps "
			echo "$t $c $tps" >>"$work/tps.txt" # for bench/plot
			CPU[$t,$c]+="$cpu "
			CPUTX[$t,$c]+="$us "
			CSTX[$t,$c]+="$cs "
		done
	done
done

# --- 1b. proxy CPU at a fixed rate ---------------------------------------------------

# Throughput on a 2-CPU machine swings with whatever else runs; the proxy's
# CPU per transaction at a fixed rate both proxies sustain is steadier, and
# is what decides who wins when the CPUs are full.
top_c="${CLIENTS##* }"
RATE="${BENCH_RATE:-$(stat_of "${TPS[direct-ip,$top_c]}" median | awk '{printf "%d", $1 / 2}')}"
declare -A FCPU FCS
for r in $(seq "$ROUNDS"); do
	for k in 0 1; do
		t=$([[ $(((k + r) % 2)) == 0 ]] && echo pgwake || echo pgbouncer)
		read -r tps cpu us cs < <(run_pgbench "$t" "$top_c" -R "$RATE")
		log "round $r  -c $top_c -R $RATE  $t: $tps tps ($us us/tx, $cs switches/tx)"
		FCPU[$t]+="$us "
		FCS[$t]+="$cs "
	done
done

# --- 2. connect per transaction ---------------------------------------------------

declare -A CTPS
CUS=""
for r in $(seq "$ROUNDS"); do
	for k in 0 1; do
		t=$([[ $(((k + r) % 2)) == 0 ]] && echo direct || echo pgwake)
		read -r tps cpu us cs < <(run_pgbench "$t" 10 -C)
		log "round $r  -C -c 10  $t: $tps tps$([[ $t == direct ]] || echo " ($t CPU ${cpu}%, ${us} us/tx)"); load $(loadavg)"
		CTPS[$t]+="$tps "
		if [[ $t == pgwake ]]; then CUS+="$us "; fi
	done
done

load_end="$(loadavg)"
gomaxprocs="$(grep -m1 -o 'gomaxprocs=[0-9]*' "$PGWAKE_STATE_DIR/pgwake.log" | cut -d= -f2)"
kill "$bouncer_pid" 2>/dev/null || true
wait "$bouncer_pid" 2>/dev/null || true
bouncer_pid=""

# --- 2b. COPY of 100 MB in and out ----------------------------------------------------

# The proxy's CPU while it relays a bulk COPY, as a share of what Postgres
# itself spends on it (the container's cgroup), next to the same COPY
# sent to the container's address directly.
COPY_MB="${BENCH_COPY_MB:-100}"
# container_cpu_ns NAME: CPU time of the container's cgroup, v1 or v2.
container_cpu_ns() {
	local id f
	id="$(docker inspect -f '{{.Id}}' "$1")"
	for f in /sys/fs/cgroup/cpuacct/docker/"$id"/cpuacct.usage /sys/fs/cgroup/cpu,cpuacct/docker/"$id"/cpuacct.usage; do
		[[ -r "$f" ]] && { cat "$f"; return; }
	done
	f="$(find /sys/fs/cgroup -maxdepth 4 -path "*$id*" -name cpu.stat 2>/dev/null | head -n 1)"
	if [[ -n "$f" ]]; then awk '/^usage_usec/{printf "%.0f\n", $2 * 1000}' "$f"; else echo nan; fi
}
log "COPY: writing $COPY_MB MB of rows"
awk -v mb="$COPY_MB" 'BEGIN{pad = sprintf("%0100d", 0); n = mb * 1e6 / 110; for (i = 0; i < n; i++) printf "%d,%s\n", i, pad}' >"$work/copy.csv"
"$PSQL" "$IURL" -qc 'create table if not exists copyt(id bigint, pad text)'
declare -A COPYIN COPYOUT
for r in $(seq "$ROUNDS"); do
	for t in direct-ip pgwake; do
		for dir in in out; do
			[[ $dir == in ]] && "$PSQL" "$IURL" -qc 'truncate copyt'
			p0="$(container_cpu_ns "$(container_of "$PROJECT")")" w0="$(cpu_ticks "$daemon_pid")" s="$(now_ms)"
			if [[ $dir == in ]]; then
				"$PSQL" "${TURL[$t]}" -qc "\\copy copyt from '$work/copy.csv' csv"
			else
				"$PSQL" "${TURL[$t]}" -qc "\\copy copyt to '/dev/null' csv"
			fi
			e="$(now_ms)" p1="$(container_cpu_ns "$(container_of "$PROJECT")")" w1="$(cpu_ticks "$daemon_pid")"
			# seconds, Postgres CPU s, proxy CPU s (0 for direct)
			line="$(awk -v a="$s" -v b="$e" -v p0="$p0" -v p1="$p1" -v w0="$w0" -v w1="$w1" -v hz="$hz" -v t="$t" \
				'BEGIN{printf "%.2f %.2f %.2f", (b-a)/1000, (p1-p0)/1e9, (t == "pgwake") ? (w1-w0)/hz : 0}')"
			log "round $r  COPY $dir  $t: $line (s, Postgres CPU s, proxy CPU s)"
			if [[ $dir == in ]]; then COPYIN[$t]+="$line;"; else COPYOUT[$t]+="$line;"; fi
		done
	done
done
# copy_stat "LINES" FIELD: the median of a field (1 seconds, 2 Postgres
# CPU, 3 proxy CPU) over the rounds.
copy_stat() { echo "$1" | tr ';' '\n' | awk -v f="$2" 'NF {print $f}' | median; }

# --- 3. cold wakes ------------------------------------------------------------------

# Warm baselines: the same clients against an awake project.
"$work/firstrow" -url "$URL" -n 3 >/dev/null
warm_go="$("$work/firstrow" -url "$URL" -n "$WAKES" | median)"
warm_psql_all=""
for i in $(seq "$WAKES"); do
	s="$(now_ms)"
	"$PSQL" "$URL" -Atc 'select 1' >/dev/null
	e="$(now_ms)"
	warm_psql_all+="$(awk -v a="$s" -v b="$e" 'BEGIN{printf "%.3f", b-a}') "
done
warm_psql="$(echo $warm_psql_all | tr ' ' '\n' | median)"
log "warm connect+select 1: firstrow ${warm_go} ms, psql ${warm_psql} ms"

# wake_series NAME URL: WAKES wakes timed around psql and GOWAKES timed
# by firstrow, interleaved; sets W_PSQL, W_GO (client-side ms) and W_SRV
# (pgwake's own wake time as ls --json reports it, ms).
wake_series() {
	local name="$1" url="$2" i s e ms srv np=0 ng=0 client
	W_PSQL="" W_GO="" W_SRV=""
	for i in $(seq $((WAKES + GOWAKES))); do
		# Spread the firstrow wakes evenly among the psql ones.
		if ((ng < GOWAKES && (np >= WAKES || ng * (WAKES + GOWAKES) < i * GOWAKES - GOWAKES / 2))); then
			client=firstrow
		else
			client=psql
		fi
		sleep_project "$name"
		if [[ $client == psql ]]; then
			s="$(now_ms)"
			"$PSQL" "$url" -Atc 'select 1' >/dev/null
			e="$(now_ms)"
			ms="$(awk -v a="$s" -v b="$e" 'BEGIN{printf "%.3f", b-a}')"
			W_PSQL+="$ms "
			np=$((np + 1))
		else
			ms="$("$work/firstrow" -url "$url")"
			W_GO+="$ms "
			ng=$((ng + 1))
		fi
		srv="$(last_wake_of "$name")"
		W_SRV+="$srv "
		log "wake $name #$i ($client): $ms ms (pgwake's wake: $srv ms)"
	done
}

log "wakes from stop ($PROJECT)"
wake_series "$PROJECT" "$URL"
S_PSQL="$W_PSQL" S_GO="$W_GO" S_SRV="$W_SRV"
log "wakes from pause ($PPROJECT)"
wake_series "$PPROJECT" "$PURL"
P_PSQL="$W_PSQL" P_GO="$W_GO" P_SRV="$W_SRV"

# --- 4. memory with N open connections ----------------------------------------------

"$PGWAKE" wake "$PROJECT" 2>/dev/null
sleep 2
rss_before="$(rss_kib "$daemon_pid")" anon_before="$(anon_kib "$daemon_pid")"
log "opening $NCONNS connections through pgwake (RSS before: $rss_before KiB)"
mkfifo "$work/holder.in"
"$work/conns" -url "$URL" -n "$NCONNS" <"$work/holder.in" >"$work/holder.out" 2>"$work/holder.err" &
holder_pid=$!
exec 7>"$work/holder.in"
for i in $(seq 1800); do
	grep -q '^ready' "$work/holder.out" 2>/dev/null && break
	kill -0 "$holder_pid" 2>/dev/null || { cat "$work/holder.err" >&2; die "conns failed"; }
	[[ $i -eq 1800 ]] && die "conns not ready after 180 s"
	sleep 0.1
done
open_secs="$(awk '{print $3}' "$work/holder.out")"
active="$("$PGWAKE" ls --json | jq -r --arg n "$PROJECT" '.[] | select(.name == $n) | .active')"
sleep 2
rss_conns="$(rss_kib "$daemon_pid")"
fds="$(ls "/proc/$daemon_pid/fd" | wc -l)"
threads="$(awk '/^Threads:/{print $2}' "/proc/$daemon_pid/status")"
log "$active connections open (in ${open_secs}s): RSS $rss_conns KiB, $fds fds, $threads threads"
exec 7>&-
wait "$holder_pid" || die "conns exited with an error"
holder_pid=""
per_conn="$(awk -v a="$rss_conns" -v b="$rss_before" -v n="$NCONNS" 'BEGIN{printf "%.1f", (a-b)/n}')"

# --- 5. tiered sleep: both wake paths ------------------------------------------------

# A Go benchmark on its own harness (its own instance label, removed when
# it ends): one tiered project, wakes from its pause and from its stop
# interleaved, next to the same client warm. It prints its table.
log "tiered: wakes from pause and from stop (go test -bench TieredWake)"
tiered_out="$work/tiered.out"
if (cd "$root" && PGWAKETEST_IMAGE="$IMAGE" PGWAKE_BENCH_WAKES="$GOWAKES" \
	go test -run '^$' -bench TieredWake -benchtime 1x -v ./internal/proxy/) >"$tiered_out" 2>&1; then
	tiered_table="$(sed -n '/| wake from/,/warm (awake/p' "$tiered_out" | sed 's/^[[:space:]]*//')"
else
	tail -n 20 "$tiered_out" >&2
	tiered_table="(the tiered benchmark failed; see the log above)"
fi

# --- 6. wake against the machine's own limit ---------------------------------------

# BenchmarkIntegrationWakeLimit interleaves pgwake's wake with a bare
# docker start / unpause of the same container polled to the first row,
# on a quiet machine and then with pgbench -S running beside it.
limit_table() {
	local out="$work/limit-$1.out" load=0
	[[ $1 == loaded ]] && load=1
	mkdir -p "$work/limit-$1"
	if (cd "$root" && PGWAKETEST_IMAGE="$IMAGE" PGWAKE_BENCH_WAKES="$GOWAKES" PGWAKE_BENCH_LOAD="$load" \
		PGWAKE_BENCH_OUT="$work/limit-$1" go test -run '^$' -bench WakeLimit -benchtime 1x -v ./internal/proxy/) >"$out" 2>&1; then
		sed -n '/| wake from/,/phases are medians/p' "$out" | sed 's/^[[:space:]]*//'
	else
		tail -n 20 "$out" >&2
		echo "(the wake-limit benchmark failed; see the log above)"
	fi
}
log "wakes against the raw limit, quiet"
limit_quiet="$(limit_table quiet)"
log "wakes against the raw limit, with pgbench beside them"
limit_loaded="$(limit_table loaded)"

# --- plots --------------------------------------------------------------------------

log "plots"
if ! (cd "$root" && go run ./bench/plot -tps "$work/tps.txt" -wakes "$work/limit-quiet/wakelimit.txt" -out "$here"); then
	log "plots failed"
fi

# --- report ------------------------------------------------------------------------

commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git -C "$root" status --porcelain -- . ':!bench' 2>/dev/null)" ]]; then
	commit+=" (working tree has uncommitted changes outside bench/)"
fi
pass() { awk -v x="$1" -v op="$2" -v y="$3" 'BEGIN{ok = (op == "<") ? (x < y) : (x >= y); print ok ? "yes" : "**no**"}'; }

report="$work/results.md"
{
	echo "# pgwake benchmark results"
	echo
	echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo "- machine: $(nproc) CPUs ($(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo)), $(awk '/^MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, kernel $(uname -r)"
	echo "- commit: $commit"
	echo "- Postgres: $("$PSQL" "$URL" -Atc 'show server_version') in Docker $(docker version --format '{{.Server.Version}}') ($IMAGE), $(pgbouncer --version | head -n1), $("$PGBENCH" --version)"
	echo "- runs: ${DURATION}s each, $ROUNDS rounds, targets alternating; values are medians; pgbench -i -s $SCALE"
	echo "- 1-minute load average: $load_start before the pgbench runs (sections 1 and 2), $load_end after them (the benchmark's own clients and backends count in it, up to ~50 during the 50-client runs; a high value before the runs means other work shared the CPUs)"
	echo
	echo "## 1. pgbench -S (select-only) throughput, TPS"
	echo
	echo "Direct baselines: **port** is the project's published port on 127.0.0.1 (Docker's port forwarding: what a client uses without pgwake); **addr** is the container's own address, no hop at all, which pgwake and PgBouncer dial. The targets (at least PgBouncer, within 15% of direct) are judged against the published port; the last ratio shows the cost of the hop itself."
	echo
	echo "| clients | direct port | direct addr | pgwake | pgbouncer (session) | pgwake/pgbouncer | pgwake/direct port | target met | pgwake/direct addr | CPU µs per tx pgwake / pgbouncer | switches per tx pgwake / pgbouncer | pgwake with client TLS | TLS/plain |"
	echo "|---:|---:|---:|---:|---:|---:|---:|:--|---:|---:|---:|---:|---:|"
	for c in $CLIENTS; do
		d="$(stat_of "${TPS[direct,$c]}" median)"
		di="$(stat_of "${TPS[direct-ip,$c]}" median)"
		w="$(stat_of "${TPS[pgwake,$c]}" median)"
		b="$(stat_of "${TPS[pgbouncer,$c]}" median)"
		wu="$(stat_of "${CPUTX[pgwake,$c]}" median)"
		bu="$(stat_of "${CPUTX[pgbouncer,$c]}" median)"
		ws="$(stat_of "${CSTX[pgwake,$c]}" median)"
		bs="$(stat_of "${CSTX[pgbouncer,$c]}" median)"
		if [[ "$c" == 1 ]]; then
			ok="(no target)"
		else
			ok="$(awk -v w="$w" -v d="$d" -v b="$b" 'BEGIN{print (w >= b && w >= 0.85*d) ? "yes" : "**no**"}')"
		fi
		tl="$(stat_of "${TPS[pgwake-tls,$c]}" median)"
		echo "| $c | $(fmt0 "$d") | $(fmt0 "$di") | $(fmt0 "$w") | $(fmt0 "$b") | $(ratio "$w" "$b") | $(ratio "$w" "$d") | $ok | $(ratio "$w" "$di") | $(fmt1 "$wu") / $(fmt1 "$bu") | $ws / $bs | $(fmt0 "$tl") | $(ratio "$tl" "$w") |"
	done
	echo
	echo "All runs (TPS, in run order per target):"
	echo
	for c in $CLIENTS; do
		echo "- $c clients: direct port ${TPS[direct,$c]% }; direct addr ${TPS[direct-ip,$c]% }; pgwake ${TPS[pgwake,$c]% }; pgbouncer ${TPS[pgbouncer,$c]% }; pgwake-tls ${TPS[pgwake-tls,$c]% }"
	done
	echo
	echo "## 1b. Proxy CPU at a fixed rate (pgbench -S -c $top_c -R $RATE, half the direct addr throughput)"
	echo
	echo "| | CPU µs per tx | context switches per tx | runs (µs per tx) |"
	echo "|:--|---:|---:|:--|"
	for t in pgwake pgbouncer; do
		echo "| $t | $(fmt1 "$(stat_of "${FCPU[$t]}" median)") | $(stat_of "${FCS[$t]}" median) | ${FCPU[$t]% } |"
	done
	echo
	echo "pgwake ran with GOMAXPROCS=$gomaxprocs ($(nproc) CPUs; see bench/README.md)."
	echo
	echo "## 2. Connect per transaction (pgbench -S -C, 10 clients), TPS"
	echo
	cd_="$(stat_of "${CTPS[direct]}" median)"
	cw="$(stat_of "${CTPS[pgwake]}" median)"
	echo "| direct | pgwake | pgwake/direct | pgwake CPU µs per connection (+1 select) |"
	echo "|---:|---:|---:|---:|"
	echo "| $(fmt0 "$cd_") | $(fmt0 "$cw") | $(ratio "$cw" "$cd_") | $(fmt0 "$(stat_of "$CUS" median)") |"
	echo
	echo "All runs: direct ${CTPS[direct]% }; pgwake ${CTPS[pgwake]% }"
	echo
	echo "## 2b. COPY of $COPY_MB MB in and out (psql \\copy, medians of $ROUNDS)"
	echo
	echo "| | direct addr s | pgwake s | pgwake/direct | Postgres CPU s, direct / pgwake | pgwake's CPU s | pgwake's CPU / Postgres's |"
	echo "|:--|---:|---:|---:|---:|---:|---:|"
	for dir in in out; do
		if [[ $dir == in ]]; then dl="${COPYIN[direct-ip]}" wl="${COPYIN[pgwake]}"; else dl="${COPYOUT[direct-ip]}" wl="${COPYOUT[pgwake]}"; fi
		ds="$(copy_stat "$dl" 1)" ws="$(copy_stat "$wl" 1)" dp="$(copy_stat "$dl" 2)" wp="$(copy_stat "$wl" 2)" wc="$(copy_stat "$wl" 3)"
		echo "| COPY $dir | $ds | $ws | $(ratio "$ws" "$ds") | $dp / $wp | $wc | $(ratio "$wc" "$wp") |"
	done
	echo
	echo "## 3. Cold wake to the first row of SELECT 1, ms ($WAKES wakes timed around psql and $GOWAKES by firstrow, per sleep mode)"
	echo
	echo "| sleep mode | firstrow median | firstrow p95 | firstrow minus warm | psql median | psql p95 | psql minus warm | pgwake's own wake, median / p95 | target (firstrow median) | met |"
	echo "|:--|---:|---:|---:|---:|---:|---:|---:|---:|:--|"
	for m in stop pause; do
		if [[ $m == stop ]]; then g="$S_GO" q="$S_PSQL" v="$S_SRV" tgt=1000; else g="$P_GO" q="$P_PSQL" v="$P_SRV" tgt=50; fi
		gm="$(stat_of "$g" median)"
		qm="$(stat_of "$q" median)"
		echo "| $m | $(fmt1 "$gm") | $(fmt1 "$(stat_of "$g" p95)") | $(fmt1 "$(awk -v a="$gm" -v b="$warm_go" 'BEGIN{print a-b}')") | $(fmt1 "$qm") | $(fmt1 "$(stat_of "$q" p95)") | $(fmt1 "$(awk -v a="$qm" -v b="$warm_psql" 'BEGIN{print a-b}')") | $(fmt1 "$(stat_of "$v" median)") / $(fmt1 "$(stat_of "$v" p95)") | < $tgt | $(pass "$gm" "<" "$tgt") |"
	done
	echo
	echo "Warm baseline (project awake, same client, median of $WAKES): firstrow $(fmt1 "$warm_go") ms, psql $(fmt1 "$warm_psql") ms. p95 is nearest-rank: with fewer than 20 samples it is the maximum."
	echo
	echo "## 4. pgwake memory (VmRSS)"
	echo
	echo "| at start (2 projects, no traffic) | idle after the runs above | with $NCONNS open connections | per connection | targets | met |"
	echo "|---:|---:|---:|---:|:--|:--|"
	echo "| $(fmt1 "$(awk -v k="$rss_start" 'BEGIN{print k/1024}')") MiB | $(fmt1 "$(awk -v k="$rss_before" 'BEGIN{print k/1024}')") MiB | $(fmt1 "$(awk -v k="$rss_conns" 'BEGIN{print k/1024}')") MiB | $per_conn KiB | idle < 30 MiB, < 40 KiB/conn | $(pass "$(awk -v k="$rss_before" 'BEGIN{print k/1024}')" "<" 30) / $(pass "$per_conn" "<" 40) |"
	echo
	echo "VmRSS includes the pages of pgwake's own binary ($(fmt1 "$(awk -v b="$(stat -c %s "$PGWAKE")" 'BEGIN{print b/1048576}')") MiB) that the kernel mapped in; they are page cache, shared by every pgwake process and dropped under memory pressure. RssAnon, what the daemon itself allocated: $(fmt1 "$(awk -v k="$anon_start" 'BEGIN{print k/1024}')") MiB at start, $(fmt1 "$(awk -v k="$anon_before" 'BEGIN{print k/1024}')") MiB idle after the runs."
	echo
	echo "Per connection = (RSS with $NCONNS connections - RSS idle just before) / $NCONNS. With them open pgwake held $fds file descriptors and $threads OS threads; opening them took ${open_secs}s."
	echo
	echo "## 5. Tiered sleep: wake from its pause and from its stop, ms (BenchmarkIntegrationTieredWake, $GOWAKES wakes each)"
	echo
	echo "One tiered project, the two paths interleaved on the same server and data; a pgconn client from connect to the first row of SELECT 1 through the proxy; \"pgwake's own wake\" is its start or unpause until Postgres answers."
	echo
	echo "$tiered_table"
	echo
	echo "## 6. Wake against the machine's limit, ms (BenchmarkIntegrationWakeLimit, $GOWAKES wakes per path and side)"
	echo
	echo "raw: the same container started (or unpaused) by a bare Engine API call, then a connect every millisecond to the first row of SELECT 1 at its address, no proxy; pgwake: a client's connect through pgwake to the first row. Interleaved on one tiered project. Phases (medians of pgwake's own wakes): engine = the start or unpause call, accept = until the server first accepted a TCP connection, ready = until Postgres answered (mean 57P03 refusals in brackets), confirm = the check that the server is the run started. Targets: median ratio <= 1.05, p95 ratio <= 1.15."
	echo
	echo "Quiet machine:"
	echo "$limit_quiet"
	echo
	echo "With pgbench -S (4 clients) against another project of the same pgwake:"
	echo "$limit_loaded"
	echo
	echo "![wake from stop](wake-stop.png) ![throughput](throughput.png)"
} >"$report"

cat "$report"
cp "$report" "$here/results.md"
log "written to bench/results.md"
