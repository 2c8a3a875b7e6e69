"""`llmb-sim demo`: both simulators + the exporter (+ Prometheus when installed), no GPU needed."""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: list[str]) -> int:
    """Start everything, print the URLs, wait for Ctrl-C, stop everything."""
    p = argparse.ArgumentParser(prog="llmb-sim demo", description=__doc__)
    p.add_argument("--out", type=Path, default=None, help="folder for config, state and logs")
    p.add_argument("--scenario", default="healthy")
    p.add_argument("--exporter-port", type=int, default=9490)
    p.add_argument("--prometheus-port", type=int, default=9090)
    args = p.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="llmb-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    ports = {"llamacpp": _free_port(), "sglang": _free_port()}
    procs: list[subprocess.Popen[bytes]] = []
    engines = []
    for kind, port in ports.items():
        cmd = [sys.executable, "-m", "simulator", "--kind", kind, "--port", str(port)]
        cmd += ["--scenario", args.scenario, "--gpu-state-file", str(out / f"{kind}-gpu.json")]
        engine = {"name": f"sim-{kind}", "kind": kind, "url": f"http://127.0.0.1:{port}"}
        if kind == "llamacpp":
            cmd += ["--log-file", str(out / "llama-server.log")]
            engine["log_file"] = str(out / "llama-server.log")
        engines.append(engine)
        procs.append(
            subprocess.Popen(cmd, stdout=(out / f"{kind}.out").open("wb"), stderr=subprocess.STDOUT)
        )
    config = {
        "listen": f"127.0.0.1:{args.exporter_port}",
        "engines": engines,
        "gpu": {"fake_file": [str(out / f"{k}-gpu.json") for k in ports]},
    }
    cfg = out / "llmb.yaml"
    cfg.write_text(yaml.safe_dump(config, sort_keys=False))
    exporter = [sys.executable, "-m", "exporter", "--config", str(cfg)]
    procs.append(
        subprocess.Popen(
            exporter, stdout=(out / "exporter.out").open("wb"), stderr=subprocess.STDOUT
        )
    )
    print(f"llama.cpp simulator  http://127.0.0.1:{ports['llamacpp']}")
    print(f"SGLang simulator     http://127.0.0.1:{ports['sglang']}")
    print(f"exporter             http://127.0.0.1:{args.exporter_port}/metrics")
    prometheus = shutil.which("prometheus")
    if prometheus:
        prom_cfg = out / "prometheus.yml"
        prom_cfg.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "5s"},
                    "scrape_configs": [
                        {
                            "job_name": "llmb",
                            "static_configs": [{"targets": [f"127.0.0.1:{args.exporter_port}"]}],
                        }
                    ],
                }
            )
        )
        cmd = [prometheus, f"--config.file={prom_cfg}", f"--storage.tsdb.path={out / 'tsdb'}"]
        cmd.append(f"--web.listen-address=127.0.0.1:{args.prometheus_port}")
        procs.append(
            subprocess.Popen(
                cmd, stdout=(out / "prometheus.out").open("wb"), stderr=subprocess.STDOUT
            )
        )
        print(f"prometheus           http://127.0.0.1:{args.prometheus_port}")
    else:
        print("prometheus           not on PATH, skipped")
    print(f"files in {out}; Ctrl-C stops everything", flush=True)
    try:
        while all(proc.poll() is None for proc in procs):
            time.sleep(0.5)
        print("a component exited; see the *.out files", file=sys.stderr)
    except KeyboardInterrupt:
        pass
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0
