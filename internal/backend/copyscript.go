package backend

// Inside a copy helper: where a source volume and a snapshot volume are
// mounted (a project's own volume goes where its server has it), and the
// folder a copy is staged in before it is published.
const (
	SrcMount   = "/pgwake-src"
	SnapMount  = "/pgwake-snap"
	StagingDir = ".pgwake-copy"
)

// CopyScript is the shell a backend's helper (a container or Pod of the
// project's image, as root) runs to copy data. The caller sets
// FILL (what fills "$S": a base backup or a file copy) and MODE:
//
//   - publish: $S is staged inside PGDATA on the project's volume (so
//     PGDATA is never empty, whatever the image's layout), then moved into
//     PGDATA with PG_VERSION last, after PGDATA's
//     old contents (if any) are gone, PG_VERSION first. Until the last
//     move no start can mistake the folder for a whole cluster, and it is
//     never empty either (the official entrypoint would run initdb on an
//     empty one): a start fails.
//   - snapshot: $S is a folder of the snapshot volume, renamed to "data"
//     when complete; a snapshot without "data" is incomplete.
//
// With ROLE_SQL set (publish only), that statement (a branch's own
// password for its superuser) runs on the staged copy in single-user
// mode, as the postgres account, before it is published: a few hundred
// milliseconds, against a server start, a login and a stop. A copy from a
// base backup finishes its recovery there, so the branch's first start
// has none left to do.
//
// cp uses --reflink=auto where the image's cp has it (GNU coreutils):
// on btrfs or XFS the copy shares blocks and takes no time.
const CopyScript = `set -eu
R=
if cp --help 2>&1 | grep -q reflink; then R=--reflink=auto; fi
copy() { cp -a $R "$1/." "$2/"; }
# copydata SRC DST: a stopped cluster, less the WAL it no longer needs.
# After a clean shutdown it needs the segment of its last checkpoint (and
# the next, should the record cross into it); the rest of pg_wal are old
# segments kept for reuse, as large as the data itself after a bulk load.
copydata() {
	redo=
	if [ ! -L "$1/pg_wal" ] && ctl=$(LC_ALL=C pg_controldata "$1" 2>/dev/null); then
		state=$(printf '%s\n' "$ctl" | sed -n 's/^Database cluster state: *//p')
		[ "$state" = "shut down" ] && redo=$(printf '%s\n' "$ctl" | sed -n "s/^Latest checkpoint's REDO WAL file: *//p")
	fi
	if [ -z "$redo" ] || [ ! -f "$1/pg_wal/$redo" ]; then copy "$1" "$2"; return; fi
	for f in "$1"/* "$1"/.[!.]* "$1"/..?*; do
		[ -e "$f" ] || [ -L "$f" ] || continue
		[ "${f##*/}" = pg_wal ] && continue
		cp -a $R "$f" "$2/"
	done
	mkdir -p "$2/pg_wal/archive_status"
	chmod 700 "$2/pg_wal" "$2/pg_wal/archive_status"
	next=$(ls "$1/pg_wal" | grep -E '^[0-9A-F]{24}$' | sort | awk -v r="$redo" '$0 > r { print; exit }')
	for w in "$redo" $next; do cp -a $R "$1/pg_wal/$w" "$2/pg_wal/"; done
	for h in "$1"/pg_wal/*.history; do
		[ -e "$h" ] && cp -a "$h" "$2/pg_wal/"
	done
	return 0
}
# asuser CMD...: CMD as the postgres account, with whichever tool the image
# has (gosu in the official Debian image, su-exec in Alpine's, su else).
asuser() {
	if command -v gosu >/dev/null 2>&1; then gosu postgres "$@"
	elif command -v su-exec >/dev/null 2>&1; then su-exec postgres "$@"
	else su -s /bin/sh -c 'exec "$0" "$@"' -- postgres "$@"
	fi
}
rm -rf "$S"
mkdir -p "$S"
eval "$FILL"
# Not a cluster (a source never started): refused before anything of the
# target is touched.
[ -s "$S/PG_VERSION" ] || { echo "the copy has no PG_VERSION: its source holds no cluster" >&2; exit 4; }
chown -R postgres:postgres "$S"
chmod 700 "$S"
if [ "$MODE" = publish ] && [ -n "${ROLE_SQL:-}" ]; then
	# exit_on_error: a failed statement ends it with a non-zero status
	# (single-user mode would go on and exit 0). Its log is stderr.
	printf '%s\n' "$ROLE_SQL" | asuser postgres --single -D "$S" -c exit_on_error=on template1 >/dev/null ||
		{ echo "setting the copy's password in single-user mode failed" >&2; exit 6; }
fi
sync # the copy is on disk before it is published
case "$MODE" in
publish)
	mkdir -p "$PGDATA"
	rm -f "$PGDATA/PG_VERSION"
	find "$PGDATA" -mindepth 1 -maxdepth 1 ! -name ` + StagingDir + ` -exec rm -rf {} +
	for f in "$S"/* "$S"/.[!.]* "$S"/..?*; do
		[ -e "$f" ] || [ -L "$f" ] || continue
		[ "${f##*/}" = PG_VERSION ] && continue
		mv "$f" "$PGDATA/"
	done
	mv "$S/PG_VERSION" "$PGDATA/PG_VERSION"
	rmdir "$S"
	chown postgres:postgres "$PGDATA"
	chmod 700 "$PGDATA"
	;;
snapshot)
	mv "$S" "$SNAP/data"
	sync
	du -sk "$SNAP/data" | cut -f1
	;;
esac
`

// FillCopyStopped is CopyScript's FILL for a copy of the stopped cluster
// in dir.
func FillCopyStopped(dir string) string { return `copydata "` + dir + `" "$S"` }

// FillRestore is CopyScript's FILL for a restore from the snapshot
// mounted at snap. A snapshot whose copy never completed has no "data":
// it is refused before anything of the project's data is touched.
func FillRestore(snap string) string {
	return `[ -s "` + snap + `/data/PG_VERSION" ] || { echo "snapshot is incomplete (its copy was interrupted); delete it" >&2; exit 3; }; copy "` + snap + `/data" "$S"`
}
