"""The Python peers a user would pick instead of tidelog, each with the setting that makes an
acknowledged put survive power loss and with its fastest setting (labels in harness.CASES say
which is which). Each case measures puts for ``ctx.seconds`` and then consumes what it put
(get + ack / delete, or reads by key), reporting both."""

from __future__ import annotations

import os
import sqlite3
import struct
from collections.abc import Callable

from .cases import read_set_size
from .measure import Ctx, Io, Metrics, rate_metrics, timed, timed_puts

__all__ = [
    "sqlite",
    "persist_queue",
    "diskcache_deque",
    "queuelib_fifo",
    "litequeue_queue",
    "lmdb_env",
]

_KEY = struct.Struct(">Q")


def _read_set(ctx: Ctx) -> int:
    """How many records a peer's read phase reads over (tidelog's read fixture's count)."""
    return read_set_size(ctx)


def _puts(ctx: Ctx, put: Callable[[], int], after: Callable[[], None] | None = None) -> Metrics:
    io = Io(ctx.device)
    n, elapsed, lat, more = timed_puts(put, ctx.seconds)
    if after is not None:
        after()
    out = rate_metrics(n, elapsed, ctx.size, lat if more == len(lat) else None)
    out.update(io.stop(n + more, (n + more) * ctx.size))
    return out


def _consume(out: Metrics, get: Callable[[], int], seconds: float, key: str = "get") -> None:
    n, elapsed = timed(get, seconds)
    out[f"{key}_rec_per_s"] = n / elapsed if elapsed > 0 else 0.0
    out[f"{key}_records"] = float(n)


# --- sqlite3 --------------------------------------------------------------------------------------


def sqlite(ctx: Ctx, synchronous: str, per_txn: int) -> Metrics:
    """A table (seq INTEGER PRIMARY KEY, data BLOB) in WAL mode; ``per_txn`` rows per commit.
    Consuming: SELECT ... WHERE seq > ? ORDER BY seq LIMIT 1000 (a read by seq, like
    tidelog's read) and, separately, DELETE by seq range + commit (a queue's get)."""
    path = os.path.join(ctx.base, "q.sqlite")
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute(f"PRAGMA synchronous={synchronous}")
        con.execute("CREATE TABLE q (seq INTEGER PRIMARY KEY, data BLOB NOT NULL)")
        data = ctx.payload
        rows = [(data,)] * per_txn
        ins = "INSERT INTO q (data) VALUES (?)"

        def put() -> int:
            if per_txn == 1:
                con.execute(ins, (data,))  # autocommit: one transaction per row
            else:
                con.execute("BEGIN")
                con.executemany(ins, rows)
                con.execute("COMMIT")
            return per_txn

        out = _puts(ctx, put)
        have = con.execute("SELECT count(*) FROM q").fetchone()[0]
        if have < _read_set(ctx):  # reads over a realistic table, as for lmdb
            con.execute("BEGIN")
            con.executemany(ins, [(data,)] * (_read_set(ctx) - have))
            con.execute("COMMIT")
        cursor = [0]

        def read() -> int:
            got = con.execute(
                "SELECT seq, data FROM q WHERE seq > ? ORDER BY seq LIMIT 1000", (cursor[0],)
            ).fetchall()
            if not got:
                return 0
            cursor[0] = got[-1][0]
            return len(got)

        _consume(out, read, ctx.seconds, "read")
        lo = [0]

        def get() -> int:
            con.execute("BEGIN")
            got = con.execute(
                "SELECT seq, data FROM q WHERE seq > ? ORDER BY seq LIMIT ?", (lo[0], per_txn)
            ).fetchall()
            if got:
                con.execute("DELETE FROM q WHERE seq <= ?", (got[-1][0],))
                lo[0] = got[-1][0]
            con.execute("COMMIT")
            return len(got)

        _consume(out, get, ctx.seconds)
        return out
    finally:
        con.close()


# --- persist-queue --------------------------------------------------------------------------------


def persist_queue(ctx: Ctx, ack: bool = False) -> Metrics:
    """persistqueue.SQLiteQueue(auto_commit=True), or with ``ack`` SQLiteAckQueue (get +
    ack(item) per record): WAL, SQLite's default synchronous (FULL)."""
    import persistqueue

    kind = persistqueue.SQLiteAckQueue if ack else persistqueue.SQLiteQueue
    q = kind(os.path.join(ctx.base, "pq"), auto_commit=True)
    data = ctx.payload

    def put() -> int:
        q.put(data)
        return 1

    out = _puts(ctx, put)

    def get() -> int:
        try:
            item = q.get(block=False)
        except persistqueue.Empty:
            return 0
        if ack:
            q.ack(item)
        return 1

    _consume(out, get, ctx.seconds)
    return out


