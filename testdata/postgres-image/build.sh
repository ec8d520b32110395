#!/usr/bin/env bash
# Builds the Postgres image pgwake's integration tests run against, without
# pulling anything: the root filesystem is assembled from this machine's
# Debian postgresql-NN packages plus busybox-static and loaded with
# `docker import`. CI and dev machines may have no registry access, but the
# backend code under test must behave exactly as with the official postgres
# image, so the image follows that image's contract (PGDATA, VOLUME, EXPOSE,
# ENTRYPOINT docker-entrypoint.sh, CMD postgres, POSTGRES_* variables; see
# docker-entrypoint.sh).
#
# Usage: build.sh [TAG]    (default $PGWAKETEST_IMAGE or pgwake-test/postgres:15)
# Requires: docker CLI, postgresql-$PG_MAJOR and busybox-static installed
# (apt-get install postgresql-15 busybox-static).
# Progress goes to stderr; the image tag is printed on stdout at the end.
#
# Idempotent: the image carries a fingerprint of its inputs as a label and is
# only rebuilt when that changes (or PGWAKETEST_IMAGE_REBUILD=1).
set -euo pipefail

tag="${1:-${PGWAKETEST_IMAGE:-pgwake-test/postgres:15}}"
pg_major="${PG_MAJOR:-15}"
pg_home="/usr/lib/postgresql/$pg_major"
pg_share="/usr/share/postgresql/$pg_major"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
entrypoint="$here/docker-entrypoint.sh"
busybox="${BUSYBOX:-/bin/busybox}"
label=io.pgwake.test.fingerprint

