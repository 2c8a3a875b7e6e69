"""Many hosts on one Prometheus (issue 8): two exporters, one Prometheus, one engine name.

Two real exporters (subprocesses) listen on different loopback addresses (127.0.0.2 and
127.0.0.3; Linux routes all of 127/8 to lo) with `host:` gpu-a and gpu-b; each reads its own
llama.cpp simulator, and both simulators' engines are named `llama`. Host gpu-b's simulator
is KV-saturated by a small client; gpu-a's stays idle. One real Prometheus with the shipped
rules scrapes both; the fleet series must keep the two `llama` engines apart and the KV alert
must name gpu-b only.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.metrics_core import Metric

from config.settings import ConfigError, parse_config
from core.conditions import SEVERITY, VERDICTS
from exporter.app import build_runner
from exporter.collectors import Collector, Scrape
from exporter.runner import Runner
from exporter.schema import MetricSet
from mixin.dashboards.fleet import FLEET_SEVERITY, rank_texts
from mixin.rules.verdict import verdict_rules
from tests.plugins.prom import (
    ROOT,
    RULE_FILES,
    PrometheusServer,
    start_prometheus,
    stop_process,
)
from tests.plugins.sim import SimHandle

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(420)]

HOSTS = {"gpu-a": "127.0.0.2", "gpu-b": "127.0.0.3"}
ENGINE = "llama"


def free_port(address: str) -> int:
    """A free TCP port on one loopback address."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Child processes the test starts; stopped (by their handle) at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in reversed(started):
        stop_process(proc)


def spawn_exporter(workdir: Path, host: str, sim: SimHandle) -> tuple[subprocess.Popen[bytes], str]:
    """Start `python -m exporter` for one host on its own address; return it and host:port."""
    address = HOSTS[host]
    listen = f"{address}:{free_port(address)}"
    config = {
        "host": host,
        "listen": listen,
        "engines": [
            {"name": ENGINE, "kind": "llamacpp", "url": sim.url, "log_file": str(sim.log_file)}
        ],
        "gpu": {"fake_file": [str(sim.gpu_state_file)], "sample_interval_seconds": 0.2},
    }
    path = workdir / f"{host}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    with (workdir / f"{host}.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "--config", str(path)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return proc, listen


async def start_exporter(
    workdir: Path, host: str, sim: SimHandle, procs: list[subprocess.Popen[bytes]]
) -> str:
    """Start one host's exporter and wait (bounded) until it serves /metrics."""
    proc, listen = spawn_exporter(workdir, host, sim)
    procs.append(proc)
    async with httpx.AsyncClient(timeout=2) as client:
        for _ in range(150):
            assert proc.poll() is None, (workdir / f"{host}.log").read_text()[-2000:]
            try:
                if (await client.get(f"http://{listen}/metrics")).status_code == 200:
                    return listen
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise AssertionError(f"exporter {host} did not answer on {listen}")


async def keep_kv_full(url: str, workers: int = 8) -> None:
    """Eight clients sending 900-token prompts back to back (the kv_saturated preset's load)."""
    prompt = "".join(f" w{i % 97}" for i in range(900))

    async def worker(n: int, client: httpx.AsyncClient) -> None:
        while True:
            body = {"prompt": f"r{n}{prompt}", "n_predict": 400, "ignore_eos": True}
            await client.post("/completion", json=body)

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        await asyncio.gather(*(worker(n, client) for n in range(workers)))


async def wait_for(
    prom: PrometheusServer, check: Callable[[], Any], timeout: float, what: str
) -> Any:
    """Poll `check` (run in a thread: the simulators share this event loop) until truthy."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await asyncio.to_thread(check)
        if last:
            return last
        await asyncio.sleep(1)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}; {prom.log_tail()}")


@pytest.fixture
async def fleet(
    sim_server: Callable[..., Awaitable[SimHandle]],
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> AsyncIterator[PrometheusServer]:
    """Two hosts (idle gpu-a, KV-saturated gpu-b) scraped by one Prometheus."""
    idle = await sim_server("llamacpp", "healthy")
    full = await sim_server("llamacpp", "kv_saturated")
    targets = [
        await start_exporter(tmp_path, "gpu-a", idle, processes),
        await start_exporter(tmp_path, "gpu-b", full, processes),
    ]
    load = asyncio.ensure_future(keep_kv_full(full.url))
    prom_dir = tmp_path / "prometheus"
    prom_dir.mkdir()
    prom = await asyncio.to_thread(
        start_prometheus, prom_dir, free_port("127.0.0.1"), {"llmb-exporter": targets}
    )
    try:
        yield prom
    finally:
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
        await asyncio.to_thread(stop_process, prom.process)


def rows(prom: PrometheusServer, expr: str) -> list[dict[str, str]]:
    """Label sets of an instant query's result."""
    return [r["metric"] for r in prom.query(expr)]


