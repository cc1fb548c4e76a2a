"""A Django ORM dashboard against a pgdp whose policy declares the synopsis people_cube over
demo.people's region, sex and education (private multiplicative weights; docs/policy.md,
"synopses"): the counting operations a Django user writes over those columns, each one check,
compared with what PostgreSQL gives for the same operation.

Usage: django_synopsis.py [check ...]

Django's default configuration with psycopg 3 (client-side binding) over an unmanaged model of
demo.people, as django_orm.py has it. Every operation runs through Django on the alias "default"
(pgdp) and, when pgdp answers, on "upstream" (the PostgreSQL database holding the demo data, as
the postgres user). pgdp's NOTICEs are captured with psycopg 3's notice handler on Django's
connection, and its budget read with SHOW pgdp.budget through a raw cursor before and after.

A check is `ok` only when pgdp's answer came from the synopsis (its NOTICE `pgdp: answered from
synopsis people_cube (…`), charged nothing unless it was the answer that paid for the synopsis
(the first in the session), holds every group PostgreSQL has, has the Python value types and
result column types PostgreSQL's has, and has its counts within the largest 95 % bound the
NOTICE states of PostgreSQL's (at most a tenth of a check's counts outside; a check with a
single count must be within). An answer of the per-query path is reported as `FAIL <check>:
mismatch not answered from the synopsis (<its NOTICEs>)`. See report.py for the lines printed.
"""

import sys
from collections import OrderedDict

import django_common as common
import report

SYNOPSIS = "people_cube"
ANSWERED = f"pgdp: answered from synopsis {SYNOPSIS} ("
PAYS = f"that pays for synopsis {SYNOPSIS} once"
CHARGED_NOTHING = f"pgdp: charged nothing: synopsis {SYNOPSIS} was paid for once"


def configure():
    """pgdp and the upstream as two database aliases (Django's default client-side binding)."""
    common.configure({"default": common.pgdp_database(), "upstream": common.upstream_database()})


configure()

from django.db import connections, models  # noqa: E402  (after settings.configure)
from django.db.models import Count  # noqa: E402


class People(models.Model):
    person_id = models.BigIntegerField(primary_key=True)
    age = models.IntegerField(null=True)
    sex = models.TextField()
    region = models.TextField()
    education = models.TextField()
    income = models.DecimalField(max_digits=12, decimal_places=2, null=True)

    class Meta:
        managed = False
        app_label = "demo"
        db_table = '"demo"."people"'


# ---------------------------------------------------------------------------------------------
# pgdp's NOTICEs and budget


class Notices:
    """pgdp's NOTICEs, from psycopg 3's notice handler on Django's connection to pgdp."""

    def __init__(self):
        self.seen = []
        self.connection = None

    def attach(self):
        """Adds the handler to the psycopg connection under the alias "default" (again when
        Django has connected anew)."""
        conn = connections["default"]
        conn.ensure_connection()
        if conn.connection is not self.connection:
            self.connection = conn.connection
            self.connection.add_notice_handler(self)

    def __call__(self, diag):
        self.seen.append(diag.message_primary or "")

    def take(self):
        seen, self.seen = self.seen, []
        return seen


NOTICES = Notices()
# Whether an answer of this run paid for the synopsis: later ones must charge nothing.
PAID = {"by": None}


