"""Hunt training workloads where the model's reserved memory is low: each grid id through the
oracle's two steps (`peak_reserved_bytes` of its caching-allocator replay) and through the
release `peakfit estimate` (`reserved_bytes`), one line each (docs/oracle.md, "Full fine-tunes
the replays did not follow").

    cargo build --release
    $PEAKFIT_ORACLE_VENV/bin/python tools/oracle/train_hunt.py tools/oracle/train_hunt_cases.txt

A case file holds one oracle-reserved.csv training id a line
(`MODEL-WORKLOAD-DTYPE-bB-tT-gcG-OPT[-rR]`, MODEL a file of tests/data/oracle-configs; `#` starts
a comment). `adamw-loop` is sized as `optimizer: adamw` (the model reads foreach).
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402
import train_events  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../.."))
GIB = 1 << 30


def annotations(c):
    """The `peakfit estimate -a` list for an oracle case."""
    a = dict(engine="hf", workload=c["workload"], dtype=c["dtype"], batch=c["batch"])
    a["context-tokens"] = c["context_tokens"]
    a["gradient-checkpointing"] = c["gradient_checkpointing"]
    a["optimizer"] = "adamw-fused" if c["optimizer"] == "adamw-fused" else (
        "adamw" if c["optimizer"] in ("adamw", "adamw-loop") else c["optimizer"])
    if c["lora_rank"]:
        a["lora-rank"] = c["lora_rank"]
    return ",".join(f"{k}={v}" for k, v in a.items())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cases", help="a file of grid ids, one a line")
    p.add_argument("--peakfit", default=os.path.join(ROOT, "target/release/peakfit"))
    a = p.parse_args(argv)
    ids = [line.split()[0] for line in open(a.cases) if line.strip() and not line.startswith("#")]
    for cid in ids:
        c = dict(train_events.grid_case(cid), steps=2)
        start = time.time()
        try:
            r = oracle._run_case(c)
        except Exception as e:  # one bad case does not stop the hunt
            print(f"{cid:70s} FAILED {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        out = subprocess.run([a.peakfit, "estimate", "--model-config", c["config"], "-a", annotations(c), "--json",
                              "--gpu-memory", "140Gi"], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{cid:70s} ESTIMATE FAILED {out.stderr[:200]}", flush=True)
            continue
        m = json.loads(out.stdout)
        oracle_reserved = r["peak_reserved_bytes"]
        err = 100 * (m["reserved_bytes"] - oracle_reserved) / oracle_reserved
        aerr = 100 * (m["allocated_bytes"] - r["peak_allocated_bytes"]) / r["peak_allocated_bytes"]
        print(f"{cid:70s} oracle {oracle_reserved / GIB:8.3f} model {m['reserved_bytes'] / GIB:8.3f} {err:+6.1f}%  "
              f"alloc {aerr:+5.1f}%  {time.time() - start:5.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
