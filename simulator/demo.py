"""`llmb-sim demo`: the whole stack without a GPU, and the verdict it reaches.

Starts a llama.cpp and an SGLang simulator (each on its own fake GPU, sized to its
scenario preset), the exporter reading both, Prometheus with the shipped rules and
Alertmanager (each when installed), drives a steady load on both engines, and prints
each engine's verdict (`llmb:engine_bottleneck:verdict`) as Prometheus computes it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import astuple, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import yaml

from config.kinds import engine_kind, kinds
from loadgen.prom_api import vector_values
from simulator import scenarios
from simulator.common import simulator_class

# The repository's prometheus/ folder (rules, alertmanager.yml); present in a clone and an
# editable install, absent from a wheel (then the demo runs without rules and says so).
PROMETHEUS_DIR = Path(__file__).resolve().parents[1] / "prometheus"
RULE_FILES = ("recording.yml", "verdict.yml", "alerts.yml")
VERDICT = "llmb:engine_bottleneck:verdict"
# One simulated engine of each kind registered when the demo starts.
KINDS: tuple[str, ...] = kinds()


@dataclass(frozen=True)
class Load:
    """The demo's closed-loop load on one engine."""

    concurrency: int
    prompt_tokens: int
    max_tokens: int


# Loads that put each preset into its bottleneck (tests/system/test_stack_integration.py imports the
# table); presets not listed get DEFAULT_LOAD.
DEFAULT_LOAD = Load(2, 256, 128)
# The prefill presets (issue 27): long prompts, short answers; the verdict each must get.
PREFILL_LOADS: dict[str, tuple[Load, str]] = {
    "prefill_at_card_limit": (Load(1, 4096, 16), "prefill_at_card_limit"),
    "ttft_waiting": (Load(4, 4096, 16), "ttft_waiting_bound"),
    "prefill_below_limit": (Load(2, 8192, 32), "prefill_below_card_limit"),
}
# The same on every kind, unless its simulator class says otherwise (`demo_loads`: the KV
# pools differ, so filling each takes its own load).
SHARED_LOADS: dict[str, Load] = {
    "weights_not_resident": Load(2, 256, 64),
    "kv_saturated": Load(8, 900, 400),
    "scheduling_bound": Load(8, 200, 200),
    "decode_at_card_limit": Load(1, 256, 64),
}
LOADS: dict[str, dict[str, Load]] = {
    preset: {
        kind: Load(*simulator_class(kind).demo_loads.get(preset, astuple(load))) for kind in KINDS
    }
    for preset, load in SHARED_LOADS.items()
}


def load_for(preset: str, kind: str) -> Load:
    """The demo's load on one engine: its preset's, else the prefill preset's, else the default."""
    prefill = PREFILL_LOADS.get(preset)
    return LOADS.get(preset, {}).get(kind, prefill[0] if prefill else DEFAULT_LOAD)


class PortBusy(Exception):
    """A port the demo must listen on is taken."""


def engine_name(kind: str) -> str:
    """The `engine` label of the simulator of this kind."""
    return f"sim-{kind}"


def check_port(port: int, what: str, flag: str) -> None:
    """Raise PortBusy with a one-line hint when 127.0.0.1:port cannot be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            raise PortBusy(
                f"port {port} ({what}) is in use; stop what holds it or pass {flag} PORT"
            ) from None


def free_port() -> int:
    """A port the kernel says is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build_parser() -> argparse.ArgumentParser:
    """Every flag with its default shown."""
    names = sorted(scenarios.SCENARIOS)
    p = argparse.ArgumentParser(
        prog="llmb-sim demo",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for configs, state and logs (default: a new temporary folder)",
    )
    p.add_argument("--scenario", default="healthy", choices=names, help="preset of both engines")
    for kind in KINDS:
        p.add_argument(
            f"--{kind}-scenario",
            default=None,
            choices=names,
            help=f"preset of the {engine_kind(kind).display} simulator (default: --scenario)",
        )
    p.add_argument("--exporter-port", type=int, default=9490)
    p.add_argument(
        "--prometheus-url",
        default=None,
        metavar="URL",
        help="read the verdicts from this Prometheus (one that scrapes the exporter itself, "
        "such as the compose service) instead of starting Prometheus and Alertmanager",
    )
    p.add_argument("--prometheus-port", type=int, default=9090)
    p.add_argument("--alertmanager-port", type=int, default=9093)
    p.add_argument(
        "--interval", default="5s", help="Prometheus scrape and rule evaluation interval"
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="simulators: wall seconds per simulated second",
    )
    for flag, text in (
        ("--no-load", "drive no load (the verdict is then `idle`)"),
        ("--once", "exit after printing both verdicts (exit 1 when none came in time)"),
    ):
        p.add_argument(flag, action="store_true", help=text)
    p.add_argument(
        "--settle",
        type=float,
        default=15.0,
        help="print a verdict once it has held this many seconds",
    )
    p.add_argument(
        "--verdict-timeout", type=float, default=180.0, help="seconds to wait for both verdicts"
    )
    return p


