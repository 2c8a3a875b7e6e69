"""NVML collector: replays of the real H200 captures, peaks, attribution, failure paths."""

from __future__ import annotations

import asyncio
import copy
import csv
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric

from config.settings import EngineConfig, GpuConfig
from exporter.attribution import Attribution
from exporter.collectors import Scrape
from exporter.collectors.nvml.backend import (
    MemoryInfo,
    NvmlError,
    NvmlFileBackend,
    PynvmlBackend,
    read_proc_cmdline,
)
from exporter.collectors.nvml.collector import NvmlCollector, WindowMax
from exporter.runner import Runner
from tests.paths import FIXTURES, ROOT

H200 = FIXTURES / "llamacpp-h200-gemma3-27b-shape-q4_0"
CAPTURES = sorted(H200.glob("nvml_*.json")) + sorted((H200 / "run2").glob("nvml_*.json"))
MIB = 1024 * 1024

LLAMA = EngineConfig(name="llama", kind="llamacpp", url="http://127.0.0.1:8080")
OTHER = EngineConfig(name="other", kind="llamacpp", url="http://127.0.0.1:8081")


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def samples(scrape: Scrape) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """All samples of a scrape keyed by (sample name, labels)."""
    out = {}
    fam: Metric
    for fam in scrape.metrics:
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(scrape: Scrape, name: str, /, **labels: str) -> float:
    return samples(scrape)[(name, frozenset(labels.items()))]


def names(scrape: Scrape) -> set[str]:
    return {name for name, _ in samples(scrape)}


def read_smi(path: Path) -> tuple[dict[str, float], list[dict[str, str]]]:
    """nvidia-smi's GPU line (memory.used/total in MiB, util %) and its process lines."""
    rows = [[c.strip() for c in row] for row in csv.reader(path.read_text().splitlines()) if row]
    _ts, used, total, util = rows[0]
    gpu = {
        "used_mib": float(used.split()[0]),
        "total_mib": float(total.split()[0]),
        "util_pct": float(util.split()[0]),
    }
    procs = [
        {"pid": r[0], "process_name": r[1], "used_mib": r[2].split()[0]}
        for r in rows[2:]  # rows[1] is the process header
    ]
    return gpu, procs


def collector(
    files: list[Path] | Path,
    engines: list[EngineConfig] | None = None,
    clock: FakeClock | None = None,
    **gpu: Any,
) -> NvmlCollector:
    files = [files] if isinstance(files, Path) else files
    config = GpuConfig(fake_file=files, **gpu)
    attribution = Attribution([LLAMA, OTHER] if engines is None else engines)
    return NvmlCollector(config, attribution, clock=clock or FakeClock())


