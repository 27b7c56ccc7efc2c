#!/usr/bin/env python3
"""Print `peakfit estimate`'s NVML peak for measure.py's cases, and the `gib` hint it suggests.

usage: hints.py PEAKFIT_BINARY PREFIX      (e.g. target/debug/peakfit h200b-)

The parent of measure.py starts a case only while the hints of the running cases sum under its
budget; a hint ~1.3 x the expected peak keeps neighbours from cutting each other's reserve. The
estimate is the model's prediction before the rows exist, so a row it under-predicts badly may
still run out beside others: the parent reruns such a case alone.
"""
import json, math, os, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
from to_csv import annotation_optimizer  # noqa: E402

GIB = 2 ** 30


def annotations(c):
    a = dict(engine="hf", workload=c["workload"], dtype=c["dtype"], batch=c["batch"], context_tokens=c["ctx"])
    if c.get("new"):
        a["prompt_tokens"] = c["ctx"] - c["new"]
    if c.get("ckpt"):
        a["gradient_checkpointing"] = c["ckpt"]
    if c.get("optim"):
        a["optimizer"] = annotation_optimizer(c["optim"])
    if c.get("rank"):
        a["lora_rank"] = c["rank"]
    if c.get("attn") == "eager":
        a["flash_attention"] = "false"
    return ",".join(f"{k.replace('_', '-')}={v}" for k, v in a.items())


def main(binary, prefix):
    for c in measure.CASES:
        if not c["id"].startswith(prefix):
            continue
        cfg = os.path.join(measure.CONFIGS, c["model"] + ".json")
        out = subprocess.run([binary, "estimate", "--model-config", cfg, "-a", annotations(c),
                              "--gpu-memory", "141Gi", "--json"], capture_output=True, text=True)
        if out.returncode:
            print(f"{c['id']:44s} ERROR {out.stderr.strip()[:200]}")
            continue
        peak = json.loads(out.stdout)["per_gpu_bytes"] / GIB
        print(f"{c['id']:44s} estimate {peak:6.1f} GiB  hint {math.ceil(peak * 1.3):3d}  (set {c.get('gib')})")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
