"""SQLAlchemy 2 against pgdp, with the psycopg2 and psycopg (3) dialects: engine connect (the
dialect's own start-up queries), inspection from the shadow catalog, a DP query through text()
through Core select(func.count()), and .limit() / .offset() / Query.first() through Core and the
ORM (the psycopg dialect sends them as `LIMIT $1::INTEGER`), and the forms the psycopg dialect
gives ordinary filters (`LIKE $1::VARCHAR`, `date_trunc($1::VARCHAR, …)`, a datetime bound in
binary, `CAST(age AS FLOAT)`), each compared with PostgreSQL's answer for the same statement
(PGDP_UPSTREAM_DSN); the same filters through the asyncpg dialect (create_async_engine), which
binds every parameter by the type pgdp's ParameterDescription gives. See matrix.py."""

import asyncio
import datetime
import os

from sqlalchemy import (Column, Date, DateTime, Float, Integer, MetaData, Table, Text, cast,
                        create_engine, func, inspect, select, text)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import matrix

DIALECTS = {"psycopg2": "postgresql+psycopg2", "psycopg": "postgresql+psycopg"}


def engine(dialect):
    return create_engine(matrix.url(DIALECTS[dialect]))


def people_table():
    # Declared by hand: a DP query must not depend on reflection.
    return Table(
        "people", MetaData(),
        Column("person_id", Integer), Column("age", Integer), Column("region", Text),
        schema="demo",
    )


def connect(dialect):
    with engine(dialect).connect() as conn:
        user = conn.execute(text("SELECT current_user")).scalar_one()
        assert user == matrix.USER, user
        return user


def inspect_tables(dialect):
    insp = inspect(engine(dialect))
    tables = sorted(insp.get_table_names(schema="demo"))
    assert tables == ["people", "prescriptions", "regions", "visits"], tables
    assert "demo" in insp.get_schema_names(), insp.get_schema_names()
    columns = {c["name"]: str(c["type"]) for c in insp.get_columns("people", schema="demo")}
    assert set(columns) == {"person_id", "age", "sex", "region", "education", "income"}, columns
    assert columns["age"] == "INTEGER", columns
    # Table options read current_setting('default_table_access_method') in a catalog query.
    options = insp.get_table_options("people", schema="demo")
    assert "postgresql_using" not in options, options
    # Full reflection, as Table(..., autoload_with=engine) does it.
    reflected = Table("people", MetaData(), schema="demo", autoload_with=engine(dialect))
    assert {c.name for c in reflected.columns} == set(columns), reflected.columns
    return ",".join(tables)


def dp_query_text(dialect):
    with engine(dialect).connect() as conn:
        n = conn.execute(
            text("SELECT COUNT(*) FROM demo.people WHERE age >= :age"), {"age": 0}).scalar_one()
        matrix.assert_people_count(n)
        return str(n)


def dp_query_core(dialect):
    people = people_table()
    with engine(dialect).connect() as conn:
        n = conn.execute(select(func.count()).select_from(people)).scalar_one()
        matrix.assert_people_count(n)
        m = conn.execute(
            select(func.count()).select_from(people).where(people.c.age >= 50)).scalar_one()
        matrix.assert_fraction_count(m)
        rows = conn.execute(
            select(people.c.region, func.count()).group_by(people.c.region)).all()
        assert {r[0] for r in rows} == matrix.REGIONS, rows
        return f"{n}/{m}/{len(rows)}groups"


def visits_table():
    return Table(
        "visits", MetaData(),
        Column("visit_id", Integer), Column("person_id", Integer), Column("clinic", Text),
        Column("visit_date", Date), Column("checked_in", DateTime(timezone=True)),
        schema="demo",
    )


def dp_query_filters(dialect):
    """Filters as the dialect writes them, each compared with PostgreSQL's answer."""
    people, visits = people_table(), visits_table()
    since = datetime.datetime(2024, 6, 1, tzinfo=datetime.timezone.utc)
    statements = {
        "checked_in": select(func.count()).select_from(visits).where(visits.c.checked_in >= since),
        "like": select(func.count()).select_from(visits).where(visits.c.clinic.like("C1%")),
        "month": select(func.count()).select_from(visits).where(
            func.date_trunc("month", visits.c.visit_date) == datetime.date(2024, 1, 1)),
        "avg_float": select(func.avg(cast(people.c.age, Float))),
    }
    driver = __import__(dialect)
    dsn = os.environ["PGDP_UPSTREAM_DSN"]
    upstream = create_engine(DIALECTS[dialect] + "://", creator=lambda: driver.connect(dsn))
    details = []
    with engine(dialect).connect() as conn, upstream.connect() as truth:
        for name, statement in statements.items():
            got = conn.execute(statement).scalar_one()
            want = truth.execute(statement).scalar_one()
            matrix.assert_near_postgresql(name, got, want)
            details.append(f"{name}={got:.6g}/{want:.6g}")
    return " ".join(details)


def filter_statements():
    """Filters as SQLAlchemy writes them for an analyst's dashboard, shared by the dialects."""
    people, visits = people_table(), visits_table()
    since = datetime.datetime(2024, 6, 1, tzinfo=datetime.timezone.utc)
    return {
        "checked_in": select(func.count()).select_from(visits).where(visits.c.checked_in >= since),
        "visit_date": select(func.count()).select_from(visits).where(
            visits.c.visit_date >= datetime.date(2024, 1, 1)),
        "age": select(func.count()).select_from(people).where(people.c.age >= 40),
        "like": select(func.count()).select_from(visits).where(visits.c.clinic.like("C1%")),
        "month": select(func.count()).select_from(visits).where(
            func.date_trunc("month", visits.c.visit_date) == datetime.date(2024, 1, 1)),
        "avg_float": select(func.avg(cast(people.c.age, Float))),
    }