def write_reading(path: Path, reading: dict[str, Any]) -> None:
    """Replace a fake NVML file atomically, as the simulators must."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(reading))
    os.replace(tmp, path)


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def capture(name: str = "nvml_3_generating.json") -> dict[str, Any]:
    return load(H200 / name)


def with_memory(reading: dict[str, Any], used: int, proc_used: int) -> dict[str, Any]:
    """A copy of a capture with device and process memory set."""
    out = copy.deepcopy(reading)
    dev = out["devices"][0]
    v2 = dev["mem_v2"]
    v2["used"] = used
    v2["free"] = v2["total"] - v2["reserved"] - used
    dev["mem"]["used"] = used + v2["reserved"]
    dev["mem"]["free"] = v2["free"]
    dev["procs"][0]["used"] = proc_used
    return out


# --- the real captures --------------------------------------------------------------------


def test_all_captures_found() -> None:
    assert len(CAPTURES) == 13  # 10 in the first session, 3 in run2/


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.stem)
async def test_capture_replay_matches_nvml_and_nvidia_smi(path: Path) -> None:
    raw = load(path)
    dev = raw["devices"][0]
    scrape = await collector(path).collect()
    assert scrape.up and not scrape.errors
    gpu = {"gpu": "0"}

    # Against the NVML capture itself: exact.
    v2 = dev["mem_v2"]
    assert value(scrape, "llmb_gpu_memory_total_bytes", **gpu) == v2["total"]
    assert value(scrape, "llmb_gpu_memory_used_bytes", **gpu) == v2["used"]
    assert value(scrape, "llmb_gpu_memory_free_bytes", **gpu) == v2["free"]
    assert value(scrape, "llmb_gpu_memory_reserved_bytes", **gpu) == v2["reserved"]
    assert value(scrape, "llmb_gpu_memory_used_peak_bytes", **gpu) == v2["used"]
    assert value(scrape, "llmb_gpu_utilization_ratio", **gpu) == dev["util"]["gpu"] / 100
    assert value(scrape, "llmb_gpu_memory_clock_hertz", **gpu) == dev["mem_clock_mhz"] * 1e6
    assert value(scrape, "llmb_gpu_memory_bus_width_bytes", **gpu) == dev["bus_width"] / 8
    assert value(scrape, "llmb_gpu_memory_bandwidth_bytes_per_second", **gpu) == 4.8e12
    info = {
        "gpu": "0",
        "uuid": dev["uuid"],
        "name": "NVIDIA H200",
        "driver": raw["driver"],
        "bandwidth_source": "table",
    }
    assert value(scrape, "llmb_gpu_info", **info) == 1

    # Against nvidia-smi read at the same moment: within 2 % (nvidia-smi rounds to MiB).
    smi_gpu, smi_procs = read_smi(
        path.parent / path.name.replace("nvml_", "smi_").replace(".json", ".csv")
    )
    used = value(scrape, "llmb_gpu_memory_used_bytes", **gpu) / MIB
    assert used == pytest.approx(smi_gpu["used_mib"], rel=0.02, abs=1)
    total = value(scrape, "llmb_gpu_memory_total_bytes", **gpu) / MIB
    assert total == pytest.approx(smi_gpu["total_mib"], rel=0.02)

    assert len(smi_procs) == len(dev["procs"])
    engine_total = 0.0
    for proc, smi in zip(dev["procs"], smi_procs, strict=True):
        labels = {"gpu": "0", "pid": str(proc["pid"]), "process": "llama-server", "engine": "llama"}
        assert smi["pid"] == labels["pid"]
        assert Path(smi["process_name"]).name == labels["process"]
        proc_bytes = value(scrape, "llmb_gpu_process_memory_used_bytes", **labels)
        assert proc_bytes == proc["used"]
        assert proc_bytes / MIB == pytest.approx(float(smi["used_mib"]), rel=0.02)
        assert value(scrape, "llmb_gpu_process_memory_used_peak_bytes", **labels) == proc["used"]
        engine_total += proc_bytes
    llama = {"engine": "llama", "kind": "llamacpp"}
    assert value(scrape, "llmb_engine_process_gpu_memory_bytes", **llama) == engine_total
    assert value(scrape, "llmb_engine_process_gpu_memory_peak_bytes", **llama) == engine_total
    assert value(scrape, "llmb_gpu_samples_total") == 1


async def test_used_is_nvml_v2_which_equals_nvidia_smi() -> None:
    """NVML v1 'used' includes the 615 MiB the driver reserves; nvidia-smi and we do not."""
    raw = capture("nvml_3_generating.json")
    smi_gpu, _ = read_smi(H200 / "smi_3_generating.csv")
    scrape = await collector(H200 / "nvml_3_generating.json").collect()
    used = value(scrape, "llmb_gpu_memory_used_bytes", gpu="0")
    assert used == 17361076224
    assert smi_gpu["used_mib"] == 16557
    assert used / MIB == pytest.approx(16557, abs=0.5)
    v1_used_mib = raw["devices"][0]["mem"]["used"] / MIB
    assert v1_used_mib - smi_gpu["used_mib"] == pytest.approx(615, abs=1)  # 644939776 B reserved


async def test_nvidia_smi_utilization_is_a_different_sampling_moment() -> None:
    """Utilization is checked against the NVML capture only: nvidia-smi sampled it apart."""
    smi_gpu, _ = read_smi(H200 / "smi_4_after.csv")
    scrape = await collector(H200 / "nvml_4_after.json").collect()
    assert value(scrape, "llmb_gpu_utilization_ratio", gpu="0") == 0.0
    assert smi_gpu["util_pct"] == 57  # read ~140 ms later, while the last tokens were decoded


# --- attribution --------------------------------------------------------------------------


async def test_llama_server_process_goes_to_the_engine_on_its_port() -> None:
    scrape = await collector(H200 / "nvml_2_loaded.json").collect()
    proc = {"gpu": "0", "pid": "16664", "process": "llama-server", "engine": "llama"}
    assert value(scrape, "llmb_gpu_process_memory_used_bytes", **proc) == 17328766976
    assert value(
        scrape, "llmb_engine_process_gpu_memory_bytes", engine="llama", kind="llamacpp"
    ) == (17328766976)
    # The engine on 8081 has no process: an explicit 0, not a missing series.
    assert (
        value(scrape, "llmb_engine_process_gpu_memory_bytes", engine="other", kind="llamacpp") == 0
    )
    assert (
        value(scrape, "llmb_engine_process_gpu_memory_peak_bytes", engine="other", kind="llamacpp")
        == 0
    )


async def test_process_of_no_configured_engine_has_empty_engine_label() -> None:
    scrape = await collector(H200 / "nvml_2_loaded.json", engines=[OTHER]).collect()
    proc = {"gpu": "0", "pid": "16664", "process": "llama-server", "engine": ""}
    assert value(scrape, "llmb_gpu_process_memory_used_bytes", **proc) == 17328766976
    assert (
        value(scrape, "llmb_engine_process_gpu_memory_bytes", engine="other", kind="llamacpp") == 0
    )


async def test_engine_reported_pid_wins() -> None:
    c = collector(H200 / "nvml_2_loaded.json")
    c.attribution.report_pids("other", {16664})
    scrape = await c.collect()
    proc = {"gpu": "0", "pid": "16664", "process": "llama-server", "engine": "other"}
    assert value(scrape, "llmb_gpu_process_memory_used_bytes", **proc) == 17328766976
    assert (
        value(scrape, "llmb_engine_process_gpu_memory_bytes", engine="llama", kind="llamacpp") == 0
    )


# --- windowed peaks -----------------------------------------------------------------------


def test_window_max_keeps_the_highest_value_until_it_expires() -> None:
    win = WindowMax(10.0)
    win.add(0.0, 5)
    win.add(1.0, 9)
    win.add(2.0, 3)
    assert win.max(2.0) == 9
    assert win.max(10.9) == 9
    assert win.max(11.0) == 3  # the 9 recorded at t=1 is 10 s old: out of the window
    assert win.max(12.0) is None


async def test_spike_between_scrapes_shows_in_peak_then_expires(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "nvml.json"
    base = capture()
    low, high = 17_000_000_000, 40_000_000_000
    write_reading(path, with_memory(base, low, low - 9_000_000))
    c = collector(path, clock=clock, peak_window_seconds=30)
    first = await c.collect()
    assert value(first, "llmb_gpu_memory_used_peak_bytes", gpu="0") == low

    # A 0.2 s spike that no scrape sees, only the sampler.
    clock.now += 5
    write_reading(path, with_memory(base, high, high - 9_000_000))
    assert c.sample_once()
    clock.now += 0.1
    assert c.sample_once()
    clock.now += 0.1
    write_reading(path, with_memory(base, low, low - 9_000_000))
    assert c.sample_once()

    clock.now += 10  # next scrape
    second = await c.collect()
    proc = {"gpu": "0", "pid": "16664", "process": "llama-server", "engine": "llama"}
    llama = {"engine": "llama", "kind": "llamacpp"}
    assert value(second, "llmb_gpu_memory_used_bytes", gpu="0") == low
    assert value(second, "llmb_gpu_memory_used_peak_bytes", gpu="0") == high
    assert value(second, "llmb_gpu_process_memory_used_bytes", **proc) == low - 9_000_000
    assert value(second, "llmb_gpu_process_memory_used_peak_bytes", **proc) == high - 9_000_000
    assert value(second, "llmb_engine_process_gpu_memory_bytes", **llama) == low - 9_000_000
    assert value(second, "llmb_engine_process_gpu_memory_peak_bytes", **llama) == high - 9_000_000
    assert value(second, "llmb_gpu_samples_total") == 5

    clock.now += 30  # the spike (at +5.0 .. +5.1) is now older than the 30 s window
    third = await c.collect()
    assert value(third, "llmb_gpu_memory_used_peak_bytes", gpu="0") == low
    assert value(third, "llmb_gpu_process_memory_used_peak_bytes", **proc) == low - 9_000_000
    assert value(third, "llmb_engine_process_gpu_memory_peak_bytes", **llama) == low - 9_000_000


async def test_background_sampler_catches_a_spike_no_scrape_sees(tmp_path: Path) -> None:
    path = tmp_path / "nvml.json"
    base = capture()
    low, high = 17_000_000_000, 30_000_000_000
    write_reading(path, with_memory(base, low, low - 9_000_000))
    c = NvmlCollector(
        GpuConfig(fake_file=[path], sample_interval_seconds=0.01),
        Attribution([LLAMA]),
    )

    def wait_for_samples(n: int) -> None:
        target = c.samples_total + n
        deadline = time.monotonic() + 5
        while c.samples_total < target:
            assert time.monotonic() < deadline, "sampler stalled"
            time.sleep(0.005)

    await c.start()
    try:
        wait_for_samples(3)
        write_reading(path, with_memory(base, high, high - 9_000_000))
        wait_for_samples(3)
        write_reading(path, with_memory(base, low, low - 9_000_000))
        wait_for_samples(3)
        scrape = await c.collect()
    finally:
        await c.close()
    assert value(scrape, "llmb_gpu_memory_used_bytes", gpu="0") == low
    assert value(scrape, "llmb_gpu_memory_used_peak_bytes", gpu="0") == high
    assert value(scrape, "llmb_gpu_samples_total") >= 10
    assert c._thread is None


# --- several files (one per simulator), devices filter, formats ---------------------------


async def test_files_of_two_simulators_merge_on_the_device_index(tmp_path: Path) -> None:
    base = capture()
    a = copy.deepcopy(base)
    a["devices"][0]["mem_v2"]["used"] = 10_000_000_000
    a["devices"][0]["mem"]["used"] = 10_000_000_000 + 644939776
    a["devices"][0]["procs"] = [
        {"pid": 111, "used": 9_990_000_000, "cmdline": "llama-server --port 8080"}
    ]
    b = copy.deepcopy(a)
    b["devices"][0]["mem_v2"]["used"] = 5_000_000_000
    b["devices"][0]["mem"]["used"] = 5_000_000_000 + 644939776
    b["devices"][0]["util"] = {"gpu": 97, "memory": 40}
    b["devices"][0]["procs"] = [
        {"pid": 222, "used": 4_990_000_000, "cmdline": "llama-server --port 8081"}
    ]
    write_reading(tmp_path / "a.json", a)
    write_reading(tmp_path / "b.json", b)
    scrape = await collector([tmp_path / "a.json", tmp_path / "b.json"]).collect()
    total = base["devices"][0]["mem_v2"]["total"]
    assert value(scrape, "llmb_gpu_memory_used_bytes", gpu="0") == 15_000_000_000
    assert (
        value(scrape, "llmb_gpu_memory_free_bytes", gpu="0") == total - 644939776 - 15_000_000_000
    )
    assert value(scrape, "llmb_gpu_utilization_ratio", gpu="0") == 0.97
    assert value(
        scrape, "llmb_engine_process_gpu_memory_bytes", engine="llama", kind="llamacpp"
    ) == (9_990_000_000)
    assert value(
        scrape, "llmb_engine_process_gpu_memory_bytes", engine="other", kind="llamacpp"
    ) == (4_990_000_000)
    assert {n for n in names(scrape) if n == "llmb_gpu_info"} == {"llmb_gpu_info"}


async def test_missing_file_contributes_nothing_and_source_recovers(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    c = collector([a, b])
    down = await c.collect()
    assert not down.up and down.errors[0].reason == "connect"
    assert down.metrics == []
    write_reading(b, capture("nvml_2_loaded.json"))  # a simulator starts: no 30 s wait
    up = await c.collect()
    assert up.up
    assert value(up, "llmb_gpu_memory_used_bytes", gpu="0") == 17338007552


async def test_half_written_file_is_a_parse_error(tmp_path: Path) -> None:
    path = tmp_path / "nvml.json"
    path.write_text('{"devices": [{"index": 0, ')
    scrape = await collector(path).collect()
    assert not scrape.up
    assert scrape.errors[0].reason == "parse"


async def test_devices_filter_by_index_and_uuid(tmp_path: Path) -> None:
    reading = capture()
    second = copy.deepcopy(reading["devices"][0])
    second.update(index=1, uuid="GPU-00000000-1111-2222-3333-444444444444", procs=[])
    reading["devices"].append(second)
    path = tmp_path / "two.json"
    write_reading(path, reading)

    everything = await collector(path).collect()
    assert value(everything, "llmb_gpu_memory_total_bytes", gpu="1") == second["mem_v2"]["total"]

    only_1 = await collector(path, devices=[1]).collect()
    gpus = {dict(k[1]).get("gpu") for k in samples(only_1) if k[0] == "llmb_gpu_memory_used_bytes"}
    assert gpus == {"1"}
    assert (
        value(only_1, "llmb_engine_process_gpu_memory_bytes", engine="llama", kind="llamacpp") == 0
    )

    only_0 = await collector(path, devices=[reading["devices"][0]["uuid"]]).collect()
    gpus = {dict(k[1]).get("gpu") for k in samples(only_0) if k[0] == "llmb_gpu_memory_used_bytes"}
    assert gpus == {"0"}
    assert (
        value(only_0, "llmb_engine_process_gpu_memory_bytes", engine="llama", kind="llamacpp")
        == (reading["devices"][0]["procs"][0]["used"])
    )


async def test_v1_only_reading_has_no_reserved(tmp_path: Path) -> None:
    reading = capture()
    del reading["devices"][0]["mem_v2"]
    path = tmp_path / "old_driver.json"
    write_reading(path, reading)
    scrape = await collector(path).collect()
    assert (
        value(scrape, "llmb_gpu_memory_used_bytes", gpu="0") == reading["devices"][0]["mem"]["used"]
    )
    assert "llmb_gpu_memory_reserved_bytes" not in names(scrape)


async def test_unsupported_optional_queries_drop_only_their_families(tmp_path: Path) -> None:
    reading = capture()
    for key in ("util", "bus_width", "mem_clock_mhz", "max_mem_clock_mhz"):
        del reading["devices"][0][key]
    reading["devices"][0]["name"] = "NVIDIA Future GPU"
    path = tmp_path / "partial.json"
    write_reading(path, reading)
    scrape = await collector(path).collect()
    assert scrape.up
    got = names(scrape)
    for family in (
        "llmb_gpu_utilization_ratio",
        "llmb_gpu_memory_clock_hertz",
        "llmb_gpu_memory_bus_width_bytes",
        "llmb_gpu_memory_bandwidth_bytes_per_second",
    ):
        assert family not in got
    info = [dict(k[1]) for k in samples(scrape) if k[0] == "llmb_gpu_info"]
    assert info[0]["bandwidth_source"] == "none"
    assert value(scrape, "llmb_gpu_memory_used_bytes", gpu="0") == 17361076224


def test_fake_backend_reports_capture_fields() -> None:
    fake = NvmlFileBackend(H200 / "nvml_7_c128k_loaded.json")
    fake.init()
    assert fake.device_count() == 1
    assert fake.driver_version() == "580.159.04"
    assert fake.memory(0) == MemoryInfo(150754820096, 27530166272, 122579714048, 644939776)
    assert fake.memory_clock_mhz(0) == (3201, 3201)
    assert fake.bus_width_bits(0) == 6016
    assert [p.pid for p in fake.processes(0)] == [16847]
    assert fake.cmdline(16847)[0] == "/opt/llama/bin/llama-server"
    assert "--port" in fake.cmdline(16847)


# --- no driver / no GPU -------------------------------------------------------------------


class BrokenBackend(NvmlFileBackend):
    """A backend whose init fails like NVML without a driver, until `fixed`."""

    def __init__(self, files: list[Path]):
        super().__init__(files)
        self.init_calls = 0
        self.fixed = False

    def init(self) -> None:
        self.init_calls += 1
        if not self.fixed:
            raise NvmlError("NVML Shared Library Not Found", 12)
        super().init()


async def test_no_driver_source_down_no_crash_retry_later(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    backend = BrokenBackend([H200 / "nvml_2_loaded.json"])
    c = NvmlCollector(GpuConfig(), Attribution([LLAMA]), backend=backend, clock=clock)
    runner = Runner([c])
    with caplog.at_level(logging.WARNING, logger="exporter.collectors.nvml.collector"):
        for _ in range(3):
            scrape = await c.collect()
            assert not scrape.up and scrape.metrics == []
            assert scrape.errors[0].reason == "connect"
            assert "Shared Library Not Found" in str(scrape.errors[0])
            assert not c.sample_once()
            families = {f.name: f for f in await runner.scrape()}
            up = [s for s in families["llmb_source_up"].samples if s.labels["source"] == "nvml"]
            assert up[0].value == 0
            assert not any(name.startswith("llmb_gpu") for name in families)
    assert backend.init_calls == 1  # not on every scrape
    # Logged once by the collector (with the retry period) and once by the runner.
    logged = [r.name for r in caplog.records if "NVML unavailable" in r.getMessage()]
    assert sorted(logged) == ["exporter.collectors.nvml.collector", "exporter.runner"]

    backend.fixed = True
    clock.now += 29
    assert not (await c.collect()).up
    assert backend.init_calls == 1
    clock.now += 2
    scrape = await c.collect()
    assert backend.init_calls == 2
    assert scrape.up
    assert value(scrape, "llmb_gpu_memory_used_bytes", gpu="0") == 17338007552


def pynvml_works() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


async def test_real_pynvml_backend_on_this_machine() -> None:
    """The real code path: without a driver (CI) it must fail cleanly; with one, read the GPU."""
    c = NvmlCollector(GpuConfig(), Attribution([LLAMA]))
    assert isinstance(c.backend, PynvmlBackend)
    await c.start()
    try:
        scrape = await asyncio.wait_for(c.collect(), timeout=30)
    finally:
        await c.close()
    if pynvml_works():
        assert scrape.up
        assert value(scrape, "llmb_gpu_memory_total_bytes", gpu="0") > 0
    else:
        assert not scrape.up
        assert scrape.metrics == []
        assert scrape.errors[0].reason == "connect"
        assert "NVML" in str(scrape.errors[0])


# --- command lines ------------------------------------------------------------------------


def test_cmdline_from_an_injected_proc_root(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cmdline").write_bytes(
        b"/usr/bin/python3\0-m\0sglang.launch_server\0--port\0 30000\0"
    )
    backend = PynvmlBackend(proc_root=tmp_path)
    assert backend.cmdline(4242) == [
        "/usr/bin/python3",
        "-m",
        "sglang.launch_server",
        "--port",
        " 30000",
    ]
    assert backend.cmdline(4243) == []


def test_cmdline_of_a_real_process() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--port", "8080"])
    try:
        # Until the child has exec'd, /proc shows the forking parent's (or no) argv.
        deadline = time.monotonic() + 10
        argv = read_proc_cmdline(Path("/proc"), proc.pid)
        while argv[-2:] != ["--port", "8080"] and time.monotonic() < deadline:
            time.sleep(0.01)
            argv = read_proc_cmdline(Path("/proc"), proc.pid)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert argv[0] == sys.executable
    assert argv[-2:] == ["--port", "8080"]
    assert Attribution([LLAMA]).engine_for(proc.pid, " ".join(argv)) is None  # not llama-server


# --- benchmark script ---------------------------------------------------------------------


def test_sampling_benchmark_runs() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "nvml_sampling.py"), "--seconds", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["backend"] == "fake"
    assert 5 <= report["samples"] <= 12  # 10 Hz for 1 s
    assert 0 < report["cpu_percent_of_one_core"] < 100


# --- wrong-typed fake readings behave like NVML errors ------------------------------------


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("mem_v2", {"total": "big", "used": 1, "free": 1, "reserved": 0}),
        ("mem_v2", 5),
        ("util", {"gpu": "busy", "memory": 1}),
        ("util", {"gpu": float("inf"), "memory": 1}),
        ("bus_width", [6016]),
        ("procs", [{"pid": "x", "used": 1}]),
        ("procs", 7),
    ],
)
async def test_wrong_typed_fake_value_is_an_nvml_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, field: str, bad: Any
) -> None:
    reading = json.loads((H200 / "nvml_2_loaded.json").read_text())
    reading["devices"][0][field] = bad
    path = tmp_path / "bad.json"
    # json.dumps writes inf as Infinity, which json.loads reads back: a file can hold it.
    path.write_text(json.dumps(reading))
    c = NvmlCollector(
        GpuConfig(sample_interval_seconds=0.01),
        Attribution([LLAMA]),
        backend=NvmlFileBackend([path]),
    )
    runner = Runner([c])
    with caplog.at_level(logging.DEBUG):
        await runner.start()
        try:
            for _ in range(5):
                families = {f.name: f for f in await runner.scrape()}
                await asyncio.sleep(0.1)  # ~10 background samples per scrape
        finally:
            await runner.close()
    up = [s for s in families["llmb_source_up"].samples if s.labels["source"] == "nvml"]
    assert up[0].value == 0
    errors = {s.labels["reason"]: s.value for s in families["llmb_source_errors"].samples}
    assert errors == {"parse": 5}
    assert not [r for r in caplog.records if r.exc_info], "no traceback for a bad reading"
    # One warning from the runner for the whole run, not one per scrape or sample.
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "reason=parse error=NVML: fake NVML" in warned[0].getMessage()
