"""asyncpg against pgdp: connect, and a prepared DP query with parameters (asyncpg always uses
named prepared statements, typed parameters from ParameterDescription and binary results).
See matrix.py."""

from decimal import Decimal
import asyncio

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
        "refusal": lambda: asyncio.run(refusal()),
    })
