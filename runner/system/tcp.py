"""Whether a TCP connection to a host and port is made within a time.

One place for the agent's reachability checks: a member serving elsewhere, a peer the fence asks, a lighthouse that
answers.
"""

from __future__ import annotations

import asyncio
import contextlib


async def dial(host: str, port: int, timeout: float) -> Exception | None:
    """None when `host`:`port` accepts a TCP connection within `timeout` s (closed at once); else the error.

    Refused, unreachable, a bad name or TimeoutError: returned, never raised.
    """
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError, ValueError) as exc:
        return exc
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None
