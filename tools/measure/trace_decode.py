"""Reserved memory and the caching allocator's large segments at each decode step of HF `generate`.

Issue 20's long generations: the relocations of `DynamicCache`'s `torch.cat` past the first
decode step. Run on a machine with one NVIDIA GPU, torch and transformers, from a checkout:

    OUT=out python3 tools/measure/trace_decode.py 32 256 8192   # batch, new tokens, context

It builds Qwen3-0.6B (`tests/data/oracle-configs/qwen3-0.6b.json`) in bf16 with random weights,
generates `new` tokens after a prompt of `context - new` (as `measure.py` does), and writes
`$OUT/t{batch}_{new}.json`: `R`, per call of a logits processor (once per forward: `k` = 0 after
the prefill, then after each decode step) the step, `memory_reserved` and `memory_allocated`;
`N`, at the steps of `SNAPSHOT_STEPS`, every large-pool segment of `torch.cuda.memory_snapshot()`
as `[MiB, [(block MiB, 'a'ctive | 'i'nactive), ...]]`. The traces in `decode-trace/` were taken
with this code (sent inline) on one H200, 2026-11-27; `docs/oracle.md`, "Decode past the first
step", reads them.
"""

import json
import os
import sys

import torch
import transformers

SNAPSHOT_STEPS = {0, 1, 2, 3, 31, 32, 33, 34, 35, 63, 64, 65, 66, 127, 128, 129, 255, 256, 511}


def segments():
    return [
        [s["total_size"] >> 20, [(x["size"] / 2**20, x["state"][0]) for x in s["blocks"]]]
        for s in torch.cuda.memory_snapshot()
        if s["segment_type"] == "large"
    ]


def main():
    b, new, ctx = map(int, sys.argv[1:4])
    p = ctx - new
    c = json.load(open("tests/data/oracle-configs/qwen3-0.6b.json"))
    cfg = transformers.AutoConfig.for_model(**c)
    with torch.device("cuda"):
        m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    m.eval()
    steps, snaps = [], {}

    class Probe(transformers.LogitsProcessor):
        def __call__(self, ids, scores):
            k = ids.shape[1] - p
            steps.append((k, torch.cuda.memory_reserved(), torch.cuda.memory_allocated()))
            if k in SNAPSHOT_STEPS:
                snaps[k] = segments()
            return scores

    x = torch.randint(0, cfg.vocab_size, (b, p), device="cuda")
    gc = transformers.GenerationConfig(
        max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    with torch.no_grad():
        m.generate(x, attention_mask=torch.ones_like(x), generation_config=gc, logits_processor=[Probe()])
    out = dict(
        b=b, new=new, ctx=ctx, R=steps, N=snaps,
        peak_res=torch.cuda.max_memory_reserved(), peak_alloc=torch.cuda.max_memory_allocated(),
    )
    json.dump(out, open(os.environ["OUT"] + f"/t{b}_{new}.json", "w"))
    print(b, new, torch.cuda.max_memory_reserved() / 2**30, torch.cuda.max_memory_allocated() / 2**30)


if __name__ == "__main__":
    main()
