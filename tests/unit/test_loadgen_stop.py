"""A step that stops cancels its requests in flight at once (the scheduler's one request loop).

The server here behaves as llama-server does after SIGTERM: it stops listening (a new
connection is refused) while a stream it was serving stays open and silent. Before the
requests in flight were cancelled at the stop, such a request sat out its whole `--timeout`.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from loadgen.client import Target
from loadgen.outcomes import CANCELLED
from loadgen.scheduler.context import RunContext
from loadgen.scheduler.phase import ABORT_ENGINE_GONE, SILENT_S
from loadgen.scheduler.spec import RunSpec
from loadgen.scheduler.step import run_step
from loadgen.summary import StepResult


def _event(obj: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


FULL = (
    _event({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]})
    + _event(
        {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        }
    )
    + b"data: [DONE]\n\n"
)


class SilentAfterFirst:
    """HTTP/1.1 by hand: /v1/models, one full stream, then streams that send one event and
    hang (the server keeps them open until the client goes)."""

    def __init__(self) -> None:
        self.completions = 0
        self.hanging = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def stop_listening(self) -> None:
        """New connections are refused from now on; open ones stay as they are."""
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode().split("\r\n"):
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                await reader.readexactly(length)
                if head.startswith(b"GET /v1/models"):
                    body = json.dumps({"data": [{"id": "m"}]}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
                    await writer.drain()
                    continue
                self.completions += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Connection: close\r\n\r\n")  # fmt: skip
                if self.completions == 1:
                    writer.write(FULL)
                    await writer.drain()
                    break
                writer.write(FULL.split(b"\n\n")[0] + b"\n\n")
                await writer.drain()
                self.hanging.set()
                await asyncio.sleep(3600)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def test_a_stopped_step_cancels_its_requests_in_flight_at_once(tmp_path: Path) -> None:
    async def scenario() -> tuple[float, StepResult]:
        server = SilentAfterFirst()
        url = await server.start()
        spec = RunSpec(
            targets=[Target("m", url)],
            max_tokens=1,
            concurrency=1,
            requests=10,
            prompt_text="hello there",
            timeout=600.0,
        )
        ctx = RunContext(tmp_path)
        step = asyncio.create_task(run_step(spec, ctx))
        await asyncio.wait_for(server.hanging.wait(), 30)
        server.stop_listening()
        t_stop = time.perf_counter()
        result = await asyncio.wait_for(step, 60)
        ctx.close()
        return time.perf_counter() - t_stop, result

    seconds, result = asyncio.run(scenario())
    # Noticed after SILENT_S without a read, then cancelled: seconds, not the 600 s timeout.
    assert seconds < 2 * SILENT_S + 2
    reason = result.abort_reason or ""
    assert result.aborted and reason.startswith(ABORT_ENGINE_GONE)
    assert "refuses connections" in reason
    records = result.records["m"]
    assert [r.error for r in records] == [None, CANCELLED]
    assert (records[1].error_detail or "").startswith(f"cancelled in flight: {ABORT_ENGINE_GONE}")
    written = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [r["error"] for r in written] == [None, CANCELLED]
