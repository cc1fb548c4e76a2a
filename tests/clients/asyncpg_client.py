"""asyncpg against pgdp: connect, and a prepared DP query with parameters (asyncpg always uses
named prepared statements, typed parameters from ParameterDescription and binary results).
See matrix.py."""

from decimal import Decimal
import asyncio
import datetime

import asyncpg

import matrix


async def connect():
    return await asyncpg.connect(
        host=matrix.HOST, port=matrix.PORT, user=matrix.USER, password=matrix.PASSWORD,
        database=matrix.DATABASE, ssl=False, timeout=10)


async def connect_check():
    conn = await connect()
    try:
        user = await conn.fetchval("SELECT current_user")
        assert user == matrix.USER, user
        return f"server_version={conn.get_server_version().major}"
    finally:
        await conn.close()


async def prepared_dp_query():
    conn = await connect()
    try:
        stmt = await conn.prepare("SELECT COUNT(*) FROM demo.people WHERE age >= $1")
        a = await stmt.fetchval(40)
        b = await stmt.fetchval(40)
        matrix.assert_fraction_count(a)
        assert a == b, f"{a} then {b}"
        n = await conn.fetchval("SELECT COUNT(*) FROM demo.people WHERE age >= $1", 0)
        matrix.assert_people_count(n)
        rows = await conn.fetch(
            "SELECT region, COUNT(*), AVG(income) FROM demo.people WHERE sex = $1 GROUP BY region",
            "X")
        assert {r["region"] for r in rows} == matrix.REGIONS, rows
        # AVG of a numeric column is numeric in PostgreSQL: asyncpg decodes it (binary) as Decimal.
        assert all(isinstance(r["avg"], Decimal) for r in rows), rows
        return f"count(age>=40)={a} count={n} groups={len(rows)}"
    finally:
        await conn.close()


async def upstream():
    """PostgreSQL itself, for the answers pgdp must match."""
    return await asyncpg.connect(**matrix.upstream_asyncpg_kwargs())


# Statements whose parameters asyncpg binds by the types Describe reports: a date, an integer, a
# numeric, a timestamptz, a LIKE pattern, a divisor. SQLAlchemy's asyncpg dialect casts every
# parameter (`$1::DATE`, `$1::INTEGER`, `$1::VARCHAR`).
TYPED = [
    ("SELECT COUNT(*) FROM demo.visits WHERE visit_date >= $1::DATE", (datetime.date(2024, 1, 1),)),
    ("SELECT COUNT(*) FROM demo.people WHERE age >= $1::INTEGER", (40,)),
    ("SELECT COUNT(*) FROM demo.people WHERE income > $1", (Decimal("50000.5"),)),
    ("SELECT COUNT(*) FROM demo.visits WHERE checked_in >= $1",
     (datetime.datetime(2024, 6, 1, tzinfo=datetime.timezone.utc),)),
    ("SELECT COUNT(*) FROM demo.visits WHERE visit_date < $1 AND clinic LIKE $2::VARCHAR",
     (datetime.date(2024, 1, 1), "C1%")),
    ("SELECT AVG(income / $1) AS avg_k FROM demo.people", (Decimal(1000),)),
]


async def typed_parameters():
    """Parameter and column types as PostgreSQL describes them; values near PostgreSQL's."""
    conn, truth = await connect(), await upstream()
    details = []
    try:
        for i, (sql, args) in enumerate(TYPED):
            mine, theirs = await conn.prepare(sql), await truth.prepare(sql)
            kinds = [t.name for t in mine.get_parameters()]
            want_kinds = [t.name for t in theirs.get_parameters()]
            assert kinds == want_kinds, f"{sql}: parameters {kinds}, PostgreSQL {want_kinds}"
            columns = [a.type.name for a in mine.get_attributes()]
            want_columns = [a.type.name for a in theirs.get_attributes()]
            assert columns == want_columns, f"{sql}: columns {columns}, PostgreSQL {want_columns}"
            got, want = await mine.fetchval(*args), await theirs.fetchval(*args)
            matrix.assert_near_postgresql(sql, got, want)
            details.append(f"{i}:{'/'.join(kinds)}={got:.6g}~{want:.6g}")
    finally:
        await conn.close()
        await truth.close()
    return " ".join(details)


async def refusal():
    conn = await connect()
    try:
        try:
            await conn.fetch("SELECT * FROM demo.people")
        except asyncpg.exceptions.InsufficientPrivilegeError as e:
            assert e.sqlstate == "42501", e.sqlstate
            assert await conn.fetchval("SELECT 1") == 1
            return "InsufficientPrivilegeError/42501"
        raise AssertionError("no refusal")
    finally:
        await conn.close()


if __name__ == "__main__":
    matrix.run({
        "connect": lambda: asyncio.run(connect_check()),
        "prepared_dp_query": lambda: asyncio.run(prepared_dp_query()),
        "typed_parameters": lambda: asyncio.run(typed_parameters()),
        "refusal": lambda: asyncio.run(refusal()),
    })
