"""Bounds on a regular expression before anything compiles it.

Compiling is not free and cannot be interrupted: the `regex` module expands counted
repeats, so `((a{1000}){1000}){1000}` (23 characters) pins a thread for minutes
before a match timeout could apply. `check_pattern` estimates the compiled size
without compiling -- every atom weighs 1, times the count of each `{m,n}` repeat
around it (`*`, `+`, `?` weigh 1: they are loops, not copies) -- and refuses a
pattern over MAX_COST, nested deeper than MAX_DEPTH groups, or longer than the
caller's bound. The estimate errs high (a `(?flags)` group counts its letters).
"""

from __future__ import annotations

import re

from .errors import ExecgateError

# ~50 ms of `regex.compile` on this project's CI machine; `a{65535}` takes ~13 ms.
MAX_COST = 200_000
MAX_DEPTH = 64
_COUNT = re.compile(r"\{(\d*)(?:,(\d*))?\}")


def check_pattern(pattern: str, max_chars: int) -> str | None:
    """Why `pattern` is refused, or None if it is within the bounds."""
    if len(pattern) > max_chars:
        return f"the pattern is {len(pattern)} characters; at most {max_chars}"
    try:
        cost, depth = _estimate(pattern)
    except _TooBig as exc:
        return str(exc)
    if depth > MAX_DEPTH:
        return f"the pattern nests {depth} groups deep; at most {MAX_DEPTH}"
    if cost > MAX_COST:
        return (
            f"the pattern would compile to about {cost} steps (counted repeats multiply); "
            f"at most {MAX_COST}"
        )
    return None


class _TooBig(ExecgateError):
    """Past the bound before the estimate is done; `check_pattern` answers its text."""


def _estimate(pattern: str) -> tuple[int, int]:
    # Per open group: [total so far, weight of the last item (for a quantifier)].
    frames: list[list[int]] = [[0, 0]]
    depth = i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i = _after_escape(pattern, i)
            _atom(frames, 1)
            continue
        if c == "[":
            i = _after_class(pattern, i)
            _atom(frames, 1)
            continue
        if c == "(":
            frames.append([0, 0])
            depth = max(depth, len(frames) - 1)
        elif c == ")" and len(frames) > 1:
            total = frames.pop()[0]
            _atom(frames, max(total, 1))
        elif c == "{" and (m := _COUNT.match(pattern, i)) and (m.group(1) or m.group(2)):
            low, high = m.group(1), m.group(2)
            count = int(high) if high else int(low or "0")
            if count > MAX_COST:
                raise _TooBig(f"a repeat count of {count}; at most {MAX_COST}")
            frame = frames[-1]
            frame[0] += frame[1] * (max(count, 1) - 1)
            frame[1] *= max(count, 1)
            if frame[0] > MAX_COST:
                raise _TooBig(f"the pattern would compile to over {MAX_COST} steps")
            i = m.end()
            continue
        elif c not in "*+?|":
            _atom(frames, 1)
        i += 1
    while len(frames) > 1:  # unbalanced: the compiler will say so; count it anyway
        total = frames.pop()[0]
        _atom(frames, total)
    return frames[0][0], depth


def _atom(frames: list[list[int]], weight: int) -> None:
    frame = frames[-1]
    frame[0] += weight
    frame[1] = weight


def _after_escape(pattern: str, i: int) -> int:
    """The index after `\\x`, `\\p{...}`, `\\N{...}`, `\\x{...}`."""
    i += 2
    if i < len(pattern) and pattern[i] == "{" and pattern[i - 1] in "pPNxXu":
        end = pattern.find("}", i)
        return len(pattern) if end < 0 else end + 1
    return i


def _after_class(pattern: str, i: int) -> int:
    """The index after a `[...]` set (a leading `]` or `^]` is a member)."""
    i += 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
        elif c == "[" and pattern.startswith("[:", i):
            end = pattern.find(":]", i + 2)
            i = len(pattern) if end < 0 else end + 2
        elif c == "]":
            return i + 1
        else:
            i += 1
    return i
