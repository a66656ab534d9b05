"""`mqgate check [--repair]`: verify every file of an embedded data directory, offline.

For operators and post-mortems: each file is read the way the gateway's start-up reads it and
reported with what was found (records, damaged records, a torn tail, an index or checkpoint
that does not match, a topic.json that cannot be read, a registry that lost its rows).
`--repair` does what is safe and what start-up would do anyway: cut torn tails, rebuild indexes
from the records' own offsets, drop bad checkpoints and temporary files, rewrite the journals
without their damaged records. Repair never moves an offset: damaged bytes inside a message log
stay, as a gap holding the offsets they held (reads skip it), and a tail the queue's checkpoint
vouches for is damage kept, not a torn write cut. An unreadable topic.json is reported, not
rewritten: the gateway serves the other topics meanwhile.

Exit status: 0 nothing wrong (or all of it repaired), 1 problems remain, 2 cannot check (a
gateway holds the directory, or it is not a data directory).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class FileReport:
    path: str
    facts: list[str] = field(default_factory=list)  # what is there
    problems: list[str] = field(default_factory=list)  # what is wrong
    repaired: list[str] = field(default_factory=list)  # what --repair did
    kept: list[str] = field(default_factory=list)  # wrong, but left as it is on purpose

    @property
    def ok(self) -> bool:
        return not self.problems and not self.kept


def add_parser(commands: Any) -> None:
    check = commands.add_parser(
        "check", help="verify every file of a data directory (stop the gateway first)", description=__doc__
    )
    check.add_argument(
        "--data-dir",
        default=os.environ.get("MQGATE_DATA_DIR", "data"),
        help="the data directory (default: data)",
    )
    check.add_argument(
        "--repair", action="store_true", help="cut torn tails, rebuild indexes, drop bad files"
    )
    check.add_argument("--json", action="store_true", help="one JSON document instead of text")
    check.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mqgate.cli.check_files import DataDirCheck, LockedError

    root = Path(args.data_dir)
    try:
        reports = DataDirCheck(root, repair=args.repair).run()
    except LockedError as exc:
        print(f"mqgate check: {exc}", flush=True)
        return 2
    if args.json:
        print(json.dumps([asdict(r) | {"ok": r.ok} for r in reports], indent=2))
    else:
        for r in reports:
            status = "OK  " if r.ok else ("KEPT" if not r.problems else "BAD ")
            if r.repaired and not r.problems:
                status = "FIXED" if not r.kept else "KEPT"
            print(f"{status} {r.path}: {'; '.join(r.facts) or 'present'}")
            for line in r.problems:
                print(f"     problem: {line}")
            for line in r.kept:
                print(f"     kept: {line}")
            for line in r.repaired:
                print(f"     repaired: {line}")
        bad = sum(1 for r in reports if r.problems)
        kept = sum(1 for r in reports if r.kept)
        left = " left" if args.repair else ""
        print(f"{len(reports)} files checked, {bad} with problems{left}, {kept} with damage kept")
    return 1 if any(not r.ok for r in reports) else 0
