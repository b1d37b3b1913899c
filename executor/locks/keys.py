"""Lock keys: the names of what a call touches, arranged as trees.

A key is a path from a root. Two roots exist:

    ws                      the workspace (X on it = every file and table in it)
    ├── a                   a directory "a" (S on it = every file below it)
    │   └── b.txt           a file "a/b.txt"
    └── data
        └── x.db            an SQLite database file
            └── \\0t         table "t" inside it
    net
    └── example.com         a network host

Table segments start with NUL, which cannot occur in a file name, so a table can
never collide with a file of the same name inside a directory of that name. The
tree is what multi-granularity locking walks: a lock on a node covers everything
below it, and intention locks on its ancestors make that cheap to check.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_WS = "ws"
_NET = "net"
_MCP = "mcp"
_TABLE = "\x00"


@dataclass(frozen=True, slots=True, order=True)
class Key:
    """A node of a lock tree: `parts[0]` is the root ("ws", "net" or "mcp")."""

    parts: tuple[str, ...]

    def ancestors(self) -> tuple[Key, ...]:
        """Every strict ancestor, root first: the nodes that get intention locks.

        Cached per path (every call asks, and directories are shared by many files).
        """
        parts = self.parts
        found = _ANCESTORS.get(parts)
        if found is None:
            found = tuple(Key(parts[:i]) for i in range(1, len(parts)))
            if len(_ANCESTORS) >= _ANCESTORS_MAX:
                _ANCESTORS.clear()
            _ANCESTORS[parts] = found
        return found

    def is_ancestor_of(self, other: Key) -> bool:
        """True when `other` lies strictly below this node."""
        n = len(self.parts)
        return len(other.parts) > n and other.parts[:n] == self.parts

    def render(self, workspace_root: str) -> str:
        """The name people read: `workspace`, `file:/abs`, `table:/abs/db/t`, `net:host`."""
        root, rest = self.parts[0], self.parts[1:]
        if root == _NET:
            return f"net:{rest[0]}" if rest else "net:*"
        if root == _MCP:
            return f"mcp:{rest[0]}" if rest else "mcp:*"
        if not rest:
            return "workspace"
        if rest[-1].startswith(_TABLE):
            db = os.path.join(workspace_root, *rest[:-1])
            return f"table:{db}/{rest[-1][1:]}"
        return "file:" + os.path.join(workspace_root, *rest)


_WORKSPACE = Key((_WS,))
# Key.ancestors() results by key parts; emptied when full (a cache, never a truth).
_ANCESTORS: dict[tuple[str, ...], tuple[Key, ...]] = {}
_ANCESTORS_MAX = 4096


def workspace_key() -> Key:
    """The workspace root: X on it excludes every other workspace call."""
    return _WORKSPACE


def path_key(rel: str) -> Key:
    """The key of a file or directory at a canonical workspace-relative path.

    "" and "." are the workspace itself. Separators are normalised (repeated or
    trailing "/", "./" segments) so that one file has one key; ".." and absolute
    paths are refused because the caller must resolve them first (a key that
    could name a place outside its tree would break the hierarchy).
    """
    if "\x00" in rel:
        raise ValueError(f"path contains NUL: {rel!r}")
    if rel.startswith("/"):
        raise ValueError(f"path must be workspace-relative: {rel!r}")
    segments = [s for s in rel.split("/") if s and s != "."]
    if ".." in segments:
        raise ValueError(f"path must be canonical (no '..'): {rel!r}")
    return Key((_WS, *segments))


def table_key(db_rel: str, table: str) -> Key:
    """The key of `table` inside the SQLite database file at `db_rel`.

    SQLite matches table names case-insensitively (ASCII only), so the name is
    folded the same way: "T" and "t" must be one key or their writes would not
    serialize.
    """
    db = path_key(db_rel)
    if len(db.parts) == 1:
        raise ValueError("a database must be a file, not the workspace")
    if not table:
        raise ValueError("table name is empty")
    folded = table.translate(_ASCII_LOWER)
    return Key((*db.parts, _TABLE + folded))


def net_key(host: str) -> Key:
    """The key of a network host (DNS names are case-insensitive; so is the key)."""
    name = host.lower().rstrip(".")
    if not name:
        raise ValueError("host is empty")
    return Key((_NET, name))


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def server_key(name: str) -> Key:
    """The key of an MCP server: what its tools claim when the operator has not said
    which files they touch (an untrusted server's tools all WRITE it: serialized)."""
    if not name:
        raise ValueError("server name is empty")
    return Key((_MCP, name))
