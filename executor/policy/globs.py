"""The one glob syntax of a policy: paths, tools, tables, hosts and agent names.

Matching is wcmatch's `globmatch` (a maintained implementation of the shell's glob)
with bash's `globstar` and `dotglob` on and POSIX paths forced: `*`, `?` and `[...]`
stay within one `/`-separated segment, `**` as a whole segment spans any number of
them, dotfiles are not special. Braces, extglobs and negation are off, so those
characters are literal. execgate adds one shorthand: a trailing `/` means the
directory and everything below it (`dir/` is `dir` or `dir/**`). A leading `/` is
ignored: every name a policy sees is relative. docs/policy.md shows the syntax.
"""

from __future__ import annotations

import functools

from wcmatch import glob

__all__ = ["FLAGS", "glob_match"]

FLAGS = glob.GLOBSTAR | glob.DOTGLOB | glob.FORCEUNIX


def glob_match(name: str, pattern: str) -> bool:
    """Does the whole of `name` match `pattern`? Case-sensitive."""
    return _compiled(pattern).match(name)


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str) -> glob.WcMatcher[str]:
    text = pattern.lstrip("/")
    if text.endswith("/"):
        text = text.rstrip("/")
        # `/` alone (or `//`) is the whole tree.
        patterns = [text, f"{text}/**"] if text else ["**"]
    else:
        patterns = [text]
    return glob.compile(patterns, flags=FLAGS)
