"""What the Django programs against pgdp share (django_orm.py, django_synopsis.py): the database
settings, Django's configuration, and running one operation on an alias with its statements,
their result types and the Python types of the result recorded.

Importable before Django is configured: what needs django.db is imported where it is used.
"""

import django
from django.conf import settings

import report


def database(name, user, password, host, port, options, server_binding=False, **extra):
    """One DATABASES entry for psycopg 3; `server_binding` sets OPTIONS
    {"server_side_binding": True} (Django 4.2+: parameters travel as $1, $2 … in the extended
    protocol), else Django's default client-side binding."""
    options = dict(options)
    if server_binding:
        options["server_side_binding"] = True
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": user,
        "PASSWORD": password,
        "HOST": host,
        "PORT": port,
        "OPTIONS": options,
        **extra,
    }


def pgdp_database(server_binding=False, **extra):
    """The entry for this test's pgdp (report.py's PGDP_* environment)."""
    return database(report.DATABASE, report.USER, report.PASSWORD, report.HOST, str(report.PORT),
                    {"sslmode": "disable", "connect_timeout": 10}, server_binding, **extra)


def upstream_database():
    """The entry for the upstream PostgreSQL database holding the demo data (PGDP_UPSTREAM_DSN)."""
    up = report.upstream_params()
    up_options = {k: v for k, v in up.items()
                  if k not in ("dbname", "user", "password", "host", "port")}
    return database(up.get("dbname", "postgres"), up.get("user", "postgres"),
                    up.get("password", ""), up.get("host", "127.0.0.1"),
                    up.get("port", "5432"), up_options)


def configure(databases):
    """The whole Django configuration: `databases`, no apps beyond the models' own label, UTC with
    time zone support (Django's recommended settings)."""
    settings.configure(
        DATABASES=databases,
        INSTALLED_APPS=[],
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


class Recorder:
    """A Django execute_wrapper: each statement as psycopg sent it, and its result types.
    `show_params` appends each statement's parameters to its text (server-side binding sends
    them apart)."""

    def __init__(self, show_params=False):
        self.statements = []
        self.show_params = show_params

    def __call__(self, execute, sql, params, many, context):
        entry = {"params": params, "sent": sql, "types": None}
        self.statements.append(entry)
        cursor = context["cursor"].cursor  # the psycopg cursor under Django's wrapper
        try:
            return execute(sql, params, many, context)
        finally:
            query = getattr(cursor, "_query", None)  # psycopg's converted query (pinned version)
            if query is not None:
                entry["sent"] = query.query.decode()
            try:
                if cursor.description is not None:
                    entry["types"] = [d.type_code for d in cursor.description]
            except Exception:
                pass

    def sql(self):
        parts = []
        for s in self.statements:
            text = s["sent"]
            if self.show_params and s["params"]:
                text += f" params={list(s['params'])!r}"
            parts.append(text)
        return " ;; ".join(parts)

    def types(self):
        return [[report.type_name(t) for t in s["types"] or []] for s in self.statements]


def shape(value):
    """The Python types of a result, structurally (values left out)."""
    from django.db import models

    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        shapes = []
        for v in value:
            s = shape(v)
            if s not in shapes:
                shapes.append(s)
        return shapes
    if isinstance(value, models.Model):
        return {f.attname: shape(getattr(value, f.attname)) for f in value._meta.concrete_fields}
    return type(value).__name__


def on(alias, operation, show_params=False):
    """Runs `operation(alias)` with a recorder; returns (result, recorder). Errors with a
    SQLSTATE raise report.Refused."""
    from django.db import connections

    recorder = Recorder(show_params)
    try:
        with connections[alias].execute_wrapper(recorder):
            return operation(alias), recorder
    except Exception as e:
        pe = report.psycopg_error(e)
        if pe is None or pe.sqlstate is None:
            raise
        sqlstate, message = report.describe_error(pe)
        raise report.Refused(sqlstate, message, recorder.sql()) from e
