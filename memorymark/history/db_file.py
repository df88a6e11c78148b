"""Where the history database lives, and opening it safely: the file, not what is in it.

Owns the per-user default path (`MEMORYMARK_DB` overrides it), the connection settings that let
several processes write at once (WAL journal, a busy timeout, explicit `BEGIN IMMEDIATE`
transactions), the schema version with its forward migrations, and what happens to a damaged
file: it is moved aside under a `.corrupt-<time>` name with one warning and a new database is
started, never overwritten in place. Must not know what a run or a report is (memorymark/
history.py does). Stdlib only: no torch.

Why these choices:
- The default path follows each platform's place for a user's own data (kept across upgrades,
  not wiped like a cache): `$XDG_DATA_HOME` (default `~/.local/share`) on Linux and other Unixes
  (XDG Base Directory specification), `~/Library/Application Support` on macOS (Apple's File
  System Programming Guide), `%LOCALAPPDATA%` on Windows (Known Folders).
- WAL lets readers run while one process writes, and `busy_timeout` makes a writer wait for the
  lock instead of failing at once (sqlite.org/wal.html, sqlite.org/pragma.html#pragma_busy_timeout).
  `BEGIN IMMEDIATE` takes the write lock when the transaction starts, so two writers never both
  read and then deadlock upgrading (sqlite.org/lang_transaction.html). WAL needs shared memory,
  so the file must not be on a network filesystem (sqlite.org/wal.html, "Disadvantages").
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from memorymark.environment import utc_now

DB_ENV = "MEMORYMARK_DB"
"""Environment variable: the history database's path, instead of the per-user default."""
FILE_NAME = "history.sqlite3"
BUSY_TIMEOUT_MS = 30_000
"""How long a writer waits for another's lock: a save holds it for milliseconds, so 30 s is
only reached by a stuck process."""
# SQLite's result codes for a damaged file, and one that is not a database at all
# (sqlite.org/rescode.html: SQLITE_CORRUPT, SQLITE_NOTADB).
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26
_CHECKED: set[Path] = set()
"""Files whose integrity this process already checked (the check reads every page once)."""


class HistoryError(Exception):
    """The history database cannot be used; the message is one line."""


class _Damaged(Exception):
    """The file exists but is not a readable database: it is to be moved aside."""


def default_path() -> Path:
    """The per-user database path for this platform (see the module docstring for why)."""
    home = Path.home()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or home / "AppData" / "Local") / "MemoryMark"
    elif sys.platform == "darwin":
        base = home / "Library" / "Application Support" / "MemoryMark"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share") / "memorymark"
    return base / FILE_NAME


def db_path() -> Path:
    """`MEMORYMARK_DB` when set, else the per-user default."""
    chosen = os.environ.get(DB_ENV, "").strip()
    return Path(chosen).expanduser() if chosen else default_path()


Migration = Sequence[str]
"""One schema step: SQL statements run in one transaction."""


def connect(
    path: Path, migrations: Sequence[Migration], warn: Callable[[str], None]
) -> sqlite3.Connection:
    """An open, migrated connection to `path` (created when missing). A damaged file is moved
    aside with one `warn(message)` and a new one started; a file that cannot be used for
    another reason (a folder, a newer schema, another program's database) raises HistoryError."""
    if path.exists() and not path.is_file():
        raise HistoryError(f"history database {path} is not a regular file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HistoryError(f"cannot create the folder for {path}: {exc.strerror}") from None
    try:
        return _open(path, migrations)
    except _Damaged:
        pass
    with _recovery_lock(path):
        try:  # another process may have moved it aside and started a new one meanwhile
            return _open(path, migrations)
        except _Damaged as exc:
            moved = _move_aside(path)
            warn(
                f"history database {path} could not be read ({exc}); moved it to {moved.name} "
                "and started a new one"
            )
        return _open(path, migrations)


def connect_private(migrations: Sequence[Migration]) -> sqlite3.Connection:
    """A migrated database of this process's memory, gone when the connection is: a hosted
    visitor's own history, with no file on the server. Its owner may use it from the threads
    that take turns running its page (never two at once), so the same-thread check is off."""
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA foreign_keys = ON")
    _migrate(conn, Path(":memory:"), migrations)
    return conn


def _open(path: Path, migrations: Sequence[Migration]) -> sqlite3.Connection:
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise _Damaged("no permission to read and write it")
    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    except sqlite3.Error as exc:
        raise HistoryError(f"cannot open history database {path}: {exc}") from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _check(conn, path)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA foreign_keys = ON")
        _migrate(conn, path, migrations)
    except BaseException as exc:
        conn.close()
        if isinstance(exc, sqlite3.DatabaseError) and _is_damage(exc):
            raise _Damaged(str(exc)) from None
        if isinstance(exc, sqlite3.Error):
            raise HistoryError(f"history database {path}: {exc}") from None
        raise
    return conn


def _is_damage(exc: sqlite3.DatabaseError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    text = str(exc)
    return "not a database" in text or "malformed" in text


def _check(conn: sqlite3.Connection, path: Path) -> None:
    """Read every page once per process: damage found later would fail a save halfway."""
    key = path.resolve()
    if key in _CHECKED:
        return
    verdict = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
    if verdict != "ok":
        raise _Damaged(f"integrity check: {verdict}")
    _CHECKED.add(key)


def _migrate(conn: sqlite3.Connection, path: Path, migrations: Sequence[Migration]) -> None:
    """Apply each migration past the file's `user_version`, in order, each in its transaction
    (another process may be migrating the same file: the version is re-read under the lock)."""
    latest = len(migrations)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > latest:
        raise HistoryError(
            f"history database {path} was written by a newer MemoryMark (schema {version}, this "
            f"one knows {latest}); upgrade, or set {DB_ENV} to another file"
        )
    if version == latest:
        return
    with transaction(conn):
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master")]
            if tables:
                raise HistoryError(
                    f"{path} is a SQLite database but not a MemoryMark history (it has "
                    f"{', '.join(sorted(tables)[:3])}); set {DB_ENV} to another file"
                )
        for number, statements in enumerate(migrations[version:], start=version + 1):
            for sql in statements:
                conn.execute(sql)
            conn.execute(f"PRAGMA user_version = {number}")


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """A write transaction that holds the database's write lock from its first statement."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@contextlib.contextmanager
def _recovery_lock(path: Path) -> Iterator[None]:
    """Only one process at a time decides to move a damaged file aside (POSIX `flock`; where
    there is none, the re-check under it is all there is)."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _move_aside(path: Path) -> Path:
    """Rename the damaged file (and its WAL and shared-memory files) to `<name>.corrupt-<time>`."""
    stamp = utc_now().replace(":", "").replace("-", "")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    try:
        path.rename(target)
    except OSError as exc:
        raise HistoryError(f"history database {path} is damaged and cannot be moved aside: "
                           f"{exc.strerror}") from None  # fmt: skip
    for extra in ("-wal", "-shm", "-journal"):
        sibling = path.with_name(path.name + extra)
        with contextlib.suppress(OSError):
            sibling.rename(target.with_name(target.name + extra))
    _CHECKED.discard(path.resolve())
    return target
