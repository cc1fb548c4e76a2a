#!/usr/bin/env python3
"""Apache Superset, in-process, against pgdp: what its charts, filters and SQL Lab send and get.

Run by tests/integration/tools_superset.rs with the venv of .ci/setup-superset. Superset runs in
this process (`superset.app.create_app()` and Flask's test client, no web server) on a copy of the
metadata database template that .ci/setup-superset made (migrated, with an admin user and
Superset's roles), in a temporary directory deleted at the end.

It registers two Superset databases, one through pgdp (PGDP_HOST, PGDP_PORT, PGDP_USER,
PGDP_PASSWORD, PGDP_DATABASE) and one straight to the upstream PostgreSQL (PGDP_UPSTREAM_DSN, a
libpq DSN of the database pgdp serves), with a dataset over demo.visits and one over demo.people on
each, and then runs every chart through Superset's own chart-data API (POST /api/v1/chart/data,
with the query context Superset's frontend builds for that kind of chart) against both, and
compares: the column types Superset reports (`coltypes`), the type OIDs PostgreSQL or pgdp
returned for the statement, and the values (plausibility of the noisy ones).

Every statement Superset sends to either server goes through a recording psycopg2 cursor, so the
report shows the SQL Superset generated and, for a refused one, the SQLSTATE pgdp answered.

Output, one line per check on stdout (nothing else goes to stdout):

    ok <check> <detail>
    FAIL <check>: refused sqlstate=<code> <message> | sql=<statement pgdp refused>
    FAIL <check>: differs: <what differs from the same chart on the upstream> | <detail>
    FAIL <check>: error: <anything else, e.g. Superset's own error>

With PGDP_SYNOPSIS set (the name of a synopsis over demo.people's region, sex and education in
pgdp's policy, e.g. people_cube), the program runs the connecting checks, the people dataset and
SYNOPSIS_CHECKS instead of the charts above: a dashboard whose counting charts pgdp answers from
that synopsis. Each is `ok` only when its counts are within SYNOPSIS_TOLERANCE of the upstream's,
its types are the upstream's, and the analyst's epsilon_spent (SHOW pgdp.budget, read straight
through pgdp with psycopg2 with the analyst's credentials) grew on the first chart only (whose notices tell that it paid for that synopsis) and not at all on every later one.

The checks are listed in CHECKS (and SYNOPSIS_CHECKS). A check is reported the same way whichever outcome is expected:
the Rust test holds the expectations (a raw-rows chart must be refused; it is *reported* `ok` if
pgdp ever answers it).
"""

import datetime
import json
import os
import re
import shutil
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))

CHECKS = [
    # What Superset sends when a database is connected and browsed.
    "connect_test_connection",
    "connect_create_database",
    "connect_schemas",
    "connect_tables",
    "connect_table_metadata",
    "dataset_visits",
    "dataset_people",
    # Charts.
    "big_number_people",
    "big_number_visits",
    "bar_chart_by_clinic",
    "line_chart_by_month_time_range",
    "filter_values_visits_clinic",
    "filter_values_people_region",
    "native_filter_visits_clinic",
    "native_filter_people_region",
    "series_limit_chart",
    "sqllab_public_table",
    "raw_rows_table_chart",
]

# The dashboard over a synopsis (PGDP_SYNOPSIS): the first chart pays the synopsis's ε once, every
# later one must be answered from it for nothing.
SYNOPSIS_CHECKS = [
    "synopsis_big_number_people",
    "synopsis_bar_by_region",
    "synopsis_bar_by_region_sex_f",
    "synopsis_bar_by_education_region_ce",
    "synopsis_reload_big_number_people",
    "synopsis_reload_bar_by_region",
]

# Absolute tolerance per count of a synopsis's answer against PostgreSQL's: with that declaration
# the synopsis's 95 % bounds are about ±2,500 rows per count, so 3,000 rows.
SYNOPSIS_TOLERANCE = 3000

# Names of the type OIDs the checks meet.
OID_NAMES = {
    16: "bool",
    20: "int8",
    21: "int2",
    23: "int4",
    25: "text",
    700: "float4",
    701: "float8",
    1043: "varchar",
    1082: "date",
    1114: "timestamp",
    1184: "timestamptz",
    1700: "numeric",
}

# Superset's GenericDataType.
COLTYPE_NAMES = {0: "NUMERIC", 1: "STRING", 2: "TEMPORAL", 3: "BOOLEAN"}

# Statements SQLAlchemy's psycopg2 dialect sends on each new connection (Superset opens one per
# query): not what a check is about, so left out of the reported SQL.
STARTUP = re.compile(
    r"^\s*(select pg_catalog\.version\(\)|select current_schema\(\)|show transaction isolation level"
    r"|show standard_conforming_strings|select cast\('test |show server_version)",
    re.IGNORECASE,
)


def one_line(text, limit=1500):
    text = re.sub(r"\s+", " ", str(text)).strip()
    return text if len(text) <= limit else text[:limit] + "…"


# ---------------------------------------------------------------------------------------------
# The recording cursor


class Recorder:
    """Every statement sent through psycopg2: the check it belongs to, the server, the SQL, the
    result's column names and type OIDs, or the error (SQLSTATE and message)."""

    def __init__(self, pgdp_port):
        self.pgdp_port = str(pgdp_port)
        self.check = "setup"
        self.entries = []

    def server_of(self, connection):
        try:
            port = connection.get_dsn_parameters().get("port", "")
        except Exception:  # noqa: BLE001 - a closed connection
            port = ""
        return "pgdp" if port == self.pgdp_port else "upstream"

    def of(self, check, server):
        return [e for e in self.entries if e["check"] == check and e["server"] == server]


RECORDER = None


