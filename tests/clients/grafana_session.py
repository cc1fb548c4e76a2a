"""A Grafana-like session against pgdp: the SQL Grafana's PostgreSQL data source sends, through
psycopg 3 (the extended protocol, as Grafana's pgx-based driver uses). See matrix.py.

The SQL comes from Grafana's own source (grafana/grafana):
- public/app/plugins/datasource/grafana-postgresql-datasource/postgresMetaQuery.ts: the version
  probe, the TimescaleDB probe, and the schema, table and column pickers (getVersion,
  getTimescaleDBVersion, showSchemas, showTables, getSchema with buildSchemaConstraint);
- pkg/tsdb/grafana-postgresql-datasource/macros.go: the macros of panel queries, which
  `interpolate` below expands the same way ($__timeFilter, $__timeGroup, $__timeGroupAlias,
  $__time, $__timeFrom, $__timeTo);
- the query editor's documented panel shapes: a time series grouped by `$__timeGroupAlias`
  (with and without a `metric` column), a table panel, and raw rows (which pgdp refuses).
"""

import datetime
import re
from decimal import Decimal

import psycopg
import psycopg.errors

import matrix

# The dashboard's time range: the demo's visits span 2023 and 2024.
FROM = datetime.datetime(2023, 1, 1, tzinfo=datetime.timezone.utc)
TO = datetime.datetime(2024, 12, 31, 23, 59, 59, 999000, tzinfo=datetime.timezone.utc)

INTERVALS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def rfc3339(t):
    """Go's time.RFC3339Nano in UTC, as Grafana formats the range."""
    text = t.strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".")
    return text + "Z"


def interval_seconds(text):
    text = text.strip().strip("'")
    number, unit = re.fullmatch(r"(\d+)([smhdw])", text).groups()
    return int(number) * INTERVALS[unit]


def interpolate(sql):
    """Expands Grafana's PostgreSQL macros as macros.go does (no TimescaleDB)."""

    def expand(m):
        name, args = m.group(1), [a.strip() for a in m.group(2).split(",")]
        if name == "__time":
            return f'{args[0]} AS "time"'
        if name == "__timeFilter":
            return f"{args[0]} BETWEEN '{rfc3339(FROM)}' AND '{rfc3339(TO)}'"
        if name == "__timeFrom":
            return f"'{rfc3339(FROM)}'"
        if name == "__timeTo":
            return f"'{rfc3339(TO)}'"
        if name in ("__timeGroup", "__timeGroupAlias"):
            s = interval_seconds(args[1])
            group = f"floor(extract(epoch from {args[0]})/{s})*{s}"
            return group + (' AS "time"' if name == "__timeGroupAlias" else "")
        raise ValueError(f"unknown macro {name}")

    return re.sub(r"\$([_a-zA-Z0-9]+)\(([^)]*)\)", expand, sql)


SCHEMA_CONSTRAINT = """
          quote_ident(table_schema) IN (
          SELECT
            CASE WHEN trim(s[i]) = '"$user"' THEN user ELSE trim(s[i]) END
          FROM
            generate_series(
              array_lower(string_to_array(current_setting('search_path'),','),1),
              array_upper(string_to_array(current_setting('search_path'),','),1)
            ) as i,
            string_to_array(current_setting('search_path'),',') s
          )"""


def connect():
    conn = psycopg.connect(matrix.libpq_dsn(), autocommit=True)
    # Grafana sets the search path through the data source's settings; the demo's tables live
    # in demo.
    conn.execute("SET search_path TO demo, public")
    return conn


def check_version_probes():
    with connect() as conn:
        (version,) = conn.execute(
            "SELECT current_setting('server_version_num')::int/100 as version").fetchone()
        assert isinstance(version, int) and version >= 1000, version
        rows = conn.execute(
            "SELECT extversion FROM pg_extension WHERE extname = 'timescaledb'").fetchall()
        assert rows == [], rows
        return f"version={version}"


def check_pickers():
    with connect() as conn:
        schemas = [r[0] for r in conn.execute("""SELECT schema_name AS "name"
    FROM information_schema.schemata
    WHERE schema_name NOT IN ('information_schema',
                              'pg_catalog',
                              'pg_toast',
                              '_timescaledb_cache',
                              '_timescaledb_catalog',
                              '_timescaledb_internal',
                              '_timescaledb_config',
                              'timescaledb_information',
                              'timescaledb_experimental')
    ORDER BY schema_name""")]
        assert "demo" in schemas, schemas
        tables = [r[0] for r in conn.execute("""SELECT quote_ident(table_name) AS "table"
      FROM information_schema.tables
      WHERE quote_ident(table_schema) = 'demo'
      ORDER BY 1""")]
        assert tables == ["people", "prescriptions", "regions", "visits"], tables
        # Without a schema: tables on the search path unqualified, first.
        listed = [r[0] for r in conn.execute(f"""SELECT
    CASE WHEN {SCHEMA_CONSTRAINT}
      THEN quote_ident(table_name)
      ELSE quote_ident(table_schema) || '.' || quote_ident(table_name)
    END AS "table"
    FROM information_schema.tables
    WHERE quote_ident(table_schema) NOT IN ('information_schema',
                             'pg_catalog',
                             '_timescaledb_cache',
                             '_timescaledb_catalog',
                             '_timescaledb_internal',
                             '_timescaledb_config',
                             'timescaledb_information',
                             'timescaledb_experimental')
    ORDER BY CASE WHEN {SCHEMA_CONSTRAINT} THEN 0 ELSE 1 END, 1""")]
        assert listed[:4] == ["people", "prescriptions", "regions", "visits"], listed
        for table in ("demo.visits", "visits"):
            part = "'" + table.replace("'", "''") + "'"
            columns = dict(conn.execute(f"""SELECT quote_ident(column_name) AS "column", data_type AS "type"
    FROM information_schema.columns
    WHERE
      CASE WHEN array_length(parse_ident({part}),1) = 2
        THEN quote_ident(table_schema) = (parse_ident({part}))[1]
          AND quote_ident(table_name) = (parse_ident({part}))[2]
        ELSE quote_ident(table_name) = {part}
          AND {SCHEMA_CONSTRAINT}
      END""").fetchall())
            assert columns.get("visit_date") == "date", (table, columns)
            assert columns.get("cost") == "numeric", (table, columns)
        return f"schemas={len(schemas)} tables={len(tables)}"


