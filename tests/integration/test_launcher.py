"""The engine launcher against real subprocesses: health wait, load time, clean stop, no orphans."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from config.settings import EngineConfig
from diagnose.launcher import (
    EngineProcess,
    LaunchError,
    engine_process,
    process_group_rss_bytes,
    render_command,
    template_fields,
)

# A stand-in engine: answers /health with 503 while "loading", then 200; forks a child
# (like SGLang's workers) and can be told to ignore SIGTERM.
FAKE_ENGINE = textwrap.dedent(
    """
    import http.server, os, signal, subprocess, sys, time
    port, load_s, mode = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "crash":
        print("fatal: cannot allocate KV cache", flush=True)
        sys.exit(3)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(sys.argv[4], "w") as f:
        f.write(str(child.pid))
    t0 = time.time()
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = time.time() - t0 >= load_s
            self.send_response(200 if ok else 503)
            self.end_headers()
            self.wfile.write(b'{"status":"ok"}' if ok else b'{"error":"Loading model"}')
        def log_message(self, *a):
            pass
    print("listening", port, flush=True)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); its state letter is Z.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _engine(tmp_path: Path, port: int, load_s: float, mode: str = "ok") -> EngineConfig:
    script = tmp_path / "fake_engine.py"
    script.write_text(FAKE_ENGINE)
    return EngineConfig.model_validate(
        {
            "name": "fake",
            "kind": "llamacpp",
            "url": f"http://127.0.0.1:{port}",
            "model_path": str(tmp_path / "model.gguf"),
            "launch": {
                "command": f"{sys.executable} {script} {{port}} {load_s} {mode} {{log}}.child "
                "--model {model} -c {ctx} -np {parallel}",
                "ready_timeout_seconds": 20,
                "settle_seconds": 0,
            },
        }
    )


def test_render_command_keeps_spaces_in_one_argument() -> None:
    argv = render_command("server -m {model} -c {ctx}", {"model": "/a b/m.gguf", "ctx": 4096})
    assert argv == ["server", "-m", "/a b/m.gguf", "-c", "4096"]
    assert template_fields("x {model} --port {port} -c {ctx}") == {"model", "port", "ctx"}
    with pytest.raises(KeyError, match=r"\{mem_fraction\}"):
        render_command("x --mem {mem_fraction}", {})


def test_start_waits_for_health_and_stop_leaves_no_orphans(tmp_path: Path, free_port: int) -> None:
    cfg = _engine(tmp_path, free_port, load_s=0.8)
    proc = engine_process(cfg, {"ctx": 2048}, tmp_path / "engine.log")
    assert "-c" in proc.argv and proc.argv[proc.argv.index("-c") + 1] == "2048"
    assert proc.argv[proc.argv.index("--model") + 1] == str(tmp_path / "model.gguf")
    with proc:
        assert proc.load_seconds is not None and 0.8 <= proc.load_seconds < 10
        assert proc.pid is not None and _alive(proc.pid)
        rss = process_group_rss_bytes(proc.pid)
        assert rss is not None and rss > 1_000_000  # two Python processes
        child = int((tmp_path / "engine.log.child").read_text())
        assert _alive(child)
    assert not _alive(proc.pid)
    assert not _alive(child)
    assert "listening" in (tmp_path / "engine.stdout.log").read_text()


def test_sigterm_ignored_falls_back_to_sigkill(tmp_path: Path, free_port: int) -> None:
    cfg = _engine(tmp_path, free_port, load_s=0.0, mode="ignore-term")
    proc = engine_process(cfg, {}, tmp_path / "engine.log")
    proc.start()
    t0 = time.monotonic()
    code = proc.stop(grace=1.0)
    assert code == -9
    assert time.monotonic() - t0 < 5
    assert proc.pid is not None and not _alive(proc.pid)


def test_engine_that_exits_reports_log_tail(tmp_path: Path, free_port: int) -> None:
    cfg = _engine(tmp_path, free_port, load_s=0.0, mode="crash")
    proc = engine_process(cfg, {}, tmp_path / "engine.log")
    with pytest.raises(LaunchError, match=r"(?s)status 3.*cannot allocate KV cache"):
        proc.start()


def test_ready_timeout(tmp_path: Path, free_port: int) -> None:
    script = tmp_path / "slow.py"
    script.write_text("import time; time.sleep(60)\n")
    proc = EngineProcess(
        argv=[sys.executable, str(script)],
        health_url=f"http://127.0.0.1:{free_port}/health",
        log_path=tmp_path / "slow.log",
        ready_timeout=1.0,
    )
    with pytest.raises(LaunchError, match="not ready after 1 s"):
        proc.start()
    assert proc.pid is not None and not _alive(proc.pid)


def test_no_launch_template_is_an_error(tmp_path: Path) -> None:
    cfg = EngineConfig(name="x", kind="sglang", url="http://127.0.0.1:1")
    with pytest.raises(LaunchError, match="no launch template"):
        engine_process(cfg, {}, tmp_path / "x.log")
