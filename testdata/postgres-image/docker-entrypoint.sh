#!/bin/sh
# Entrypoint for the pgwake test image (see build.sh). It is a small busybox
# sh re-implementation of the official postgres image's docker-entrypoint.sh,
# covering exactly the contract pgwake relies on, so the same backend code
# runs against this image and against postgres:NN from Docker Hub:
#
#   POSTGRES_PASSWORD (required unless POSTGRES_HOST_AUTH_METHOD=trust),
#   POSTGRES_USER (default postgres), POSTGRES_DB (default $POSTGRES_USER),
#   POSTGRES_INITDB_ARGS, POSTGRES_HOST_AUTH_METHOD, the *_FILE variants,
#   /docker-entrypoint-initdb.d/*.sql, *.sql.gz and *.sh (executed when
#   executable, sourced otherwise) in lexical order while PGDATA is empty,
#   the server's options (postgres -c name=value) also for the temporary
#   server those run against, and "postgres" ending up as PID 1 so that
#   docker stop's signal reaches it directly.
set -eu
# Like upstream (bash, -o pipefail): a failing gunzip fails its pipeline.
set -o pipefail

# file_env VAR: allow VAR_FILE (docker secrets) instead of VAR, like upstream.
file_env() {
	eval "_val=\${$1:-}"
	eval "_file=\${${1}_FILE:-}"
	if [ -n "$_val" ] && [ -n "$_file" ]; then
		echo >&2 "error: both $1 and ${1}_FILE are set (but are exclusive)"
		exit 1
	fi
	if [ -n "$_file" ]; then
		_val="$(cat "$_file")"
	fi
	export "$1=$_val"
	unset "${1}_FILE" _val _file
}

# Like upstream: "docker run image -c foo=bar" means "postgres -c foo=bar".
case "${1:-}" in
-*) set -- postgres "$@" ;;
esac

# Only the server gets the initialisation treatment; "docker run image sh"
# and friends run as given.
if [ "${1:-}" != postgres ]; then
	exec "$@"
fi

: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA

if [ "$(id -u)" = 0 ]; then
	# A freshly created volume (or a bind mount) may be owned by root; the
	# server refuses to run as root, so hand the directories to postgres and
	# re-exec as that user. busybox su execs the shell in-process (no fork),
	# and the shell execs us again, so PID 1 stays PID 1 and becomes postgres.
	# The "--" matters: busybox su uses permuting getopt, so without it a
	# server argument such as "-c foo=bar" would be taken as su's own -c.
	mkdir -p "$PGDATA" /var/run/postgresql
	chmod 0700 "$PGDATA"
	chmod 3777 /var/run/postgresql
	find "$PGDATA" /var/run/postgresql ! -user postgres -exec chown postgres:postgres {} +
	exec su -s /bin/sh -c 'exec "$0" "$@"' -- postgres "$0" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	file_env POSTGRES_PASSWORD
	file_env POSTGRES_USER
	file_env POSTGRES_DB
	file_env POSTGRES_INITDB_ARGS
	: "${POSTGRES_USER:=postgres}"
	: "${POSTGRES_DB:=$POSTGRES_USER}"
	: "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"

	if [ -z "$POSTGRES_PASSWORD" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != trust ]; then
		cat >&2 <<-'EOE'
			Error: Database is uninitialized and superuser password is not specified.
			       You must specify POSTGRES_PASSWORD to a non-empty value for the
			       superuser. For example, "-e POSTGRES_PASSWORD=password" on "docker run".

			       You may also use "POSTGRES_HOST_AUTH_METHOD=trust" to allow all
			       connections without a password. This is *not* recommended.

			       See PostgreSQL documentation about "trust":
			       https://www.postgresql.org/docs/current/auth-trust.html
		EOE
		exit 1
	fi

	# The password goes through a pipe rather than a file or argv so it is
	# never on disk or visible in ps. POSTGRES_INITDB_ARGS is eval'd (as
	# upstream does) so quoted values survive, and comes last so it can
	# override our defaults. The locale comes from LANG (C.UTF-8 or C, set by
	# build.sh); --encoding=UTF8 makes the encoding independent of it.
	pwfile=
	if [ -n "$POSTGRES_PASSWORD" ]; then
		pwfile=--pwfile=/dev/stdin
	fi
	printf '%s\n' "$POSTGRES_PASSWORD" | eval 'initdb --username="$POSTGRES_USER" $pwfile \
		--encoding=UTF8 --auth-host=scram-sha-256 --auth-local=trust '"$POSTGRES_INITDB_ARGS"

	{
		printf '\n'
		if [ "$POSTGRES_HOST_AUTH_METHOD" = trust ]; then
			printf '# warning trust is enabled for all connections\n'
		fi
		printf 'host all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD"
	} >>"$PGDATA/pg_hba.conf"
	# Upstream patches postgresql.conf.sample at image build time; doing it
	# here has the same effect on a new cluster.
	printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"

	# Temporary server on the unix socket only, so nothing can connect over
	# TCP before initialisation is complete. Like upstream it gets the
	# server's own options (settings an init script may need, such as
	# shared_preload_libraries), quoted for the shell pg_ctl runs it with.
	opts=
	shift
	for a in "$@" -c "listen_addresses=" -p "${PGPORT:-5432}"; do
		opts="$opts'$(printf '%s' "$a" | sed "s/'/'\\\\''/g")' "
	done
	set -- postgres "$@"
	pg_ctl -D "$PGDATA" -o "$opts" -w start

	psql_run() {
		psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password --no-psqlrc "$@"
	}
	if [ "$POSTGRES_DB" != postgres ]; then
		psql_run --dbname postgres --set db="$POSTGRES_DB" <<-'EOSQL'
			SELECT 'CREATE DATABASE ' || quote_ident(:'db')
			WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db') \gexec
		EOSQL
	fi
	for f in /docker-entrypoint-initdb.d/*; do
		case "$f" in
		*.sh)
			if [ -x "$f" ]; then
				echo "$0: running $f"
				"$f"
			else
				echo "$0: sourcing $f"
				. "$f"
			fi
			;;
		*.sql) echo "$0: running $f"; psql_run --dbname "$POSTGRES_DB" -f "$f" ;;
		*.sql.gz) echo "$0: running $f"; gunzip -c "$f" | psql_run --dbname "$POSTGRES_DB" ;;
		*) if [ -e "$f" ]; then echo "$0: ignoring $f"; fi ;;
		esac
	done

	pg_ctl -D "$PGDATA" -m fast -w stop
	echo
	echo 'PostgreSQL init process complete; ready for start up.'
	echo
fi

exec "$@"