@dataclass
class Demo:
    """The children the demo started and how to stop them."""

    out: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def spawn(self, name: str, cmd: list[str]) -> None:
        """Start a child with its output in OUT/NAME.out."""
        with (self.out / f"{name}.out").open("wb") as log:
            self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def dead(self) -> str | None:
        """Name of a child that exited, if any."""
        return next((n for n, p in self.procs.items() if p.poll() is not None), None)

    def shutdown(self) -> None:
        """Stop every child (SIGTERM, SIGKILL after 10 s), then the load threads."""
        self.stop.set()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # Their requests fail now that the simulators are gone; daemon threads, so a stuck
        # one cannot hold the exit.
        for thread in self.threads:
            thread.join(timeout=1)


def drive(url: str, load: Load, stop: threading.Event) -> None:
    """One closed-loop client: completions of `load`'s shape until `stop` is set."""
    prompt = " ".join(["word"] * load.prompt_tokens)
    body = {"prompt": prompt, "max_tokens": load.max_tokens, "temperature": 0}
    with httpx.Client(timeout=httpx.Timeout(600, connect=5)) as client:
        while not stop.is_set():
            try:
                client.post(f"{url}/v1/completions", json=body)
            except httpx.HTTPError:
                stop.wait(1)  # the engine is starting or stopping


