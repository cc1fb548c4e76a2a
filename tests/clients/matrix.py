"""Shared reporting for the Python clients of pgdp's client matrix (driven by tests/integration/clients.rs).

Each client script runs named checks against a running pgdp and prints one line per check:
`ok <name> <detail>` or `FAIL <name>: <error>`. tests/integration/clients.rs asserts on these lines. The
connection parameters come from the environment (PGDP_HOST, PGDP_PORT, PGDP_USER,
PGDP_PASSWORD, PGDP_DATABASE); the checks to run are the script's arguments (all when none).
"""

import os
import sys
import traceback

HOST = os.environ.get("PGDP_HOST", "127.0.0.1")
PORT = int(os.environ.get("PGDP_PORT", "6432"))
USER = os.environ.get("PGDP_USER", "analyst")
PASSWORD = os.environ.get("PGDP_PASSWORD", "analyst")
DATABASE = os.environ.get("PGDP_DATABASE", "pgdp_demo")

# The demo data at scale 1 has 100,000 people; a DP count at epsilon 1 is within a few units of
# that, so this window fails only if the query did not count demo.people at all.
PEOPLE_MIN = 99_000
PEOPLE_MAX = 101_000
REGIONS = {"CE", "EA", "IS", "NE", "NO", "NW", "SE", "SO", "SW", "WE"}


def libpq_dsn():
    return (
        f"host={HOST} port={PORT} user={USER} password={PASSWORD} dbname={DATABASE} "
        "sslmode=disable connect_timeout=10"
    )


def url(scheme):
    return f"{scheme}://{USER}:{PASSWORD}@{HOST}:{PORT}/{DATABASE}?sslmode=disable"


def assert_people_count(n):
    assert isinstance(n, int), f"count is {type(n).__name__}, not int: {n!r}"
    assert PEOPLE_MIN <= n <= PEOPLE_MAX, f"count {n} is not near 100000"


def assert_fraction_count(n):
    """A DP count of a strict subset of demo.people."""
    assert isinstance(n, int), f"count is {type(n).__name__}, not int: {n!r}"
    assert 1_000 < n < PEOPLE_MAX, f"count {n} is implausible"


def upstream_asyncpg_kwargs():
    """asyncpg's connect() arguments for PostgreSQL itself (PGDP_UPSTREAM_DSN, libpq key=value),
    for checks that compare pgdp's answers with PostgreSQL's."""
    fields = dict(part.split("=", 1) for part in os.environ["PGDP_UPSTREAM_DSN"].split())
    return dict(host=fields.get("host", "127.0.0.1"), port=int(fields.get("port", "5432")),
                user=fields.get("user"), password=fields.get("password"),
                database=fields.get("dbname"), ssl=False, timeout=10)


def assert_near_postgresql(label, got, want):
    """pgdp's answer has PostgreSQL's Python type and lies within 2 % + 50 of PostgreSQL's."""
    assert type(got) is type(want), f"{label}: {type(got).__name__} for {type(want).__name__}"
    assert abs(float(got) - float(want)) <= 0.02 * abs(float(want)) + 50, \
        f"{label}: {got} where PostgreSQL gives {want}"


def run(checks):
    """Runs the checks named on the command line (all when none) and exits 1 if any failed."""
    wanted = sys.argv[1:] or list(checks)
    failed = False
    for name in wanted:
        check = checks.get(name)
        if check is None:
            print(f"FAIL {name}: no such check", flush=True)
            failed = True
            continue
        try:
            detail = check()
            print(f"ok {name}" + (f" {detail}" if detail else ""), flush=True)
        except Exception as e:  # a check's failure of any kind is reported, not raised
            failed = True
            text = f"{type(e).__module__}.{type(e).__name__}: {e}".replace("\n", " | ")
            print(f"FAIL {name}: {text}", flush=True)
            traceback.print_exc(file=sys.stderr)
    sys.exit(1 if failed else 0)


def expect_error(fn, exc_class, sqlstate, get_code):
    """Calls fn, which must raise exc_class with SQLSTATE sqlstate."""
    try:
        fn()
    except exc_class as e:
        code = get_code(e)
        assert code == sqlstate, f"{type(e).__name__} with SQLSTATE {code}, expected {sqlstate}"
        return f"{type(e).__name__}/{code}"
    raise AssertionError(f"no {exc_class.__name__} raised")
