"""Validates a SARIF log against the OASIS SARIF 2.1.0 JSON schema (committed beside this file,
from the OASIS SARIF TC's repository: sarif-2.1/schema/sarif-schema-2.1.0.json, errata 01).

usage: sarif_validate.py SCHEMA LOG
Prints "valid SARIF 2.1.0: N run(s), R rules, F results" and exits 0, or every error and exits 1.
"""
import json
import sys

from jsonschema import Draft4Validator, FormatChecker


def main(schema_path, log_path):
    with open(schema_path, encoding="utf-8") as f:
        schema = json.load(f)
    with open(log_path, encoding="utf-8") as f:
        log = json.load(f)
    Draft4Validator.check_schema(schema)
    validator = Draft4Validator(schema, format_checker=FormatChecker())
    errors = sorted(validator.iter_errors(log), key=lambda e: list(e.absolute_path))
    for error in errors:
        print("invalid at /%s: %s" % ("/".join(str(p) for p in error.absolute_path), error.message))
    if errors:
        return 1
    runs = log["runs"]
    rules = sum(len(run["tool"]["driver"].get("rules", [])) for run in runs)
    results = sum(len(run.get("results", [])) for run in runs)
    print("valid SARIF 2.1.0: %d run%s, %d rules, %d results" % (len(runs), "" if len(runs) == 1 else "s", rules, results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