# --- diskcache ------------------------------------------------------------------------------------


def diskcache_deque(ctx: Ctx, sqlite_synchronous: int | None) -> Metrics:
    """diskcache.Deque: append / popleft. ``sqlite_synchronous=2`` (FULL) syncs the WAL per
    commit; the default (1, NORMAL) does not."""
    import diskcache

    directory = os.path.join(ctx.base, "dc")
    if sqlite_synchronous is None:
        cache = diskcache.Cache(directory, eviction_policy="none")
    else:
        cache = diskcache.Cache(
            directory, eviction_policy="none", sqlite_synchronous=sqlite_synchronous
        )
    try:
        dq = diskcache.Deque.fromcache(cache)
        data = ctx.payload

        def put() -> int:
            dq.append(data)
            return 1

        out = _puts(ctx, put)

        def get() -> int:
            try:
                dq.popleft()
            except IndexError:
                return 0
            return 1

        _consume(out, get, ctx.seconds)
        return out
    finally:
        cache.close()


# --- queuelib -------------------------------------------------------------------------------------


def queuelib_fifo(ctx: Ctx) -> Metrics:
    """queuelib.FifoDiskQueue: push = one os.write, never fsyncs; its head/tail info is written
    only by close(), so a crash before close loses track of everything."""
    from queuelib import FifoDiskQueue

    q = FifoDiskQueue(os.path.join(ctx.base, "ql"))
    data = ctx.payload
    push = q.push

    def put() -> int:
        push(data)
        return 1

    try:
        out = _puts(ctx, put)
        pop = q.pop

        def get() -> int:
            return 0 if pop() is None else 1

        _consume(out, get, ctx.seconds)
        return out
    finally:
        q.close()


# --- litequeue ------------------------------------------------------------------------------------


def litequeue_queue(ctx: Ctx, full: bool) -> Metrics:
    """litequeue.LiteQueue: WAL with synchronous=NORMAL hard-coded; ``full`` switches the
    connection to synchronous=FULL after init (the only way to make puts durable). Consuming:
    get() + done(message_id)."""
    import litequeue

    q = litequeue.LiteQueue(os.path.join(ctx.base, "lq.sqlite"))
    if full:
        q.conn.execute("PRAGMA synchronous=FULL")
    data = ctx.payload

    def put() -> int:
        q.put(data)
        return 1

    try:
        out = _puts(ctx, put)

        def get() -> int:
            msg = q.pop()
            if msg is None:
                return 0
            q.done(msg.message_id)
            return 1

        _consume(out, get, ctx.seconds)
        return out
    finally:
        q.conn.close()


# --- lmdb -----------------------------------------------------------------------------------------


def lmdb_env(ctx: Ctx, sync: bool, per_txn: int) -> Metrics:
    """lmdb: big-endian u64 seq keys, ``per_txn`` puts per write transaction; sync=True
    fdatasyncs data and meta per commit. Reading: point gets by key in one read transaction
    (``read``), and get + delete per transaction of ``per_txn`` (``get``)."""
    import lmdb

    env = lmdb.open(os.path.join(ctx.base, "lmdb"), map_size=4 << 30, sync=sync, metasync=sync)
    try:
        data = ctx.payload
        seq = [0]

        def put() -> int:
            with env.begin(write=True) as txn:
                s = seq[0]
                for i in range(per_txn):
                    txn.put(_KEY.pack(s + i), data, append=True)
            seq[0] = s + per_txn
            return per_txn

        out = _puts(ctx, put)
        # point gets over as many keys as tidelog's read fixture holds, not over the few a
        # slow durable put loop managed (a tiny hot set would flatter the read rate)
        want = _read_set(ctx)
        with env.begin(write=True) as txn:
            for s in range(seq[0], want):
                txn.put(_KEY.pack(s), data, append=True)
        total = seq[0] = max(seq[0], want)
        pos = [0]

        def read() -> int:
            got = 0
            with env.begin() as txn:
                get = txn.get
                for _ in range(1000):
                    if pos[0] >= total:
                        pos[0] = 0
                    get(_KEY.pack(pos[0]))
                    pos[0] += 1
                    got += 1
            return got

        _consume(out, read, ctx.seconds, "read")
        lo = [0]

        def get() -> int:
            if lo[0] >= total:
                return 0
            with env.begin(write=True) as txn:
                hi = min(total, lo[0] + per_txn)
                for k in range(lo[0], hi):
                    key = _KEY.pack(k)
                    txn.get(key)
                    txn.delete(key)
            done = hi - lo[0]
            lo[0] = hi
            return done

        _consume(out, get, ctx.seconds)
        return out
    finally:
        env.close()
