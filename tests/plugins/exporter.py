"""Run the real exporter (`python -m exporter`) as a subprocess, as users do.

`exporter_process(config: dict)` writes the config to a temp file, starts the exporter on a
free port (unless the config names `listen`), waits for `/healthz`, and returns an
`ExporterProcess` with `url`, `scrape()` (parsed samples) and `stop()`.

`served_page(page)` serves an exposition (`page()`, read at each request) on a loopback port
at /metrics, as an exporter would, for Prometheus or a reader under test.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tools.gpu_report import Key, parse

ROOT = Path(__file__).resolve().parents[2]

# {(name, sorted label pairs): value} of an exposition: the GPU report's reader.
SampleKey = Key
parse_samples = parse


def pick(samples: dict[SampleKey, float], name: str, **labels: str) -> list[float]:
    """Values of `name` whose labels include `labels`."""
    return [
        v
        for (n, lab), v in samples.items()
        if n == name and all(dict(lab).get(k) == val for k, val in labels.items())
    ]


@dataclass
class ExporterProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def scrape(self, timeout_header: float | None = None) -> dict[SampleKey, float]:
        headers = {}
        if timeout_header is not None:
            headers["X-Prometheus-Scrape-Timeout-Seconds"] = str(timeout_header)
        resp = httpx.get(self.url + "/metrics", headers=headers, timeout=30)
        resp.raise_for_status()
        return parse_samples(resp.text)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_exporter(config: dict[str, Any], workdir: Path, timeout: float = 60.0) -> ExporterProcess:
    """Start `python -m exporter` with `config` and wait until it serves."""
    config = dict(config)
    if "listen" not in config:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            config["listen"] = f"127.0.0.1:{sock.getsockname()[1]}"
    path = workdir / f"exporter-{config['listen'].rpartition(':')[2]}.yaml"
    path.write_text(yaml.safe_dump(config))
    log = path.with_suffix(".log")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMB__")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--config", str(path)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env=env,
    )
    url = f"http://{config['listen']}"
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"exporter exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return ExporterProcess(url, proc, log)
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError("exporter did not start")
        time.sleep(0.1)


@pytest.fixture
def exporter_process(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], ExporterProcess]]:
    started: list[ExporterProcess] = []

    def factory(config: dict[str, Any]) -> ExporterProcess:
        exp = start_exporter(config, tmp_path)
        started.append(exp)
        return exp

    yield factory
    for exp in started:
        exp.stop()


@contextmanager
def served_page(page: Callable[[], bytes]) -> Iterator[str]:
    """Serve `page()` at /metrics (404 elsewhere) on 127.0.0.1; yields `host:port`."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = page() if self.path == "/metrics" else b""
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
