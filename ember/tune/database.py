"""The tuning database: every schedule config the auto-tuner measured, in one SQLite file.

A record says how fast one :class:`~ember.schedule.config.KernelConfig` ran for one kernel
(its workload key, :mod:`ember.schedule.workload`) on one machine (its *target key*, see
:func:`target_key`), or why it failed.  The tuner asks :meth:`TuningDatabase.lookup` before
measuring, so an interrupted run resumes where it stopped; builds ask
:meth:`TuningDatabase.best_configs` for the fastest valid config of each kernel.  Records of
another target key are never applied: a config tuned for one machine's caches and threads is
only a guess on another.

The file is shared and untrusted.  It uses WAL journaling and a busy timeout so that several
tuning processes can write it at once, files are exchanged with :meth:`TuningDatabase.merge`
and :meth:`TuningDatabase.export_best`, and a row that does not decode (a config that is not
a config, a field of the wrong type) is skipped with a :class:`TuningDatabaseWarning` instead
of failing a build.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import sqlite3
import statistics
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from ember import __version__
from ember.core.errors import EmberError
from ember.core.target import Target
from ember.schedule.config import KernelConfig, ScheduleConfigError

SCHEMA_VERSION = 1
FORMAT_MARKER = "ember tuning database"
# A config measured this many times is "confirmed" (see TuningDatabase._best).
CONFIRMED_SAMPLES = 3
_COLUMNS = ("workload_key", "target_key", "config", "seconds", "valid", "error", "kernel",
            "ember_version", "created")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT, workload_key TEXT NOT NULL,
    target_key TEXT NOT NULL, config TEXT NOT NULL, seconds REAL, valid INTEGER NOT NULL,
    error TEXT NOT NULL, kernel TEXT NOT NULL, ember_version TEXT NOT NULL,
    created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS records_by_kernel ON records (workload_key, target_key, config)
"""
# The tuner's verdicts: the config it chose for a workload after confirming its finalists
# against the default (the default itself where none beat it by enough).  Where a workload
# has one, it is what best_configs() applies; the records' medians decide only without one.
_DECISIONS = """
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, workload_key TEXT NOT NULL,
    target_key TEXT NOT NULL, config TEXT NOT NULL, ember_version TEXT NOT NULL,
    decided REAL NOT NULL)
"""


class TuningDatabaseError(EmberError, ValueError):
    """A file that cannot be used as a tuning database (not SQLite, another program's
    database, a newer schema) or an export that would overwrite a file."""


class TuningDatabaseWarning(UserWarning):
    """A row of a tuning database was skipped because it does not decode."""