async def asyncpg_filters():
    import asyncpg
    from sqlalchemy.ext.asyncio import create_async_engine

    async def upstream_connection():
        return await asyncpg.connect(**matrix.upstream_asyncpg_kwargs())

    pgdp = create_async_engine(
        f"postgresql+asyncpg://{matrix.USER}:{matrix.PASSWORD}@{matrix.HOST}:{matrix.PORT}/"
        f"{matrix.DATABASE}", connect_args={"ssl": False})
    upstream = create_async_engine("postgresql+asyncpg://", async_creator=upstream_connection)
    details = []
    try:
        async with pgdp.connect() as conn, upstream.connect() as truth:
            for name, statement in filter_statements().items():
                got = (await conn.execute(statement)).scalar_one()
                want = (await truth.execute(statement)).scalar_one()
                matrix.assert_near_postgresql(name, got, want)
                details.append(f"{name}={got:.6g}/{want:.6g}")
    finally:
        await pgdp.dispose()
        await upstream.dispose()
    return " ".join(details)


def dp_query_asyncpg_filters():
    """The filters through SQLAlchemy's asyncpg dialect (`$1::DATE`, `$1::INTEGER`,
    `$1::VARCHAR`, a binary timestamptz), each compared with PostgreSQL's answer."""
    return asyncio.run(asyncpg_filters())


class Base(DeclarativeBase):
    pass


class Person(Base):
    __tablename__ = "people"
    __table_args__ = {"schema": "demo"}
    person_id: Mapped[int] = mapped_column(primary_key=True)
    age: Mapped[int]
    region: Mapped[str]


class Visit(Base):
    __tablename__ = "visits"
    __table_args__ = {"schema": "demo"}
    visit_id: Mapped[int] = mapped_column(primary_key=True)
    clinic: Mapped[str]
    visit_date: Mapped[datetime.date]


def dp_query_group_counts(dialect):
    """Counts of groups as the ORM writes them (Query.count() of a DISTINCT or GROUP BY query:
    `SELECT count(*) FROM (SELECT DISTINCT …) AS anon_1`, answered as COUNT(DISTINCT ROW(…))),
    each compared with PostgreSQL's answer. Keys many people share: each person keeps at most
    10 of its key tuples (the policy's max_rows_per_unit), which removes no group here (see
    docs/privacy.md on counts of groups of rarer keys)."""
    month = func.date_trunc("month", Visit.visit_date)
    counts = {
        "distinct": lambda s: s.query(Visit.clinic).distinct().count(),
        "group_by": lambda s: s.query(Visit.clinic, month).group_by(Visit.clinic, month).count(),
        "month": lambda s: s.query(month).distinct().count(),
    }
    driver = __import__(dialect)
    dsn = os.environ["PGDP_UPSTREAM_DSN"]
    upstream = create_engine(DIALECTS[dialect] + "://", creator=lambda: driver.connect(dsn))
    details = []
    with Session(engine(dialect)) as session, Session(upstream) as truth:
        for name, count in counts.items():
            got, want = count(session), count(truth)
            matrix.assert_near_postgresql(name, got, want)
            details.append(f"{name}={got}/{want}")
    return " ".join(details)


def dp_query_limit(dialect):
    """LIMIT and OFFSET as SQLAlchemy writes them, with its defaults: the rows PostgreSQL's
    `ORDER BY region LIMIT 3 OFFSET 2` gives over the ten public regions, and Query.first()."""
    people = people_table()
    expected = sorted(matrix.REGIONS)[2:5]
    with engine(dialect).connect() as conn:
        rows = conn.execute(
            select(people.c.region, func.count().label("n"))
            .group_by(people.c.region).order_by(people.c.region).limit(3).offset(2)).all()
        assert [r.region for r in rows] == expected, rows
        assert all(isinstance(r.n, int) and 1_000 < r.n < 30_000 for r in rows), rows
    with Session(engine(dialect)) as session:
        orm_rows = session.execute(
            select(Person.region, func.count(Person.person_id))
            .group_by(Person.region).order_by(Person.region).limit(3).offset(2)).all()
        assert [r[0] for r in orm_rows] == expected, orm_rows
        # Query.first(): `SELECT count(…) FROM demo.people LIMIT $1::INTEGER` bound to 1.
        (n,) = session.query(func.count(Person.person_id)).first()
        matrix.assert_people_count(n)
        over = session.query(Person.region, func.count(Person.person_id)).group_by(
            Person.region).order_by(Person.region).offset(20).all()
        assert over == [], over
    return f"{','.join(expected)}/{n}"


if __name__ == "__main__":
    matrix.run({
        f"{name}_{dialect}": (lambda fn=fn, dialect=dialect: fn(dialect))
        for name, fn in [("connect", connect), ("inspect", inspect_tables),
                         ("dp_query_text", dp_query_text), ("dp_query_core", dp_query_core),
                         ("dp_query_limit", dp_query_limit), ("dp_query_filters", dp_query_filters),
                         ("dp_query_group_counts", dp_query_group_counts)]
        for dialect in DIALECTS
    } | {"dp_query_filters_asyncpg": dp_query_asyncpg_filters})
