"""The tuning database, on real SQLite files.

Oracles: the records written (a reopened file must give them back unchanged), the minimum
computed by hand over the valid timings, and the files themselves (a foreign or damaged file
must be refused or its bad rows skipped, never crash a reader).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ember
from ember.core.target import Target
from ember.schedule.config import KernelConfig
from ember.tune.database import (Record, TuningDatabase, TuningDatabaseError,
                                 TuningDatabaseWarning, host_cpu_model, target_key,
                                 target_label)

AVX2 = Target.parse("x86_64-avx2")
TARGET = target_key(AVX2, cpu_model="Test CPU 9000")
OTHER_TARGET = target_key(AVX2.with_machine(threads=8), cpu_model="Test CPU 9000")
CONV = "0123456789abcdef0123456789abcdef"
GEMM = "fedcba9876543210fedcba9876543210"

EVERY_KIND = KernelConfig.of({"gemm0.tile": (4, 16, 64), "nest0.parallel": True,
                              "nest1.chunk": 8, "nest0.vectorize": "j", "partition": None,
                              "reduction0.partials": 0, "nest2.parallel": False})


def record(seconds: float | None, workload: str = CONV, target: str = TARGET, *,
           valid: bool = True, error: str = "", created: float = 1000.0,
           **knobs: object) -> Record:
    return Record(workload, target, KernelConfig.of(knobs or {"nest0.chunk": 4}), seconds,
                  valid, error, kernel="Conv+Relu", created=created)


def test_records_round_trip_through_a_reopened_file(tmp_path: Path) -> None:
    path = tmp_path / "tuning.db"
    written = [
        Record(CONV, TARGET, EVERY_KIND, 1.25e-4, True, kernel="Conv+Relu"),
        Record(CONV, TARGET, KernelConfig(), None, False, error="timeout after 10 s"),
        Record(GEMM, OTHER_TARGET, KernelConfig.of({"gemm0.tile": (8, 8, 8)}), 3.0, False,
               error="mismatch: max abs error 0.5", kernel="MatMul"),
    ]
    with TuningDatabase(path) as db:
        db.add(written[0])
        db.add_many(written[1:])
    with TuningDatabase(path) as db:
        read = db.records()
        assert len(db) == 3
    assert read == written
    assert read[0].config.as_dict() == EVERY_KIND.as_dict()
    assert read[0].config.get("gemm0.tile") == (4, 16, 64)
    assert read[0].ember_version == ember.__version__
    assert read[1].seconds is None and read[1].valid is False


def test_records_filter_by_workload_and_target() -> None:
    with TuningDatabase(":memory:") as db:
        db.add_many([record(1.0), record(2.0, GEMM), record(3.0, CONV, OTHER_TARGET)])
        assert [r.seconds for r in db.records(CONV)] == [1.0, 3.0]
        assert [r.seconds for r in db.records(target_key=TARGET)] == [1.0, 2.0]
        assert [r.seconds for r in db.records(GEMM, OTHER_TARGET)] == []
        assert db.workloads() == sorted([CONV, GEMM])
        assert db.workloads(OTHER_TARGET) == [CONV]


def test_best_is_the_smallest_valid_time() -> None:
    with TuningDatabase(":memory:") as db:
        db.add_many([
            record(5e-4, **{"nest0.chunk": 1}),
            record(1e-4, valid=False, error="mismatch", **{"nest0.chunk": 2}),  # fast, wrong
            record(None, error="compile error", **{"nest0.chunk": 3}),
            record(2e-4, **{"nest0.chunk": 4}),
            record(3e-4, **{"nest0.chunk": 8}),
            record(1e-5, CONV, OTHER_TARGET, **{"nest0.chunk": 16}),
        ])
        best = db.best(CONV, TARGET)
        assert best is not None and best.seconds == 2e-4
        assert best.config == KernelConfig.of({"nest0.chunk": 4})
        assert db.best(GEMM, TARGET) is None


def test_best_of_only_failed_records_is_none() -> None:
    with TuningDatabase(":memory:") as db:
        db.add_many([record(None, error="crash"), record(1.0, valid=False, error="mismatch")])
        assert db.best(CONV, TARGET) is None
        assert db.best_configs(TARGET) == {}


def test_best_configs_ignores_other_targets() -> None:
    with TuningDatabase(":memory:") as db:
        db.add_many([
            record(2.0, CONV, **{"nest0.chunk": 2}), record(1.0, CONV, **{"nest0.chunk": 1}),
            record(4.0, GEMM, **{"gemm0.tile": (4, 4, 4)}),
            record(0.5, GEMM, OTHER_TARGET, **{"gemm0.tile": (8, 8, 8)}),
            record(0.1, "11" * 16, OTHER_TARGET),
        ])
        assert db.best_configs(TARGET) == {
            CONV: KernelConfig.of({"nest0.chunk": 1}),
            GEMM: KernelConfig.of({"gemm0.tile": (4, 4, 4)})}
        assert set(db.best_configs(OTHER_TARGET)) == {GEMM, "11" * 16}


def test_lookup_finds_exactly_the_config_and_the_latest_record() -> None:
    with TuningDatabase(":memory:") as db:
        db.add_many([record(1.0, created=1.0, **{"nest0.chunk": 4}),
                     record(2.0, created=2.0, **{"nest0.chunk": 4}),
                     record(3.0, created=3.0, **{"nest0.chunk": 4, "partition": False}),
                     record(4.0, GEMM, created=4.0, **{"nest0.chunk": 4})])
        found = db.lookup(CONV, TARGET, KernelConfig.of({"nest0.chunk": 4}))
        assert found is not None and found.seconds == 2.0
        both = KernelConfig.of({"partition": False, "nest0.chunk": 4})  # order is irrelevant
        assert db.lookup(CONV, TARGET, both).seconds == 3.0
        assert db.lookup(CONV, TARGET, KernelConfig.of({"nest0.chunk": 8})) is None
        assert db.lookup(CONV, OTHER_TARGET, KernelConfig.of({"nest0.chunk": 4})) is None


def test_merge_adds_only_new_records_and_is_idempotent(tmp_path: Path) -> None:
    mine, theirs = tmp_path / "mine.db", tmp_path / "theirs.db"
    shared = [record(1.0, created=10.0), record(None, error="crash", created=11.0,
                                                **{"nest0.chunk": 8})]
    with TuningDatabase(mine) as db:
        db.add_many(shared)
    with TuningDatabase(theirs) as db:
        db.add_many([*shared, record(1.0, created=12.0),  # the same config measured again
                     record(0.5, GEMM, created=10.0)])
    with TuningDatabase(mine) as db:
        assert db.merge(theirs) == 2
        assert len(db) == 4
        assert db.merge(str(theirs)) == 0
        with TuningDatabase(theirs) as other:
            assert db.merge(other) == 0
        assert db.merge(mine) == 0
    with TuningDatabase(theirs) as db:
        assert db.merge(mine) == 0
    with TuningDatabase(mine) as db:
        assert sorted((r.workload_key, r.created) for r in db.records()) == sorted(
            [(CONV, 10.0), (CONV, 11.0), (CONV, 12.0), (GEMM, 10.0)])
        with pytest.raises(TuningDatabaseError, match="no such file"):
            db.merge(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()


def test_export_best_keeps_one_record_per_workload_and_target(tmp_path: Path) -> None:
    out = tmp_path / "best.db"
    with TuningDatabase(tmp_path / "all.db") as db:
        db.add_many([record(3.0, **{"nest0.chunk": 1}), record(1.0, **{"nest0.chunk": 2}),
                     record(0.1, valid=False, error="mismatch", **{"nest0.chunk": 8}),
                     record(2.0, GEMM), record(None, GEMM, error="timeout", **{"nest0.chunk": 8}),
                     record(5.0, CONV, OTHER_TARGET), record(None, "22" * 16, error="crash")])
        assert db.export_best(out) == 3
        with TuningDatabase(out) as best:
            kept = {(r.workload_key, r.target_key): r.seconds for r in best.records()}
        assert kept == {(CONV, TARGET): 1.0, (GEMM, TARGET): 2.0, (CONV, OTHER_TARGET): 5.0}
        db.add(record(0.5, **{"nest0.chunk": 4}))
        with pytest.raises(TuningDatabaseError, match="overwrite"):
            db.export_best(out)
        with TuningDatabase(out) as best:
            assert len(best) == 3  # untouched by the refused export
        assert db.export_best(out, overwrite=True) == 3
        with TuningDatabase(out) as best:
            assert best.best(CONV, TARGET).seconds == 0.5
        with pytest.raises(TuningDatabaseError):
            db.export_best(tmp_path / "all.db", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.db", "best.db"]


def test_a_file_that_is_not_sqlite_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are not the records you are looking for\n" * 20)
    with pytest.raises(TuningDatabaseError, match="cannot be read as an SQLite") as info:
        TuningDatabase(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, ember.EmberError)


def test_a_foreign_sqlite_database_is_refused_and_left_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
        conn.execute("CREATE TABLE meta (key TEXT, value TEXT)")
    conn.close()
    with pytest.raises(TuningDatabaseError, match="not an ember tuning database") as info:
        TuningDatabase(path)
    assert str(path) in str(info.value)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert conn.execute("SELECT COUNT(*) FROM meta").fetchone()[0] == 0
    conn.close()


def test_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    with TuningDatabase(path) as db:
        db.add(record(1.0))
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.close()
    with pytest.raises(TuningDatabaseError, match="newer ember.*upgrade ember"):
        TuningDatabase(path)


def test_undecodable_rows_are_skipped_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "damaged.db"
    with TuningDatabase(path) as db:
        db.add_many([record(1.0, **{"nest0.chunk": 1}), record(0.5, **{"nest0.chunk": 2}),
                     record(0.2, **{"nest0.chunk": 4}), record(0.1, **{"nest0.chunk": 8})])
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE records SET config = '{\"nest0.chunk\": ' WHERE id = 2")
        conn.execute("UPDATE records SET seconds = 'fast' WHERE id = 3")
        conn.execute("UPDATE records SET config = '{\"a\": [[1]]}' WHERE id = 4")
    conn.close()
    with TuningDatabase(path) as db:
        with pytest.warns(TuningDatabaseWarning) as caught:
            rows = db.records()
        assert [r.seconds for r in rows] == [1.0]
        messages = " ".join(str(w.message) for w in caught)
        assert all(f"record {i} skipped" in messages for i in (2, 3, 4))
        with pytest.warns(TuningDatabaseWarning) as caught:
            assert db.best(CONV, TARGET).seconds == 1.0
        assert any("record 4 skipped" in str(w.message) for w in caught)
        with pytest.warns(TuningDatabaseWarning):
            assert db.best_configs(TARGET) == {CONV: KernelConfig.of({"nest0.chunk": 1})}


def test_records_of_the_wrong_types_are_refused() -> None:
    with pytest.raises(ValueError):
        record(-1.0)
    with pytest.raises(TypeError):
        Record(CONV, TARGET, {"nest0.chunk": 4}, 1.0, True)  # type: ignore[arg-type]
    with TuningDatabase(":memory:") as db, pytest.raises(TypeError):
        db.add("not a record")  # type: ignore[arg-type]


def test_two_objects_on_one_file_see_each_others_writes(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    with TuningDatabase(path) as writer, TuningDatabase(path) as reader:
        assert len(reader) == 0
        writer.add(record(1.0))
        assert reader.records() == writer.records() and len(reader) == 1
        reader.add(record(0.5, GEMM))
        assert writer.best_configs(TARGET) == {CONV: KernelConfig.of({"nest0.chunk": 4}),
                                               GEMM: KernelConfig.of({"nest0.chunk": 4})}


def test_two_processes_write_one_file(tmp_path: Path) -> None:
    path = tmp_path / "parallel.db"
    script = textwrap.dedent(f"""
        import sys
        from ember.schedule.config import KernelConfig
        from ember.tune.database import Record, TuningDatabase
        with TuningDatabase({str(path)!r}) as db:
            for i in range(40):
                db.add(Record(sys.argv[1] * 32, "t", KernelConfig.of({{"n": i}}), 1.0, True))
    """)
    workers = [subprocess.Popen([sys.executable, "-c", script, name]) for name in "ab"]
    assert [w.wait(timeout=120) for w in workers] == [0, 0]
    with TuningDatabase(path) as db:
        assert len(db) == 80 and db.workloads() == ["a" * 32, "b" * 32]


def test_target_key_is_stable_and_names_the_machine() -> None:
    assert target_key(AVX2, "cpu") == target_key(Target.parse("x86_64-avx2"), "cpu")
    different = [Target.parse("x86_64-avx2+avx512_vnni"), Target.parse("x86_64-avx512"),
                 AVX2.with_machine(l2_bytes=2 << 20), AVX2.with_machine(l1d_bytes=48 << 10),
                 AVX2.with_machine(threads=4)]
    keys = {target_key(t, "cpu") for t in [AVX2, *different]}
    assert len(keys) == len(different) + 1
    assert target_key(AVX2, "cpu") != target_key(AVX2, "another cpu")
    assert target_key(AVX2) == target_key(AVX2, host_cpu_model())
    assert host_cpu_model()
    label = target_label(target_key(Target.parse("x86_64-avx512"), "AMD EPYC 9R14"))
    assert label == "AMD EPYC 9R14, x86_64 avx512, 2 threads"
    assert target_label("not json") == "not json"


def test_a_config_that_ever_failed_never_wins(tmp_path: Path) -> None:
    with TuningDatabase(tmp_path / "t.db") as db:
        db.add_many([record(1.0, **{"nest0.chunk": 1}), record(0.5, **{"nest0.chunk": 2}),
                     record(None, valid=False, error="run: hung", **{"nest0.chunk": 2})])
        assert db.best(CONV, TARGET).config.get("nest0.chunk") == 1
        assert db.best_configs(TARGET)[CONV].get("nest0.chunk") == 1


def test_confirmed_configs_are_judged_by_their_median(tmp_path: Path) -> None:
    """A finalist measured three times (median 2.0) beats a config with one lucky sample
    (1.5) and a config whose single best sample (1.0) hides a slow median (3.0)."""
    with TuningDatabase(tmp_path / "t.db") as db:
        db.add_many([record(s, **{"nest0.chunk": 1}) for s in (2.0, 2.1, 1.9)] +
                    [record(s, **{"nest0.chunk": 2}) for s in (1.0, 3.0, 3.2)] +
                    [record(1.5, **{"nest0.chunk": 3})])
        best = db.best(CONV, TARGET)
        assert best.config.get("nest0.chunk") == 1 and best.seconds == 1.9
