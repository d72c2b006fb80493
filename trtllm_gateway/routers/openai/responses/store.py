"""ResponseStore: the stored responses that previous_response_id and GET/DELETE read, bounded by
count, bytes and age, shared by every API server process.

One sqlite file (stdlib sqlite3, WAL) in the supervisor's run directory with --api-server-count
N, so a chain whose turns land on different processes still finds its previous response; one
in-memory database in a single-process server. Each record holds the response and the whole
conversation it ended (input items, then its output items), so a chain never needs an ancestor
that was evicted. Past a limit the least recently used record goes first, never one that a
request in flight reads (pinned); a record older than the age limit is gone on its next read.

Every method blocks (a few ms of sqlite): the router calls them through asyncio.to_thread.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    record TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created REAL NOT NULL,
    last_used REAL NOT NULL,
    pins INTEGER NOT NULL DEFAULT 0
)
"""


@dataclass(frozen=True, slots=True)
class StoreLimits:
    max_count: int
    max_bytes: int
    max_age_s: float


class ResponseStore:
    def __init__(self, path: str, limits: StoreLimits) -> None:
        """`path`: the sqlite file (shared by processes), or ":memory:" for this process only."""
        self.limits = limits
        self._lock = threading.Lock()  # one connection, used from the thread pool
        self._db = sqlite3.connect(
            path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        if path != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _tx(self) -> _Transaction:
        return _Transaction(self._db, self._lock)

    def put(self, response_id: str, record: dict[str, Any]) -> bool:
        """Store `record`, then evict past the limits; False when it alone passes max_bytes."""
        text = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
        size = len(text.encode())
        if size > self.limits.max_bytes:
            logger.warning(
                "response %s not stored: %d bytes > the store's limit", response_id, size
            )
            return False
        now = time.time()
        with self._tx() as db:
            self._expire(db, now)
            db.execute(
                "INSERT OR REPLACE INTO responses (id, record, bytes, created, last_used) "
                "VALUES (?, ?, ?, ?, ?)",
                (response_id, text, size, now, now),
            )
            self._evict(db, keep=response_id)
        return True

    def get(self, response_id: str, pin: bool = False) -> dict[str, Any] | None:
        """The record (a use: it becomes the most recently used), or None when gone. pin=True
        also keeps it from eviction until unpin."""
        now = time.time()
        with self._tx() as db:
            self._expire(db, now)
            row = db.execute("SELECT record FROM responses WHERE id = ?", (response_id,)).fetchone()
            if row is None:
                return None
            db.execute(
                "UPDATE responses SET last_used = ?, pins = pins + ? WHERE id = ?",
                (now, 1 if pin else 0, response_id),
            )
        record: dict[str, Any] = json.loads(row[0])
        return record

    def unpin(self, response_id: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE responses SET pins = MAX(0, pins - 1) WHERE id = ?", (response_id,))

    def delete(self, response_id: str) -> bool:
        with self._tx() as db:
            gone = db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
            return gone.rowcount > 0

    def stats(self) -> tuple[int, int]:
        """(records, bytes) now."""
        with self._tx() as db:
            count, size = db.execute("SELECT COUNT(*), TOTAL(bytes) FROM responses").fetchone()
        return int(count), int(size)

    def _expire(self, db: sqlite3.Connection, now: float) -> None:
        db.execute(
            "DELETE FROM responses WHERE created < ? AND pins = 0", (now - self.limits.max_age_s,)
        )

    def _evict(self, db: sqlite3.Connection, keep: str) -> None:
        count, size = db.execute("SELECT COUNT(*), TOTAL(bytes) FROM responses").fetchone()
        if count <= self.limits.max_count and size <= self.limits.max_bytes:
            return
        rows = db.execute(
            "SELECT id, bytes FROM responses WHERE pins = 0 AND id != ? ORDER BY last_used",
            (keep,),
        ).fetchall()
        for victim, victim_bytes in rows:
            if count <= self.limits.max_count and size <= self.limits.max_bytes:
                break
            db.execute("DELETE FROM responses WHERE id = ?", (victim,))
            count -= 1
            size -= victim_bytes


class _Transaction:
    """BEGIN IMMEDIATE .. COMMIT (ROLLBACK on error) under the process's lock: the write lock
    across processes is sqlite's own."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock) -> None:
        self._db = db
        self._lock = lock

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._lock.release()
            raise
        return self._db

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self._db.execute("ROLLBACK" if exc_type is not None else "COMMIT")
        finally:
            self._lock.release()
