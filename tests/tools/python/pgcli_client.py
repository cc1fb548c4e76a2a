"""pgcli against pgdp: its start-up, the completion metadata it loads, \\dt and \\d, a DP query,
a refusal and an interactive session, each one check, compared with what PostgreSQL gives for the
same command.

Usage: pgcli_client.py [check ...]

pgcli runs as an analyst runs it: `pgcli -h … -c COMMAND` (its own command line, pgcli.main:cli)
in a process of its own with a private configuration directory and TZ=Europe/Berlin, so that its
start-up sets the session's time zone as it does on a machine whose zone differs from the
server's; and once interactively in a pseudo-terminal (start-up, the completion refresh in its
background thread, a query typed at the prompt, \\q). The completion metadata that the
interactive mode loads (pgcli's CompletionRefresher, on a second connection) is also loaded
in-process, as pgcli does it, one check per refresher. Every statement pgcli sends goes through
psycopg's Cursor.execute, which sql_recorder.py records (SQL as sent, result types, SQLSTATE), so
each check reports what pgdp received, and compares result types with the same command run
against the upstream PostgreSQL database. See report.py for the lines printed.
"""

import atexit
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from importlib.metadata import version

import psycopg

import report
import sql_recorder

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = tempfile.mkdtemp(prefix="pgdp-pgcli-")
atexit.register(shutil.rmtree, WORK, ignore_errors=True)
CONFIG = os.path.join(WORK, "pgclirc")
with open(CONFIG, "w", encoding="utf-8") as f:
    f.write(
        "[main]\n"
        "enable_pager = False\n"
        f"log_file = {WORK}/log\n"
        f"history_file = {WORK}/history\n"
        "log_level = INFO\n"
    )
TIME_ZONE = "Europe/Berlin"
_runs = [0]


class Run:
    """One pgcli process: its exit status, output and the statements it sent."""

    def __init__(self, status, stdout, stderr, statements):
        self.status = status
        self.stdout = stdout
        self.stderr = stderr
        self.statements = statements

    def sql(self):
        return " ;; ".join(statement_text(s) for s in self.statements)

    def refusal(self):
        """The first statement that failed with a SQLSTATE, as report.Refused."""
        for s in self.statements:
            if s["sqlstate"]:
                return report.Refused(s["sqlstate"], s["message"], self.sql())
        return None


def statement_text(s):
    text = s["sql"].strip()
    if s["params"]:
        text += f" params={s['params']}"
    return text