def epsilon_spent():
    """The analyst's spent ε, from SHOW pgdp.budget through a raw cursor on pgdp's alias."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SHOW pgdp.budget")
        row = cursor.fetchone()
        names = [d.name for d in cursor.description]
    return float(row[names.index("epsilon_spent")])


def stated_bound(notices):
    """The largest 95 % bound (`within <number> `) that the synopsis NOTICE states."""
    notice = next(n for n in notices if n.startswith(ANSWERED))
    bounds = []
    for part in notice.split("within ")[1:]:
        try:
            bounds.append(float(part.split(" ")[0]))
        except ValueError:
            pass
    assert bounds, f"no bound in {notice!r}"
    return max(bounds)


# ---------------------------------------------------------------------------------------------
# Running one operation on pgdp and on PostgreSQL


on = common.on
shape = common.shape


def counts(result, keys):
    """A result as {group key (a tuple of the `keys` values): count}; a bare count is the one
    group ()."""
    if not keys:
        return {(): result}
    return {tuple(row[k] for k in keys): row["n"] for row in result}


def dashboard(operation, keys, order=None):
    """The check of one counting operation grouped by `keys` (none: a bare `.count()`): pgdp's
    answer from the synopsis, its charge, and its counts against PostgreSQL's. `order(rows)`
    asserts the order the operation asks for."""
    NOTICES.attach()
    NOTICES.take()
    before = epsilon_spent()
    got, pgdp = on("default", operation)
    notices = NOTICES.take()
    after = epsilon_spent()
    want, upstream = on("upstream", operation)
    sql = pgdp.sql()
    said = " ;; ".join(f"NOTICE: {n}" for n in notices) or "no NOTICE"
    if not any(n.startswith(ANSWERED) for n in notices):
        raise report.Mismatch(f"not answered from the synopsis ({said})", sql)
    if pgdp.types() != upstream.types():
        raise report.Mismatch(
            f"column types {pgdp.types()} where PostgreSQL gives {upstream.types()}", sql)
    if shape(got) != shape(want):
        raise report.Mismatch(
            f"Python types {shape(got)} where PostgreSQL gives {shape(want)}", sql)

    # The charge: the synopsis's ε by the answer that pays for it, nothing by any other.
    pays = any(PAYS in n for n in notices)
    if pays and PAID["by"] is None:
        PAID["by"] = sql
        charge = f"paid for the synopsis: epsilon_spent {before:g} -> {after:g}"
    elif after != before or not any(n.startswith(CHARGED_NOTHING) for n in notices):
        raise report.Mismatch(
            f"charged after the synopsis was paid for: epsilon_spent {before:g} -> {after:g} "
            f"({said})", sql)
    else:
        charge = "charged nothing"

    # Every group PostgreSQL has, and each count within the stated bound of PostgreSQL's.
    bound = stated_bound(notices)
    released, truth = counts(got, keys), counts(want, keys)
    missing = sorted(set(truth) - set(released))
    if missing:
        raise report.Mismatch(f"groups {missing} that PostgreSQL has are missing", sql)
    outside = sorted((k, n, truth.get(k, 0)) for k, n in released.items()
                     if abs(n - truth.get(k, 0)) > bound)
    if (len(released) == 1 and outside) or len(outside) * 10 > len(released):
        raise report.Mismatch(
            f"{len(outside)} of {len(released)} counts outside the stated 95 % bound {bound:g} "
            f"of PostgreSQL's (group, count, true): {outside} ({said})", sql)
    if order is not None:
        try:
            order(got)
        except AssertionError as e:
            raise report.Mismatch(f"not in the order asked for: {e}", sql) from e
    return (f"from synopsis {SYNOPSIS}, {charge}; counts={len(released)} "
            f"outside={len(outside)} bound={bound:g} types={pgdp.types()} "
            f"pytypes={shape(got)} | sql: {sql}")


# ---------------------------------------------------------------------------------------------
# The operations of the dashboard


def people(alias):
    return People.objects.using(alias)


def check_total():
    return dashboard(lambda a: people(a).count(), [])


def op_count_filter(alias):
    return people(alias).filter(sex="F").count()


def check_count_filter():
    return dashboard(op_count_filter, [])


def check_count_in():
    return dashboard(lambda a: people(a).filter(region__in=["CE", "EA"]).count(), [])


def op_by_region(alias):
    return list(people(alias).values("region").annotate(n=Count("*")).order_by("region"))


def by_region_order(rows):
    regions = [r["region"] for r in rows]
    assert regions == sorted(regions), regions


def check_by_region():
    return dashboard(op_by_region, ["region"], by_region_order)


def check_by_sex_filtered():
    def descending(rows):
        ns = [r["n"] for r in rows]
        assert ns == sorted(ns, reverse=True), ns
    return dashboard(
        lambda a: list(people(a).filter(education__in=["bachelor", "master"]).values("sex")
                       .annotate(n=Count("*")).order_by("-n")),
        ["sex"], descending)


def check_by_region_sex():
    return dashboard(
        lambda a: list(people(a).values("region", "sex").annotate(n=Count("*"))),
        ["region", "sex"])


def check_count_pk():
    """COUNT of the primary key, what Django users usually write."""
    return dashboard(
        lambda a: list(people(a).values("education").annotate(n=Count("pk"))), ["education"])


def check_count_column():
    return dashboard(
        lambda a: list(people(a).values("region").annotate(n=Count("sex"))), ["region"])


def check_exclude():
    return dashboard(
        lambda a: list(people(a).exclude(region="CE").values("sex").annotate(n=Count("*"))),
        ["sex"])


def check_reload():
    """A dashboard reload: by_region and count_filter again, neither charged."""
    if PAID["by"] is None:
        # Run alone: the first answer pays; the reload is what follows it.
        dashboard(op_by_region, ["region"], by_region_order)
    first = dashboard(op_by_region, ["region"], by_region_order)
    second = dashboard(op_count_filter, [])
    return f"by_region: {first} || count_filter: {second}"


CHECKS = OrderedDict([
    ("total", check_total),
    ("count_filter", check_count_filter),
    ("count_in", check_count_in),
    ("by_region", check_by_region),
    ("by_sex_filtered", check_by_sex_filtered),
    ("by_region_sex", check_by_region_sex),
    ("count_pk", check_count_pk),
    ("count_column", check_count_column),
    ("exclude", check_exclude),
    ("reload", check_reload),
])

if __name__ == "__main__":
    report.run(CHECKS, sys.argv[1:])