def install_recorder(pgdp_port):
    global RECORDER
    import psycopg2
    import psycopg2.extensions

    RECORDER = Recorder(pgdp_port)

    class RecordingCursor(psycopg2.extensions.cursor):
        def execute(self, query, vars=None):  # noqa: A002 - psycopg2's name
            sql = query.decode() if isinstance(query, bytes) else str(query)
            entry = {
                "check": RECORDER.check,
                "server": RECORDER.server_of(self.connection),
                "sql": sql,
                "error": None,
                "types": None,
                "notices": [],
            }
            RECORDER.entries.append(entry)
            notices_before = len(self.connection.notices)
            try:
                result = super().execute(query, vars)
            except psycopg2.Error as error:
                entry["error"] = (error.pgcode, one_line(error.pgerror or error))
                raise
            finally:
                entry["notices"] = [one_line(n) for n in self.connection.notices[notices_before:]]
            if self.query is not None:
                entry["sql"] = self.query.decode(errors="replace")
            if self.description is not None:
                entry["types"] = [(d.name, d.type_code) for d in self.description]
            return result

    connect = psycopg2.connect

    def recording_connect(*args, **kwargs):
        kwargs.setdefault("cursor_factory", RecordingCursor)
        return connect(*args, **kwargs)

    psycopg2.connect = recording_connect


def statements(check, server):
    """The statements of `check` on `server` that the check is about (not connection start-up)."""
    return [e for e in RECORDER.of(check, server) if not STARTUP.match(e["sql"])]


def sql_summary(check, server="pgdp"):
    return " ; ".join(one_line(e["sql"], 800) for e in statements(check, server)) or "(none)"


def last_error(check, server="pgdp"):
    errors = [e for e in statements(check, server) if e["error"]]
    return errors[-1] if errors else None


def main_types(check, server):
    """Column names and type names of the last statement of the check that returned rows."""
    answered = [e for e in statements(check, server) if e["types"] is not None]
    if not answered:
        return None
    return [(name, OID_NAMES.get(oid, str(oid))) for name, oid in answered[-1]["types"]]


def types_text(types):
    if types is None:
        return "-"
    return ",".join(f"{name}:{oid}" for name, oid in types)


