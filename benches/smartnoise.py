#!/usr/bin/env python3
"""SmartNoise SQL on the queries of the proxy bench's figure 8 (benches/proxy/main.rs, DUP).

Runs each query through SmartNoise SQL (`pip install smartnoise-sql psycopg2-binary`) on the same
PostgreSQL database as the bench, against the same table (`bench.pums_dup`, created by
`cargo bench --bench proxy`), with the same bounds and caps as the bench policy: at most 3 rows
per person (SmartNoise samples them with ROW_NUMBER() OVER (PARTITION BY pid ORDER BY random())),
income in [0, 500000], ε = 1, δ = 1e-7. Prints one line per query: the label, the median latency
in ms over the runs (after one discarded warm-up), and the runs. Optional: the bench and CI never
need it.

    python3 benches/smartnoise.py 'host=127.0.0.1 user=postgres dbname=pgdp_test_demo_s1_v2' [runs]
"""

import statistics
import sys
import time

import psycopg2
import snsql
from snsql import Privacy

METADATA = {
    "bench": {
        "bench": {
            "pums_dup": {
                "max_ids": 3,
                "row_privacy": False,
                "sample_max_ids": True,
                "pid": {"name": "pid", "type": "int", "private_id": True},
                "age": {"name": "age", "type": "int", "lower": 0, "upper": 100},
                "sex": {"name": "sex", "type": "string"},
                "educ": {"name": "educ", "type": "int"},
                "income": {"name": "income", "type": "float", "lower": 0, "upper": 500000},
            }
        }
    }
}

# The labels and queries of figure 8 (DUP in benches/proxy/main.rs).
QUERIES = [
    ("dup: COUNT(*)", "SELECT COUNT(*) AS n FROM bench.pums_dup"),
    (
        "dup: COUNT, AVG(income) by sex",
        "SELECT sex, COUNT(*) AS n, AVG(income) AS a FROM bench.pums_dup GROUP BY sex",
    ),
    (
        "dup: COUNT, SUM(income) by educ",
        "SELECT educ, COUNT(*) AS n, SUM(income) AS s FROM bench.pums_dup GROUP BY educ",
    ),
]


def main():
    dsn = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    conn = psycopg2.connect(dsn)
    privacy = Privacy(epsilon=1.0, delta=1e-7)
    reader = snsql.from_connection(conn, engine="postgres", privacy=privacy, metadata=METADATA)
    for label, sql in QUERIES:
        times = []
        for i in range(runs + 1):
            started = time.perf_counter()
            reader.execute(sql)
            if i > 0:
                times.append((time.perf_counter() - started) * 1000.0)
        print(f"{label}\t{statistics.median(times):.1f}\t{runs}", flush=True)


if __name__ == "__main__":
    main()