def check_time_series():
    """A weekly panel over two years: heavy users have visits in more weeks than the policy's 16
    groups per person, so the chosen caps leave about a quarter of the visits out; under
    pgdp.max_bias = 0.1 (the default, which Grafana never changes) pgdp refuses it (22000, the
    hint asks for larger buckets) rather than draw a chart a quarter low. The same panel by 30
    days passes; with the setting off the weekly one is drawn."""
    panel = """SELECT
  $__timeGroupAlias(visit_date,'{bucket}'),
  count(*) AS "visits"
FROM demo.visits
WHERE
  $__timeFilter(visit_date)
GROUP BY 1
ORDER BY 1"""
    weekly = interpolate(panel.replace("{bucket}", "1w"))
    with connect() as conn:
        setting = conn.execute("SHOW pgdp.max_bias").fetchone()[0]
        assert setting == "0.1", setting
        try:
            conn.execute(weekly)
            raise AssertionError("the weekly panel was answered under pgdp.max_bias = 0.1")
        except psycopg.errors.DataException as e:
            assert e.sqlstate == "22000", e.sqlstate
            assert "pgdp.max_bias" in str(e), str(e)
            assert "larger groups" in (e.diag.message_hint or ""), e.diag.message_hint
        monthly = conn.execute(interpolate(panel.replace("{bucket}", "30d"))).fetchall()
        assert 20 <= len(monthly) <= 26, len(monthly)
        conn.execute("SET pgdp.max_bias = off")
        cur = conn.execute(weekly)
        names = [d.name for d in cur.description]
        assert names == ["time", "visits"], names
        rows = cur.fetchall()
        # Weekly buckets of two years, released by partition selection: most of them.
        assert 80 <= len(rows) <= 106, len(rows)
        times = [r[0] for r in rows]
        assert times == sorted(times), "not ordered by time"
        # PostgreSQL types floor(numeric) * integer as numeric; each is a week's start.
        assert all(isinstance(t, Decimal) and t % 604800 == 0 for t in times), times[:3]
        assert all(isinstance(n, int) and n >= 0 for _, n in rows), rows[:3]
        start = datetime.datetime.fromtimestamp(int(times[0]), datetime.timezone.utc)
        assert FROM - datetime.timedelta(days=7) <= start <= FROM + datetime.timedelta(days=14), start
        return f"weekly refused under max_bias, {len(monthly)} 30-day buckets, {len(rows)} weekly buckets with it off"


def check_time_series_by_metric():
    sql = interpolate("""SELECT
  $__timeGroupAlias(visit_date,'30d'),
  clinic AS metric,
  count(*) AS value
FROM demo.visits
WHERE $__timeFilter(visit_date) AND clinic IN ('C01', 'C02')
GROUP BY 1, 2
ORDER BY 1, 2""")
    with connect() as conn:
        cur = conn.execute(sql)
        assert [d.name for d in cur.description] == ["time", "metric", "value"]
        rows = cur.fetchall()
        assert {r[1] for r in rows} <= {"C01", "C02"}, rows[:3]
        assert len(rows) >= 30, len(rows)
        assert [r[0] for r in rows] == sorted(r[0] for r in rows)
        return f"points={len(rows)}"


def check_table_panel():
    sql = interpolate("""SELECT clinic, count(*) AS visits, avg(cost) AS mean_cost
FROM demo.visits
WHERE $__timeFilter(visit_date)
GROUP BY clinic
ORDER BY 2 DESC
LIMIT 10""")
    with connect() as conn:
        rows = conn.execute(sql).fetchall()
        assert len(rows) == 10, rows
        assert [r[1] for r in rows] == sorted((r[1] for r in rows), reverse=True)
        # AVG of a numeric column is numeric, inside the policy's bounds [0, 2000].
        assert all(isinstance(r[2], Decimal) and 0 <= r[2] <= 2000 for r in rows), rows
        return f"rows={len(rows)}"


def check_raw_rows_refused():
    sql = interpolate("""SELECT $__time(visit_date), cost FROM demo.visits
WHERE $__timeFilter(visit_date) ORDER BY 1""")
    with connect() as conn:
        detail = matrix.expect_error(
            lambda: conn.execute(sql), psycopg.errors.InsufficientPrivilege, "42501",
            lambda e: e.sqlstate)
        # The session goes on.
        assert conn.execute("SELECT 1").fetchone() == (1,)
        return detail


matrix.run({
    "version_probes": check_version_probes,
    "pickers": check_pickers,
    "time_series": check_time_series,
    "time_series_by_metric": check_time_series_by_metric,
    "table_panel": check_table_panel,
    "raw_rows_refused": check_raw_rows_refused,
})