def transcript():
    """Every statement Superset sent to pgdp, by check, on stderr (shown when the test fails)."""
    print("-- what Superset sent to pgdp (connection start-up statements left out):", file=sys.stderr)
    for entry in RECORDER.entries:
        if entry["server"] != "pgdp" or STARTUP.match(entry["sql"]):
            continue
        if entry["error"]:
            outcome = f"refused {entry['error'][0]}: {entry['error'][1]}"
        else:
            outcome = types_text(
                None if entry["types"] is None else [(n, OID_NAMES.get(o, str(o))) for n, o in entry["types"]]
            )
        print(f"[{entry['check']}] {one_line(entry['sql'], 3000)}\n    -> {outcome}", file=sys.stderr)
        for notice in entry["notices"]:
            print(f"    {notice}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# Reporting


class Differs(Exception):
    """The chart was answered, but not like the upstream's (types or implausible values)."""


class Refused(Exception):
    pass


def report_ok(check, detail):
    print(f"ok {check} {one_line(detail, 4000)}", flush=True)


def report_fail(check, error):
    print(f"FAIL {check}: {one_line(error, 4000)}", flush=True)


def failure_text(check, message):
    """A failed API call: pgdp's refusal when a statement of the check was refused."""
    error = last_error(check)
    if error is not None:
        code, text = error["error"]
        return f"refused sqlstate={code} {text} | sql={one_line(error['sql'], 800)} | superset: {one_line(message, 300)}"
    upstream_error = last_error(check, "upstream")
    if upstream_error is not None:
        code, text = upstream_error["error"]
        return f"error: the upstream refused too: sqlstate={code} {text} | sql={one_line(upstream_error['sql'], 800)}"
    return f"error: {one_line(message, 800)} | sql={sql_summary(check)}"


# ---------------------------------------------------------------------------------------------
# Superset's API


class Api:
    def __init__(self, client):
        self.client = client
        self.headers = {}

    def login(self):
        # The login form, as a browser does: Flask's test client keeps the session cookie. (A JWT
        # from /api/v1/security/login authenticates the API calls but leaves Flask-Login's
        # current_user anonymous, which Superset's dataset and database filters then reject.)
        response = self.client.post("/login/", data={"username": "admin", "password": "admin"})
        if response.status_code not in (200, 302):
            raise RuntimeError(f"login: {response.status_code} {response.get_data(as_text=True)[:500]}")
        me = self.client.get("/api/v1/me/")
        if me.status_code != 200:
            raise RuntimeError(f"login did not take: /api/v1/me/ {me.status_code}")

    def call(self, method, path, body=None, expect=(200, 201)):
        response = self.client.open(path, method=method, json=body, headers=self.headers)
        try:
            payload = response.get_json()
        except Exception:  # noqa: BLE001 - not JSON
            payload = None
        if response.status_code not in expect:
            text = payload if payload is not None else response.get_data(as_text=True)
            raise ApiError(f"{method} {path}: HTTP {response.status_code}: {json.dumps(text) if not isinstance(text, str) else text}")
        return payload


class ApiError(Exception):
    pass


def rison_schema(schema):
    return f"(force:!t,schema_name:{schema})"


# ---------------------------------------------------------------------------------------------
# Query contexts, as Superset's frontend builds them


COUNT = "count"  # the metric Superset creates with every dataset: COUNT(*)
AVG_COST = {
    "expressionType": "SIMPLE",
    "column": {"column_name": "cost", "type": "NUMERIC(10, 2)"},
    "aggregate": "AVG",
    "label": "AVG(cost)",
    "optionName": "metric_avg_cost",
}
TIME_RANGE = "2023-01-01 : 2023-07-01"


def query_context(dataset_id, viz_type, query, form_data_extra=None):
    base = {
        "filters": [],
        "extras": {"having": "", "where": ""},
        "applied_time_extras": {},
        "columns": [],
        "metrics": [],
        "orderby": [],
        "annotation_layers": [],
        "row_limit": None,
        "series_limit": 0,
        "order_desc": True,
        "url_params": {},
        "custom_params": {},
        "custom_form_data": {},
        "post_processing": [],
    }
    base.update(query)
    # What the frontend leaves undefined is not in the JSON it sends.
    base = {key: value for key, value in base.items() if value is not None}
    form_data = {
        "datasource": f"{dataset_id}__table",
        "viz_type": viz_type,
        "force": True,
        "result_format": "json",
        "result_type": "full",
    }
    form_data.update(form_data_extra or {})
    return {
        "datasource": {"id": dataset_id, "type": "table"},
        "force": True,
        "queries": [base],
        "form_data": form_data,
        "result_format": "json",
        "result_type": "full",
    }


def big_number(dataset_id):
    # plugin-chart-echarts BigNumberTotal: one metric, no columns.
    return query_context(
        dataset_id, "big_number_total", {"metrics": [COUNT]}, {"metric": COUNT, "time_range": "No filter"}
    )


def bar_by_clinic(dataset_id):
    # plugin-chart-echarts Timeseries (echarts_timeseries_bar) with a categorical x-axis: the axis
    # column as a BASE_AXIS adhoc column, ordered by the first metric, pivoted on the axis.
    return query_context(
        dataset_id,
        "echarts_timeseries_bar",
        {
            "columns": [
                {"columnType": "BASE_AXIS", "sqlExpression": "clinic", "label": "clinic", "expressionType": "SQL"}
            ],
            "metrics": [COUNT, AVG_COST],
            "orderby": [[COUNT, False]],
            "row_limit": 10000,
            "series_columns": [],
            "time_offsets": [],
            "post_processing": [
                {
                    "operation": "pivot",
                    "options": {
                        "index": ["clinic"],
                        "columns": [],
                        "aggregates": {COUNT: {"operator": "mean"}, "AVG(cost)": {"operator": "mean"}},
                        "drop_missing_columns": False,
                    },
                },
                {"operation": "flatten"},
            ],
        },
        {"x_axis": "clinic", "metrics": [COUNT, AVG_COST], "groupby": [], "row_limit": 10000},
    )


def line_by_month(dataset_id):
    # plugin-chart-echarts Timeseries (echarts_timeseries_line): the temporal x-axis with a time
    # grain, and the time range as a TEMPORAL_RANGE adhoc filter.
    return query_context(
        dataset_id,
        "echarts_timeseries_line",
        {
            "filters": [{"col": "visit_date", "op": "TEMPORAL_RANGE", "val": TIME_RANGE}],
            "columns": [
                {
                    "timeGrain": "P1M",
                    "columnType": "BASE_AXIS",
                    "sqlExpression": "visit_date",
                    "label": "visit_date",
                    "expressionType": "SQL",
                }
            ],
            "metrics": [COUNT],
            "orderby": [[COUNT, False]],
            "row_limit": 10000,
            "series_columns": [],
            "time_offsets": [],
            "post_processing": [
                {
                    "operation": "pivot",
                    "options": {
                        "index": ["visit_date"],
                        "columns": [],
                        "aggregates": {COUNT: {"operator": "mean"}},
                        "drop_missing_columns": False,
                    },
                },
                {"operation": "flatten"},
            ],
        },
        {"x_axis": "visit_date", "time_grain_sqla": "P1M", "metrics": [COUNT], "time_range": TIME_RANGE},
    )


def series_limit(dataset_id):
    # The same line chart with a dimension (groupby clinic) and a series limit of 5 ordered by
    # AVG(cost): Superset joins the main query to a subquery that picks the top series.
    return query_context(
        dataset_id,
        "echarts_timeseries_line",
        {
            "filters": [{"col": "visit_date", "op": "TEMPORAL_RANGE", "val": TIME_RANGE}],
            "columns": [
                {
                    "timeGrain": "P1M",
                    "columnType": "BASE_AXIS",
                    "sqlExpression": "visit_date",
                    "label": "visit_date",
                    "expressionType": "SQL",
                },
                "clinic",
            ],
            "metrics": [AVG_COST],
            "orderby": [[AVG_COST, False]],
            "row_limit": 10000,
            "series_columns": ["clinic"],
            "series_limit": 5,
            "series_limit_metric": AVG_COST,
            "order_desc": True,
            "time_offsets": [],
            "post_processing": [
                {
                    "operation": "pivot",
                    "options": {
                        "index": ["visit_date"],
                        "columns": ["clinic"],
                        "aggregates": {"AVG(cost)": {"operator": "mean"}},
                        "drop_missing_columns": False,
                    },
                },
                {"operation": "rename", "options": {"columns": {"AVG(cost)": None}, "level": 0, "inplace": True}},
                {"operation": "flatten"},
            ],
        },
        {
            "x_axis": "visit_date",
            "time_grain_sqla": "P1M",
            "metrics": [AVG_COST],
            "groupby": ["clinic"],
            "limit": 5,
            "timeseries_limit_metric": AVG_COST,
            "order_desc": True,
            "time_range": TIME_RANGE,
        },
    )


def bar_count_by(dataset_id, column, filters=(), adhoc_filters=()):
    # plugin-chart-echarts Timeseries (echarts_timeseries_bar) with a categorical x-axis and
    # COUNT(*) only, as bar_by_clinic; an adhoc filter of the chart's controls (adhoc_filters in
    # the form data) reaches the query as a simple filter (col, op, val).
    return query_context(
        dataset_id,
        "echarts_timeseries_bar",
        {
            "filters": list(filters),
            "columns": [{"columnType": "BASE_AXIS", "sqlExpression": column, "label": column, "expressionType": "SQL"}],
            "metrics": [COUNT],
            "orderby": [[COUNT, False]],
            "row_limit": 10000,
            "series_columns": [],
            "time_offsets": [],
            "post_processing": [
                {
                    "operation": "pivot",
                    "options": {
                        "index": [column],
                        "columns": [],
                        "aggregates": {COUNT: {"operator": "mean"}},
                        "drop_missing_columns": False,
                    },
                },
                {"operation": "flatten"},
            ],
        },
        {
            "x_axis": column,
            "metrics": [COUNT],
            "groupby": [],
            "row_limit": 10000,
            "adhoc_filters": list(adhoc_filters),
        },
    )


def simple_adhoc(column, operator, comparator):
    return {
        "clause": "WHERE",
        "subject": column,
        "operator": operator,
        "comparator": comparator,
        "expressionType": "SIMPLE",
    }


def bar_by_region(dataset_id):
    return bar_count_by(dataset_id, "region")


def bar_by_region_sex_f(dataset_id):
    # The adhoc filter sex IN ('F').
    return bar_count_by(
        dataset_id, "region", [{"col": "sex", "op": "IN", "val": ["F"]}], [simple_adhoc("sex", "IN", ["F"])]
    )


def bar_by_education_region_ce(dataset_id):
    # The adhoc filter region = 'CE'.
    return bar_count_by(
        dataset_id, "education", [{"col": "region", "op": "==", "val": "CE"}], [simple_adhoc("region", "==", "CE")]
    )


def native_filter(dataset_id, column):
    # src/filters/components/Select/buildQuery.ts: the column grouped, IS NOT NULL, sorted
    # ascending, with the native filters' row limit of 1000.
    return query_context(
        dataset_id,
        "filter_select",
        {
            "columns": [column],
            "metrics": [],
            "filters": [{"col": column, "op": "IS NOT NULL"}],
            "orderby": [[column, True]],
            "row_limit": 1000,
            "apply_fetch_values_predicate": True,
        },
        {"groupby": [column], "sortAscending": True},
    )


def raw_rows(dataset_id):
    # plugin-chart-table in raw records mode: columns, no metrics.
    return query_context(
        dataset_id,
        "table",
        {
            "columns": ["visit_date", "clinic", "cost"],
            "metrics": None,
            "orderby": [],
            "row_limit": 1000,
            "post_processing": [],
        },
        {"query_mode": "raw", "all_columns": ["visit_date", "clinic", "cost"], "row_limit": 1000},
    )


# ---------------------------------------------------------------------------------------------
# The run


class Run:
    """The checks. Connecting is checked on both Superset databases side by side; the datasets
    and everything that uses them run in two phases, first on pgdp, then on the upstream, because
    Superset's SQLite metadata schema keeps a UNIQUE (table_name) on datasets from an old
    migration: two databases cannot have a dataset over demo.visits at the same time. Each
    outcome is kept, and the checks are reported once both phases ran."""

    def __init__(self, api, pgdp_uri, upstream_uri):
        self.api = api
        self.pgdp_uri = pgdp_uri
        self.upstream_uri = upstream_uri
        self.databases = {}  # "pgdp" / "upstream" -> id
        self.datasets = {}  # ("pgdp", "visits") -> id
        self.outcomes = {}  # check -> server -> ("ok", value) | ("error", message)

    def check(self, name, function):
        """A check run once, over both servers: reported at once."""
        RECORDER.check = name
        try:
            detail = function()
        except Differs as differs:
            report_fail(name, f"differs: {differs}")
        except ApiError as error:
            report_fail(name, failure_text(name, str(error)))
        except Exception as error:  # noqa: BLE001 - reported, the run goes on
            traceback.print_exc(file=sys.stderr)
            report_fail(name, failure_text(name, f"{type(error).__name__}: {error}"))
        else:
            report_ok(name, detail)
        finally:
            RECORDER.check = "between"

    def attempt(self, name, server, function):
        """One server's half of a check: its outcome is kept for `report`."""
        RECORDER.check = name
        try:
            outcome = ("ok", function())
        except ApiError as error:
            outcome = ("error", str(error))
        except Exception as error:  # noqa: BLE001 - reported, the run goes on
            traceback.print_exc(file=sys.stderr)
            outcome = ("error", f"{type(error).__name__}: {error}")
        finally:
            RECORDER.check = "between"
        self.outcomes.setdefault(name, {})[server] = outcome

    def report(self, name, compare):
        """Reports a two-phase check: pgdp's failure, or the comparison with the upstream."""
        outcomes = self.outcomes.get(name, {})
        pgdp, upstream = outcomes.get("pgdp"), outcomes.get("upstream")
        if pgdp is None:
            report_fail(name, "error: not run (what it needs failed)")
        elif pgdp[0] == "error":
            report_fail(name, failure_text(name, pgdp[1]))
        elif upstream is None or upstream[0] == "error":
            message = upstream[1] if upstream else "not run"
            report_fail(name, f"error: on the upstream: {one_line(message, 800)}")
        else:
            RECORDER.check = name
            try:
                report_ok(name, compare(pgdp[1], upstream[1]))
            except Differs as differs:
                report_fail(name, f"differs: {differs}")
            except Exception as error:  # noqa: BLE001 - reported, the run goes on
                traceback.print_exc(file=sys.stderr)
                report_fail(name, f"error: comparing: {type(error).__name__}: {error}")
            finally:
                RECORDER.check = "between"

    # -- connecting -----------------------------------------------------------------------------

    def test_connection(self):
        self.api.call(
            "POST",
            "/api/v1/database/test_connection/",
            {"database_name": "pgdp", "sqlalchemy_uri": self.pgdp_uri, "extra": json.dumps({})},
        )
        return f"sql={sql_summary('connect_test_connection')}"

    def create_databases(self):
        for server, uri in (("pgdp", self.pgdp_uri), ("upstream", self.upstream_uri)):
            payload = self.api.call(
                "POST",
                "/api/v1/database/",
                {
                    "database_name": server,
                    "sqlalchemy_uri": uri,
                    "expose_in_sqllab": True,
                    "allow_run_async": False,
                    "allow_ctas": False,
                    "allow_cvas": False,
                    "allow_dml": False,
                    "allow_file_upload": False,
                },
            )
            self.databases[server] = payload["id"]
        return f"sql={sql_summary('connect_create_database')}"

    def schemas(self):
        found = {}
        for server, pk in self.databases.items():
            found[server] = self.api.call("GET", f"/api/v1/database/{pk}/schemas/?q=(force:!t)")["result"]
        detail = f"schemas={found['pgdp']} sql={sql_summary('connect_schemas')}"
        # pgdp shows the policy's schemas (demo) beside public and information_schema, never
        # the upstream's others (other tests may have made some in the same database).
        expected = sorted(s for s in found["upstream"] if s in ("demo", "public", "information_schema"))
        if sorted(found["pgdp"]) != expected:
            raise Differs(f"schemas {found['pgdp']}, upstream {found['upstream']} | {detail}")
        return detail

    def tables(self):
        found = {}
        for server, pk in self.databases.items():
            payload = self.api.call("GET", f"/api/v1/database/{pk}/tables/?q={rison_schema('demo')}")
            found[server] = sorted(t["value"] for t in payload["result"])
        detail = f"tables={found['pgdp']} sql={sql_summary('connect_tables')}"
        expected = ["people", "prescriptions", "regions", "visits"]
        if found["pgdp"] != expected:
            raise Differs(f"tables {found['pgdp']}, expected {expected} | {detail}")
        return detail

    def table_metadata(self):
        columns = {}
        for server, pk in self.databases.items():
            legacy = self.api.call("GET", f"/api/v1/database/{pk}/table/visits/demo/")
            current = self.api.call("GET", f"/api/v1/database/{pk}/table_metadata/?name=visits&schema=demo")
            self.api.call("GET", f"/api/v1/database/{pk}/table_extra/visits/demo/")
            self.api.call("GET", f"/api/v1/database/{pk}/select_star/visits/demo/")
            columns[server] = [(c["name"], str(c["type"])) for c in legacy["columns"]]
            current_columns = [(c["name"], str(c["type"])) for c in current["columns"]]
            if current_columns != columns[server]:
                raise Differs(f"{server}: /table/ {columns[server]} but /table_metadata/ {current_columns}")
        detail = f"columns={columns['pgdp']} sql={sql_summary('connect_table_metadata')}"
        if columns["pgdp"] != columns["upstream"]:
            raise Differs(f"columns {columns['pgdp']}, upstream {columns['upstream']} | {detail}")
        return detail

    # -- the phases -----------------------------------------------------------------------------

    def phase(self, server, charts, tables=("visits", "people"), sqllab=True):
        """Datasets on `server`, every chart, the filters and SQL Lab; then the datasets go."""
        for table in tables:
            self.attempt(f"dataset_{table}", server, lambda table=table: self.create_dataset(server, table))
        for name, table, run in charts:
            if (server, table) in self.datasets:
                self.attempt(name, server, lambda table=table, run=run: run(self.datasets[(server, table)]))
        if sqllab:
            self.attempt("sqllab_public_table", server, lambda: self.sqllab(server))
        for table in tables:
            dataset = self.datasets.pop((server, table), None)
            if dataset is not None:
                self.api.call("DELETE", f"/api/v1/dataset/{dataset}")

    def create_dataset(self, server, table):
        payload = self.api.call(
            "POST",
            "/api/v1/dataset/",
            {"database": self.databases[server], "schema": "demo", "table_name": table},
        )
        self.datasets[(server, table)] = payload["id"]
        dataset = self.api.call("GET", f"/api/v1/dataset/{payload['id']}")["result"]
        columns = [(c["column_name"], c["type"], bool(c["is_dttm"])) for c in dataset["columns"]]
        metrics = [(m["metric_name"], m["expression"]) for m in dataset["metrics"]]
        return columns, metrics

    def chart_data(self, context):
        payload = self.api.call("POST", "/api/v1/chart/data", context)
        result = payload["result"][0]
        if result.get("error"):
            raise ApiError(f"chart data error: {result['error']}")
        return result

    def column_values(self, dataset, column):
        return self.api.call("GET", f"/api/v1/datasource/table/{dataset}/column/{column}/values/")["result"]

    def sqllab(self, server):
        payload = self.api.call(
            "POST",
            "/api/v1/sqllab/execute/",
            {
                "database_id": self.databases[server],
                "sql": SQLLAB_SQL,
                "schema": "demo",
                "runAsync": False,
                "queryLimit": 1000,
                "select_as_cta": False,
                "ctas_method": "TABLE",
                "tab": "pgdp test",
                "client_id": server[:4] + str(int(time.time() * 1000))[-6:],
                "expand_data": True,
            },
            expect=(200, 202),
        )
        if payload.get("status") != "success":
            raise ApiError(f"SQL Lab: {payload}")
        return payload


SQLLAB_SQL = "SELECT region, name, population FROM demo.regions ORDER BY region"


# ---------------------------------------------------------------------------------------------
# Comparisons with the upstream


def compare_datasets(check):
    def compare(pgdp, upstream):
        (columns, metrics), (up_columns, _) = pgdp, upstream
        detail = f"columns={columns} metrics={metrics} sql={sql_summary(check)}"
        if sorted(columns) != sorted(up_columns):
            raise Differs(f"columns {columns}, upstream {up_columns} | {detail}")
        return detail

    return compare


def compare_chart(check, plausible):
    def compare(pgdp, upstream):
        types = {"pgdp": main_types(check, "pgdp"), "upstream": main_types(check, "upstream")}
        coltypes = {
            "pgdp": [COLTYPE_NAMES.get(t, str(t)) for t in pgdp["coltypes"]],
            "upstream": [COLTYPE_NAMES.get(t, str(t)) for t in upstream["coltypes"]],
        }
        detail = (
            f"sql={sql_summary(check)} coltypes={coltypes['pgdp']} "
            f"types={types_text(types['pgdp'])} rows={pgdp.get('rowcount')}"
        )
        problems = []
        if coltypes["pgdp"] != coltypes["upstream"]:
            problems.append(f"coltypes {coltypes['pgdp']}, upstream {coltypes['upstream']}")
        if pgdp.get("colnames") != upstream.get("colnames") and check != "series_limit_chart":
            problems.append(f"colnames {pgdp.get('colnames')}, upstream {upstream.get('colnames')}")
        if types["pgdp"] != types["upstream"]:
            problems.append(f"types {types_text(types['pgdp'])}, upstream {types_text(types['upstream'])}")
        values = plausible(pgdp, upstream, problems)
        if problems:
            raise Differs(f"{'; '.join(problems)} | {detail} values: {values}")
        return f"{detail} values: {values}"

    return compare


def compare_value_lists(check):
    def compare(pgdp, upstream):
        types = {"pgdp": main_types(check, "pgdp"), "upstream": main_types(check, "upstream")}
        detail = f"sql={sql_summary(check)} types={types_text(types['pgdp'])}"
        problems = []
        summary = compare_value_sets(pgdp, upstream, problems)
        if types["pgdp"] != types["upstream"]:
            problems.append(f"types {types_text(types['pgdp'])}, upstream {types_text(types['upstream'])}")
        if problems:
            raise Differs(f"{'; '.join(problems)} | {detail} values: {summary}")
        return f"{detail} values: {summary}"

    return compare


def compare_value_sets(pgdp, upstream, problems):
    # A private column without public values is released by partition selection: a subset of the
    # upstream's values, nearly all of them here (every clinic has thousands of people).
    dp, up = set(pgdp), set(upstream)
    if not dp <= up:
        problems.append(f"values not upstream: {sorted(dp - up)}")
    if len(dp) < 0.8 * len(up):
        problems.append(f"only {len(dp)} of {len(up)} values")
    return f"{len(dp)} values {sorted(dp)[:5]}…, upstream {len(up)}"


def native_filter_plausible(column):
    def plausible(pgdp, upstream, problems):
        return compare_value_sets(
            [row[column] for row in pgdp["data"]], [row[column] for row in upstream["data"]], problems
        )

    return plausible


def compare_sqllab(pgdp, upstream):
    check = "sqllab_public_table"
    rows = {
        "pgdp": [tuple(r.values()) for r in pgdp["data"]],
        "upstream": [tuple(r.values()) for r in upstream["data"]],
    }
    types = {"pgdp": main_types(check, "pgdp"), "upstream": main_types(check, "upstream")}
    detail = f"sql={sql_summary(check)} types={types_text(types['pgdp'])} rows={len(rows['pgdp'])}"
    problems = []
    if rows["pgdp"] != rows["upstream"]:
        problems.append(f"rows {rows['pgdp'][:3]}…, upstream {rows['upstream'][:3]}…")
    if types["pgdp"] != types["upstream"]:
        problems.append(f"types {types_text(types['pgdp'])}, upstream {types_text(types['upstream'])}")
    if problems:
        raise Differs(f"{'; '.join(problems)} | {detail}")
    return detail


# ---------------------------------------------------------------------------------------------
# Plausibility of the noisy values (pgdp) against the exact ones (upstream)


def close(dp, up, tolerance):
    return abs(dp - up) <= tolerance * abs(up)


def plausible_people_count(pgdp, upstream, problems):
    # One row per person (max_rows_per_unit 1): the noisy count is within a few per cent.
    dp, up = pgdp["data"][0][COUNT], upstream["data"][0][COUNT]
    if not close(dp, up, 0.02):
        problems.append(f"count {dp}, upstream {up}: more than 2% apart")
    return f"count={dp} upstream={up}"


def plausible_visits(dp, up, what, problems, tolerance):
    # The demo chooses each query's caps on visits and groups per person (choose_bounds, up to
    # every visit of its heaviest users in 16 groups), so a DP count of visits estimates
    # PostgreSQL's own count: within `tolerance` of it (2 % for all visits, 25 % per clinic
    # beside AVG(cost), which shares ε with it,
    # 10 % per month, where a few heavy users' 17th and later months are cut).
    if not close(dp, up, tolerance):
        problems.append(f"{what} {dp}, upstream {up}: more than {tolerance:.0%} apart")


def plausible_visit_count(pgdp, upstream, problems):
    dp, up = pgdp["data"][0][COUNT], upstream["data"][0][COUNT]
    plausible_visits(dp, up, "count", problems, 0.02)
    return f"count={dp} upstream={up}"


def by_key(result, key):
    return {row[key]: row for row in result["data"]}


def plausible_bar(pgdp, upstream, problems):
    dp, up = by_key(pgdp, "clinic"), by_key(upstream, "clinic")
    if not set(dp) <= set(up) or len(dp) < 0.8 * len(up):
        problems.append(f"clinics {sorted(dp)}, upstream {sorted(up)}")
    # AVG(cost) estimates the mean of cost clamped into the policy's bounds [0, 2000]; the demo's costs have a heavy tail (up to ~200,000), so the clamped mean is
    # about half the upstream's plain AVG(cost) (109 against 216 over the whole table), and each
    # clinic's noisy AVG has a standard deviation of 20 to 30 at the default epsilon. Checked:
    # every AVG within the bounds, and their mean over the clinics within a factor of 3 of the
    # upstream's.
    avgs, up_avgs = [], []
    for clinic, row in dp.items():
        if clinic not in up:
            continue
        # The count shares ε with AVG(cost)'s sum and count: its noise is about 2,000 a clinic
        # (one clinic of 50 is 18 % off with the test's seed).
        plausible_visits(row[COUNT], up[clinic][COUNT], f"count of {clinic}", problems, 0.25)
        avg = row["AVG(cost)"]
        if avg is None or not 0 <= avg <= 2000:
            problems.append(f"AVG(cost) of {clinic} {avg} outside the policy's bounds [0, 2000]")
        else:
            avgs.append(float(avg))
            up_avgs.append(float(up[clinic]["AVG(cost)"]))
    mean = sum(avgs) / len(avgs) if avgs else 0.0
    up_mean = sum(up_avgs) / len(up_avgs) if up_avgs else 0.0
    if not up_mean / 3 <= mean <= up_mean * 3:
        problems.append(f"mean AVG(cost) over the clinics {mean:.1f}, upstream {up_mean:.1f}")
    sample = sorted(dp)[:1]
    shown = [(c, dp[c][COUNT], up[c][COUNT]) for c in sample if c in up]
    return (
        f"{len(dp)} clinics of {len(up)}; (clinic, count, upstream) {shown}; mean AVG(cost) "
        f"{mean:.1f}, upstream {up_mean:.1f} (cost clamped to [0, 2000]: AVG(cost) checked for "
        f"its order of magnitude only)"
    )


def plausible_months(pgdp, upstream, problems):
    dp, up = by_key(pgdp, "visit_date"), by_key(upstream, "visit_date")
    if set(dp) != set(up):
        problems.append(f"months {sorted(dp)}, upstream {sorted(up)}")
    for month, row in dp.items():
        if month in up:
            plausible_visits(row[COUNT], up[month][COUNT], f"count of {month}", problems, 0.10)
    first = min(dp) if dp else None
    # Superset's JSON gives temporal values as epoch milliseconds.
    shown = first
    if isinstance(first, (int, float)):
        shown = datetime.datetime.fromtimestamp(first / 1000, datetime.timezone.utc).date().isoformat()
    return (
        f"{len(dp)} months (upstream {len(up)}); first {shown}: {dp.get(first, {}).get(COUNT)} "
        f"(upstream {up.get(first, {}).get(COUNT)})"
    )


def plausible_series(pgdp, upstream, problems):
    # After the pivot, one column per series (clinic) besides the x-axis.
    dp = [c for c in pgdp["colnames"] if c != "visit_date"]
    up = [c for c in upstream["colnames"] if c != "visit_date"]
    if not 1 <= len(dp) <= 5:
        problems.append(f"{len(dp)} series, expected 1 to 5")
    if not all(re.fullmatch(r"C\d\d", c) for c in dp):
        problems.append(f"series {dp} are not clinics")
    return f"series {dp}, upstream {up} (noisy AVG(cost) picks them: they may differ)"


# ---------------------------------------------------------------------------------------------
# The dashboard over a synopsis: values within SYNOPSIS_TOLERANCE, and what it charged

# check -> (epsilon_spent before, after) the check's chart ran on pgdp.
BUDGET = {}


def epsilon_spent():
    """The analyst's spent ε: SHOW pgdp.budget on a connection of its own straight to pgdp, with
    the credentials Superset uses (a plain cursor: not recorded as a statement of a check)."""
    import psycopg2
    import psycopg2.extensions

    env = os.environ
    connection = psycopg2.connect(
        host=env["PGDP_HOST"],
        port=env["PGDP_PORT"],
        user=env["PGDP_USER"],
        password=env["PGDP_PASSWORD"],
        dbname=env["PGDP_DATABASE"],
        sslmode="disable",
        cursor_factory=psycopg2.extensions.cursor,
    )
    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW pgdp.budget")
            row = cursor.fetchone()
            names = [d.name for d in cursor.description]
    finally:
        connection.close()
    return float(row[names.index("epsilon_spent")])


def budgeted(name, runner):
    """`runner` with the analyst's epsilon_spent read before and after it (on pgdp)."""

    def run(dataset):
        before = epsilon_spent()
        try:
            return runner(dataset)
        finally:
            BUDGET[name] = (before, epsilon_spent())

    return run


def counts_within(dp, up, what, problems):
    """Each count of `dp` within SYNOPSIS_TOLERANCE of `up`'s, a group missing on one side counted
    as 0 there."""
    worst = 0
    for key in sorted(set(dp) | set(up), key=str):
        mine, theirs = dp.get(key) or 0, up.get(key) or 0
        worst = max(worst, abs(mine - theirs))
        if abs(mine - theirs) > SYNOPSIS_TOLERANCE:
            problems.append(f"{what} {key}: {mine}, upstream {theirs}: more than {SYNOPSIS_TOLERANCE} apart")
    return worst


def synopsis_total(pgdp, upstream, problems):
    dp, up = pgdp["data"][0][COUNT], upstream["data"][0][COUNT]
    counts_within({"all": dp}, {"all": up}, "count of", problems)
    return f"count={dp} upstream={up}"


def synopsis_bar(column):
    def plausible(pgdp, upstream, problems):
        dp = {row[column]: row[COUNT] for row in pgdp["data"]}
        up = {row[column]: row[COUNT] for row in upstream["data"]}
        worst = counts_within(dp, up, f"count of {column}", problems)
        first = sorted(up)[:2]
        shown = [(key, dp.get(key), up[key]) for key in first]
        return f"{len(dp)} {column} values (upstream {len(up)}), largest difference {worst}; ({column}, count, upstream) {shown}"

    return plausible


def synopsis_charged(name, first, values):
    """The chart's values and what it charged: the first chart pays for the synopsis (its notice
    says so; SHOW pgdp.budget's epsilon_spent is the ε proven for the history, which grows by less
    than the synopsis's declared ε), every later one nothing."""

    def plausible(pgdp, upstream, problems):
        shown = values(pgdp, upstream, problems)
        if name not in BUDGET:
            problems.append("epsilon_spent not read")
            return shown
        before, after = BUDGET[name]
        charge = f"epsilon_spent {before:g} -> {after:g}"
        if first:
            synopsis = os.environ["PGDP_SYNOPSIS"]
            notices = " ".join(n for e in statements(name, "pgdp") for n in e["notices"])
            if after <= before or f"pays for synopsis {synopsis} once" not in notices:
                problems.append(
                    f"the first chart did not pay for synopsis {synopsis}: {charge} notices={one_line(notices, 600)} "
                    f"sql={sql_summary(name)}"
                )
        elif after != before:
            problems.append(f"charged after the synopsis was paid for (not answered from it): {charge} sql={sql_summary(name)}")
        return f"{shown}; {charge}"

    return plausible


def plausible_raw(pgdp, upstream, problems):
    return f"{pgdp.get('rowcount')} raw rows answered (upstream {upstream.get('rowcount')})"


# ---------------------------------------------------------------------------------------------


def libpq_dsn_to_url(dsn):
    """A SQLAlchemy URL (psycopg2) for a libpq key=value DSN or a postgres:// URL."""
    from sqlalchemy.engine import URL, make_url

    if dsn.startswith(("postgres://", "postgresql://")):
        url = make_url(dsn.replace("postgres://", "postgresql://", 1))
        return url.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)
    params = dict(re.findall(r"(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", dsn))
    params = {k: v[1:-1].replace("\\'", "'") if v.startswith("'") else v for k, v in params.items()}
    host = params.pop("host", "127.0.0.1")
    port = params.pop("port", None)
    query = {}
    if host.startswith("/"):
        query["host"] = host
        host = None
    user = params.pop("user", None)
    password = params.pop("password", None)
    database = params.pop("dbname", None)
    query.update(params)
    url = URL.create(
        "postgresql+psycopg2",
        username=user,
        password=password,
        host=host,
        port=int(port) if port and host else None,
        database=database,
        query=query,
    )
    if port and not host:
        url = url.update_query_dict({"port": port})
    return url.render_as_string(hide_password=False)


