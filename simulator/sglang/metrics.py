"""SGLang's `/metrics`: the state the simulator feeds and prometheus_client renders, in the
families and label shapes of the release it answers as (`spec`)."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Iterator

from prometheus_client.core import Metric

from simulator.model import Request
from simulator.scenarios import GIB
from simulator.sglang.payloads import SglangSim
from simulator.sglang.spec import FAMILIES, FAMILIES_BY_VERSION, FamilySpec

ENGINE_TYPE = "unified"


class Hist:
    """Cumulative histogram state (what prometheus_client keeps per child)."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        """Count `value` `times` times."""
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += times
                break
        else:
            self.counts[-1] += times
        self.sum += value * times


class SglangMetrics:
    """Metric state fed by the simulator and rendered like SGLang's collectors."""

    def __init__(self, sim: SglangSim):
        self.sim = sim
        self.version = sim.opts.sglang_version
        self.families = FAMILIES_BY_VERSION[self.version]
        self.specs = {f.name: f for f in self.families}
        # Values are fed in 0.5.23's label shape; an older release's children drop the labels it
        # lacks (0.5.11 counts streaming and non-streaming requests together).
        self.fed = {f.name: f.extra for f in FAMILIES}
        self.counters: dict[str, dict[tuple[str, ...], float]] = defaultdict(dict)
        self.hists: dict[str, dict[tuple[str, ...], Hist]] = defaultdict(dict)
        self.active: dict[tuple[str, ...], float] = {}
        self.t0 = time.monotonic()
        self.cpu0 = time.process_time()

    def inc(self, name: str, labels: tuple[str, ...] = (), value: float = 1.0) -> None:
        """Add to a counter child."""
        labels = self._project(name, labels)
        fam = self.counters[name]
        fam[labels] = fam.get(labels, 0.0) + value

    def observe(
        self, name: str, value: float, labels: tuple[str, ...] = (), times: int = 1
    ) -> None:
        """Observe into a histogram child (families this release lacks are not kept)."""
        if name not in self.specs:
            return
        labels = self._project(name, labels)
        fam = self.hists[name]
        if labels not in fam:
            fam[labels] = Hist(self.specs[name].buckets)
        fam[labels].observe(value, times)

    def evicted(self, tokens: int) -> None:
        """The radix cache freed `tokens` device slots."""
        m = self
        labels = ("UnifiedRadixCache", "0")
        m.inc("sglang:evicted_tokens", labels, tokens)
        m.observe("sglang:eviction_duration_seconds", 2e-5 * tokens / 1000, labels)

    def retracted(self, req: Request) -> None:
        """The scheduler retracted `req` (it resumes later)."""
        m = self
        m.inc("sglang:num_retracted_requests")
        m.inc("sglang:num_retracted_input_tokens", (), len(req.prompt))
        m.inc("sglang:num_retracted_output_tokens", (), len(req.generated))

    def finished(self, req: Request) -> None:
        """The per-request counters and histograms of a finished request."""
        m = self
        streaming = ("true",) if req.stream else ("false",)
        n_gen = len(req.generated)
        first = req.prompt_done or req.arrival
        end = req.last_token or first
        m.inc("sglang:prompt_tokens", streaming, len(req.prompt))
        m.inc("sglang:generation_tokens", streaming, n_gen)
        if req.cached:  # SGLang counts cache hits only (the family appears at the first one)
            m.inc("sglang:cached_tokens", ("device",), req.cached)
        m.inc("sglang:num_requests", streaming)
        m.observe("sglang:time_to_first_token_seconds", first - req.arrival, streaming)
        m.observe("sglang:e2e_request_latency_seconds", end - req.arrival, streaming)
        if n_gen > 1:
            tpot = (end - first) / (n_gen - 1)
            m.observe("sglang:request_time_per_output_token_seconds", tpot, streaming)
            m.observe("sglang:inter_token_latency_seconds", tpot, (), n_gen - 1)
        m.observe("sglang:prompt_tokens_histogram", len(req.prompt))
        m.observe("sglang:uncached_prompt_tokens_histogram", len(req.prompt) - req.cached)
        m.observe("sglang:generation_tokens_histogram", n_gen)
        queue = (req.admitted or req.arrival) - req.arrival
        m.observe("sglang:queue_time_seconds", queue)
        m.observe("sglang:per_stage_req_latency_seconds", queue, ("request_process",))
        m.observe(
            "sglang:per_stage_req_latency_seconds",
            first - (req.admitted or req.arrival),
            ("prefill_forward",),
        )
        m.inc("sglang:realtime_tokens", ("prefill_compute",), len(req.prompt) - req.cached)
        m.inc("sglang:realtime_tokens", ("prefill_cache",), req.cached)
        m.inc("sglang:realtime_tokens", ("decode",), n_gen)
        m.inc("sglang:prefill_effective_tokens", ("input",), len(req.prompt))
        m.inc("sglang:prefill_effective_tokens", ("device_hit",), req.cached)
        m.inc("sglang:cuda_graph_passes", ("prefill_none",))
        m.inc("sglang:cuda_graph_passes", ("decode_cuda_graph",), max(0, n_gen - 1))

    def _project(self, name: str, labels: tuple[str, ...]) -> tuple[str, ...]:
        spec = self.specs.get(name)
        fed = self.fed.get(name, ())
        if spec is None or spec.extra == fed or len(labels) != len(fed):
            return labels
        by_name = dict(zip(fed, labels, strict=True))
        return tuple(by_name[n] for n in spec.extra)

    def _gauges(self) -> dict[str, float]:
        e = self.sim.engine
        total = e.params.ctx_total
        used = e.kv_used()
        evictable = e.kv_cached_idle()
        return {
            "sglang:max_total_num_tokens": total,
            "sglang:weight_memory_usage_gb": round(e.weights_gpu / GIB, 2),
            "sglang:kv_cache_memory_usage_gb": round(e.kv_pool_bytes * e.kv_gpu_share / GIB, 2),
            "sglang:page_size": 1,
            "sglang:num_pages": total,
            "sglang:context_len": e.params.context_len,
            "sglang:startup_available_gpu_memory_gb": round(
                (e.gpu.total_bytes - e.gpu.driver_bytes - e.weights_gpu) / GIB, 2
            ),
            "sglang:num_running_reqs": len(e.running),
            "sglang:num_queue_reqs": min(len(e.waiting), e.queued_after_admit),
            "sglang:gen_throughput": e.gen_throughput(),
            "sglang:cache_hit_rate": e.stats.last_cache_hit_rate,
            "sglang:decode_sum_seq_lens": used,
            "sglang:token_usage": round(used / total, 2) if total else 0.0,
            "sglang:full_token_usage": used / total if total else 0.0,
            "sglang:num_used_tokens": used,
            "sglang:kv_available_tokens": max(0, total - used - evictable),
            "sglang:kv_evictable_tokens": evictable,
            "sglang:kv_used_tokens": used,
            "sglang:new_token_ratio": e.params.new_token_ratio,
            "sglang:is_cuda_graph": 1.0 if e.running else 0.0,
            "sglang:fwd_occupancy": float("nan"),
            "sglang:num_retracted_reqs": sum(1 for r in e.waiting if r.retractions),
            # 0.5.11 declares these two but never sets them: the real server reads 0.
            "sglang:engine_startup_time": 0.0,
            "sglang:engine_load_weights_time": 0.0,
            **self._spec_gauges(),
        }

    def _spec_gauges(self) -> dict[str, float]:
        """Speculative decoding gauges (EAGLE): tokens per verify step and acceptance."""
        e, st = self.sim.engine, self.sim.engine.stats
        if e.params.spec_draft_max <= 0 or not st.spec_drafts:
            return {}
        return {
            "sglang:spec_accept_length": (st.spec_accepted + st.spec_drafts) / st.spec_drafts,
            "sglang:spec_accept_rate": st.spec_accepted / st.spec_draft_tokens,
            "sglang:spec_num_steps": float(e.params.spec_draft_max),
            "sglang:spec_num_draft_tokens": float(e.params.spec_draft_max + 1),
        }

    def _values(self, spec: FamilySpec) -> dict[tuple[str, ...], float]:
        name = spec.name
        sim = self.sim
        if name in self.counters or spec.type == "counter":
            seeded = {} if spec.lazy else {s: 0.0 for s in spec.seeds or ((),)}
            seeded.update(self.counters.get(name, {}))
            if name == "sglang:process_cpu_seconds":
                cpu = time.process_time() - self.cpu0
                return {("tokenizer",): cpu * 0.3, ("detokenizer",): cpu * 0.05}
            if name == "sglang:scheduler_idle_seconds":
                return {(): self.sim.idle_seconds()}
            return seeded
        if name == "sglang:graph_memory_usage_gb":
            return {
                s: (round(sim.engine.params.graph_bytes / GIB, 2) if s == ("decode",) else 0.0)
                for s in spec.seeds
            }
        if name == "sglang:startup_time_seconds":
            load = sim.engine.loaded_at
            return {
                ("load_weight",): load * 0.5,
                ("kv_cache_allocation",): load * 0.05,
                ("scheduler_e2e",): load * 0.95,
                ("tokenizer_e2e",): load,
            }
        if name in ("sglang:num_retracted_reqs", "sglang:num_paused_reqs"):
            value = self._gauges().get(name, 0.0)
            return {(str(os.getpid()),): float(value)}
        if name == "sglang:http_requests_active":
            return dict(self.active)
        gauges = self._gauges()
        return {s: float(gauges.get(name, 0.0)) for s in spec.seeds or ((),)}

    def _labels(self, spec: FamilySpec, values: tuple[str, ...]) -> dict[str, str]:
        labels: dict[str, str] = {}
        if spec.scope in ("rank", "model"):
            labels["engine_type"] = ENGINE_TYPE
            labels["model_name"] = self.sim.model_name
        if spec.scope == "rank":
            labels.update(moe_ep_rank="0", pp_rank="0", tp_rank="0")
        elif spec.scope == "cache":  # radix-cache metrics carry only the ranks
            labels.update(pp_rank="0", tp_rank="0")
        labels.update(zip(spec.extra, values, strict=True))
        return labels

    def collect(self) -> Iterator[Metric]:
        """Families in SGLang's shape: sorted labels, `_sum` first, no `_created`."""
        prefix = "sglang_" if self.sim.opts.metric_spelling == "underscore" else "sglang:"
        for spec in self.families:
            name = prefix + spec.name.split(":", 1)[1]
            metric = Metric(name, spec.help, spec.type)
            if spec.type == "histogram":
                children = dict(self.hists.get(spec.name, {}))
                if not spec.lazy:
                    for seed in spec.seeds or ((),):
                        children.setdefault(seed, Hist(spec.buckets))
                if not children:
                    continue
                for key, hist in children.items():
                    base = self._labels(spec, key)
                    metric.add_sample(name + "_sum", dict(sorted(base.items())), hist.sum)
                    acc = 0
                    bounds = [*(_le(b) for b in spec.buckets), "+Inf"]
                    for bound, count in zip(bounds, hist.counts, strict=True):
                        acc += count
                        labels = dict(sorted({**base, "le": bound}.items()))
                        metric.add_sample(name + "_bucket", labels, float(acc))
                    metric.add_sample(name + "_count", dict(sorted(base.items())), float(acc))
            else:
                values = self._values(spec)
                if not values:
                    continue
                suffix = "_total" if spec.type == "counter" else ""
                for key, value in values.items():
                    labels = dict(sorted(self._labels(spec, key).items()))
                    metric.add_sample(name + suffix, labels, float(value))
            yield metric


def _le(bound: float) -> str:
    """Bucket bound as prometheus_client writes it (0.1 -> '0.1', 1 -> '1.0')."""
    return repr(float(bound))
