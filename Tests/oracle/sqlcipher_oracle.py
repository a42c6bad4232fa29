#!/usr/bin/env python3
"""Real SQLCipher 4 (PyPI sqlcipher3-binary) as the judge of what DataProtectionSQLite writes.

usage: sqlcipher_oracle.py DB KEY [--compat 3|4] [--page-size N] [--kdf-iter N] [--wal] [--crash] SQL...

--wal switches the database to WAL mode first; --crash ends the process right after the last
statement without closing anything (a hot WAL or journal is left behind, as after a crash).

KEY is `pass:<passphrase>`, `raw:<64 or 96 hex digits>`, or `none`. Each SQL statement's rows
are printed as one JSON array per row; `PRAGMA cipher_integrity_check` rows are printed too,
so an empty output from it means every page verified. Exit 2 on any SQLCipher error.
"""
import json
import os
import sys

import sqlcipher3


def main(argv):
    db, key, rest = argv[0], argv[1], argv[2:]
    compat = page_size = kdf_iter = None
    wal = crash = False
    statements = []
    i = 0
    while i < len(rest):
        if rest[i] == "--compat":
            compat = int(rest[i + 1]); i += 2
        elif rest[i] == "--page-size":
            page_size = int(rest[i + 1]); i += 2
        elif rest[i] == "--wal":
            wal = True; i += 1
        elif rest[i] == "--crash":
            crash = True; i += 1
        elif rest[i] == "--kdf-iter":
            kdf_iter = int(rest[i + 1]); i += 2
        else:
            statements.append(rest[i]); i += 1
    conn = sqlcipher3.connect(db, isolation_level=None)
    try:
        if key.startswith("pass:"):
            conn.execute("PRAGMA key = '%s'" % key[5:].replace("'", "''"))
        elif key.startswith("raw:"):
            conn.execute("PRAGMA key = \"x'%s'\"" % key[4:])
        if compat is not None:
            conn.execute("PRAGMA cipher_compatibility = %d" % compat)
        if page_size is not None:
            conn.execute("PRAGMA cipher_page_size = %d" % page_size)
        if kdf_iter is not None:
            conn.execute("PRAGMA kdf_iter = %d" % kdf_iter)
        if wal:
            conn.execute("PRAGMA journal_mode = WAL").fetchall()
            conn.execute("PRAGMA wal_autocheckpoint = 0").fetchall()
        for sql in statements:
            for row in conn.execute(sql):
                print(json.dumps([v.hex() if isinstance(v, bytes) else v for v in row]))
        if crash:
            sys.stdout.flush()
            os._exit(0)
    except sqlcipher3.DatabaseError as error:
        print("sqlcipher error: %s" % error, file=sys.stderr)
        return 2
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
