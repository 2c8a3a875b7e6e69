"""Induce each bottleneck on a real GPU and record everything needed to check the product.

Runs on the GPU machine. For every scenario it starts llama-server (`-lv 4 --log-file`),
keeps ONE exporter (real NVML) running across scenarios, drives load with `llmb-loadgen run`,
scrapes the exporter every `--scrape-interval` seconds into `<out>/<scenario>/scrapes.jsonl`,
and takes independent readings at the same moments: `nvidia-smi --query-gpu` and
`--query-compute-apps`, the engine's `timings`, and its `KV buffer size` log lines.
`summary.json` holds the comparisons; `tools/gpu_report.py` turns the scrapes into promtool
tests so the verdict rules are evaluated on the real GPU's series.

    python3 bench/gpu_validation.py --llama-server BIN --model MODEL.gguf --out DIR

It also runs on a CPU machine (scenarios still run; NVML is down) to rehearse the procedure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core import series as llmb  # noqa: E402


@dataclass
class Scenario:
    name: str
    server_args: list[str]
    concurrency: int
    requests: int
    prompt_tokens: int
    max_tokens: int
    expect: str  # the verdict the product should give
    extra: dict[str, Any] = field(default_factory=dict)


SCENARIOS = [
    Scenario("resident_c1", ["-c", "8192", "-np", "1", "-ngl", "999"], 1, 4, 425, 256, "decode"),
    Scenario(
        "sched_np4_c8",
        ["-c", "32768", "-np", "4", "-ngl", "999"],
        8,
        16,
        425,
        128,
        "scheduling_bound",
    ),
    Scenario(
        "ngl30", ["-c", "8192", "-np", "1", "-ngl", "30"], 1, 2, 228, 64, "weights_not_resident"
    ),
    Scenario("kvslot", ["-c", "4096", "-np", "4", "-ngl", "999"], 4, 4, 570, 512, "kv_saturated"),
    # Two GPUs (issue 8): one engine split over both, by layers and by rows.
    Scenario(
        "split2_layer",
        ["-c", "8192", "-np", "1", "-ngl", "999", "-sm", "layer", "-ts", "1,1"],
        1,
        4,
        425,
        256,
        "decode",
    ),
    Scenario(
        "split2_ngl30",
        ["-c", "8192", "-np", "1", "-ngl", "30", "-sm", "layer", "-ts", "1,1"],
        1,
        2,
        228,
        64,
        "weights_not_resident",
    ),
    Scenario(
        "split2_row",
        ["-c", "8192", "-np", "1", "-ngl", "999", "-sm", "row", "-ts", "1,1"],
        1,
        4,
        425,
        256,
        "decode",
    ),
]
SINGLE_GPU = "resident_c1,sched_np4_c8,ngl30,kvslot"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _csv(query: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return [[p.strip() for p in line.split(",")] for line in out.splitlines() if line.strip()]


def smi() -> dict[str, Any]:
    """nvidia-smi readings (the independent source); empty on a machine without it."""
    if not shutil.which("nvidia-smi"):
        return {}
    gpus = _csv("--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu")
    apps = _csv("--query-compute-apps=pid,process_name,used_memory,gpu_uuid")
    index_of = {g[1]: int(g[0]) for g in gpus}
    return {
        "t": time.time(),
        # GPU 0 first, as the first captures had it.
        "memory_used_mib": float(gpus[0][2]) if gpus else None,
        "memory_total_mib": float(gpus[0][3]) if gpus else None,
        "utilization_pct": float(gpus[0][4]) if gpus else None,
        "gpus": [
            {"index": int(g[0]), "used_mib": float(g[2]), "total_mib": float(g[3])} for g in gpus
        ],
        "apps": [
            {"pid": int(a[0]), "name": a[1], "used_mib": float(a[2]), "gpu": index_of.get(a[3])}
            for a in apps
        ],
    }


def scrape(url: str) -> tuple[float, str]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return time.time(), text


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    for lab, v in samples(text).get(name, []):
        if all(lab.get(k) == val for k, val in labels.items()):
            return v
    return None


def start_server(
    binary: str, model: str, port: int, args: list[str], log: Path
) -> tuple[subprocess.Popen[bytes], float]:
    argv = [
        binary,
        "-m",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics",
        "-lv",
        "4",
        "--log-file",
        str(log),
        *args,
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        if proc.poll() is not None:
            raise RuntimeError(
                f"llama-server exited {proc.returncode}: "
                + (log.read_text()[-3000:] if log.exists() else "")
            )
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc, time.monotonic() - t0
        except httpx.HTTPError:
            pass
        if time.monotonic() - t0 > 600:
            proc.kill()
            raise TimeoutError("server not ready")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def run_scenario(
    sc: Scenario, args: argparse.Namespace, exporter_url: str, port: int, out: Path
) -> dict[str, Any]:
    d = out / sc.name
    d.mkdir(parents=True, exist_ok=True)
    log = d / "server.log"
    record: dict[str, Any] = {
        "scenario": sc.name,
        "server_args": sc.server_args,
        "expect": sc.expect,
    }
    record["baseline"] = {"smi": smi(), "scrape": scrape(exporter_url)[1]}
    proc, load_s = start_server(args.llama_server, args.model, port, sc.server_args, log)
    record["load_seconds_measured"] = load_s
    time.sleep(args.settle)
    t, text = scrape(exporter_url)
    record["loaded"] = {"smi": smi(), "scrape": text, "t": t}
    scrapes = (d / "scrapes.jsonl").open("w")
    scrapes.write(json.dumps({"t": t, "text": text}) + "\n")
    loadgen = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loadgen",
            "run",
            "--url",
            f"http://127.0.0.1:{port}",
            "--kind",
            "llamacpp",
            "--name",
            "llama",
            "--concurrency",
            str(sc.concurrency),
            "--requests",
            str(sc.requests),
            "--prompt-tokens",
            str(sc.prompt_tokens),
            "--max-tokens",
            str(sc.max_tokens),
            "--warmup",
            "0",
            "--out",
            str(d / "loadgen"),
            "--no-progress",
            "--metrics-port",
            "0",
        ],
        cwd=ROOT,
        stdout=(d / "loadgen.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    during: dict[str, Any] | None = None
    while loadgen.poll() is None:
        t, text = scrape(exporter_url)
        scrapes.write(json.dumps({"t": t, "text": text}) + "\n")
        running = value(text, llmb.ENGINE_REQUESTS_RUNNING, engine="llama") or 0
        if during is None and running >= min(sc.concurrency, 1):
            # The independent reading right after a scrape while generating.
            during = {"scrape": text, "t": t, "smi": smi()}
        time.sleep(args.scrape_interval)
    # Counters of llama.cpp move when requests end: a few more scrapes after the load.
    for _ in range(int(args.tail / args.scrape_interval)):
        t, text = scrape(exporter_url)
        scrapes.write(json.dumps({"t": t, "text": text}) + "\n")
        time.sleep(args.scrape_interval)
    scrapes.close()
    record["loadgen_rc"] = loadgen.returncode
    record["during"] = during
    t, text = scrape(exporter_url)
    record["after"] = {"smi": smi(), "scrape": text, "t": t}
    stop(proc)
    record["log_tail"] = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    return record


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--llama-server", required=True, help="path of the llama-server binary")
    parser.add_argument("--model", required=True, help="GGUF model")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument(
        "--scenarios", default=SINGLE_GPU, help="comma list; also split2_layer,split2_row"
    )
    parser.add_argument(
        "--settle", type=float, default=3.0, help="seconds after load before 'loaded'"
    )
    parser.add_argument("--scrape-interval", type=float, default=0.5)
    parser.add_argument("--tail", type=float, default=3.0, help="seconds of scrapes after the load")
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply request counts and lengths (rehearsal on CPU)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = set(args.scenarios.split(","))
    port, eport = free_port(), free_port()
    config = {
        "listen": f"127.0.0.1:{eport}",
        "engines": [
            {
                "name": "llama",
                "kind": "llamacpp",
                "url": f"http://127.0.0.1:{port}",
                "log_file": str(args.out / "current.log"),
                "model_path": args.model,
            }
        ],
        "gpu": {"enabled": True, "sample_interval_seconds": 0.1, "peak_window_seconds": 10},
    }
    cfg = args.out / "exporter.yaml"
    cfg.write_text(yaml.safe_dump(config))
    exporter = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--config", str(cfg)],
        cwd=ROOT,
        stdout=(args.out / "exporter.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{eport}"
    for _ in range(300):
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    results = []
    try:
        for sc in SCENARIOS:
            if sc.name not in wanted:
                continue
            if args.scale != 1.0:
                sc.requests = max(1, int(sc.requests * args.scale))
                sc.max_tokens = max(8, int(sc.max_tokens * args.scale))
            # The exporter follows one log path: point it at this scenario's log.
            current = args.out / "current.log"
            if current.exists() or current.is_symlink():
                current.unlink()
            current.symlink_to(args.out / sc.name / "server.log")
            print(f"== {sc.name}", flush=True)
            try:
                results.append(run_scenario(sc, args, url, port, args.out))
            except Exception as exc:  # noqa: BLE001 - record and go on to the next scenario
                results.append({"scenario": sc.name, "error": f"{type(exc).__name__}: {exc}"})
                print(f"   failed: {exc}", flush=True)
    finally:
        stop(exporter)  # type: ignore[arg-type]
    (args.out / "summary.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