def pgcli(target, *commands):
    """Runs `pgcli … -c C1 -c C2 …` against "pgdp" or "upstream"."""
    _runs[0] += 1
    log = os.path.join(WORK, f"sql-{_runs[0]}.jsonl")
    env = dict(os.environ, PGDP_SQL_LOG=log, XDG_CONFIG_HOME=WORK, TZ=TIME_ZONE,
               PAGER="cat", PGCONNECT_TIMEOUT="10", COLUMNS="200", LINES="1000")
    env.pop("PGOPTIONS", None)
    if target == "pgdp":
        args = ["-h", report.HOST, "-p", str(report.PORT), "-U", report.USER,
                "-d", report.DATABASE, "-w"]
        env["PGPASSWORD"] = report.PASSWORD
        env["PGSSLMODE"] = "disable"
    else:
        args = [report.UPSTREAM_DSN, "-w"]
        env.pop("PGPASSWORD", None)
    command = [sys.executable, "-c", "import sql_recorder; sql_recorder.launch_pgcli()",
               "--pgclirc", CONFIG, *args]
    for c in commands:
        command += ["-c", c]
    p = subprocess.run(command, cwd=HERE, env=env, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    return Run(p.returncode, p.stdout, p.stderr, sql_recorder.read(log))


def types(statements):
    return [[report.type_name(t) for t in s["types"] or []] for s in statements]


def normalized(s):
    """A statement's text with its quoted numbers (OIDs, which differ between pgdp's shadow
    catalog and PostgreSQL) left out."""
    return re.sub(r"'\d+'", "'?'", s["sql"]).strip()


def compare_types(got, want):
    """Result types statement by statement, each statement sent to pgdp paired with the same
    statement (up to OIDs) sent to PostgreSQL. pgcli may send PostgreSQL more (\d asks for
    indexes, constraints and triggers only when pg_class says the table has them): those are
    named in the returned note. A statement sent to pgdp only, or other types, is a mismatch."""
    unused = list(want)
    for s in got:
        twin = next((w for w in unused if normalized(w) == normalized(s)), None)
        sql = " ;; ".join(statement_text(s) for s in got)
        if twin is None:
            raise report.Mismatch(f"a statement not sent to PostgreSQL: {statement_text(s)}", sql)
        unused.remove(twin)
        if s["sqlstate"] is None and types([s]) != types([twin]):
            raise report.Mismatch(f"column types {types([s])[0]} where PostgreSQL gives "
                                  f"{types([twin])[0]} for {statement_text(s)}", sql)
    if not unused:
        return ""
    return f"(PostgreSQL was also asked {len(unused)} more: " + " ;; ".join(
        statement_text(w)[:60] + "…" for w in unused) + ")"


def table(stdout, index=0):
    """The rows of the `index`-th table pgcli printed (its psql-like format), as lists of cells,
    with its header."""
    tables = []
    lines = stdout.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("+-") and i + 2 < len(lines) and lines[i + 2].startswith("|-"):
            header = [c.strip() for c in lines[i + 1].strip("|").split("|")]
            rows = []
            i += 3
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            tables.append((header, rows))
        i += 1
    if index >= len(tables):
        raise AssertionError(f"pgcli printed {len(tables)} table(s): {stdout!r}")
    return tables[index]


def answered(target_run, what):
    refusal = target_run.refusal()
    if refusal is not None:
        raise refusal
    if target_run.status != 0:
        raise AssertionError(f"pgcli {what} exited with {target_run.status}: "
                             f"{target_run.stderr.strip()!r}")


# ---------------------------------------------------------------------------------------------
# pgcli's command line


def check_startup():
    """Start-up with -c: connect, `show time zone`, `set time zone "Europe/Berlin"` (the local zone
    differs from the server's), then the command."""
    run = pgcli("pgdp", "SELECT 1 AS one")
    answered(run, "startup")
    header, rows = table(run.stdout)
    assert header == ["one"] and rows == [["1"]], (header, rows)
    note = compare_types(run.statements, pgcli("upstream", "SELECT 1 AS one").statements)
    zone = re.search(r"Using local time zone (\S+) \(server uses (\S+)\)", run.stdout)
    zone = f"local={zone.group(1)} server={zone.group(2)}" if zone else "no zone change"
    return (f"pgcli={version('pgcli')} {zone} types={types(run.statements)} {note} "
            f"| sql: {run.sql()}")


def check_dt():
    run = pgcli("pgdp", "\\dt demo.*")
    answered(run, "\\dt")
    header, rows = table(run.stdout)
    up = pgcli("upstream", "\\dt demo.*")
    up_header, up_rows = table(up.stdout)
    assert header == up_header, (header, up_header)
    names = [r[:3] for r in rows]
    assert names == [r[:3] for r in up_rows], f"{names} where PostgreSQL lists {up_rows}"
    note = compare_types(run.statements, up.statements)
    return f"tables={[r[1] for r in rows]} owner={rows[0][3]!r} {note} | sql: {run.sql()}"


def check_d_people():
    run = pgcli("pgdp", "\\d demo.people")
    answered(run, "\\d")
    header, rows = table(run.stdout)
    up = pgcli("upstream", "\\d demo.people")
    up_header, up_rows = table(up.stdout)
    assert header == up_header, (header, up_header)
    columns = [r[:2] for r in rows]
    assert columns == [r[:2] for r in up_rows], f"{columns} where PostgreSQL has {up_rows}"
    note = compare_types(run.statements, up.statements)
    modifiers = {r[0]: r[2] for r in rows if r[2]}
    up_modifiers = {r[0]: r[2] for r in up_rows if r[2]}
    if modifiers != up_modifiers:
        raise report.Mismatch(f"modifiers {modifiers} where PostgreSQL shows {up_modifiers}",
                              run.sql())
    return f"columns={columns} {note} | sql: {run.sql()}"


DP_QUERY = "SELECT region, COUNT(*), AVG(income) FROM demo.people GROUP BY region ORDER BY region"
# The truth for DP_QUERY: pgdp clamps income into the policy's bounds [0, 250000].
DP_TRUTH = ("SELECT region, COUNT(*), AVG(LEAST(income, 250000)) FROM demo.people "
            "GROUP BY region")


def check_dp_query():
    run = pgcli("pgdp", DP_QUERY)
    answered(run, "DP query")
    header, rows = table(run.stdout)
    up = pgcli("upstream", DP_QUERY)
    up_header, _ = table(up.stdout)
    assert header == up_header, (header, up_header)
    note = compare_types(run.statements, up.statements)
    with psycopg.connect(report.UPSTREAM_DSN) as conn:
        truth = {r[0]: r for r in conn.execute(DP_TRUTH).fetchall()}
    assert {r[0] for r in rows} == report.REGIONS, rows
    for region, count, avg in rows:
        true_count, true_avg = truth[region][1], float(truth[region][2])
        if abs(int(count) - true_count) > 0.02 * true_count + 20:
            raise report.Mismatch(f"count {count} of {region} is not near {true_count}", run.sql())
        if abs(float(avg) - true_avg) > 0.05 * true_avg:
            raise report.Mismatch(f"AVG {avg} of {region} is not near {true_avg}", run.sql())
    notice = next((line for line in run.stdout.splitlines() if line.startswith("pgdp:")), None)
    return (f"groups={len(rows)} notice={notice!r} types={types(run.statements)} {note} "
            f"| sql: {run.sql()}")


def check_refusal():
    run = pgcli("pgdp", "SELECT * FROM demo.people LIMIT 5", "SELECT 1 AS after")
    refusal = run.refusal()
    if refusal is None:
        header, rows = table(run.stdout)
        return f"rows={len(rows)} (raw rows of a private table were answered) | sql: {run.sql()}"
    assert refusal.sqlstate in run.stdout + run.stderr or refusal.message.split(" (HINT")[0] in \
        run.stdout + run.stderr, f"pgcli did not show the error: {run.stdout!r} {run.stderr!r}"
    raise refusal


def check_interactive():
    """pgcli as an analyst starts it, in a terminal (a pseudo-terminal here): start-up, the
    completion refresh in its background thread on a second connection, a DP query typed at the
    prompt, then \\q."""
    log = os.path.join(WORK, "sql-interactive.jsonl")
    env = dict(os.environ, PGDP_SQL_LOG=log, XDG_CONFIG_HOME=WORK, TZ=TIME_ZONE, TERM="xterm",
               PROMPT_TOOLKIT_NO_CPR="1", PAGER="cat", PGPASSWORD=report.PASSWORD,
               PGSSLMODE="disable", PGCONNECT_TIMEOUT="10", COLUMNS="120", LINES="40")
    env.pop("PGOPTIONS", None)
    argv = [sys.executable, "-c", "import sql_recorder; sql_recorder.launch_pgcli()",
            "--pgclirc", CONFIG, "-h", report.HOST, "-p", str(report.PORT), "-U", report.USER,
            "-d", report.DATABASE, "-w"]
    pid, fd = pty.fork()
    if pid == 0:  # the child: pgcli
        os.chdir(HERE)
        os.execve(sys.executable, argv, env)
    screen = bytearray()

    def read_until(pattern, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    screen.extend(os.read(fd, 65536))
                except OSError:
                    break
                if pattern in screen:
                    return True
        return pattern in screen

    def refreshed():
        return any("p.proname func_name" in s["sql"] or s["sqlstate"]
                   for s in sql_recorder.read(log))

    try:
        assert read_until(f"{report.DATABASE}>".encode(), 20), \
            f"no prompt: {bytes(screen).decode(errors='replace')!r}"
        deadline = time.monotonic() + 20
        while not refreshed() and time.monotonic() < deadline:
            time.sleep(0.2)
        os.write(fd, b"SELECT COUNT(*) FROM demo.people;\r")
        answered_in_time = read_until(b"Time:", 20) or read_until(b"rror", 1)
        os.write(fd, b"\\q\r")
        read_until(b"Goodbye", 5)
    finally:
        for _ in range(50):
            if os.waitpid(pid, os.WNOHANG) != (0, 0):
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    statements = sql_recorder.read(log)
    run = Run(0, "", "", statements)
    refusal = run.refusal()
    if refusal is not None:
        raise refusal
    assert refreshed(), f"the completion refresh did not finish: {run.sql()}"
    assert answered_in_time, f"no answer: {bytes(screen).decode(errors='replace')!r}"
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", bytes(screen).decode(errors="replace"))
    count = re.search(r"\|\s*(\d+)\s*\|", text[text.rfind("count"):])
    assert count, f"no count on the screen: {text!r}"
    with psycopg.connect(report.UPSTREAM_DSN) as conn:
        (truth,) = conn.execute("SELECT COUNT(*) FROM demo.people").fetchone()
    n = int(count.group(1))
    if abs(n - truth) > 0.02 * truth:
        raise report.Mismatch(f"count {n} is not near {truth}", run.sql())
    first_lines = " ;; ".join(" ".join(s["sql"].split())[:70] for s in statements)
    return f"count={n} statements={len(statements)} | sql: {first_lines}"


# ---------------------------------------------------------------------------------------------
# The completion metadata of the interactive mode


_refreshed = {}


def refresh(target):
    """pgcli's completion refresh against "pgdp" or "upstream", as CompletionRefresher's
    background thread runs it: a copy of the executor (a second connection), then every
    refresher in order on one PGCompleter. Returns the completer and, per refresher, the
    statements it sent and the exception it raised (pgcli's thread would stop there; this goes on
    to the next one to report them all)."""
    if target in _refreshed:
        return _refreshed[target]
    from pgcli.completion_refresher import CompletionRefresher
    from pgcli.pgcompleter import PGCompleter
    from pgcli.pgexecute import PGExecute
    from pgspecial.main import PGSpecial

    connecting = []
    sql_recorder.install(connecting)  # pgcli's connection checks, not a refresher's
    if target == "pgdp":
        executor = PGExecute(report.DATABASE, report.USER, report.PASSWORD, report.HOST,
                             str(report.PORT), sslmode="disable", connect_timeout=10)
    else:
        executor = PGExecute(dsn=report.UPSTREAM_DSN)
    executor = executor.copy()
    completer = PGCompleter(smart_completion=True, pgspecial=PGSpecial(), settings={})
    outcomes = {}
    stdout = sys.stdout
    sys.stdout = sys.stderr  # PGCompleter prints its complaints
    try:
        for name, refresher in CompletionRefresher.refreshers.items():
            statements = []
            sql_recorder.install(statements)
            error = None
            try:
                refresher(completer, executor)
            except Exception as e:
                error = e
            outcomes[name] = (statements, error)
    finally:
        sys.stdout = stdout
        executor.conn.close()
    _refreshed[target] = (completer, outcomes)
    return _refreshed[target]


def refresher_check(name):
    def check():
        completer, outcomes = refresh("pgdp")
        statements, error = outcomes[name]
        sql = " ;; ".join(statement_text(s) for s in statements)
        if error is not None:
            failed = next((s for s in statements if s["sqlstate"]), None)
            if failed is not None:
                raise report.Refused(failed["sqlstate"], failed["message"], sql)
            raise report.Mismatch(f"pgcli's refresher failed on pgdp's answer: "
                                  f"{type(error).__name__}: {error}", sql)
        detail = compare_types(statements, refresh("upstream")[1][name][0]) + " "
        if name == "tables":
            tables = completer.dbmetadata["tables"].get("demo", {})
            assert {"people", "visits", "regions", "prescriptions"} <= set(tables), tables
            people = [c.strip('"') for c in tables["people"]]
            assert {"person_id", "age", "region", "income"} <= set(people), people
            detail += f"demo tables={sorted(tables)} people columns={people} "
        elif name == "schemata":
            assert "demo" in completer.dbmetadata["tables"], completer.dbmetadata
            detail += f"search_path={completer.search_path} "
        return f"{detail}types={types(statements)} | sql: {sql}"
    return check


CHECKS = OrderedDict([
    ("startup", check_startup),
    ("refresh_schemata", refresher_check("schemata")),
    ("refresh_tables", refresher_check("tables")),
    ("refresh_views", refresher_check("views")),
    ("refresh_types", refresher_check("types")),
    ("refresh_databases", refresher_check("databases")),
    ("refresh_functions", refresher_check("functions")),
    ("dt", check_dt),
    ("d_people", check_d_people),
    ("dp_query", check_dp_query),
    ("refusal", check_refusal),
    ("interactive", check_interactive),
])

if __name__ == "__main__":
    report.run(CHECKS, sys.argv[1:])
