"""A thread pool of its own for the blocking steps of stopping a call.

Signalling a process tree and scanning /proc for what is left block, so they run
off the event loop. They must not wait behind tool work: the default executor
also runs `search`, `sql` and the file tools, and a few long calls there would
hold a kill until they finish. The stop ladder's steps run here instead.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

# Each step is short (a signal, a /proc scan); four cover concurrent stops of a batch.
_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="execgate-stop")


async def off_loop(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a blocking stop step in the stop pool."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, functools.partial(fn, *args, **kwargs))
