"""The math SDPA kernel's training step, run twice on the CPU: once on real tensors (the profiler's allocator
events), once on fake tensors as the oracle follows them (`oracle.Tracker`). The two peaks should agree.

    $PEAKFIT_ORACLE_VENV/bin/python tools/oracle/real_cpu_check.py --batch 2 --heads 71 --seq 256 [--no-checkpoint]

The block is Falcon-7B's attention as SDPA's math kernel sees it (bf16 q with `heads` heads, one kv head, a bf16
additive mask, `_scaled_dot_product_attention_math` called the way `oracle.sdpa_sm90` calls it), under
`torch.utils.checkpoint(use_reentrant=False)` unless `--no-checkpoint`, then backward. On real tensors no
TorchDispatchMode is active, so the kernel takes its in-place `attn.add_(mask)` branch as a GPU does; on fake
tensors `areAnyTensorSubclassLike` is true and it takes `attn.add(mask)`. The check is how docs/oracle.md
("Falcon-7B LoRA: the GPU holds one more fp32 score block") rules out the fake-tensor run as the cause of a
math-kernel training gap: what is left between the oracle and a GPU is CUDA's, not the fake tensors'.
Prints both peaks above the starting point in MiB (the fake one without the two 32 MiB cuBLAS workspaces the
oracle adds) and one fp32 score block's size.

    $PEAKFIT_ORACLE_VENV/bin/python tools/oracle/real_cpu_check.py --config F.json --set num_hidden_layers=2 ... \
        --batch 2 --seq 1024 [--no-checkpoint]

With `--config`, the whole step of a shrunk model instead: bf16 weights, PEFT LoRA r16 on all linear layers,
checkpointing, foreach AdamW, two steps (`oracle._run_case` on fake tensors against the same code on real
CPU tensors, SDPA through `oracle.sdpa_sm90` in both). Peaks above the weights; the real run's also holds the
CPU's own copies that a GPU does not make (TensorIterator promotes mixed-dtype inputs into temporaries only on
the CPU: LoRA's fp32 update added to a bf16 output), so it may read higher where those set the peak.
"""
import argparse
import os
import sys

import torch
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402

HEAD_DIM = 64
MIB = 2 ** 20


def block(x, w, mask, b, h, s):
    """q, k, v from one projection (Falcon's fused query_key_value), the math kernel, a scalar out."""
    qkv = x @ w
    q, k, v = qkv.split([h * HEAD_DIM, HEAD_DIM, HEAD_DIM], -1)
    q = q.view(b, s, h, HEAD_DIM).transpose(1, 2).contiguous()
    k = k.view(b, s, 1, HEAD_DIM).transpose(1, 2).contiguous()
    v = v.view(b, s, 1, HEAD_DIM).transpose(1, 2).contiguous()
    o = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, mask, 0.0, False, None)[0]
    return o.transpose(1, 2).reshape(b, s, h * HEAD_DIM).sum()


def inputs(b, h, s):
    torch.manual_seed(0)
    x = torch.randn(b, s, 256, dtype=torch.bfloat16)
    w = torch.randn(256, (h + 2) * HEAD_DIM, dtype=torch.bfloat16, requires_grad=True)
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    mask = torch.where(causal.logical_not(), torch.tensor(float("-inf"), dtype=torch.bfloat16),
                       torch.tensor(0.0, dtype=torch.bfloat16))[None, None]
    return x, w, mask


def step(x, w, mask, b, h, s, ckpt):
    f = (lambda *a: checkpoint(block, *a, b, h, s, use_reentrant=False)) if ckpt else \
        (lambda *a: block(*a, b, h, s))
    return f(x, w, mask)


def profiled_peak(run):
    """The most bytes the CPU allocator held above its level at the start of `run()`: the profiler's
    allocation and free events in time order (no dispatch mode is active, so the C++ runs as on a GPU)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    cur = peak = 0
    for e in events:
        cur += e.nbytes()
        peak = max(peak, cur)
    return peak


def real_peak(b, h, s, ckpt):
    x, w, mask = inputs(b, h, s)
    return profiled_peak(lambda: step(x, w, mask, b, h, s, ckpt).backward())


def fake_peak(b, h, s, ckpt):
    from torch._subclasses.fake_tensor import FakeTensorMode
    x, w, mask = inputs(b, h, s)
    w = w.detach()
    fm = FakeTensorMode()
    with fm:
        x, mask = fm.from_tensor(x), fm.from_tensor(mask)
        w = fm.from_tensor(w).requires_grad_(True)
    tr = oracle.Tracker()
    with fm, tr:
        tr.phase = "forward"
        tr.restart()
        y = step(x, w, mask, b, h, s, ckpt)
        tr.phase = "backward"
        y.backward()
        tr.finish()
    return tr.peak - sum(rec[0] for rec in tr.snap if rec[1] == "workspace")


def shrunk_config(path, sets):
    """The config at `path` with `key=value` overrides (ints where they parse), in a temporary file."""
    import json
    import tempfile
    with open(path) as f:
        d = json.load(f)
    for kv in sets:
        k, v = kv.split("=", 1)
        d[k] = int(v) if v.lstrip("-").isdigit() else v
    fd, out = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(d, f)
    return out


def model_peaks(config, b, s, ckpt):
    """(real, fake) peaks above the weights of two LoRA training steps of the model at `config`."""
    import peft
    import transformers
    case = dict(config=config, workload="lora", dtype="bf16", batch=b, context_tokens=s, lora_rank=16,
                gradient_checkpointing="full" if ckpt else "none", optimizer="adamw", steps=2, reserved=False)
    res = oracle._run_case(case)
    fake = res["peak_allocated_bytes"] - res["weights_bytes"] - res["breakdown_bytes"]["workspace"]
    oracle.patch_transformers()
    _, cfg = oracle.load_config(config)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.train()
    model.config.use_cache = False
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                                       lora_dropout=0.0, task_type="CAUSAL_LM"))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, foreach=True)
    x = torch.randint(0, cfg.vocab_size, (b, s))

    def two_steps():
        for _ in range(2):
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
    return profiled_peak(two_steps), fake, cfg.num_attention_heads


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=71)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--no-checkpoint", action="store_true")
    p.add_argument("--config", help="run a whole LoRA step of this model (shrink it with --set)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    a = p.parse_args(argv)
    ckpt = not a.no_checkpoint
    if a.config:
        path = shrunk_config(a.config, a.set)
        try:
            real, fake, heads = model_peaks(path, a.batch, a.seq, ckpt)
        finally:
            os.unlink(path)
    else:
        heads = a.heads
        real = real_peak(a.batch, heads, a.seq, ckpt)
        fake = fake_peak(a.batch, heads, a.seq, ckpt)
    score = a.batch * heads * a.seq * a.seq * 4
    print(f"real CPU {real / MIB:.2f} MiB  fake (oracle) {fake / MIB:.2f} MiB  "
          f"difference {(fake - real) / MIB:+.2f} MiB  one fp32 score block {score / MIB:.2f} MiB")


if __name__ == "__main__":
    main()
