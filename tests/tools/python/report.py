"""Reporting shared by the analysts' Python tools against pgdp (tests/integration/tools_python.rs).

Each program runs named checks and prints one line per check on stdout:

    ok <check> <detail>
    FAIL <check>: refused sqlstate=<SQLSTATE> <message> | sql: <what pgdp received>
    FAIL <check>: mismatch <what differs from PostgreSQL> | sql: ...
    FAIL <check>: error <exception> ...

`refused` is an error that pgdp (or the tool) raised with a SQLSTATE; `mismatch` is an answer
whose column types, Python value types or values are not what PostgreSQL gives for the same
operation (values within plausibility ranges only: pgdp's answers are noisy); `error` is anything
else. The Rust test holds the expected outcome of every check. A program exits with 0 once it has
reported every check, whatever their outcomes, and with 2 when it could not run them.

pgdp's address comes from PGDP_HOST, PGDP_PORT, PGDP_USER, PGDP_PASSWORD, PGDP_DATABASE; the
upstream database holding the same demo data (for the comparison with PostgreSQL) from
PGDP_UPSTREAM_DSN, a libpq DSN or URL.
"""

import os
import sys
import traceback

import psycopg
import psycopg.conninfo

HOST = os.environ.get("PGDP_HOST", "127.0.0.1")
PORT = int(os.environ.get("PGDP_PORT", "6442"))
USER = os.environ.get("PGDP_USER", "analyst")
PASSWORD = os.environ.get("PGDP_PASSWORD", "analyst")
DATABASE = os.environ.get("PGDP_DATABASE", "pgdp_demo")
UPSTREAM_DSN = os.environ.get(
    "PGDP_UPSTREAM_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=pgdp_demo")

REGIONS = {"CE", "EA", "IS", "NE", "NO", "NW", "SE", "SO", "SW", "WE"}


def pgdp_dsn():
    return (
        f"host={HOST} port={PORT} user={USER} password={PASSWORD} dbname={DATABASE} "
        "sslmode=disable connect_timeout=10"
    )


def upstream_params():
    """The upstream DSN as a dict of libpq parameters (it may be a URL)."""
    return psycopg.conninfo.conninfo_to_dict(UPSTREAM_DSN)


class Refused(Exception):
    """An error with a SQLSTATE: what pgdp answered instead of rows."""

    def __init__(self, sqlstate, message, sql=""):
        super().__init__(f"sqlstate={sqlstate} {message}")
        self.sqlstate = sqlstate
        self.message = message
        self.sql = sql


class Mismatch(Exception):
    """An answer that differs from PostgreSQL's beyond what the noise explains."""

    def __init__(self, what, sql=""):
        super().__init__(what)
        self.what = what
        self.sql = sql


def psycopg_error(e):
    """The psycopg error behind `e` (itself, or what a wrapper like Django's was raised from)."""
    while e is not None and not isinstance(e, psycopg.Error):
        e = e.__cause__
    return e


def describe_error(e):
    """`(sqlstate, message)` of a psycopg error: the primary message and its hint."""
    diag = e.diag
    message = diag.message_primary or str(e)
    if diag.message_hint:
        message += f" (HINT: {diag.message_hint})"
    return e.sqlstate, message


def one_line(text):
    return " ".join(str(text).split())


def type_name(oid):
    info = psycopg.adapters.types.get(oid)
    return info.name if info else f"oid{oid}"


def run(checks, names=None):
    """Runs `checks` (an ordered dict of name -> function returning a detail string) and prints
    one line for each. `names` restricts them (all when empty)."""
    for name in names or list(checks):
        check = checks.get(name)
        if check is None:
            print(f"FAIL {name}: error no such check", flush=True)
            continue
        try:
            detail = check()
            print(f"ok {name} {one_line(detail or '')}".rstrip(), flush=True)
        except Refused as e:
            sql = f" | sql: {one_line(e.sql)}" if e.sql else ""
            print(f"FAIL {name}: refused sqlstate={e.sqlstate} {one_line(e.message)}{sql}",
                  flush=True)
        except Mismatch as e:
            sql = f" | sql: {one_line(e.sql)}" if e.sql else ""
            print(f"FAIL {name}: mismatch {one_line(e.what)}{sql}", flush=True)
        except Exception as e:  # any other failure is reported, not raised
            print(f"FAIL {name}: error {type(e).__name__}: {one_line(e)}", flush=True)
            traceback.print_exc(file=sys.stderr)
    sys.exit(0)
