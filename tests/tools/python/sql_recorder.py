"""Records every statement a program sends through psycopg 3's Cursor.execute: the SQL as psycopg
sent it ($1 … with server-side binding), its parameters, its result column types (OIDs) and its
error (SQLSTATE and message). Used for pgcli, which sends everything through psycopg cursors
(its own catalog queries, pgspecial's backslash commands and the user's SQL).

`install(sink)` patches psycopg.Cursor.execute; `sink` is a list (in-process) or a file path
(JSON lines, for a pgcli process started with `python -c` through `launch_pgcli()`).
"""

import json
import os
import sys

import psycopg
import psycopg.sql

_installed = []


def _text(query, cursor):
    if isinstance(query, (psycopg.sql.Composable,)):
        return query.as_string(cursor)
    if isinstance(query, bytes):
        return query.decode()
    return str(query)


def install(sink):
    if _installed:
        _installed[0] = sink
        return
    _installed.append(sink)
    original = psycopg.Cursor.execute

    def execute(self, query, params=None, **kwargs):
        entry = {"sql": _text(query, self), "params": None if params is None else repr(params),
                 "types": None, "sqlstate": None, "message": None}
        try:
            result = original(self, query, params, **kwargs)
            if self.description is not None:
                entry["types"] = [d.type_code for d in self.description]
            return result
        except psycopg.Error as e:
            entry["sqlstate"] = e.sqlstate
            message = e.diag.message_primary or str(e)
            if e.diag.message_hint:
                message += f" (HINT: {e.diag.message_hint})"
            entry["message"] = message
            raise
        finally:
            sent = getattr(self, "_query", None)  # psycopg's converted query (pinned version)
            if sent is not None and sent.query:
                entry["sql"] = sent.query.decode()
            target = _installed[0]
            if isinstance(target, list):
                target.append(entry)
            else:
                with open(target, "a", encoding="utf-8") as f:
                    f.write(json.dumps(entry) + "\n")

    psycopg.Cursor.execute = execute


def read(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def launch_pgcli():
    """`python -c "import sql_recorder; sql_recorder.launch_pgcli()" ARGS…`: pgcli's own
    command line (pgcli.main:cli, what the `pgcli` script runs) with the recorder installed."""
    install(os.environ["PGDP_SQL_LOG"])
    from pgcli.main import cli

    sys.argv[0] = "pgcli"
    cli()
