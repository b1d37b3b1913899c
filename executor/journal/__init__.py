"""The journal room: the daemon's durable record, in SQLite, and every SQL statement on it.

The journal of calls (`store`), its schema and migrations (`schema`), the one writer thread
with group commit (`writer`), the JSON codec of outcomes, the tables of approvals and runs,
and recovery of what a stopped daemon left running. Other rooms decide what a record says;
this room only stores and reads it. Its modules are imported directly, so `__all__` is empty.
"""

__all__: list[str] = []
