"""Start and stop an inference engine from its `launch` template, one variable at a time.

The command template is split with `shlex.split` first and each argument is then
formatted, so a value with spaces stays one argument and no shell is involved.
The engine runs in its own process group (SGLang forks workers) with stdout and
stderr in a log file; `stop()` sends SIGTERM to the group, then SIGKILL. Every
started engine is also registered with `atexit`, so an exception or Ctrl-C in the
caller never leaves an engine holding the GPU.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import signal
import string
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import httpx

from config.settings import EngineConfig, LaunchConfig

PLACEHOLDERS = ("model", "ctx", "parallel", "ngl", "port", "log", "mem_fraction", "host")

# Defaults used when neither the config's `launch.defaults` nor the caller sets a value.
BUILTIN_DEFAULTS: dict[str, str | int | float] = {
    "ctx": 4096,
    "parallel": 1,
    "ngl": 999,
    "mem_fraction": 0.85,
}


class LaunchError(RuntimeError):
    """The engine could not be started or did not become ready; the message has the log tail."""


def template_fields(command: str) -> set[str]:
    """Names of the `{placeholders}` used in a command template."""
    names = set()
    for arg in shlex.split(command):
        for _, name, _, _ in string.Formatter().parse(arg):
            if name:
                names.add(name)
    return names


def render_command(command: str, values: Mapping[str, Any]) -> list[str]:
    """Split the template into arguments and fill in each placeholder (KeyError: missing)."""
    argv = []
    for arg in shlex.split(command):
        try:
            argv.append(arg.format_map(dict(values)))
        except KeyError as exc:
            raise KeyError(
                f"launch command uses {{{exc.args[0]}}} but no value is known for it "
                f"(set launch.defaults.{exc.args[0]} or the engine's model_path/log_file)"
            ) from None
    return argv


def launch_values(
    engine: EngineConfig, overrides: Mapping[str, Any], log_path: Path
) -> dict[str, Any]:
    """Placeholder values: built-in defaults < config defaults < engine fields < `overrides`."""
    assert engine.launch is not None
    parts = urlsplit(engine.url)
    values: dict[str, Any] = dict(BUILTIN_DEFAULTS)
    values.update(engine.launch.defaults)
    values.setdefault("host", parts.hostname or "127.0.0.1")
    if parts.port is not None:
        values.setdefault("port", parts.port)
    if engine.model_path is not None:
        values.setdefault("model", str(engine.model_path))
    values["log"] = str(log_path)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return values


def process_group_pids(pgid: int) -> set[int]:
    """Every process id in a process group (Linux /proc; empty elsewhere)."""
    pids: set[int] = set()
    proc = Path("/proc")
    if not proc.is_dir():
        return pids
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            # Fields after the ")" of the command name: state ppid pgrp ...
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                pids.add(int(entry.name))
    return pids


def process_group_rss_bytes(pgid: int) -> int | None:
    """Resident memory of every process in a process group (Linux /proc), None when unknown."""
    total = 0
    found = False
    for pid in process_group_pids(pgid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    found = True
    return total if found else None


@dataclass
class EngineProcess:
    """One launched engine; use as a context manager so it is always stopped."""

    argv: list[str]
    health_url: str
    log_path: Path
    # The file `{log}` names: the engine's own log (llama.cpp --log-file), apart from stdout.
    engine_log: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout: float = 600.0
    headers: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    started_at: float | None = None
    ready_at: float | None = None
    _log: IO[bytes] | None = None

    @property
    def load_seconds(self) -> float | None:
        """Seconds from spawning the process to the first successful health check."""
        if self.started_at is None or self.ready_at is None:
            return None
        return self.ready_at - self.started_at

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> float:
        """Spawn the engine and wait until /health answers 200; return the load time in seconds."""
        if self.proc is not None:
            raise RuntimeError("engine already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        env = dict(os.environ)
        env.update(self.env)
        self.started_at = time.time()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            self._log.close()
            raise LaunchError(f"cannot start {self.argv[0]!r}: {exc}") from exc
        atexit.register(self.stop)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        assert self.load_seconds is not None
        return self.load_seconds

    def _wait_ready(self) -> None:
        assert self.proc is not None and self.started_at is not None
        deadline = self.started_at + self.ready_timeout
        last = "no answer yet"
        with httpx.Client(timeout=5.0, headers=self.headers) as client:
            while time.time() < deadline:
                code = self.proc.poll()
                if code is not None:
                    raise LaunchError(
                        f"engine exited with status {code} before it was ready; log tail:\n"
                        + self.log_tail()
                    )
                try:
                    resp = client.get(self.health_url)
                    if resp.status_code == 200:
                        self.ready_at = time.time()
                        return
                    # 503 while the model loads: keep waiting.
                    last = f"HTTP {resp.status_code}"
                except httpx.HTTPError as exc:
                    last = type(exc).__name__
                time.sleep(0.2)
        raise LaunchError(
            f"engine not ready after {self.ready_timeout:.0f} s ({last}); log tail:\n"
            + self.log_tail()
        )

    def rss_bytes(self) -> int | None:
        """Host resident memory of the engine's process group."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        return process_group_rss_bytes(self.proc.pid)

    def log_tail(self, lines: int = 20) -> str:
        """Last lines of the engine's output (and of its own log file when it wrote one)."""
        out = []
        for path in (self.log_path, self.engine_log):
            try:
                text = path.read_text(errors="replace") if path else ""
            except OSError:
                continue
            out += text.splitlines()[-lines:]
        return "\n".join(out) or "(no log)"

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM the process group, SIGKILL after `grace` seconds; return the exit status."""
        atexit.unregister(self.stop)
        proc = self.proc
        code = None
        if proc is not None:
            code = proc.poll()
            if code is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    code = proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    code = proc.wait(timeout=grace)
            # Children that ignored SIGTERM after the leader exited must not linger.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self._log is not None and not self._log.closed:
            self._log.close()
        return code

    def __enter__(self) -> EngineProcess:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def engine_process(
    engine: EngineConfig, overrides: Mapping[str, Any], log_path: Path
) -> EngineProcess:
    """Build (not start) the EngineProcess for `engine` with some placeholders overridden."""
    launch: LaunchConfig | None = engine.launch
    if launch is None:
        raise LaunchError(f"engine {engine.name!r} has no launch template in the config")
    values = launch_values(engine, overrides, log_path)
    argv = render_command(launch.command, values)
    # stdout/stderr go to a file of their own: an engine writing `{log}` itself may truncate it.
    stdout_log = log_path.with_name(log_path.stem + ".stdout.log")
    key = engine.api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    port = values.get("port")
    parts = urlsplit(engine.url)
    base = f"{parts.scheme}://{parts.hostname}:{port}" if port else engine.url
    return EngineProcess(
        argv=argv,
        health_url=base.rstrip("/") + "/health",
        log_path=stdout_log,
        engine_log=log_path,
        env=dict(launch.env),
        ready_timeout=launch.ready_timeout_seconds,
        headers=headers,
    )
