"""The journal on PostgreSQL (`--journal postgresql://...`): the same store interfaces
as the SQLite journal (journal/base.py), shared by several daemons.

    db        PgDb: psycopg's async pool on a loop of its own; retries while the server is away
    schema    the tables and their migrations
    presence  each daemon's lease and liveness lock; reaping the dead; LISTEN
    notices   NOTIFY between daemons (cancels, approvals, runs, keyed calls)
    calls, approvals, runs, others   one store per record kind
    locktable the lock table of `--locks postgresql` (SQL only; the rule is locks.decide)
    store     PgJournal, the whole backend

Imported only when asked for: psycopg is the `postgresql` extra.
"""

__all__: list[str] = []
