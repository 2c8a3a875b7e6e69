"""Long prompts against a running llama-server: each as random token ids (no prefix cache),
one token generated; llama-server's own `timings` per request and the card's clocks."""

import json
import random
import subprocess
import sys
import time
import urllib.request

URL, OUT = sys.argv[1], sys.argv[2]


def post(tokens: int, seed: int) -> dict:
    rng = random.Random(seed)
    body = {
        "prompt": [rng.randrange(1000, 200000) for _ in range(tokens)],
        "n_predict": 1,
        "cache_prompt": False,
        "temperature": 0,
    }
    req = urllib.request.Request(
        URL + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=600) as resp:
        doc = json.loads(resp.read())
    smi = subprocess.run(
        [
            "nvidia-smi",
            "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active",
            "--format=csv,noheader",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "prompt_tokens_sent": tokens,
        "seed": seed,
        "wall_s": time.time() - t0,
        "timings": doc.get("timings"),
        "tokens_evaluated": doc.get("tokens_evaluated"),
        "gpu_after": smi,
    }


runs = [post(512, 0)]  # warm-up (CUDA graphs, kernels)
for n in (8192, 8192, 32768, 32768):
    runs.append(post(n, len(runs)))
    print(n, runs[-1]["timings"]["prompt_per_second"], flush=True)
json.dump({"runs": runs}, open(OUT, "w"), indent=1)
