"""The checks behind `mqgate check`: one report per file of an embedded data directory."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import sqlite3
from array import array
from collections.abc import Iterator
from pathlib import Path

from mqgate.cli.check import FileReport
from mqgate.durable.append_file import install, write_new
from mqgate.durable.framing import frame
from mqgate.offsets.backends.embedded import journal as offsets_journal
from mqgate.scheduler.backends.embedded import log as schedule_log
from mqgate.store.backends.embedded import journal as round_journal
from mqgate.store.backends.embedded.data_format import (
    FORMAT,
    FORMAT_FILE,
    READS_ALSO,
    TOPIC_FILE,
    read_topic_config,
)
from mqgate.store.backends.embedded.queue_log import CHECKPOINT_FILE, read_checkpoint, vouched_by
from mqgate.store.backends.embedded.segment import INDEX_SUFFIX, LOG_SUFFIX, describe_gaps, index_records


class LockedError(Exception):
    pass


class DataDirCheck:
    def __init__(self, root: Path, *, repair: bool) -> None:
        self.root = root
        self.repair = repair
        self.reports: list[FileReport] = []

    def run(self) -> list[FileReport]:
        if not self.root.is_dir():
            raise LockedError(f"{self.root} is not a directory")
        with self._locked():
            self._format()
            store_topics = self._topics()
            self._journal()
            self._round_journal()
            self._schedule()
            self._registry(store_topics)
            self._temporary_files()
        return self.reports

    def _report(self, path: Path) -> FileReport:
        report = FileReport(str(path.relative_to(self.root)) if path != self.root else str(path))
        self.reports.append(report)
        return report

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        lock = self.root / ".lock"
        if not lock.exists():
            yield
            return
        fd = os.open(lock, os.O_RDWR)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise LockedError(f"a gateway is running on {self.root}: stop it first") from exc
            yield
        finally:
            os.close(fd)

    # --- files ----------------------------------------------------------------------------

    def _format(self) -> None:
        path = self.root / FORMAT_FILE
        report = self._report(path)
        try:
            found = path.read_text().strip()
        except FileNotFoundError:
            report.problems.append("missing: the gateway treats a data directory with topics as format 1")
            return
        report.facts.append(found)
        if found in READS_ALSO:
            report.facts.append(f"read as it is, and marked {FORMAT!r} when the gateway opens it")
        elif found != FORMAT:
            report.problems.append(f"format {found!r}, this build reads {FORMAT!r}")

    def _topics(self) -> set[str]:
        names: set[str] = set()
        topics_dir = self.root / "topics"
        if not topics_dir.is_dir():
            return names
        for topic_dir in sorted(p for p in topics_dir.iterdir() if p.is_dir()):
            report = self._report(topic_dir / TOPIC_FILE)
            try:
                queues = read_topic_config(topic_dir).queues
            except FileNotFoundError:
                report.facts.append("absent: an unfinished creation, ignored at start-up")
                continue
            except (OSError, ValueError) as exc:
                report.problems.append(
                    f"unreadable ({exc}): the gateway does not serve this topic until it is written "
                    "again or the topic is deleted"
                )
                continue
            names.add(topic_dir.name)
            report.facts.append(f"{queues} queues")
            for q in range(queues):
                self._queue(topic_dir / str(q))
        return names

    def _queue(self, directory: Path) -> None:
        segments = sorted(directory.glob("*" + LOG_SUFFIX))
        if not segments:
            self._report(directory).facts.append("no segment yet")
            return
        checkpoint = self._checkpoint(directory / CHECKPOINT_FILE, segments[-1])
        for seg, after in itertools.pairwise(segments):
            self._segment(seg, known=(_base(after), seg.stat().st_size), active=False)
        last = segments[-1]
        self._segment(last, known=vouched_by(checkpoint, _base(last), last.stat().st_size), active=True)

    def _segment(self, path: Path, *, known: tuple[int, int] | None, active: bool) -> None:
        """A segment indexed as the gateway's start-up does (`index_records`): each record at
        its own offset, what a sealed segment or a checkpoint vouches for kept."""
        report = self._report(path)
        data = path.read_bytes()
        indexed = index_records(data, pos0=0, first=_base(path), known=known)
        report.facts.append(f"{len(indexed.positions)} records")
        if indexed.gaps:
            report.kept.append(describe_gaps(indexed.gaps))
        if indexed.end < len(data):
            problem = f"torn tail of {len(data) - indexed.end} bytes after byte {indexed.end}"
            if self.repair:
                with open(path, "r+b") as fh:
                    fh.truncate(indexed.end)
                    os.fsync(fh.fileno())
                report.repaired.append(f"cut the {problem}")
            else:
                report.problems.append(problem)
        self._index(path.with_suffix(INDEX_SUFFIX), indexed.positions, indexed.end, active=active)

    def _index(self, path: Path, positions: list[int], end: int, *, active: bool) -> None:
        report = self._report(path)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            if not active and positions:
                self._fix(report, path, positions, end, "missing")
            else:
                report.facts.append("absent (rebuilt at start-up)")
            return
        stored = array("Q")
        stored.frombytes(raw[: len(raw) - len(raw) % stored.itemsize])
        report.facts.append(f"{len(stored)} positions")
        expected = positions if not active else positions[: len(stored)]
        if list(stored) != expected or len(raw) % stored.itemsize:
            self._fix(report, path, positions, end, "does not match its log")

    def _fix(self, report: FileReport, path: Path, positions: list[int], end: int, problem: str) -> None:
        if not self.repair:
            report.problems.append(problem)
            return
        tmp = path.with_suffix(".idx.tmp")
        write_new(tmp, [array("Q", positions).tobytes()]).close()
        install(tmp, path)
        report.repaired.append(
            f"{problem}: rebuilt from the records' own offsets ({len(positions)} positions)"
        )
        checkpoint_path = path.parent / CHECKPOINT_FILE
        checkpoint = read_checkpoint(checkpoint_path)
        # Kept while it still holds: it vouches for the offsets up to its end (start-up keeps
        # damage before it as a gap instead of cutting it as a torn tail).
        if (
            checkpoint is not None
            and checkpoint[0] == _base(path)
            and not _agrees(checkpoint, positions, end)
        ):
            checkpoint_path.unlink()
            report.repaired.append("removed the queue's checkpoint: start-up verifies the whole segment")

    def _checkpoint(self, path: Path, last_segment: Path) -> tuple[int, int, int] | None:
        """The queue's checkpoint (base, end offset, end byte), if it is readable and about its
        last segment: what the offsets of that segment are vouched for up to."""
        if not path.exists():
            return None
        report = self._report(path)
        checkpoint = read_checkpoint(path)
        if checkpoint is None:
            self._drop(report, path, "unreadable")
            return None
        base, end, pos = checkpoint
        report.facts.append(f"offsets up to {end} verified at byte {pos}")
        if base != _base(last_segment):
            return None
        size = last_segment.stat().st_size
        if pos > size:
            # Kept: it is all that says which offsets the lost bytes held (start-up keeps them
            # as a gap, so they are not handed out again).
            report.kept.append(f"points past the end of {last_segment.name} ({size} bytes): bytes lost")
        return checkpoint

    def _drop(self, report: FileReport, path: Path, problem: str) -> None:
        if self.repair:
            path.unlink()
            report.repaired.append(f"{problem}: removed (start-up verifies the whole segment)")
        else:
            report.problems.append(problem)

    def _journal(self) -> None:
        path = self.root / "offsets" / "journal.log"
        if not path.exists():
            return
        report = self._report(path)
        data = path.read_bytes()
        replayed = offsets_journal.replay(data)
        good, dropped, good_end = replayed.good, replayed.dropped, replayed.valid_bytes
        report.facts.append(f"{len(good)} records")
        problems = [f"{len(dropped)} damaged records: {', '.join(dropped[:5])}"] if dropped else []
        if good_end < len(data):
            problems.append(f"torn tail of {len(data) - good_end} bytes after byte {good_end}")
        if problems and self.repair:
            tmp = path.with_suffix(".tmp")
            write_new(tmp, [b"".join(frame(p) for p in good)]).close()
            install(tmp, path)
            report.repaired.append(f"rewritten with its {len(good)} good records ({'; '.join(problems)})")
        else:
            report.problems.extend(problems)

    def _round_journal(self) -> None:
        """The message store's round journal: left as it is, even by --repair (the next start
        writes from it what the queue files lack, and only then deletes it)."""
        for path in round_journal.journal_files(self.root / round_journal.JOURNAL_DIR):
            report = self._report(path)
            found = round_journal.inspect(path)
            if found.entries:
                report.facts.append(f"{len(found.entries)} entries, applied by the next start")
            if found.damaged:
                report.kept.append(f"{found.damaged} damaged entries (their queue files may hold them)")
            if found.torn_bytes:
                report.kept.append(f"torn tail of {found.torn_bytes} bytes (a round that answered nobody)")
        aside = self.root / round_journal.JOURNAL_DIR / round_journal.UNAPPLIED_DIR
        for path in round_journal.journal_files(aside):
            found = round_journal.inspect(path)
            self._report(path).kept.append(
                f"{len(found.entries)} entries a start could not apply (their topic not served, or "
                "beyond their queue file's end); once their topic is mended, and if it was not "
                "deleted since, moving the file back into journal/ applies them at the next start"
            )

    def _schedule(self) -> None:
        path = self.root / "scheduler" / "schedule.log"
        if not path.exists():
            return
        report = self._report(path)
        data = path.read_bytes()
        replayed = schedule_log.replay(data)
        report.facts.append(f"{replayed.records} records, {len(replayed.held)} held messages")
        problems = []
        if replayed.dropped:
            problems.append(f"{len(replayed.dropped)} damaged records: {', '.join(replayed.dropped[:5])}")
        if replayed.valid_bytes < len(data):
            tail = len(data) - replayed.valid_bytes
            problems.append(f"torn tail of {tail} bytes after byte {replayed.valid_bytes}")
        if problems and self.repair:
            tmp = path.with_suffix(".tmp")
            write_new(tmp, replayed.compacted).close()
            install(tmp, path)
            report.repaired.append(f"rewritten compacted ({'; '.join(problems)})")
        else:
            report.problems.extend(problems)

    def _registry(self, store_topics: set[str]) -> None:
        path = self.root / "registry.db"
        if not path.exists():
            if store_topics:
                self._report(path).facts.append(
                    "absent: the registry is a database elsewhere (registry = URL), or it was lost"
                )
            return
        report = self._report(path)
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
                tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                names = (
                    {r[0] for r in db.execute("SELECT name FROM mqgate_topics")}
                    if "mqgate_topics" in tables
                    else set()
                )
        except sqlite3.DatabaseError as exc:
            report.problems.append(f"not a readable SQLite database: {exc}")
            return
        report.facts.append(f"{len(names)} topics")
        if integrity != "ok":
            report.problems.append(f"integrity check: {integrity}")
        if not names and store_topics:
            report.problems.append(
                f"empty while the data directory holds {len(store_topics)} topics: "
                "the gateway refuses to start"
            )
        missing = sorted(names - store_topics)
        if missing:
            report.facts.append(
                f"registered without store files yet (made at start-up): {', '.join(missing[:10])}"
            )

    def _temporary_files(self) -> None:
        for path in sorted(self.root.rglob("*.tmp")):
            report = self._report(path)
            if self.repair:
                path.unlink()
                report.repaired.append("left by an interrupted write: removed")
            else:
                report.problems.append("left by an interrupted write (removed by --repair)")


def _base(segment: Path) -> int:
    """A segment's base offset, from its log's or its index's name."""
    return int(segment.stem)


def _agrees(checkpoint: tuple[int, int, int], positions: list[int], end: int) -> bool:
    """The checkpoint still holds for its segment indexed thus: its end offset starts at its
    end byte."""
    _, cp_end, cp_pos = checkpoint
    i = cp_end - checkpoint[0]
    return 0 <= i <= len(positions) and (positions[i] if i < len(positions) else end) == cp_pos