@functools.lru_cache(maxsize=1)
def host_cpu_model() -> str:
    """The host CPU's model name: two machines of one ISA level differ in caches, ports and
    clocks, so the best config of one is only a guess for the other."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip().lower() == "model name" and value.strip():
                    return " ".join(value.split())
    except OSError:  # not Linux
        pass
    return " ".join(platform.processor().split()) or "unknown"


def _median_seconds(records: list[Record]) -> float:
    return float(statistics.median(r.seconds for r in records))


def target_key(target: Target, cpu_model: str | None = None) -> str:
    """The canonical JSON text naming the machine a record was measured on: the CPU model,
    the instruction set and the memory hierarchy and threads the schedule was built for."""
    data = {"cpu": host_cpu_model() if cpu_model is None else cpu_model,
            "kind": target.kind, "march": list(target.march), "arch": target.arch,
            "vector_bits": target.vector_bits,
            "features": sorted(target.features), "machine": target.machine_dict()}
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def target_label(key: str) -> str:
    """A short human form of a target key, e.g. ``AMD EPYC 9R14, x86_64 avx512, 2 threads``
    (the key itself where it is not one: labels are for reports, never for matching)."""
    try:
        data = json.loads(key)
        features = set(data["features"])
        level = next((name for feature, name in (
            ("avx512f", "avx512"), ("avx2", "avx2"), ("sve", "sve"), ("neon", "neon"),
            ("simd128", "simd128")) if feature in features), f"{data['vector_bits']}-bit")
        return f"{data['cpu']}, {data['arch']} {level}, {data['machine']['threads']} threads"
    except (ValueError, TypeError, KeyError):
        return key


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value)


@dataclass(frozen=True)
class Record:
    """One measurement: ``seconds`` is the kernel's median time (None when it failed),
    ``valid`` whether its output matched the oracle, ``error`` why it failed."""

    workload_key: str
    target_key: str
    config: KernelConfig
    seconds: float | None
    valid: bool
    error: str = ""
    kernel: str = ""
    ember_version: str = __version__
    created: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        # Checked here so that a row of a file decodes through the same gate as a new record.
        for name in ("workload_key", "target_key", "error", "kernel", "ember_version"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a string, got {getattr(self, name)!r}")
        if not isinstance(self.config, KernelConfig):
            raise TypeError(f"config must be a KernelConfig, got {self.config!r}")
        if self.seconds is not None:
            if not _is_number(self.seconds) or self.seconds < 0:
                raise ValueError(f"seconds must be a finite non-negative number or None, "
                                 f"got {self.seconds!r}")
            object.__setattr__(self, "seconds", float(self.seconds))
        if not isinstance(self.valid, bool):
            raise TypeError(f"valid must be a bool, got {self.valid!r}")
        if not _is_number(self.created):
            raise ValueError(f"created must be a finite number, got {self.created!r}")
        object.__setattr__(self, "created", float(self.created))

    def identity(self) -> tuple[Any, ...]:
        """What makes two records the same measurement (merging skips a record it has)."""
        return (self.workload_key, self.target_key, self.config.to_json(), self.seconds,
                self.valid, self.error, self.created)


class TuningDatabase:
    """A tuning database file (or ``":memory:"``), created with its schema when new."""

    def __init__(self, path: str | Path, timeout: float = 30.0):
        self.path = str(path)
        self._conn: sqlite3.Connection | None = None
        try:
            # isolation_level=None: transactions are begun explicitly (BEGIN IMMEDIATE), so
            # that a writer waits for the lock up front instead of failing mid-transaction.
            self._conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
            if not self._objects():
                with self._write():
                    if not self._objects():  # another process may have created it meanwhile
                        for statement in _SCHEMA.split(";"):  # (executescript commits)
                            self._conn.execute(statement)
                        self._conn.executemany(
                            "INSERT OR IGNORE INTO meta VALUES (?, ?)",
                            [("format", FORMAT_MARKER), ("schema_version", str(SCHEMA_VERSION))])
            self._check_schema()
            if self.path != ":memory:":  # only now: never change another program's file
                self._conn.execute("PRAGMA journal_mode=WAL")
            if "decisions" not in self._objects():
                with self._write():
                    self._conn.execute(_DECISIONS)
        except sqlite3.Error as error:
            self.close()
            raise TuningDatabaseError(
                f"{self.path} cannot be read as an SQLite database ({error}); pass the path "
                f"of an ember tuning database, or a new file name to start one") from None
        except BaseException:
            self.close()
            raise

    def _objects(self) -> list[str]:
        return [row[0] for row in self._conn.execute("SELECT name FROM sqlite_master")]

    def _check_schema(self) -> None:
        try:
            meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.OperationalError:  # no meta table, or one of other columns
            meta = {}
        if meta.get("format") != FORMAT_MARKER:
            raise TuningDatabaseError(
                f"{self.path} is an SQLite database but not an ember tuning database "
                f"(it holds {', '.join(sorted(self._objects())) or 'nothing'}); pass a tuning "
                f"database, or a new file name to start one")
        version = str(meta.get("schema_version", ""))
        if not version.isdigit():
            raise TuningDatabaseError(f"{self.path}: the tuning database has no valid schema "
                                      f"version ({version!r}); it is damaged, start a new file")
        if int(version) > SCHEMA_VERSION:
            raise TuningDatabaseError(
                f"{self.path} was written by a newer ember (tuning database schema {version}; "
                f"this ember reads up to {SCHEMA_VERSION}): upgrade ember, or use another file")
        columns = {row[1] for row in self._conn.execute("PRAGMA table_info(records)")}
        if not set(_COLUMNS) <= columns:
            raise TuningDatabaseError(f"{self.path}: the tuning database's records table lacks "
                                      f"{sorted(set(_COLUMNS) - columns)}; it is damaged, start "
                                      f"a new file")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taking the file's write lock at once (waiting out other
        writers for up to the busy timeout)."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    # ------------------------------------------------------------------ writing
    def add(self, record: Record) -> None:
        self.add_many([record])

    def add_many(self, records: Iterable[Record]) -> None:
        """Adds all of ``records`` in one transaction (all or none)."""
        rows = [self._encode(r) for r in records]
        with self._write() as conn:
            conn.executemany(f"INSERT INTO records ({', '.join(_COLUMNS)}) "
                             f"VALUES ({', '.join('?' * len(_COLUMNS))})", rows)

    @staticmethod
    def _encode(record: Record) -> tuple[Any, ...]:
        if not isinstance(record, Record):
            raise TypeError(f"a tuning database holds Records, got {record!r}")
        return (record.workload_key, record.target_key, record.config.to_json(),
                record.seconds, int(record.valid), record.error, record.kernel,
                record.ember_version, record.created)

    # ------------------------------------------------------------------ reading
    def _select(self, where: str = "", params: Iterable[Any] = (),
                order: str = "id") -> Iterator[Record]:
        """The decodable records of a query; a row that is not one is skipped with a
        warning (the file is untrusted input)."""
        sql = (f"SELECT id, {', '.join(_COLUMNS)} FROM records"
               f"{' WHERE ' + where if where else ''} ORDER BY {order}")
        for row in self._conn.execute(sql, tuple(params)).fetchall():
            record = self._decode(row)
            if record is not None:
                yield record

    def _decode(self, row: tuple[Any, ...]) -> Record | None:
        rowid, workload, target, config, seconds, valid, error, kernel, version, created = row
        try:
            if not isinstance(config, str):
                raise TypeError(f"config must be JSON text, got {type(config).__name__}")
            if type(valid) is not int or valid not in (0, 1):
                raise TypeError(f"valid must be 0 or 1, got {valid!r}")
            return Record(workload, target, KernelConfig.from_json(config), seconds,
                          bool(valid), error, kernel, version, created)
        except (ScheduleConfigError, TypeError, ValueError, RecursionError) as why:
            warnings.warn(f"{self.path}: tuning record {rowid} skipped: {why}",
                          TuningDatabaseWarning, stacklevel=2)
            return None

    def lookup(self, workload_key: str, target_key: str,
               config: KernelConfig) -> Record | None:
        """The latest record of exactly ``config`` (the tuner's check that it was measured)."""
        return next(self._select("workload_key = ? AND target_key = ? AND config = ?",
                                 (workload_key, target_key, config.to_json()),
                                 order="created DESC, id DESC"), None)

    def records(self, workload_key: str | None = None,
                target_key: str | None = None) -> list[Record]:
        """All records, or those of one workload and/or target, in the order they were added."""
        filters = {"workload_key": workload_key, "target_key": target_key}
        used = {k: v for k, v in filters.items() if v is not None}
        return list(self._select(" AND ".join(f"{k} = ?" for k in used), used.values()))

    def _best(self, where: str, params: Iterable[Any]) -> dict[tuple[str, str], Record]:
        """The best config of each (workload, target) the query selects, as its fastest
        record.

        Times are noisy, so a config is judged by the median of its records, and where some
        config of a workload was confirmed (measured ``CONFIRMED_SAMPLES`` times or more, as
        the tuner does with its finalists and the default), only confirmed configs compete:
        one lucky sample does not beat a finalist's median.  A config with any record that
        failed or mismatched never wins."""
        samples: dict[tuple[str, str], dict[str, list[Record]]] = {}
        refused: set[tuple[str, str, str]] = set()
        for record in self._select(f"1 = 1{where}", params, order="id"):
            config = record.config.to_json()
            if not record.valid or record.seconds is None:
                refused.add((record.workload_key, record.target_key, config))
                continue
            samples.setdefault((record.workload_key, record.target_key), {}) \
                .setdefault(config, []).append(record)
        best: dict[tuple[str, str], Record] = {}
        for key, by_config in samples.items():
            contenders = {config: records for config, records in by_config.items()
                          if (*key, config) not in refused}
            confirmed = {c: r for c, r in contenders.items() if len(r) >= CONFIRMED_SAMPLES}
            pool = confirmed or contenders
            if pool:
                records = min(pool.values(), key=_median_seconds)
                best[key] = min(records, key=lambda r: r.seconds)
        return best

    def best(self, workload_key: str, target_key: str) -> Record | None:
        """The valid record with the smallest time (failed and mismatching ones never win)."""
        return self._best(" AND workload_key = ? AND target_key = ?",
                          (workload_key, target_key)).get((workload_key, target_key))

    def best_configs(self, target_key: str) -> dict[str, KernelConfig]:
        """Workload key -> the config to build it with on the target: the tuner's latest
        decision where there is one, else the best config by its records (``best``)."""
        best = {workload: record.config for (workload, _), record in
                self._best(" AND target_key = ?", (target_key,)).items()}
        best.update(self._decisions(target_key))
        return dict(sorted(best.items()))

    # ------------------------------------------------------------------ decisions
    def decide(self, workload_key: str, target_key: str, config: KernelConfig) -> None:
        """Record the tuner's verdict for a workload on a target (the latest one counts)."""
        with self._write() as conn:
            conn.execute("INSERT INTO decisions (workload_key, target_key, config, "
                         "ember_version, decided) VALUES (?, ?, ?, ?, ?)",
                         (workload_key, target_key, config.to_json(), __version__,
                          time.time()))

    def decision(self, workload_key: str, target_key: str) -> KernelConfig | None:
        """The latest verdict for the workload on the target, if the tuner gave one."""
        return self._decisions(target_key, workload_key).get(workload_key)

    def _decisions(self, target_key: str, workload_key: str | None = None
                   ) -> dict[str, KernelConfig]:
        where, params = "target_key = ?", [target_key]
        if workload_key is not None:
            where, params = where + " AND workload_key = ?", params + [workload_key]
        found: dict[str, KernelConfig] = {}
        for rowid, workload, config in self._conn.execute(
                f"SELECT id, workload_key, config FROM decisions WHERE {where} "
                f"ORDER BY decided, id", params).fetchall():
            try:
                if not isinstance(workload, str) or not isinstance(config, str):
                    raise TypeError("workload and config must be text")
                found[workload] = KernelConfig.from_json(config)
            except (ScheduleConfigError, TypeError, ValueError, RecursionError) as why:
                warnings.warn(f"{self.path}: tuning decision {rowid} skipped: {why}",
                              TuningDatabaseWarning, stacklevel=3)
        return found

    def _decision_rows(self) -> list[tuple[Any, ...]]:
        return self._conn.execute("SELECT workload_key, target_key, config, ember_version, "
                                  "decided FROM decisions").fetchall()

    def workloads(self, target_key: str | None = None) -> list[str]:
        """The workload keys with any record (on ``target_key`` when given), sorted."""
        where = " AND target_key = ?" if target_key is not None else ""
        rows = self._conn.execute(
            f"SELECT DISTINCT workload_key FROM records WHERE typeof(workload_key) = 'text'"
            f"{where} ORDER BY workload_key", () if target_key is None else (target_key,))
        return [row[0] for row in rows]

    # ------------------------------------------------------------------ exchange
    def merge(self, other: "TuningDatabase | str | Path") -> int:
        """Adds ``other``'s records this database does not hold; returns how many (merging
        the same file twice adds nothing)."""
        if not isinstance(other, TuningDatabase):
            if str(other) != ":memory:" and not Path(other).is_file():
                raise TuningDatabaseError(f"cannot merge {other}: no such file")
            with TuningDatabase(other) as opened:
                return self.merge(opened)
        incoming = other.records()
        with self._write() as conn:  # the lock first: a concurrent merge cannot double rows
            have = {row for row in conn.execute(
                "SELECT workload_key, target_key, config, seconds, valid, error, created "
                "FROM records")}
            new = []
            for record in incoming:
                if record.identity() not in have:
                    have.add(record.identity())
                    new.append(self._encode(record))
            conn.executemany(f"INSERT INTO records ({', '.join(_COLUMNS)}) "
                             f"VALUES ({', '.join('?' * len(_COLUMNS))})", new)
            decided = set(self._decision_rows())
            conn.executemany("INSERT INTO decisions (workload_key, target_key, config, "
                             "ember_version, decided) VALUES (?, ?, ?, ?, ?)",
                             [row for row in other._decision_rows() if row not in decided])
        return len(new)

    def export_best(self, path: str | Path, overwrite: bool = False) -> int:
        """Writes a new database of only the best valid record of each (workload, target)
        and the latest decisions, the small file a deployment ships; returns how many
        records it holds."""
        path = Path(path)
        if path.exists() and not overwrite:
            raise TuningDatabaseError(f"{path} exists; pass overwrite=True (--overwrite) to "
                                      f"replace it, or choose another file name")
        if self.path != ":memory:" and path.exists() and path.samefile(self.path):
            raise TuningDatabaseError(f"cannot export {self.path} onto itself")
        best = self._best("", ())
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.unlink(missing_ok=True)
        try:
            with TuningDatabase(partial) as out:
                out.add_many(best[key] for key in sorted(best))
                for workload, target in sorted({key for key in best} |
                                               {(r[0], r[1]) for r in self._decision_rows()}):
                    config = self._decisions(target, workload).get(workload)
                    if config is not None:
                        out.decide(workload, target, config)
            for suffix in ("-wal", "-shm"):  # an old file's journal must not meet the new one
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            os.replace(partial, path)  # readers see the old file or the whole new one
        finally:
            for leftover in ("", "-wal", "-shm"):
                Path(f"{partial}{leftover}").unlink(missing_ok=True)
        return len(best)

    # ------------------------------------------------------------------ lifetime
    def __len__(self) -> int:
        """The number of stored rows (undecodable ones included)."""
        return self._conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]

    def close(self) -> None:
        if self._conn is not None:  # (later use raises sqlite3.ProgrammingError)
            self._conn.close()

    def __enter__(self) -> "TuningDatabase":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TuningDatabase({self.path!r})"
