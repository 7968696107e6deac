"""``python -m hetmem doctor [--json] [--strict]``: the doctor's report on this machine."""

import argparse
import json
import sys

from ._doctor import checks_text, doctor


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m hetmem")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("doctor", help="what this machine can do for CPU<->GPU memory sharing")
    check.add_argument("--json", action="store_true", help="the report as JSON (schema hetmem.doctor/1)")
    check.add_argument("--strict", action="store_true", help="exit with status 1 when any check fails")
    args = parser.parse_args()
    report = doctor()
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(checks_text(report))
    failed = any(check["status"] == "fail" for check in report["checks"])
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
