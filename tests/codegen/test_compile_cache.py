"""The compile cache never loads an entry it cannot verify.

A library in the cache is loaded into the process (its constructors run), so a truncated file,
another entry's library, a foreign library, a directory, a symlink or a FIFO in an entry's slot
must be reported, discarded and rebuilt -- never loaded.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import uuid
import warnings

import pytest

from ember.core.target import Target
from ember.toolchain import CacheWarning, CompileCache, compile_shared, stats
from ember.toolchain.cache import DIGEST_SUFFIX

EXPORT = '__attribute__((visibility("default")))'


def _source(answer: int, extra: str = "") -> str:
    return f"/* {uuid.uuid4()} */\n{EXPORT} int ember_answer(void) {{ return {answer}; }}\n{extra}"


def _foreign_library(tmp_path, marker) -> str:
    """A library whose constructor leaves a marker file: if it is ever loaded, we know."""
    constructor = (f'#include <stdio.h>\n__attribute__((constructor)) static void mark(void) '
                   f'{{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    return compile_shared(_source(7, constructor), Target.native(), use_cache=False)


@pytest.fixture()
def cache(tmp_path) -> CompileCache:
    return CompileCache(tmp_path / "cache")


def _compile(source: str, cache: CompileCache):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiles = stats.compiles
        path = compile_shared(source, Target.native(), cache=cache)
    rebuilt = stats.compiles - compiles
    reported = [w for w in caught if issubclass(w.category, CacheWarning)]
    return path, rebuilt, reported


def _check_rebuilt(source: str, cache: CompileCache, marker=None) -> None:
    path, rebuilt, reported = _compile(source, cache)
    assert rebuilt == 1, "a broken entry must be rebuilt"
    assert len(reported) == 1 and str(path) in str(reported[0].message)
    assert ctypes.CDLL(str(path)).ember_answer() == 42
    if marker is not None:
        assert not marker.exists(), "the foreign library was loaded"
    # and the rebuilt entry verifies again: the next compile is a silent hit
    again, rebuilt, reported = _compile(source, cache)
    assert again == path and rebuilt == 0 and not reported


def test_a_verified_entry_is_a_silent_hit(cache):
    source = _source(42)
    first, rebuilt, reported = _compile(source, cache)
    assert rebuilt == 1 and not reported
    assert (first.parent / (first.name + DIGEST_SUFFIX)).is_file()
    second, rebuilt, reported = _compile(source, cache)
    assert second == first and rebuilt == 0 and not reported


def test_truncated_library_is_rebuilt(cache):
    source = _source(42)
    path, _, _ = _compile(source, cache)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _check_rebuilt(source, cache)


def test_another_entrys_library_with_its_digest_is_rebuilt(cache):
    """Copying entry B (library and digest file) into A's slot does not verify: the digest
    is bound to the slot's key."""
    source_a, source_b = _source(42), _source(7)
    path_a, _, _ = _compile(source_a, cache)
    path_b, _, _ = _compile(source_b, cache)
    shutil.copyfile(path_b, path_a)
    shutil.copyfile(str(path_b) + DIGEST_SUFFIX, str(path_a) + DIGEST_SUFFIX)
    _check_rebuilt(source_a, cache)


def test_foreign_library_is_never_loaded(cache, tmp_path):
    source = _source(42)
    path, _, _ = _compile(source, cache)
    marker = tmp_path / "constructor-ran"
    shutil.copyfile(_foreign_library(tmp_path, marker), path)
    _check_rebuilt(source, cache, marker)


def test_missing_digest_is_rebuilt(cache):
    source = _source(42)
    path, _, _ = _compile(source, cache)
    os.unlink(str(path) + DIGEST_SUFFIX)
    _check_rebuilt(source, cache)


def test_directory_in_the_slot_is_replaced(cache):
    source = _source(42)
    path, _, _ = _compile(source, cache)
    path.unlink()
    (path / "inside").mkdir(parents=True)
    _check_rebuilt(source, cache)


def test_symlink_in_the_slot_is_not_followed(cache, tmp_path):
    source = _source(42)
    path, _, _ = _compile(source, cache)
    marker = tmp_path / "constructor-ran"
    foreign = _foreign_library(tmp_path, marker)
    path.unlink()
    path.symlink_to(foreign)
    _check_rebuilt(source, cache, marker)
    assert foreign.exists(), "the symlink's target must not be removed"


def test_fifo_in_the_slot_does_not_hang(cache):
    source = _source(42)
    path, _, _ = _compile(source, cache)
    path.unlink()
    os.mkfifo(path)
    _check_rebuilt(source, cache)


def _unkeyed_digest(key: str, content_sha256: str) -> str:
    """The digest as anyone could compute it before the cache had a secret."""
    import hashlib

    return hashlib.sha256(f"ember-cache-entry\0{key}\0{content_sha256}".encode()).hexdigest()


@pytest.mark.parametrize("forged", ["unkeyed", "guessed secret"])
def test_a_planted_library_with_a_recomputed_digest_is_never_loaded(cache, tmp_path, forged):
    """Anyone who can write the cache could recompute the digest of an unkeyed scheme; with
    the cache's secret (0600, made with the cache) a planted library cannot verify."""
    from ember.toolchain.cache import entry_digest, file_sha256

    source = _source(42)
    path, _, _ = _compile(source, cache)
    marker = tmp_path / "planted-library-ran"
    planted = _foreign_library(tmp_path, marker)
    shutil.copyfile(planted, path)
    key = path.name[:-len(".so")]
    content = file_sha256(path)
    digest = _unkeyed_digest(key, content) if forged == "unkeyed" else \
        entry_digest(key, content, b"\0" * 32)
    path.with_name(path.name + DIGEST_SUFFIX).write_text(digest + "\n")
    rebuilt_path, rebuilt, reported = _compile(source, cache)
    assert rebuilt == 1
    assert len(reported) == (1 if forged == "guessed secret" else 0)  # unkeyed: an old entry
    assert ctypes.CDLL(str(rebuilt_path)).ember_answer() == 42
    assert not marker.exists(), "the planted library was loaded"


def test_an_entry_of_another_cache_does_not_verify(tmp_path):
    first, second = CompileCache(tmp_path / "a"), CompileCache(tmp_path / "b")
    source = _source(42)
    path, _, _ = _compile(source, first)
    target = second.path(path.name[:-len(".so")], ".so")
    second.secret  # noqa: B018 -- makes the directory and its own secret
    shutil.copyfile(path, target)
    shutil.copyfile(str(path) + DIGEST_SUFFIX, str(target) + DIGEST_SUFFIX)
    _, rebuilt, reported = _compile(source, second)
    assert rebuilt == 1 and len(reported) == 1


def test_the_secret_is_private_and_a_shared_directory_is_refused(tmp_path):
    from ember.toolchain import ToolchainError
    from ember.toolchain.cache import SECRET_FILE

    cache = CompileCache(tmp_path / "private")
    _compile(_source(42), cache)
    secret = tmp_path / "private" / SECRET_FILE
    assert oct(secret.stat().st_mode & 0o777) == "0o600" and secret.stat().st_size == 32
    secret.chmod(0o644)  # readable by others: the secret is no longer one
    with pytest.raises(ToolchainError, match="not a private file"):
        compile_shared(_source(42), Target.native(), cache=CompileCache(tmp_path / "private"))
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ToolchainError, match="may be written by other users"):
        compile_shared(_source(42), Target.native(), cache=CompileCache(shared))