def firing_hosts(prom: PrometheusServer, alertname: str) -> set[tuple[str, str]]:
    """(host, engine) of every firing `alertname`."""
    return {
        (a["labels"].get("host", ""), a["labels"].get("engine", ""))
        for a in prom.get("/api/v1/alerts")["alerts"]
        if a["labels"]["alertname"] == alertname and a["state"] == "firing"
    }


async def test_two_hosts_with_one_engine_name_stay_apart(fleet: PrometheusServer) -> None:
    prom = fleet

    def both_up() -> list[dict[str, str]]:
        found = rows(prom, 'llmb_engine_up{engine="llama"} == 1')
        return found if len(found) == 2 else []

    up = await wait_for(prom, both_up, 60, "both exporters scraped")
    assert {r["host"] for r in up} == set(HOSTS)
    # Every series of both exporters names its host, never merged by `instance` alone.
    by_host = {r["host"]: r["instance"].split(":")[0] for r in up}
    assert by_host == HOSTS
    unlabeled = rows(prom, '{__name__=~"llmb_.+", job="llmb-exporter", host=""}')
    assert unlabeled == []

    def verdicts() -> dict[str, str]:
        found = rows(prom, 'llmb:engine_bottleneck:verdict{engine="llama"} == 1')
        got = {r["host"]: r["verdict"] for r in found}
        return got if got == {"gpu-a": "idle", "gpu-b": "kv_saturated"} else {}

    await wait_for(prom, verdicts, 150, "idle on gpu-a and kv_saturated on gpu-b")

    # Fleet recording rules (evaluated one group later): one row per engine, worst first.
    def ranked() -> list[dict[str, Any]]:
        found = prom.query("sort_desc(llmb:engine_bottleneck:severity)")
        got = [(r["metric"]["host"], r["metric"]["verdict"]) for r in found]
        return found if got == [("gpu-b", "kv_saturated"), ("gpu-a", "idle")] else []

    severity = await wait_for(prom, ranked, 30, "fleet severity of both hosts")
    assert [float(r["value"][1]) for r in severity] == [5.0, 1.0]
    counts = {
        (r["metric"]["host"], r["metric"]["verdict"]): float(r["value"][1])
        for r in prom.query("host_verdict:llmb_engines:count")
    }
    assert counts == {("gpu-a", "idle"): 1.0, ("gpu-b", "kv_saturated"): 1.0}
    worst = {r["host"] for r in rows(prom, "host:llmb_engine_bottleneck_severity:max")}
    assert worst == set(HOSTS)

    # The KV alert names host gpu-b (pending for `for_kv_saturated`, then firing) and
    # never gpu-a, although both engines are called `llama`.
    fired = await wait_for(
        prom, lambda: firing_hosts(prom, "LLMKVCacheSaturated"), 150, "LLMKVCacheSaturated"
    )
    assert fired == {("gpu-b", ENGINE)}

    # Every fleet dashboard query returns data for both hosts with Grafana's "All".
    doc = json.loads((ROOT / "grafana/dashboards/fleet.json").read_text(encoding="utf-8"))
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$host", ".*").replace("$engine", ".*")
            hosts = {r.get("host") for r in await asyncio.to_thread(rows, prom, expr)}
            assert hosts == set(HOSTS), (panel["title"], expr, hosts)


def test_dashboard_severity_ranks_match_the_rules() -> None:
    ranks = {verdict: rank for verdict, (rank, _) in FLEET_SEVERITY.items()}
    assert ranks == SEVERITY
    assert set(SEVERITY) == set(VERDICTS) | {"engine_down"}
    # Verdicts may share a rank (a prompt and a decode verdict of the same weight): the
    # dashboard's mapping names every verdict of a rank, so none is hidden behind another.
    texts = rank_texts()
    assert set(texts) == set(ranks.values())
    for verdict, rank in ranks.items():
        assert verdict in texts[rank][0].split(" or "), verdict
    # The fleet rules rank with the same table.
    (fleet_group,) = [g for g in verdict_rules() if g["name"] == "llmb-fleet"]
    severity = fleet_group["rules"][0]["expr"]
    for verdict in VERDICTS:
        assert f'verdict="{verdict}"}} == 1) * {SEVERITY[verdict]}' in severity, verdict