def wait_http(url: str, timeout: float) -> bool:
    """True once `url` answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def verdicts(prom_url: str) -> dict[str, str]:
    """Active verdict per engine from Prometheus (empty while none is recorded)."""
    try:
        resp = httpx.get(f"{prom_url}/api/v1/query", params={"query": f"{VERDICT} == 1"}, timeout=5)
        rows = vector_values(resp.json())
    except (httpx.HTTPError, ValueError):
        return {}
    return {labels.get("engine", ""): labels.get("verdict", "") for labels, _ in rows}


def prometheus_config(exporter: str, alertmanager: str | None, interval: str) -> dict[str, Any]:
    """prometheus/prometheus.yml with the demo's targets and absolute rule paths."""
    doc: dict[str, Any] = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    doc["global"] = {
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "evaluation_interval": interval,
    }
    doc["rule_files"] = [str(PROMETHEUS_DIR / "rules" / name) for name in RULE_FILES]
    if alertmanager:
        doc["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    else:
        doc.pop("alerting", None)
    # Only the exporter: the demo's load is not the load generator (no llmb-loadgen job).
    doc["scrape_configs"] = [
        {**job, "static_configs": [{"targets": [exporter]}]}
        for job in doc["scrape_configs"]
        if job["job_name"] == "llmb-exporter"
    ]
    return doc


def main(argv: list[str]) -> int:
    """Start everything, print the URLs and verdicts, stop everything on Ctrl-C/SIGTERM."""
    args = build_parser().parse_args(argv)
    chosen = {kind: getattr(args, f"{kind}_scenario") or args.scenario for kind in KINDS}
    if args.prometheus_url:
        prometheus, alertmanager, has_rules = None, None, True
    else:
        prometheus = shutil.which("prometheus")
        alertmanager = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
        has_rules = (PROMETHEUS_DIR / "rules" / "verdict.yml").is_file()
    try:
        check_port(args.exporter_port, "exporter", "--exporter-port")
        if prometheus:
            check_port(args.prometheus_port, "Prometheus", "--prometheus-port")
        if prometheus and alertmanager:
            check_port(args.alertmanager_port, "Alertmanager", "--alertmanager-port")
    except PortBusy as exc:
        print(f"llmb-sim demo: {exc}", file=sys.stderr)
        return 2

    out = args.out or Path(tempfile.mkdtemp(prefix="llmb-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    demo = Demo(out)

    # SIGTERM (docker stop, kill, a test) takes the same way out as Ctrl-C.
    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return run(args, chosen, demo, prometheus, alertmanager, has_rules)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        demo.shutdown()


def run(
    args: argparse.Namespace,
    chosen: dict[str, str],
    demo: Demo,
    prometheus: str | None,
    alertmanager: str | None,
    has_rules: bool,
) -> int:
    """The demo's body; `main` owns signals and the shutdown."""
    out = demo.out
    urls = {kind: f"http://127.0.0.1:{free_port()}" for kind in KINDS}
    engines = []
    for index, kind in enumerate(KINDS):
        state = out / f"{kind}-gpu.json"
        cmd = [sys.executable, "-m", "simulator", "--kind", kind]
        cmd += ["--port", urls[kind].rsplit(":", 1)[1], "--scenario", chosen[kind]]
        cmd += ["--time-scale", str(args.time_scale)]
        # Its own card: two engines on one fake card would add up past its size.
        cmd += ["--gpu-state-file", str(state), "--gpu-index", str(index)]
        engine: dict[str, Any] = {"name": engine_name(kind), "kind": kind, "url": urls[kind]}
        log_name = simulator_class(kind).demo_log
        if log_name:
            cmd += ["--log-file", str(out / log_name)]
            engine["log_file"] = str(out / log_name)
        engines.append(engine)
        demo.spawn(kind, cmd)
    config = {
        "listen": f"127.0.0.1:{args.exporter_port}",  # LLMB__LISTEN overrides (compose)
        "engines": engines,
        "gpu": {"fake_file": [str(out / f"{k}-gpu.json") for k in KINDS]},
    }
    cfg = out / "llmb.yaml"
    cfg.write_text(yaml.safe_dump(config, sort_keys=False))
    demo.spawn("exporter", [sys.executable, "-m", "exporter", "--config", str(cfg)])

    if prometheus and alertmanager and has_rules:
        demo.spawn(
            "alertmanager",
            [
                alertmanager,
                f"--config.file={PROMETHEUS_DIR / 'alertmanager.yml'}",
                f"--storage.path={out / 'alertmanager'}",
                f"--web.listen-address=127.0.0.1:{args.alertmanager_port}",
                "--cluster.listen-address=",  # no gossip port: one instance
            ],
        )
    else:
        alertmanager = None
    if prometheus and has_rules:
        prom_cfg = out / "prometheus.yml"
        am_target = f"127.0.0.1:{args.alertmanager_port}" if alertmanager else None
        doc = prometheus_config(f"127.0.0.1:{args.exporter_port}", am_target, args.interval)
        prom_cfg.write_text(yaml.safe_dump(doc, sort_keys=False))
        demo.spawn(
            "prometheus",
            [
                prometheus,
                f"--config.file={prom_cfg}",
                f"--storage.tsdb.path={out / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{args.prometheus_port}",
            ],
        )

    print_addresses(args, chosen, urls, prometheus, alertmanager, has_rules)
    print(f"files in {out}; Ctrl-C stops everything", flush=True)
    with_verdict = bool((prometheus or args.prometheus_url) and has_rules)
    return drive_and_report(args, chosen, demo, urls, with_verdict)


def print_addresses(
    args: argparse.Namespace,
    chosen: dict[str, str],
    urls: dict[str, str],
    prometheus: str | None,
    alertmanager: str | None,
    has_rules: bool,
) -> None:
    """Where each part answers; under compose (--prometheus-url) no address it cannot reach."""
    exporter_url = f"http://127.0.0.1:{args.exporter_port}"
    prom_url = f"http://127.0.0.1:{args.prometheus_port}"
    am_url = f"http://127.0.0.1:{args.alertmanager_port}"
    for kind in KINDS:
        label = engine_kind(kind).display
        print(f"{label + ' simulator':<21}{urls[kind]}  ({chosen[kind]})")
    if args.prometheus_url:
        listen = os.environ.get("LLMB__LISTEN", f"127.0.0.1:{args.exporter_port}")
        print(f"{'exporter':<21}listening on {listen} (scraped by {args.prometheus_url})")
        print(f"{'prometheus':<21}{args.prometheus_url}  (its own service: rules and alerts)")
        return
    print(f"{'exporter':<21}{exporter_url}/metrics")
    if not prometheus:
        print(f"{'prometheus':<21}not installed: no verdict (apt-get install prometheus)")
    elif not has_rules:
        print(f"{'prometheus':<21}skipped: no rules at {PROMETHEUS_DIR} (run from a clone)")
    else:
        print(f"{'prometheus':<21}{prom_url}  (rules loaded: {prom_url}/rules)")
        if alertmanager:
            print(f"{'alertmanager':<21}{am_url}")
        else:
            print(f"{'alertmanager':<21}not installed (apt-get install prometheus-alertmanager)")


def drive_and_report(
    args: argparse.Namespace,
    chosen: dict[str, str],
    demo: Demo,
    urls: dict[str, str],
    with_verdict: bool,
) -> int:
    """Wait for the simulators, drive the load, print each verdict once it has settled."""
    out = demo.out
    exporter_url = f"http://127.0.0.1:{args.exporter_port}"
    prom_url = args.prometheus_url or f"http://127.0.0.1:{args.prometheus_port}"
    for kind in KINDS:
        if not wait_http(f"{urls[kind]}/health", 60):
            print(
                f"llmb-sim demo: the {kind} simulator did not start; see {out}/{kind}.out",
                file=sys.stderr,
            )
            return 1
    if not args.no_load:
        for kind in KINDS:
            load = load_for(chosen[kind], kind)
            for _ in range(load.concurrency):
                thread = threading.Thread(
                    target=drive, args=(urls[kind], load, demo.stop), daemon=True
                )
                thread.start()
                demo.threads.append(thread)
        print(
            "load: "
            + ", ".join(
                f"{engine_name(k)} {load_for(chosen[k], k).concurrency} in flight" for k in KINDS
            ),
            flush=True,
        )

    if with_verdict:
        print("waiting for each engine's verdict to settle (about a minute)...", flush=True)
    shown: dict[str, str] = {}
    # The first evaluations see only a few seconds of the rules' 1m windows: a verdict is
    # printed once it has held for --settle seconds.
    candidate: dict[str, tuple[str, float]] = {}
    started = time.monotonic()
    while True:
        dead = demo.dead()
        if dead:
            print(f"llmb-sim demo: {dead} exited; see {out}/{dead}.out", file=sys.stderr)
            return 1
        if with_verdict:
            now, current = time.monotonic(), verdicts(prom_url)
            for kind in KINDS:
                name = engine_name(kind)
                verdict = current.get(name)
                if verdict is None:
                    candidate.pop(name, None)
                    continue
                if candidate.get(name, ("", 0.0))[0] != verdict:
                    candidate[name] = (verdict, now)
                if now - candidate[name][1] >= args.settle and shown.get(name) != verdict:
                    shown[name] = verdict
                    print(f"verdict  {name:<14} {verdict}", flush=True)
            if args.once and len(shown) == len(KINDS):
                return 0
            if args.once and now - started > args.verdict_timeout:
                print(
                    f"llmb-sim demo: no settled verdict for both engines within "
                    f"{args.verdict_timeout:.0f}s; see {out}",
                    file=sys.stderr,
                )
                return 1
        elif args.once:
            return 0 if wait_http(f"{exporter_url}/metrics", 30) else 1
        time.sleep(1)
