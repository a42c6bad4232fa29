#!/usr/bin/env python3
"""The peer of `dp-bench sqlite`: runs the same SQL workloads on real SQLCipher 4 (PyPI
sqlcipher3-binary) with a raw key, and prints the seconds each workload took as JSON.

usage: sqlcipher_workload.py DIR RAWKEYHEX [SETTING-SQL ...] < workload.json

workload.json is [{"name": ..., "statements": [...], "mixed": {...} or null}, ...], produced by
dp-bench so that both sides run exactly the same SQL. Statements are executed in C by SQLite; no
rows cross into Python. The mixed workload is a loop of prepared statements (Python's statement
cache), one call per operation, as dp-bench runs it with GRDB's prepared statements. The
setting statements (page size, page cache, journal mode) run first, after the key.
"""
import json
import os
import sys
import time

import sqlcipher3


def run_mixed(conn, mixed):
    select, update = mixed["select"], mixed["update"]
    rows, batch, operations = mixed["rows"], mixed["batch"], mixed["operations"]
    total = 0.0
    for i in range(operations):
        if i % batch == 0:
            conn.execute("BEGIN")
        key = (i * 7919) % rows + 1
        if i % 10 == 9:
            conn.execute(update, (key,))
        else:
            total += conn.execute(select, (key,)).fetchone()[0]
        if i % batch == batch - 1 or i == operations - 1:
            conn.execute("COMMIT")
    assert total > 0


def run(path, key, settings, workload):
    conn = sqlcipher3.connect(path, isolation_level=None)
    conn.execute("PRAGMA key = \"x'%s'\"" % key)
    for sql in settings:
        conn.execute(sql).fetchall()
    conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
    times = {}
    for group in workload:
        start = time.perf_counter()
        for sql in group.get("statements") or []:
            conn.execute(sql).fetchall()
        if group.get("mixed"):
            run_mixed(conn, group["mixed"])
        times[group["name"]] = time.perf_counter() - start
    conn.close()
    return times


def main():
    directory, key, settings = sys.argv[1], sys.argv[2], sys.argv[3:]
    workload = json.load(sys.stdin)
    result = {"version": sqlcipher3.connect(":memory:").execute("PRAGMA cipher_version").fetchone()[0]}
    path = os.path.join(directory, "sqlcipher-keyed.db")
    result["keyed"] = run(path, key, settings, workload)
    os.unlink(path)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