log() { printf 'build.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -x "$pg_home/bin/postgres" ]] || die "$pg_home/bin/postgres not found (apt-get install postgresql-$pg_major)"
[[ -d "$pg_share" ]] || die "$pg_share not found (apt-get install postgresql-$pg_major)"
[[ -x "$busybox" ]] || die "$busybox not found (apt-get install busybox-static)"
# A dynamic busybox would need its own libc set-up; ldd fails on static ones.
if ldd "$busybox" >/dev/null 2>&1; then die "$busybox is not static (apt-get install busybox-static)"; fi
command -v docker >/dev/null || die "docker CLI not found"

# Fingerprint everything the image is made from, coarsely: the two scripts
# and the versions of the packages whose files end up in it.
fingerprint="$(
	{
		cat "${BASH_SOURCE[0]}" "$entrypoint"
		"$pg_home/bin/postgres" --version
		"$busybox" 2>&1 | head -n 1
		dpkg-query -W "postgresql-$pg_major" busybox-static libc6 2>/dev/null || true
	} | sha256sum | cut -d' ' -f1
)"
old_id="$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)"
if [[ -n "$old_id" && -z "${PGWAKETEST_IMAGE_REBUILD:-}" ]] &&
	[[ "$(docker image inspect -f "{{index .Config.Labels \"$label\"}}" "$tag")" == "$fingerprint" ]]; then
	log "$tag is up to date"
	echo "$tag"
	exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/pgwake-pgimage.XXXXXX")"
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
mkdir -p "$root"/{bin,sbin,etc,lib64,usr/bin,usr/sbin,usr/local/bin,usr/local/sbin,tmp,root} \
	"$root"/var/lib/postgresql/data "$root"/var/run/postgresql "$root"/docker-entrypoint-initdb.d
chmod 1777 "$root/tmp"
chmod 0700 "$root/var/lib/postgresql/data" "$root/root"
chmod 3777 "$root/var/run/postgresql"

# Postgres itself. JIT (llvmjit.so + bitcode) is left out: it drags in
# libLLVM and libz3 (~150 MB) for nothing a test needs; without the provider
# the server just reports jit as unavailable. Docs/man pages are left out too.
tar -C / -cf - \
	--exclude="${pg_home#/}/lib/bitcode" --exclude="${pg_home#/}/lib/llvmjit*" \
	--exclude="${pg_share#/}/man" \
	"${pg_home#/}" "${pg_share#/}" usr/share/zoneinfo |
	tar -C "$root" -xf -
# Debian's postgres is built --with-system-tzdata, so zoneinfo above is what
# makes TimeZone settings (sent by most clients) work. The locale likewise:
# C.UTF-8 if the host has it, otherwise plain C (UTF8 encoding either way).
lang=C
if [[ -d /usr/lib/locale/C.utf8 ]]; then
	mkdir -p "$root/usr/lib/locale"
	cp -a /usr/lib/locale/C.utf8 "$root/usr/lib/locale/"
	lang=C.UTF-8
fi

# Every shared library the binaries and server modules need, copied to the
# path ldd resolved it to (symlinks dereferenced, so the file is named by its
# soname), plus the dynamic loader. Debian's loader searches
# /lib/x86_64-linux-gnu and /usr/lib/x86_64-linux-gnu without a ld.so.cache.
mapfile -t libs < <(
	ldd "$root$pg_home"/bin/* "$root$pg_home"/lib/*.so 2>/dev/null |
		awk '$2 == "=>" && $3 == "not" { print "MISSING " $1; next }
		     $2 == "=>" && $3 ~ /^\// { print $3; next }
		     $1 ~ /^\// && $1 !~ /:$/ { print $1 }' |
		sort -u
)
for lib in "${libs[@]}"; do
	[[ "$lib" != MISSING* ]] || die "unresolved library ${lib#MISSING }"
	mkdir -p "$root$(dirname "$lib")"
	cp -L "$lib" "$root$lib"
done

# busybox provides /bin/sh and the few tools the entrypoint needs (su drops
# root; busybox-static has neither chpst nor setuidgid, and its setpriv
# cannot change uid). All applets are linked: handy for `docker exec sh`.
cp "$busybox" "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list); do
	[[ "$applet" == busybox || -e "$root/bin/$applet" ]] || ln -s busybox "$root/bin/$applet"
done
install -m 0755 "$entrypoint" "$root/usr/local/bin/docker-entrypoint.sh"

cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
postgres:x:999:999:PostgreSQL administrator:/var/lib/postgresql:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
postgres:x:999:
nogroup:x:65534:
EOF
# glibc's built-in defaults would do, but be explicit (files only for users).
printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
# UTC like the official (Debian-based) image. Without /etc/localtime initdb
# probes every zone in zoneinfo to guess the system's, costing ~3 s on each
# fresh container.
ln -s /usr/share/zoneinfo/Etc/UTC "$root/etc/localtime"
# initdb's post-bootstrap runs `locale -a` to import system collations and
# warns when it is missing; busybox has no locale applet, so list ours.
{
	printf '#!/bin/sh\n# Stand-in for glibc locale(1): enough for the "locale -a" postgres runs.\n'
	printf '[ "${1:-}" = -a ] || { echo "locale: only -a is supported" >&2; exit 1; }\n'
	printf 'echo C\necho POSIX\n'
	if [[ "$lang" == C.UTF-8 ]]; then printf 'echo C.utf8\n'; fi
} >"$root/usr/bin/locale"
chmod 0755 "$root/usr/bin/locale"

# Root-owned tree first, then the postgres-owned directories (empty in the
# image) with uid/gid 999: tar sets owners per invocation, and this way the
# build does not need to run as root. Docker copies the owner of the VOLUME
# directory into fresh volumes, as with the official image.
tar -C "$root" --sort=name --numeric-owner --owner=0 --group=0 \
	--exclude=./var/lib/postgresql --exclude=./var/run/postgresql \
	-cf "$work/rootfs.tar" .
tar -C "$root" --sort=name --numeric-owner --owner=999 --group=999 \
	-rf "$work/rootfs.tar" ./var/lib/postgresql ./var/run/postgresql

pg_version="$("$pg_home/bin/postgres" --version | awk '{print $3}')"
log "importing $(du -h "$work/rootfs.tar" | cut -f1) rootfs (PostgreSQL $pg_version) as $tag"
# No STOPSIGNAL: docker < 23 rejects it in --change. Callers that want a
# fast shutdown pass --stop-signal SIGINT, as pgwake does.
docker import \
	-c "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$pg_home/bin" \
	-c "ENV LANG=$lang" \
	-c "ENV PG_MAJOR=$pg_major" \
	-c "ENV PG_VERSION=$pg_version" \
	-c "ENV PGDATA=/var/lib/postgresql/data" \
	-c "VOLUME /var/lib/postgresql/data" \
	-c "EXPOSE 5432/tcp" \
	-c 'ENTRYPOINT ["docker-entrypoint.sh"]' \
	-c 'CMD ["postgres"]' \
	-c "LABEL $label=$fingerprint" \
	-m "pgwake test image: Debian postgresql-$pg_major $pg_version + busybox" \
	- "$tag" <"$work/rootfs.tar" >/dev/null

# The previous build of this tag is now dangling; drop it if nothing uses it.
new_id="$(docker image inspect -f '{{.Id}}' "$tag")"
if [[ -n "$old_id" && "$old_id" != "$new_id" ]]; then
	docker image rm "$old_id" >/dev/null 2>&1 || true
fi
echo "$tag"