def synopsis_dashboard(run, chart):
    """The people dataset and SYNOPSIS_CHECKS, on pgdp (with the budget read around each chart)
    and then on the upstream; reported like the other charts."""
    charts = [
        ("synopsis_big_number_people", chart(big_number), synopsis_total),
        ("synopsis_bar_by_region", chart(bar_by_region), synopsis_bar("region")),
        ("synopsis_bar_by_region_sex_f", chart(bar_by_region_sex_f), synopsis_bar("region")),
        ("synopsis_bar_by_education_region_ce", chart(bar_by_education_region_ce), synopsis_bar("education")),
        ("synopsis_reload_big_number_people", chart(big_number), synopsis_total),
        ("synopsis_reload_bar_by_region", chart(bar_by_region), synopsis_bar("region")),
    ]
    assert [name for name, _, _ in charts] == SYNOPSIS_CHECKS
    run.phase(
        "pgdp",
        [(name, "people", budgeted(name, runner)) for name, runner, _ in charts],
        tables=("people",),
        sqllab=False,
    )
    run.phase("upstream", [(name, "people", runner) for name, runner, _ in charts], tables=("people",), sqllab=False)
    run.report("dataset_people", compare_datasets("dataset_people"))
    for index, (name, _, values) in enumerate(charts):
        run.report(name, compare_chart(name, synopsis_charged(name, index == 0, values)))
    transcript()
    return 0


