"""Long prompts against a running SGLang server, one at a time: random token ids (no prefix
cache), one generated token, streamed. Per request: the client's time to the first chunk,
the response's `meta_info`, SGLang's /metrics counters and histogram sums before and after,
and the card's clocks right after."""

import json
import random
import subprocess
import sys
import time
import urllib.request

URL, OUT = sys.argv[1], sys.argv[2]
SMI = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"


def smi() -> str:
    cmd = ["nvidia-smi", f"--query-gpu={SMI}", "--format=csv,noheader"]
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()


def scrape() -> dict:
    """SGLang's counters, histogram sums and counts (no buckets), keyed by series."""
    text = urllib.request.urlopen(URL + "/metrics", timeout=30).read().decode()
    series = {}
    for line in text.splitlines():
        if line.startswith("sglang:") and "_bucket{" not in line:
            key, _, value = line.rpartition(" ")
            series[key] = float(value)
    return series


def post(tokens: int, seed: int, warmup: bool) -> dict:
    rng = random.Random(seed)
    body = {
        "input_ids": [rng.randrange(100, 31900) for _ in range(tokens)],
        "sampling_params": {"max_new_tokens": 1, "ignore_eos": True, "temperature": 0},
        "stream": True,
    }
    before = scrape()
    req = urllib.request.Request(
        URL + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    t0 = time.time()
    first, last = None, None
    with urllib.request.urlopen(req, timeout=600) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            first = first or time.time() - t0
            last = json.loads(line[5:])
    wall = time.time() - t0
    gpu = smi()
    time.sleep(0.5)  # let the scheduler's histograms land before the second scrape
    return {
        "prompt_tokens_sent": tokens,
        "seed": seed,
        "warmup": warmup,
        "client_ttft_s": first,
        "wall_s": wall,
        "meta_info": (last or {}).get("meta_info"),
        "metrics_before": before,
        "metrics_after": scrape(),
        "gpu_after": gpu,
    }


doc = {"gpu_idle": smi()}
for path in ("/server_info", "/get_model_info"):
    doc[path.strip("/")] = json.loads(urllib.request.urlopen(URL + path, timeout=60).read())
runs = [post(n, i, True) for i, n in enumerate((512, 8192, 32768))]  # Triton JIT, autotune
for n in (8192, 8192, 32768, 32768):
    runs.append(post(n, len(runs), False))
    print(n, runs[-1]["client_ttft_s"], runs[-1]["meta_info"], flush=True)
doc["runs"] = runs
json.dump(doc, open(OUT, "w"), indent=1)
