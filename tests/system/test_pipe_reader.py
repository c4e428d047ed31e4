"""runner/system/pipe_reader.py: the one non-blocking pipe reader (tee, helper logs, health commands)."""

from __future__ import annotations

import asyncio
import fcntl
import os

from runner.system.pipe_reader import CHUNK, MAX_CHUNKS_PER_TURN, PipeReader

F_SETPIPE_SZ = 1031  # linux/fcntl.h (Python's fcntl names it from 3.10, not on every build)


def test_every_byte_arrives_in_order_and_eof_is_said_once():
    """A writer that writes more than a turn's worth: every byte arrives, in order, then EOF once."""
    async def go() -> tuple[bytes, int]:
        r, w = os.pipe()
        got: list[bytes] = []
        ends: list[int] = []
        done = asyncio.get_running_loop().create_future()

        def eof() -> None:
            ends.append(1)
            done.set_result(None)

        reader = PipeReader(r, got.append, eof)
        reader.start()
        payload = bytes(range(256)) * 4096  # 1 MiB, written while the loop reads
        os.set_blocking(w, False)
        view = memoryview(payload)
        while view:
            try:
                view = view[os.write(w, view):]
            except BlockingIOError:
                await asyncio.sleep(0)
        os.close(w)
        await asyncio.wait_for(done, 10)
        reader.read()  # after EOF: nothing, no second EOF
        reader.stop()
        os.close(r)
        return b"".join(got), len(ends)

    data, ends = asyncio.run(go())
    assert data == bytes(range(256)) * 4096
    assert ends == 1


def test_a_read_takes_a_bounded_amount():
    """read(n) takes at most n chunks (a turn of the loop takes MAX_CHUNKS_PER_TURN): a fast writer cannot starve
    the loop; the rest stays in the pipe for the next turn."""
    r, w = os.pipe()
    fcntl.fcntl(w, F_SETPIPE_SZ, 4 * CHUNK)  # room for more than one chunk (the default holds exactly one)
    os.set_blocking(w, False)
    written = 0
    try:
        while True:
            written += os.write(w, b"x" * 4096)
    except BlockingIOError:
        pass
    sizes: list[int] = []
    reader = PipeReader(r, lambda d: sizes.append(len(d)), lambda: None)
    os.set_blocking(r, False)
    reader.read(2)
    assert len(sizes) == 2 and all(0 < s <= CHUNK for s in sizes)
    assert sum(sizes) < written  # the rest is still there
    reader.read()
    assert sum(sizes) == written
    os.close(r)
    os.close(w)
    assert MAX_CHUNKS_PER_TURN * CHUNK <= 1 << 20
