"""psycopg2 against pgdp: connect, DP queries with client-side parameter binding (psycopg2's only
kind), and refusals mapped to psycopg2's exception classes. See matrix.py for the protocol."""

import psycopg2
import psycopg2.errors
import psycopg2.extensions

import matrix


def connect(**kwargs):
    return psycopg2.connect(matrix.libpq_dsn(), **kwargs)


def check_connect():
    with connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT current_user")
        assert cur.fetchone() == (matrix.USER,)
        assert conn.server_version >= 90000, conn.server_version
        return f"server_version={conn.server_version}"


def check_dp_query_client_binding():
    # psycopg2 interpolates the parameters into the SQL text and runs it in an implicit
    # transaction (BEGIN first): both must work through pgdp.
    conn = connect()
    try:
        cur = conn.cursor()
        cur.execute("SELECT COUNT(*) FROM demo.people WHERE age >= %s", (0,))
        (n,) = cur.fetchone()
        matrix.assert_people_count(n)
        cur.execute(
            "SELECT region, COUNT(*) FROM demo.people WHERE sex = %s GROUP BY region",
            ("F",),
        )
        rows = cur.fetchall()
        assert {r[0] for r in rows} == matrix.REGIONS, rows
        assert all(isinstance(r[1], int) for r in rows), rows
        conn.commit()
        return f"count={n} groups={len(rows)}"
    finally:
        conn.close()


def check_errors_map_to_exception_classes():
    conn = connect()
    conn.autocommit = True
    try:
        cur = conn.cursor()
        code = lambda e: e.pgcode
        seen = [
            matrix.expect_error(
                lambda: cur.execute("SELECT * FROM demo.people"),
                psycopg2.errors.InsufficientPrivilege, "42501", code),
            matrix.expect_error(
                lambda: cur.execute("SELECT COUNT(*) OVER () FROM demo.people"),
                psycopg2.errors.FeatureNotSupported, "0A000", code),
            matrix.expect_error(
                lambda: cur.execute("SELEC 1"), psycopg2.errors.SyntaxError, "42601", code),
            matrix.expect_error(
                lambda: cur.execute("SELECT COUNT(*) FROM demo.no_such_table"),
                psycopg2.errors.UndefinedTable, "42P01", code),
            matrix.expect_error(
                lambda: cur.execute("SET pgdp.epsilon = %s", (-1,)),
                psycopg2.errors.InvalidParameterValue, "22023", code),
        ]
        # The DB-API class hierarchy holds too: a refusal is a ProgrammingError.
        assert issubclass(psycopg2.errors.InsufficientPrivilege, psycopg2.ProgrammingError)
        cur.execute("SELECT 1")
        assert cur.fetchone() == (1,)
        return " ".join(seen)
    finally:
        conn.close()


def check_error_in_transaction_then_rollback():
    # Without autocommit, a refusal aborts the transaction (25P02 until ROLLBACK).
    conn = connect()
    try:
        cur = conn.cursor()
        try:
            cur.execute("SELECT * FROM demo.people")
            raise AssertionError("refusal expected")
        except psycopg2.errors.InsufficientPrivilege:
            pass
        try:
            cur.execute("SELECT 1")
            raise AssertionError("in-failed-transaction error expected")
        except psycopg2.errors.InFailedSqlTransaction:
            pass
        conn.rollback()
        cur.execute("SELECT 1")
        assert cur.fetchone() == (1,)
        return "25P02 then rollback"
    finally:
        conn.close()


if __name__ == "__main__":
    matrix.run({
        "connect": check_connect,
        "dp_query_client_binding": check_dp_query_client_binding,
        "errors": check_errors_map_to_exception_classes,
        "error_in_transaction": check_error_in_transaction_then_rollback,
    })
