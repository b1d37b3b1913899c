"""Notices of a journal one daemon writes alone (SQLite): there are never any, since
everything that happens to its records happens in this very process."""

from __future__ import annotations

from collections.abc import Callable

from .records import Notice


class NoNotices:
    """`base.NoticeStore` with nothing to tell."""

    def subscribe(self, fn: Callable[[Notice], None]) -> Callable[[], None]:
        return lambda: None
