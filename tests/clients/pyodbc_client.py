"""psqlODBC through unixODBC and pyodbc against pgdp: connect (the driver's own start-up queries),
SQLTables and SQLColumns (answered from the shadow catalog), and a DP query, each with the
driver's cursor mode off (UseDeclareFetch=0: the whole result at once) and on
(UseDeclareFetch=1: DECLARE/FETCH in a transaction). See matrix.py."""

import pyodbc

import matrix

DRIVER = "PostgreSQL Unicode"


def connect(declare_fetch, autocommit=True):
    return pyodbc.connect(
        f"DRIVER={{{DRIVER}}};SERVER={matrix.HOST};PORT={matrix.PORT};"
        f"DATABASE={matrix.DATABASE};UID={matrix.USER};PWD={matrix.PASSWORD};"
        f"SSLmode=disable;UseDeclareFetch={declare_fetch};Fetch=2",
        timeout=10, autocommit=autocommit)


def connect_check(declare_fetch):
    conn = connect(declare_fetch)
    try:
        user = conn.cursor().execute("SELECT current_user").fetchval()
        assert user == matrix.USER, user
        return conn.getinfo(pyodbc.SQL_DBMS_VER)
    finally:
        conn.close()


def tables_and_columns(declare_fetch):
    conn = connect(declare_fetch)
    try:
        tables = sorted(r.table_name for r in conn.cursor().tables(schema="demo", tableType="TABLE"))
        assert tables == ["people", "prescriptions", "regions", "visits"], tables
        columns = [(r.column_name, r.type_name) for r in conn.cursor().columns(table="people", schema="demo")]
        names = {c[0] for c in columns}
        assert names == {"person_id", "age", "sex", "region", "education", "income"}, columns
        assert ("age", "int4") in columns, columns
        return f"tables={','.join(tables)} columns={len(columns)}"
    finally:
        conn.close()


def dp_query(declare_fetch):
    conn = connect(declare_fetch)
    try:
        cur = conn.cursor()
        n = cur.execute("SELECT COUNT(*) FROM demo.people WHERE age >= ?", 0).fetchval()
        matrix.assert_people_count(int(n))
        rows = cur.execute("SELECT region, COUNT(*) FROM demo.people GROUP BY region").fetchall()
        assert {r[0] for r in rows} == matrix.REGIONS, rows
        return f"count={n} groups={len(rows)}"
    finally:
        conn.close()


def refusal(declare_fetch):
    conn = connect(declare_fetch)
    try:
        try:
            conn.cursor().execute("SELECT * FROM demo.people").fetchall()
        except pyodbc.Error as e:
            assert e.args[0] == "42501", e.args
            return "42501"
        raise AssertionError("no refusal")
    finally:
        conn.close()


def dp_query_in_transaction(declare_fetch):
    # autocommit off: psqlODBC sends BEGIN, and with its default statement-level rollback it
    # wraps each statement in a SAVEPOINT.
    conn = connect(declare_fetch, autocommit=False)
    try:
        n = conn.cursor().execute("SELECT COUNT(*) FROM demo.people WHERE age >= ?", 0).fetchval()
        matrix.assert_people_count(int(n))
        conn.commit()
        return f"count={n}"
    finally:
        conn.close()


CHECKS = {"connect": connect_check, "tables_columns": tables_and_columns, "dp_query": dp_query,
          "refusal": refusal, "dp_query_in_transaction": dp_query_in_transaction}

if __name__ == "__main__":
    matrix.run({
        f"{name}_declare_fetch_{mode}": (lambda fn=fn, mode=mode: fn(mode))
        for name, fn in CHECKS.items() for mode in (0, 1)
    })
