#!/usr/bin/env python3
"""The peer of `dp-bench sqlite`: runs the same SQL workload on real SQLCipher 4 (PyPI
sqlcipher3-binary), once without a key and once with a raw key, and prints the seconds each
workload took as JSON.

usage: sqlcipher_workload.py DIR RAWKEYHEX < workload.json

workload.json is [{"name": ..., "statements": [...]}, ...], produced by dp-bench so that both
sides run exactly the same SQL. Every statement is executed in C by SQLite; no rows cross into
Python, so the interpreter adds nothing measurable to either side.
"""
import json
import os
import sys
import time

import sqlcipher3


def run(path, key, workload):
    conn = sqlcipher3.connect(path, isolation_level=None)
    if key:
        conn.execute("PRAGMA key = \"x'%s'\"" % key)
    conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
    times = {}
    for group in workload:
        start = time.perf_counter()
        for sql in group["statements"]:
            conn.execute(sql).fetchall()
        times[group["name"]] = time.perf_counter() - start
    conn.close()
    return times


def main():
    directory, key = sys.argv[1], sys.argv[2]
    workload = json.load(sys.stdin)
    result = {"version": sqlcipher3.connect(":memory:").execute("PRAGMA cipher_version").fetchone()[0]}
    for name, k in (("plain", None), ("keyed", key)):
        path = os.path.join(directory, "sqlcipher-%s.db" % name)
        result[name] = run(path, k, workload)
        os.unlink(path)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