def main():
    started = time.monotonic()
    env = os.environ
    pgdp_port = env["PGDP_PORT"]
    pgdp_uri = (
        f"postgresql+psycopg2://{env['PGDP_USER']}:{env['PGDP_PASSWORD']}@{env['PGDP_HOST']}:"
        f"{pgdp_port}/{env['PGDP_DATABASE']}?sslmode=disable"
    )
    upstream_uri = libpq_dsn_to_url(env["PGDP_UPSTREAM_DSN"])

    template = env.get("PGDP_SUPERSET_TEMPLATE", os.path.join(HERE, ".venv", "pgdp-superset-metadata.sqlite"))
    tmp = tempfile.mkdtemp(prefix="pgdp-superset-")
    try:
        metadata = os.path.join(tmp, "superset.sqlite")
        shutil.copyfile(template, metadata)
        env["PGDP_SUPERSET_METADATA_DB"] = metadata
        env["SUPERSET_CONFIG_PATH"] = os.path.join(HERE, "superset_config.py")
        env.setdefault("SUPERSET_HOME", tmp)
        install_recorder(pgdp_port)

        from superset.app import create_app

        app = create_app()
        print(f"superset app created in {time.monotonic() - started:.1f} s", file=sys.stderr)
        with app.app_context():
            api = Api(app.test_client())
            api.login()
            run = Run(api, pgdp_uri, upstream_uri)
            run.check("connect_test_connection", run.test_connection)
            run.check("connect_create_database", run.create_databases)
            if len(run.databases) < 2:
                return 1
            run.check("connect_schemas", run.schemas)
            run.check("connect_tables", run.tables)
            run.check("connect_table_metadata", run.table_metadata)

            def chart(build):
                return lambda dataset: run.chart_data(build(dataset))

            if env.get("PGDP_SYNOPSIS"):
                return synopsis_dashboard(run, chart)

            def native(column):
                return lambda dataset: run.chart_data(native_filter(dataset, column))

            # (check, table, what runs on a dataset id, how pgdp's answer is compared)
            charts = [
                ("big_number_people", "people", chart(big_number), plausible_people_count),
                ("big_number_visits", "visits", chart(big_number), plausible_visit_count),
                ("bar_chart_by_clinic", "visits", chart(bar_by_clinic), plausible_bar),
                ("line_chart_by_month_time_range", "visits", chart(line_by_month), plausible_months),
                ("filter_values_visits_clinic", "visits", lambda ds: run.column_values(ds, "clinic"), None),
                ("filter_values_people_region", "people", lambda ds: run.column_values(ds, "region"), None),
                ("native_filter_visits_clinic", "visits", native("clinic"), native_filter_plausible("clinic")),
                ("native_filter_people_region", "people", native("region"), native_filter_plausible("region")),
                ("series_limit_chart", "visits", chart(series_limit), plausible_series),
                ("raw_rows_table_chart", "visits", chart(raw_rows), plausible_raw),
            ]
            for server in ("pgdp", "upstream"):
                run.phase(server, [(name, table, runner) for name, table, runner, _ in charts])

            for table in ("visits", "people"):
                run.report(f"dataset_{table}", compare_datasets(f"dataset_{table}"))
            for name, _, _, plausible in charts:
                if plausible is None:
                    run.report(name, compare_value_lists(name))
                else:
                    run.report(name, compare_chart(name, plausible))
            run.report("sqllab_public_table", compare_sqllab)
            transcript()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"superset checks took {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
