#!/usr/bin/env python3
"""Get a server ready before the first tool call (kernel, initramfs,
image, template), showing its progress; retry a failed phase. Then the
same with asyncio.

    python3 examples/prepare.py SOCKET"""
import asyncio
import sys
import time

from capsule_client import AsyncClient, CapsuleError, Client, Progress

sock = sys.argv[1]


def show(p: Progress) -> None:
    if p.status == "line":
        print(f"    {p.phase}: {p.message}")
    else:
        print(f"[{p.done}/{p.total}] {p.phase}: {p.status} {p.message or ''}")


with Client(sock) as c:
    for attempt in range(3):
        try:
            r = c.prepare(on_progress=show)
            print(f"prepared in {r.duration_ms} ms; built now: {r.built or 'nothing'}")
            break
        except CapsuleError as e:
            if not e.retryable:
                raise
            print(f"failed ({e.message}); retrying in 5 s")
            time.sleep(5)


async def main() -> None:
    async with await AsyncClient.connect(sock) as ac:
        stream = ac.prepare_stream()
        async for p in stream:          # the progress, as it comes
            show(p)
        r = await stream                # then the result (or its error)
        print(f"async: prepared, kernel {r.kernel}")

asyncio.run(main())
