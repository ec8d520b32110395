#!/usr/bin/env bash
# Reproduces docs/status.png, the screenshot of `pgwake status` in the README.
#
# Runs a throwaway pgwake daemon (its own state dir, Docker backend), gives
# its projects some history (wakes, sleeps, an open connection, a pin made
# with the dashboard's own `p` key), shows `pgwake status` in a 100x30 tmux
# pane, captures the pane with its colours (capture-pane -e) and renders
# that to PNG with freeze. Everything it creates is removed on exit.
#
#   docs/screenshot.sh [OUTPUT.png]
#
# Needs Docker, tmux and psql (scripts/setup installs them) and the Postgres
# image: $PGWAKE_IMAGE, or pgwake-test/postgres:15 built by
# testdata/postgres-image/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

out="${1:-docs/status.png}"
image="${PGWAKE_IMAGE:-pgwake-test/postgres:15}"
freeze="github.com/charmbracelet/freeze@v0.2.2"

work="$(mktemp -d /tmp/pgwXXXX)" # short: it holds the admin socket
psql_pid=""
cleanup() {
	set +e
	tmux -S "$work/tmux.sock" kill-server 2>/dev/null
	[[ -n "$psql_pid" ]] && kill "$psql_pid" 2>/dev/null
	[[ -S "$work/pgwake.sock" ]] && "$work/pgwake" down --volumes >/dev/null 2>&1
	rm -rf "$work"
}
trap cleanup EXIT

docker image inspect "$image" >/dev/null 2>&1 ||
	{ echo "screenshot: image $image is missing (testdata/postgres-image/build.sh builds it)" >&2; exit 1; }

go build -o "$work/pgwake" ./cmd/pgwake
pgwake() { "$work/pgwake" "$@"; }
# Only this daemon's settings: none of the user's PGWAKE_* or pgwake.yaml.
while IFS= read -r v; do unset "$v"; done < <(env | sed -n 's/^\(PGWAKE_[A-Z_]*\)=.*/\1/p')
export PGWAKE_STATE_DIR="$work" PGWAKE_IMAGE="$image" PGWAKE_BACKEND=docker PGWAKE_CONFIG=/dev/null
unset TMUX NO_COLOR

cd "$work"
pgwake up -d --wait --listen 127.0.0.1:0
for p in analytics app billing reports; do pgwake create "$p" >/dev/null; done
pgwake create cache --sleep-mode pause --sleep-after 5m >/dev/null

# History for the sparklines: the first wake of each runs initdb; cache
# pauses, so its later wakes take milliseconds.
for _ in 1 2 3 4 5; do pgwake wake app; pgwake sleep app; done
for _ in 1 2 3; do pgwake wake analytics; pgwake sleep analytics; done
for _ in 1 2 3 4; do pgwake wake cache; pgwake sleep cache; done
pgwake wake cache
pgwake wake billing
# An open connection keeps app awake.
pgwake wake app
psql "$(pgwake url app)" -qAt -c "select pg_sleep(600)" >/dev/null 2>&1 &
psql_pid=$!

tmux -S "$work/tmux.sock" -f /dev/null new-session -d -s status -x 100 -y 30 \
	-e TERM=xterm-256color -e COLORTERM=truecolor "$work/pgwake status"

# wait_for TEXT: poll the pane (up to 60 s) until it shows TEXT.
wait_for() {
	for _ in $(seq 600); do
		tmux -S "$work/tmux.sock" capture-pane -p -t status | grep -qF -- "$1" && return 0
		sleep 0.1
	done
	echo "screenshot: the pane never showed: $1" >&2
	tmux -S "$work/tmux.sock" capture-pane -p -t status >&2
	exit 1
}
keys() { tmux -S "$work/tmux.sock" send-keys -t status "$@"; }

wait_for "5 projects"
# Pin billing with the dashboard (third row), then select app (second).
keys j j
wait_for "/billing?"
keys p
wait_for "billing is pinned"
keys k
wait_for "/app?"
wait_for "1 open"
sleep 1 # let the status line's flash and the countdown settle on a whole second

# freeze understands SGR 0, 38 and 48 only: restate every change of style
# as a reset and the colours in force, with faint text as grey, so that
# tmux's 39/49 (default colour) and 2/22 (faint) draw right.
tmux -S "$work/tmux.sock" capture-pane -e -p -t status | perl -pe '
	BEGIN { ($fg, $bg, $faint) = ("", "", 0) }
	s/\e\[([0-9;]*)m/sgr($1)/ge;
	sub sgr {
		my @p = length $_[0] ? split(/;/, $_[0]) : (0);
		while (@p) {
			my $v = shift @p;
			if    ($v == 0)  { ($fg, $bg, $faint) = ("", "", 0) }
			elsif ($v == 2)  { $faint = 1 }
			elsif ($v == 22) { $faint = 0 }
			elsif ($v == 39) { $fg = "" }
			elsif ($v == 49) { $bg = "" }
			elsif (($v >= 30 && $v <= 37) || ($v >= 90 && $v <= 97)) { $fg = $v }
			elsif ($v >= 40 && $v <= 47)   { $bg = "48;5;" . ($v - 40) }
			elsif ($v >= 100 && $v <= 107) { $bg = "48;5;" . ($v - 92) }
			elsif ($v == 38 || $v == 48) {
				my $c = shift(@p) == 5 ? "5;" . shift(@p) : "2;" . join(";", splice(@p, 0, 3));
				if ($v == 38) { $fg = "38;$c" } else { $bg = "48;$c" }
			}
		}
		my $f = length $fg ? $fg : ($faint ? "38;5;245" : "");
		return "\e[0m" . (length $f ? "\e[${f}m" : "") . (length $bg ? "\e[${bg}m" : "");
	}' >"$work/status.ansi"
cd - >/dev/null
go run "$freeze" --language ansi --window --theme charm --padding 20 --margin 20 \
	--font.size 14 --line-height 1.2 -o "$out" <"$work/status.ansi" >/dev/null
chmod 0644 "$out"
echo "wrote $out"
