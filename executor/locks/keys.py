"""Lock keys: the names of what a call touches, arranged as trees.

A key is a path from a root. Three roots exist:

    ws
    └── /srv/ws/alice       a workspace, by its canonical root (X on it = every file
        │                   and table in it)
        ├── a               a directory "a" (S on it = every file below it)
        │   └── b.txt       a file "a/b.txt"
        └── data
            └── x.db        an SQLite database file
                └── \\0t     table "t" inside it
    net
    └── example.com         a network host
    mcp
    └── git                 an MCP server ...
        └── /srv/ws/alice   ... as it serves one workspace (a process of its own)

Every workspace is a subtree of its own under `ws`, named by its canonical root: calls
in different workspaces never conflict (the `ws` node itself is never locked: no key
names it), and two workspace names for one root are one subtree.
Roots never nest (pipeline/workspaces.py refuses a root inside another), so one file
has one key.

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
        The `ws` node above the workspaces is none: no key names it, so nothing but
        (compatible) intention locks could ever be held on it.
        """
        parts = self.parts
        found = _ANCESTORS.get(parts)
        if found is None:
            first = 2 if parts[0] == _WS else 1
            found = tuple(Key(parts[:i]) for i in range(first, len(parts)))
            if len(_ANCESTORS) >= _ANCESTORS_MAX:
                _ANCESTORS.clear()
            _ANCESTORS[parts] = found
        return found

    def is_ancestor_of(self, other: Key) -> bool:
        """True when `other` lies strictly below this node."""
        n = len(self.parts)
        return len(other.parts) > n and other.parts[:n] == self.parts

    def render(self) -> str:
        """The name people read: `workspace` (the root of the workspace the key is in: a
        call's keys are all in its own), `file:/abs`, `table:/abs/db/t`, `net:host`,
        `mcp:name`."""
        root, rest = self.parts[0], self.parts[1:]
        if root == _NET:
            return f"net:{rest[0]}" if rest else "net:*"
        if root == _MCP:
            return f"mcp:{rest[0]}" if rest else "mcp:*"
        if len(rest) <= 1:
            return "workspace"
        home, inside = rest[0], rest[1:]
        if inside[-1].startswith(_TABLE):
            db = os.path.join(home, *inside[:-1])
            return f"table:{db}/{inside[-1][1:]}"
        return "file:" + os.path.join(home, *inside)

    @property
    def workspace(self) -> str:
        """The canonical root of the workspace the key lies in ("" for net and mcp keys,
        and for the `ws` node above every workspace)."""
        if self.parts[0] == _WS and len(self.parts) > 1:
            return self.parts[1]
        return ""


# Key.ancestors() results by key parts; emptied when full (a cache, never a truth).
_ANCESTORS: dict[tuple[str, ...], tuple[Key, ...]] = {}
_ANCESTORS_MAX = 4096


def workspace_key(root: str) -> Key:
    """A workspace, by its canonical root: X on it excludes every other call in it, and
    nothing in any other workspace."""
    if not root.startswith("/"):
        raise ValueError(f"a workspace is named by its absolute root: {root!r}")
    return Key((_WS, root))


def path_key(root: str, rel: str) -> Key:
    """The key of a file or directory at a canonical path relative to the workspace at
    `root` (its canonical absolute root).

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
    return Key((*workspace_key(root).parts, *segments))


def table_key(root: str, db_rel: str, table: str) -> Key:
    """The key of `table` inside the SQLite database file at `db_rel` (in the workspace
    at `root`).

    SQLite matches table names case-insensitively (ASCII only), so the name is
    folded the same way: "T" and "t" must be one key or their writes would not
    serialize.
    """
    db = path_key(root, db_rel)
    if len(db.parts) == 2:
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


def server_key(name: str, root: str) -> Key:
    """The key of an MCP server as it serves the workspace at `root` (a process of its
    own there): what its tools claim when the operator has not said which files they
    touch (an untrusted server's tools all WRITE it: serialized in that workspace)."""
    if not name:
        raise ValueError("server name is empty")
    return Key((_MCP, name, workspace_key(root).parts[1]))
