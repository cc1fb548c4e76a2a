"""psycopg 3 against pgdp: connect, DP queries with server-side binding (the extended protocol,
psycopg 3's default), explicitly prepared statements, binary results, client-side binding
(ClientCursor), and refusals mapped to psycopg's exception classes. See matrix.py."""

from decimal import Decimal

import psycopg
import psycopg.errors

import matrix


def connect(**kwargs):
    return psycopg.connect(matrix.libpq_dsn(), **kwargs)


def check_connect():
    with connect() as conn:
        row = conn.execute("SELECT current_user").fetchone()
        assert row == (matrix.USER,), row
        return f"server_version={conn.info.server_version}"


def check_dp_query_server_binding():
    with connect(autocommit=True) as conn:
        (n,) = conn.execute(
            "SELECT COUNT(*) FROM demo.people WHERE age >= %s", (0,)).fetchone()
        matrix.assert_people_count(n)
        rows = conn.execute(
            "SELECT region, COUNT(*), AVG(income) FROM demo.people WHERE sex = %s GROUP BY region",
            ("M",)).fetchall()
        assert {r[0] for r in rows} == matrix.REGIONS, rows
        # PostgreSQL's types: COUNT is bigint, AVG of a numeric column is numeric (Decimal).
        assert all(isinstance(r[1], int) and isinstance(r[2], Decimal) for r in rows), rows
        return f"count={n} groups={len(rows)}"


def check_dp_query_prepared_twice():
    with connect(autocommit=True) as conn:
        sql = "SELECT COUNT(*) FROM demo.people WHERE age >= %s"
        a = conn.execute(sql, (30,), prepare=True).fetchone()[0]
        b = conn.execute(sql, (30,), prepare=True).fetchone()[0]
        matrix.assert_fraction_count(a)
        assert a == b, f"identical prepared query answered {a} then {b} (replay expected)"
        c = conn.execute(sql, (60,), prepare=True).fetchone()[0]
        matrix.assert_fraction_count(c)
        assert c < a, f"age >= 60 ({c}) not below age >= 30 ({a})"
        return f"count(age>=30)={a} count(age>=60)={c}"


def check_dp_query_binary_results():
    with connect(autocommit=True) as conn:
        cur = conn.cursor(binary=True)
        cur.execute("SELECT COUNT(*), AVG(age) FROM demo.people WHERE region = %s", ("NO",))
        n, avg = cur.fetchone()
        matrix.assert_fraction_count(n)
        # AVG of an integer column is numeric in PostgreSQL, read in binary as a Decimal.
        assert isinstance(avg, Decimal) and 0 <= avg <= 100, avg
        return f"count={n} avg_age={avg:.1f}"


def check_dp_query_client_binding():
    with connect(autocommit=True) as conn:
        cur = psycopg.ClientCursor(conn)
        cur.execute("SELECT COUNT(*) FROM demo.people WHERE education = %s", ("master",))
        (n,) = cur.fetchone()
        matrix.assert_fraction_count(n)
        return f"count={n}"


def check_errors_map_to_exception_classes():
    with connect(autocommit=True) as conn:
        code = lambda e: e.sqlstate
        seen = [
            matrix.expect_error(
                lambda: conn.execute("SELECT * FROM demo.people"),
                psycopg.errors.InsufficientPrivilege, "42501", code),
            matrix.expect_error(
                lambda: conn.execute("SELECT COUNT(*) OVER () FROM demo.people"),
                psycopg.errors.FeatureNotSupported, "0A000", code),
            matrix.expect_error(
                lambda: conn.execute("SELEC 1"), psycopg.errors.SyntaxError, "42601", code),
            matrix.expect_error(
                lambda: conn.execute("SELECT COUNT(*) FROM demo.no_such_table"),
                psycopg.errors.UndefinedTable, "42P01", code),
            # The same refusal through a bound parameter (extended protocol).
            matrix.expect_error(
                lambda: conn.execute("SELECT person_id FROM demo.people WHERE age = %s", (1,)),
                psycopg.errors.InsufficientPrivilege, "42501", code),
        ]
        assert conn.execute("SELECT 1").fetchone() == (1,)
        return " ".join(seen)


def check_any_of_a_list():
    """`= ANY(%s)` with a Python list (a text[] parameter) counts what `IN (…)` of its items
    counts; NULL items and an integer list too."""
    with connect(autocommit=True) as conn:
        (listed,) = conn.execute(
            "SELECT COUNT(*) FROM demo.people WHERE region IN ('NO', 'SE')").fetchone()
        (bound,) = conn.execute(
            "SELECT COUNT(*) FROM demo.people WHERE region = ANY(%s)", (["NO", "SE", None],)
        ).fetchone()
        (ages,) = conn.execute(
            "SELECT COUNT(*) FROM demo.people WHERE age = ANY(%s)", ([30, 31, 32],)).fetchone()
        assert isinstance(bound, int) and abs(bound - listed) <= 50, (bound, listed)
        matrix.assert_fraction_count(bound)
        matrix.assert_fraction_count(ages)
        return f"any={bound} in={listed} ages={ages}"


def check_server_side_cursors():
    """Named (server-side) cursors, as Django's .iterator(), SQLAlchemy's stream_results and
    pandas' chunksize use them: DECLARE, a Describe of the portal named like the cursor, FETCH
    FORWARD in batches, CLOSE."""
    sql = "SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region ORDER BY region"
    # WITH HOLD, outside a transaction (psycopg's withhold=True in autocommit mode).
    with connect(autocommit=True) as conn:
        with conn.cursor(name="pgdp_regions", withhold=True) as cur:
            cur.execute(sql)
            assert [d.name for d in cur.description] == ["region", "n"], cur.description
            first = cur.fetchmany(3)
            rest = cur.fetchall()
        regions = [r[0] for r in first + rest]
        assert regions == sorted(matrix.REGIONS), regions
        assert all(isinstance(r[1], int) for r in first + rest), first
        assert conn.execute("SELECT 1").fetchone() == (1,)
    # In a transaction, with a bound parameter, iterated in batches of 4.
    with connect() as conn:
        with conn.cursor(name="pgdp_ages") as cur:
            cur.itersize = 4
            cur.execute(
                "SELECT region, AVG(income) AS mean FROM demo.people WHERE age >= %s"
                " GROUP BY region ORDER BY region",
                (40,))
            rows = list(cur)
        assert [r[0] for r in rows] == sorted(matrix.REGIONS), rows
        assert all(isinstance(r[1], Decimal) for r in rows), rows
    return f"regions={len(regions)} batched={len(rows)}"


if __name__ == "__main__":
    matrix.run({
        "connect": check_connect,
        "dp_query_server_binding": check_dp_query_server_binding,
        "dp_query_prepared_twice": check_dp_query_prepared_twice,
        "dp_query_binary_results": check_dp_query_binary_results,
        "dp_query_client_binding": check_dp_query_client_binding,
        "errors": check_errors_map_to_exception_classes,
        "server_side_cursors": check_server_side_cursors,
        "any_of_a_list": check_any_of_a_list,
    })
