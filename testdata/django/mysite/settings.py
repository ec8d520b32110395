"""Settings for the minimal Django project pgwake's integration tests run.

The database comes from the environment `pgwake env` prints: DATABASE_URL
when it is set, otherwise the PG* variables. Parsed here with urllib.parse,
so the project needs nothing beyond Django and psycopg2.
"""
import os
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured


def database_from_url(url):
    u = urlsplit(url)
    if u.scheme not in ("postgres", "postgresql"):
        raise ImproperlyConfigured("DATABASE_URL: scheme %r is not postgres" % u.scheme)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(u.path.lstrip("/")),
        "USER": unquote(u.username or ""),
        "PASSWORD": unquote(u.password or ""),
        "HOST": u.hostname or "",
        "PORT": str(u.port or ""),
        # sslmode, sslrootcert, ...: libpq connection parameters, which
        # psycopg2 passes through.
        "OPTIONS": dict(parse_qsl(u.query)),
    }


def database_from_pg_env(env):
    if not env.get("PGDATABASE"):
        raise ImproperlyConfigured("set DATABASE_URL or PGDATABASE (eval \"$(pgwake env NAME)\")")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": env["PGDATABASE"],
        "USER": env.get("PGUSER", ""),
        "PASSWORD": env.get("PGPASSWORD", ""),
        "HOST": env.get("PGHOST", ""),
        "PORT": env.get("PGPORT", ""),
    }


def database(env):
    if env.get("DATABASE_URL"):
        return database_from_url(env["DATABASE_URL"])
    return database_from_pg_env(env)


SECRET_KEY = "pgwake-tests-only"
DEBUG = False
INSTALLED_APPS = ["notes"]
DATABASES = {"default": database(os.environ)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