def test_every_dashboard_has_host_and_engine_variables() -> None:
    for path in sorted((ROOT / "grafana/dashboards").glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        names = [v["name"] for v in doc["templating"]["list"]]
        assert names == ["datasource", "host", "engine"], path.name
        for panel in doc["panels"]:
            for target in panel.get("targets", []):
                assert 'host=~"$host"' in target["expr"], (path.name, panel["title"])


@pytest.mark.parametrize("name", ["remote_write.example.yml", "federate.example.yml"])
def test_long_term_store_examples_pass_promtool(name: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run scripts/install.sh (Debian package prometheus)"
    result = subprocess.run(
        [promtool, "check", "config", f"prometheus/{name}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    doc = yaml.safe_load((ROOT / "prometheus" / name).read_text(encoding="utf-8"))
    if name.startswith("remote_write"):
        urls = {w["name"]: w["url"] for w in doc["remote_write"]}
        assert urls["thanos"].endswith("/api/v1/receive")
        assert urls["mimir"].endswith("/api/v1/push")
        assert urls["victoriametrics"].endswith("/api/v1/write")
        assert doc["rule_files"] == [f"rules/{f}" for f in RULE_FILES]
    else:
        job = doc["scrape_configs"][0]
        assert job["metrics_path"] == "/federate" and job["honor_labels"] is True


class TwoEngines(Collector):
    """One source emitting a per-engine and a per-GPU family; `fail` makes it time out."""

    def __init__(self, source: str, fail: bool = False):
        self.source = source
        self.fail = fail

    async def collect(self) -> Scrape:
        if self.fail:
            await asyncio.sleep(10)
        ms = MetricSet()
        ms.add("llmb_engine_up", 1, engine=self.source, kind="llamacpp")
        ms.add("llmb_gpu_memory_used_bytes", 5.0, gpu="0")
        return Scrape(ms.metrics())

    def fallback(self) -> list[Metric]:
        ms = MetricSet()
        ms.add("llmb_engine_up", 0, engine=self.source, kind="sglang")
        return ms.metrics()


async def test_runner_adds_host_to_every_family_once() -> None:
    runner = Runner([TwoEngines("a"), TwoEngines("b", fail=True)], host="gpu-a")
    families = await runner.scrape(0.3)
    names = {fam.name for fam in families}
    # own series, collected series and a timed-out source's fallback all carry the host
    assert names == {
        "llmb_engine_up",
        "llmb_gpu_memory_used_bytes",
        "llmb_exporter_build",
        "llmb_source_up",
        "llmb_source_duration_seconds",
        "llmb_source_errors",
    }
    samples = [s for fam in families for s in fam.samples]
    assert samples and all(s.labels["host"] == "gpu-a" for s in samples)
    up = {
        s.labels["engine"]: s.value
        for f in families
        if f.name == "llmb_engine_up"
        for s in f.samples
    }
    assert up == {"a": 1.0, "b": 0.0}
    again = [s for fam in await runner.scrape(0.3) for s in fam.samples]
    assert len(again) == len(samples) and all(s.labels["host"] == "gpu-a" for s in again)
    # Without a host (unit tests, embedding) nothing is added.
    bare = await Runner([TwoEngines("a")]).scrape(1.0)
    assert all("host" not in s.labels for fam in bare for s in fam.samples)


def test_host_defaults_to_the_hostname_and_follows_the_environment() -> None:
    assert parse_config({}, environ={}).host == socket.gethostname()
    assert parse_config({"host": "gpu-a"}, environ={}).host == "gpu-a"
    assert parse_config({"host": "gpu-a"}, environ={"LLMB__HOST": "gpu-b"}).host == "gpu-b"
    assert parse_config({}, environ={"LLMB__HOST": "42"}).host == "42"
    with pytest.raises(ConfigError) as err:
        parse_config({"host": ""}, environ={})
    assert any(e.startswith("host:") for e in err.value.errors), err.value.errors
    runner = build_runner(parse_config({"host": "gpu-c", "gpu": {"enabled": False}}, environ={}))
    assert runner.host == "gpu-c"
