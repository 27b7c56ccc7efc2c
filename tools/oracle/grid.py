#!/usr/bin/env python3
"""The oracle grid: tests/data/oracle-grid.csv, regenerated or checked.

  grid.py generate --root R [--resume] [--limit N]   run every case of the design (one process)
  grid.py generate --root R --add [--resume]         run only the cases of hunt() missing from the file, keep
                                                     the other rows and their header, note the addition
  grid.py check --root R N [--seed S]                rerun N sampled rows, compare with the committed file
  grid.py rerun --root R SELECTOR                    rerun the rows a change of the oracle touches (RERUN:
                                                     math-kernel, softmax-backward), in both
                                                     files, keep the rest, note the rerun in each header
"""
import argparse
import csv
import datetime
import io
import json
import os
import platform
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402

GIB = 2 ** 30
H200_GIB = 141.0
COLUMNS = ["id", "config", "workload", "dtype", "batch", "context_tokens", "new_tokens", "gradient_checkpointing",
           "optimizer", "lora_rank", "attention", "oracle_allocated_gib", "weights_gib", "gradients_gib",
           "optimizer_gib", "activations_gib", "peak_phase", "seconds"]

DECODERS = ["smollm2-135m", "qwen2.5-0.5b", "qwen3-0.6b", "llama-3.2-1b", "qwen2.5-1.5b", "qwen3-1.7b",
            "smollm2-1.7b", "gemma-2-2b", "llama-3.2-3b", "phi-3-mini-4k-instruct", "qwen3-4b", "falcon-7b",
            "mistral-7b-v0.1", "mistral-7b-v0.3", "qwen2.5-7b", "llama-3.1-8b", "qwen3-8b", "gemma-2-9b",
            "qwen3-30b-a3b", "mixtral-8x7b-v0.1", "gpt2"]
SMALL = ["smollm2-135m", "qwen2.5-0.5b", "qwen3-0.6b", "llama-3.2-1b", "gpt2"]
MID = ["qwen2.5-1.5b", "qwen3-1.7b", "gemma-2-2b", "llama-3.2-3b", "qwen3-4b"]
BIG = ["mistral-7b-v0.3", "qwen2.5-7b", "llama-3.1-8b", "qwen3-8b"]


def case(config, workload, dtype, batch, ctx, new=None, gc=None, opt=None, rank=None, attn="sdpa"):
    parts = [config, workload, dtype, f"b{batch}", f"t{ctx}"]
    if new:
        parts.append(f"n{new}")
    if gc:
        parts.append(f"gc{gc}")
    if opt:
        parts.append(opt)
    if rank:
        parts.append(f"r{rank}")
    if attn != "sdpa":
        parts.append(attn)
    return dict(id="-".join(parts), config=config, workload=workload, dtype=dtype, batch=batch, context_tokens=ctx,
                new_tokens=new, gradient_checkpointing=gc, optimizer=opt, lora_rank=rank, attention=attn)


def max_ctx(cfg):
    return cfg.get("n_positions") or cfg.get("max_position_embeddings") or 32768


def design(root):
    """Most rows are generation (cheap); training and LoRA on small and mid models; every optimizer,
    with and without checkpointing; 16-bit and fp32; SDPA and eager."""
    cfgs = {n: json.load(open(f"{root}/tests/data/oracle-configs/{n}.json"))
            for n in DECODERS + ["bert-base-uncased", "bert-large", "whisper-small", "whisper-large-v3"]}
    out = []
    # 1. generate, bf16, SDPA: batch x context over every decoder
    for m in DECODERS:
        for b in (1, 8, 32, 128):
            for ctx in (512, 2048, 8192, 32768):
                if ctx > max_ctx(cfgs[m]):
                    continue
                if b * ctx > 2 ** 20 and m not in SMALL:      # keep the grid to workloads that fit
                    continue
                out.append(case(m, "inference", "bf16", b, ctx, new=min(64, ctx // 8)))
    # 2. batch 256 and short prompts
    for m in SMALL + MID:
        for ctx in (128, 1024):
            if ctx <= max_ctx(cfgs[m]):
                out.append(case(m, "inference", "bf16", 256, ctx, new=16))
    # 3. fp16 and fp32 (fp32: SDPA runs the memory-efficient kernel on sm90), eager attention
    for m in SMALL + MID + ["mistral-7b-v0.1", "llama-3.1-8b"]:
        for ctx in (1024, 4096):
            if ctx > max_ctx(cfgs[m]):
                continue
            out.append(case(m, "inference", "fp16", 8, ctx, new=64))
            if m not in ("mistral-7b-v0.1", "llama-3.1-8b"):
                out.append(case(m, "inference", "fp32", 4, ctx, new=32))
                out.append(case(m, "inference", "fp32", 4, ctx, new=32, attn="eager"))
            out.append(case(m, "inference", "bf16", 4, ctx, new=32, attn="eager"))
    # 4. encoders (one forward) and Whisper (3,000 mel frames, greedy decode)
    for m in ("bert-base-uncased", "bert-large"):
        for b in (1, 32, 128, 256):
            for ctx in (128, 512):
                for dt in ("fp16", "fp32"):
                    out.append(case(m, "inference", dt, b, ctx))
        out.append(case(m, "inference", "bf16", 64, 512))
        out.append(case(m, "inference", "fp16", 64, 512, attn="eager"))
    for m in ("whisper-small", "whisper-large-v3"):
        for b in (1, 8, 16, 32):
            for n in (64, 224):
                out.append(case(m, "inference", "fp16", b, n, new=n))
        out.append(case(m, "inference", "fp32", 8, 128, new=128))
    # 5. full fine-tuning: fp16-amp and bf16 (fp32 a few), each optimizer, with and without checkpointing
    for m in SMALL + ["qwen2.5-1.5b", "qwen3-1.7b"]:
        for dt in ("fp16-amp", "bf16"):
            for gc in ("none", "full"):
                for opt in ("adamw", "adamw-fused", "sgd"):
                    b, ctx = (4, 1024) if gc == "none" else (8, 2048)
                    if m == "gpt2":
                        ctx = 1024
                    out.append(case(m, "training", dt, b, ctx, gc=gc, opt=opt))
        out.append(case(m, "training", "fp32", 2, 1024, gc="none", opt="adamw"))
    # 6. LoRA on all linear layers
    for m in ["qwen2.5-0.5b", "llama-3.2-1b", "qwen3-1.7b", "llama-3.2-3b", "qwen3-4b"] + BIG:
        for rank in (16, 64):
            for gc in ("none", "full"):
                b, ctx = (2, 2048) if gc == "none" else (8, 2048)
                out.append(case(m, "lora", "bf16", b, ctx, gc=gc, opt="adamw", rank=rank))
        out.append(case(m, "lora", "fp16-amp", 4, 1024, gc="full", opt="adamw-fused", rank=8))
    out += hunt()
    # drop duplicate ids (keep the first)
    seen, uniq = set(), []
    for c in out:
        if c["id"] not in seen:
            seen.add(c["id"])
            uniq.append(c)
    return uniq


def hunt():
    """7. Settings the sections above and the measured rows do not cover, chosen where the model was most
    likely to be low (issue 20): batch 1 at 16k-32k, fp32 and eager attention at long context, tiny
    models at huge batch, 256k vocabularies, sliding windows past their length in inference and training,
    mixtures of experts decoding wide batches, long generations, LoRA and full fine-tuning at long context,
    SGD, encoders at 512 x 256 and more. Added with `scripts/oracle grid --add`."""
    inf, gen = "inference", dict(new=64)
    short, eager = dict(new=32), dict(new=32, attn="eager")
    rows = [
        # batch 1 at 16k, windows past their length, Falcon's own SDPA call, Mixtral
        ("llama-3.1-8b", inf, "bf16", 1, 16384, gen), ("qwen3-8b", inf, "bf16", 1, 16384, gen),
        ("mistral-7b-v0.1", inf, "bf16", 1, 16384, gen), ("falcon-7b", inf, "bf16", 1, 16384, gen),
        ("falcon-7b", inf, "bf16", 4, 8192, gen), ("gemma-2-9b", inf, "bf16", 4, 8192, gen),
        ("gemma-2-2b", inf, "bf16", 16, 8192, gen), ("phi-3-mini-4k-instruct", inf, "bf16", 16, 4096, gen),
        ("mixtral-8x7b-v0.1", inf, "bf16", 1, 16384, gen), ("falcon-7b", inf, "fp16", 2, 8192, gen),
        # fp32 at long context (GQA: the math kernel; MHA: the memory-efficient one), eager at long context
        ("qwen2.5-0.5b", inf, "fp32", 1, 16384, short), ("llama-3.2-1b", inf, "fp32", 1, 8192, short),
        ("gpt2", inf, "fp32", 16, 1024, short), ("phi-3-mini-4k-instruct", inf, "fp32", 2, 4096, short),
        ("smollm2-135m", inf, "fp32", 1, 8192, eager), ("llama-3.2-1b", inf, "bf16", 1, 16384, eager),
        ("qwen3-0.6b", inf, "bf16", 2, 8192, eager), ("gemma-2-2b", inf, "bf16", 1, 8192, eager),
        ("falcon-7b", inf, "bf16", 1, 4096, eager),
    ]
    # tiny models at huge batch; 256k and 128k vocabularies at wide batch (the logits)
    rows += [(m, inf, "bf16", b, ctx, dict(new=16)) for m, b, ctx in (
        ("smollm2-135m", 512, 512), ("qwen2.5-0.5b", 512, 256), ("gpt2", 512, 512), ("qwen3-0.6b", 1024, 128),
        ("gemma-2-9b", 256, 128), ("llama-3.2-1b", 512, 128))]
    rows += [
        ("llama-3.2-1b", inf, "bf16", 256, 2048, gen), ("gemma-2-2b", inf, "bf16", 64, 512, gen),
        ("gemma-2-9b", inf, "bf16", 128, 256, gen),
        # mixtures of experts decoding wide batches (batched_mm gathers each routed token's experts)
        ("qwen3-30b-a3b", inf, "bf16", 64, 512, gen), ("qwen3-30b-a3b", inf, "bf16", 256, 256, short),
        ("mixtral-8x7b-v0.1", inf, "bf16", 32, 1024, gen),
        # long generations (the prompt is half the context)
        ("llama-3.1-8b", inf, "bf16", 16, 4096, dict(new=2048)), ("qwen2.5-1.5b", inf, "bf16", 64, 2048, dict(new=1024)),
        # encoders and Whisper
        ("bert-large", inf, "bf16", 256, 512, {}), ("bert-base-uncased", inf, "fp32", 256, 512, dict(attn="eager")),
        ("bert-large", inf, "fp16", 512, 256, dict(attn="eager")), ("bert-base-uncased", inf, "fp16", 1024, 128, {}),
        ("whisper-large-v3", inf, "fp16", 64, 224, dict(new=224)), ("whisper-small", inf, "fp32", 32, 224, dict(new=224)),
    ]
    # training at long context, LoRA with and without checkpointing, SGD, sliding windows, eager
    adamw = dict(opt="adamw")
    rows += [
        ("llama-3.2-1b", "lora", "bf16", 1, 16384, dict(gc="none", rank=16, **adamw)),
        ("llama-3.2-1b", "lora", "bf16", 1, 16384, dict(gc="full", rank=16, **adamw)),
        ("qwen3-1.7b", "lora", "bf16", 2, 8192, dict(gc="full", rank=64, **adamw)),
        ("qwen2.5-0.5b", "training", "bf16", 16, 2048, dict(gc="full", opt="sgd")),
        ("llama-3.2-1b", "training", "fp32", 2, 2048, dict(gc="none", opt="sgd")),
        ("gemma-2-2b", "training", "bf16", 2, 2048, dict(gc="none", **adamw)),
        ("gemma-2-2b", "lora", "bf16", 4, 2048, dict(gc="full", rank=16, **adamw)),
        ("qwen2.5-0.5b", "training", "bf16", 1, 32768, dict(gc="full", **adamw)),
        ("phi-3-mini-4k-instruct", "lora", "bf16", 2, 4096, dict(gc="full", rank=16, **adamw)),
        ("mistral-7b-v0.1", "lora", "bf16", 1, 8192, dict(gc="full", rank=16, **adamw)),
        ("smollm2-135m", "training", "bf16", 4, 2048, dict(gc="none", attn="eager", **adamw)),
        ("qwen3-0.6b", "training", "fp16-amp", 8, 4096, dict(gc="full", opt="sgd")),
    ]
    # a second pass: Falcon and GPT-2 LoRA, Gemma-2 under autocast and past its window in LoRA, Phi-3 in fp16,
    # a mixture of experts at 32k and in LoRA (PEFT adapts every expert), fp32 fine-tune at 4k, fp16 long generation
    rows += [
        ("falcon-7b", "lora", "bf16", 2, 2048, dict(gc="full", rank=16, **adamw)),
        ("falcon-7b", "lora", "bf16", 1, 2048, dict(gc="none", rank=16, **adamw)),
        ("gemma-2-2b", "training", "fp16-amp", 2, 2048, dict(gc="full", **adamw)),
        ("gpt2", "lora", "bf16", 8, 1024, dict(gc="none", rank=16, **adamw)),
        ("phi-3-mini-4k-instruct", inf, "fp16", 8, 4096, gen), ("qwen3-30b-a3b", inf, "bf16", 1, 32768, gen),
        ("llama-3.2-3b", "training", "fp32", 1, 4096, dict(gc="full", opt="sgd")),
        ("mistral-7b-v0.3", "lora", "fp16-amp", 2, 4096, dict(gc="full", opt="adamw-fused", rank=8)),
        ("gemma-2-9b", "lora", "bf16", 2, 8192, dict(gc="full", rank=16, **adamw)),
        ("smollm2-1.7b", inf, "fp32", 2, 4096, eager), ("qwen2.5-7b", inf, "fp16", 32, 2048, dict(new=256)),
        ("qwen3-30b-a3b", "lora", "bf16", 1, 2048, dict(gc="full", rank=16, **adamw)),
    ]
    # a third pass: head dim 80 (Phi-2: parallel attention and MLP, gelu_new, partial rotary), Whisper at
    # batch 128 and at its full 448-token decoder, Gemma-2's sliding window at 32k, and a mixture of experts
    # decoding batch 256 at a 512-token context (in bf16 only: transformers 5.17's grouped_mm experts call
    # torch._grouped_mm, whose kernel and meta function take bf16 alone, so fp16 fails before any memory use)
    rows += [
        ("phi-2", inf, "bf16", 8, 2048, gen), ("phi-2", inf, "fp16", 1, 2048, short),
        ("phi-2", "lora", "bf16", 4, 2048, dict(gc="full", rank=16, **adamw)),
        ("whisper-large-v3", inf, "fp16", 128, 224, dict(new=224)),
        ("whisper-small", inf, "fp16", 256, 448, dict(new=448)),
        ("gemma-2-2b", inf, "bf16", 1, 32768, gen),
        ("qwen3-30b-a3b", inf, "bf16", 256, 512, short),
    ]
    # a fourth pass: Phi-2 under autocast (its gelu_new's pow runs in fp32) and with eager attention, Whisper in
    # fp32, Gemma-2-9b's window at 32k, LoRA on a 7B at 16k, Mixtral decoding batch 128
    rows += [
        ("phi-2", "training", "fp16-amp", 2, 2048, dict(gc="none", **adamw)),
        ("phi-2", inf, "bf16", 4, 2048, eager),
        ("whisper-large-v3", inf, "fp32", 16, 224, dict(new=224)),
        ("gemma-2-9b", inf, "bf16", 1, 32768, gen),
        ("qwen2.5-7b", "lora", "bf16", 1, 16384, dict(gc="full", rank=16, **adamw)),
        ("mixtral-8x7b-v0.1", inf, "bf16", 128, 512, short),
    ]
    # a fifth pass: eager attention under backward (q/k norms, GPT-2 under autocast, Phi-3 LoRA), a window
    # past its length in LoRA (Mistral v0.1 at 16k), Falcon and Gemma-2 in fp32. GPT-2 runs with its dropout
    # off (gpt2-no-dropout.json: attn_pdrop, resid_pdrop, embd_pdrop 0): in training its default 0.1 saves a
    # mask per attention score that peakfit has no input for yet, and on fake CPU tensors the oracle takes
    # dropout's CPU path (`input * noise`, the noise saved in the input's dtype) where a GPU runs
    # `native_dropout` (a 1-byte mask), so such a row would be off on both sides.
    rows += [
        ("qwen3-1.7b", "training", "bf16", 2, 4096, dict(gc="none", attn="eager", **adamw)),
        ("gpt2-no-dropout", "training", "fp16-amp", 16, 1024, dict(gc="none", attn="eager", **adamw)),
        ("phi-3-mini-4k-instruct", "lora", "bf16", 2, 4096, dict(gc="full", rank=16, attn="eager", **adamw)),
        ("mistral-7b-v0.1", "lora", "bf16", 1, 16384, dict(gc="full", rank=16, **adamw)),
        ("falcon-7b", inf, "fp32", 1, 4096, short), ("gemma-2-2b", inf, "fp32", 1, 8192, short),
    ]
    # a sixth pass: eager attention under autocast (Llama's and Gemma-2's explicit fp32 softmax), Falcon LoRA
    # eager, GPT-2 eager inference at batch 64, a tiny model's loss at batch 64, Phi-3 full fine-tune in bf16
    rows += [
        ("llama-3.2-1b", "training", "fp16-amp", 4, 4096, dict(gc="full", attn="eager", **adamw)),
        ("gemma-2-2b", "training", "fp16-amp", 1, 4096, dict(gc="none", attn="eager", **adamw)),
        ("smollm2-135m", "training", "fp16-amp", 64, 2048, dict(gc="none", **adamw)),
        ("gpt2", inf, "fp16", 64, 1024, eager),
        ("falcon-7b", "lora", "bf16", 1, 2048, dict(gc="full", rank=16, attn="eager", **adamw)),
        ("phi-3-mini-4k-instruct", "training", "bf16", 1, 4096, dict(gc="full", **adamw)),
    ]
    # a seventh pass: q/k norms in LoRA under autocast, Phi-2 LoRA with eager attention, Mixtral LoRA (PEFT
    # adapts its 8 experts), Gemma-2 in fp16, an fp32 grouped-query prefill at 4k (the math kernel)
    rows += [
        ("qwen3-1.7b", "lora", "fp16-amp", 2, 4096, dict(gc="none", rank=16, **adamw)),
        ("phi-2", "lora", "bf16", 2, 2048, dict(gc="none", rank=16, attn="eager", **adamw)),
        ("mixtral-8x7b-v0.1", "lora", "bf16", 1, 2048, dict(gc="full", rank=16, **adamw)),
        ("gemma-2-9b", inf, "fp16", 8, 4096, gen), ("qwen2.5-7b", inf, "fp32", 1, 4096, short),
        # LoRA on a mixture of experts without checkpointing: every layer's folded expert weights stay
        ("qwen3-30b-a3b", "lora", "bf16", 1, 1024, dict(gc="none", rank=16, **adamw)),
    ]
    return [case(m, w, dt, b, ctx, **kw) for m, w, dt, b, ctx, kw in rows]


def row_of(c, r):
    bd = r["breakdown_bytes"]
    tot = r["peak_allocated_bytes"]
    g = lambda n: f"{n / GIB:.4f}"
    act = tot - bd["weights"] - bd["gradients"] - bd["optimizer"]
    new = c["new_tokens"] if c["new_tokens"] else ""
    return dict(id=c["id"], config=c["config"] + ".json", workload=c["workload"], dtype=c["dtype"], batch=c["batch"],
                context_tokens=c["context_tokens"], new_tokens=new,
                gradient_checkpointing=c["gradient_checkpointing"] or "", optimizer=c["optimizer"] or "",
                lora_rank=c["lora_rank"] or "", attention=c["attention"], oracle_allocated_gib=g(tot),
                weights_gib=g(bd["weights"]), gradients_gib=g(bd["gradients"]), optimizer_gib=g(bd["optimizer"]),
                activations_gib=g(act), peak_phase=r["peak_phase"], seconds=f"{r['seconds']:.1f}")


def run(c, root, reserved=False):
    """The grid's allocated peak: generate's shortcut (prefill and last decode step), 2 training steps. With
    `reserved`, the caching-allocator replay too, over the run the GPU really does: every decode step (a
    second run) and measure.py's 3 training steps (a segment made in step 3 would count)."""
    cc = dict(c, reserved=reserved)
    cc["config"] = f"{root}/tests/data/oracle-configs/{c['config']}.json"
    if cc["workload"] != "inference":
        cc["steps"] = 3 if reserved else 2
    return oracle.run_case(cc)


def header(root, seconds=None):
    import torch
    import transformers
    import peft
    lines = [
        "# peakfit oracle grid: peak torch.cuda.max_memory_allocated (GiB) of each workload on an sm90 GPU",
        "# (H100/H200), computed without a GPU by tools/oracle/oracle.py (docs/oracle.md).",
        "# command: scripts/oracle grid",
        f"# torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}",
        f"# date {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"# machine {platform.machine()} {platform.system()} {platform.release()}, "
        f"{os.cpu_count()} CPUs (python {platform.python_version()}), no GPU",
        "# activations_gib = everything else live at the peak (saved activations, KV cache, temporaries,",
        "# cuBLAS workspaces). seconds = oracle run time for the case. Cases over 141 GiB (an H200) are left out.",
    ]
    if seconds is not None:
        lines.append(f"# generated in {seconds / 60:.1f} min")
    return lines


def load_partial(partial, resume):
    """The rows an interrupted run left in `partial` (with `resume`), else none (the file is removed)."""
    done = {}
    if resume and os.path.exists(partial):
        for line in open(partial):
            r = json.loads(line)
            if "failed" not in r:
                done[r["id"]] = r
    elif os.path.exists(partial):
        os.remove(partial)
    return done


def add(a):
    """Run the cases of hunt() that the committed grid lacks; keep every other row and the header it was
    generated with, and say in the header which rows were added, when, and with which versions."""
    import torch
    import transformers
    import peft
    root = a.root
    path = f"{root}/tests/data/oracle-grid.csv"
    partial = f"{root}/target/oracle-grid.add.jsonl"
    os.makedirs(os.path.dirname(partial), exist_ok=True)
    old_header = [l.rstrip("\n") for l in open(path) if l.startswith("#")]
    done = {r["id"]: r for r in read_grid(path)}
    committed = set(done)
    done.update(load_partial(partial, a.resume))
    todo = [c for c in hunt() if c["id"] not in done]
    if not any(c["id"] not in committed for c in hunt()):
        print(f"{path}: every case of hunt() is there already", flush=True)
        return 0
    with open(partial, "a") as sink:
        for i, c in enumerate(todo):
            r = run(c, root)
            rec = dict(id=c["id"], too_big=r["peak_allocated_gib"]) if r["peak_allocated_bytes"] / GIB > H200_GIB \
                else row_of(c, r)
            print(f"[{i + 1}/{len(todo)}] {c['id']}: {r['peak_allocated_gib']:.3f} GiB {r['peak_phase']} "
                  f"{r['seconds']:.1f}s", flush=True)
            done[c["id"]] = rec
            sink.write(json.dumps(rec) + "\n")
            sink.flush()
    added = [c["id"] for c in hunt() if c["id"] not in committed and "oracle_allocated_gib" in done.get(c["id"], {})]
    seconds = sum(float(done[i]["seconds"]) for i in added)
    note = (f"# {len(added)} rows of grid.py's hunt() (issue 20) added "
            f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} with "
            f"`scripts/oracle grid --add` (torch {torch.__version__}, transformers {transformers.__version__}, "
            f"peft {peft.__version__}; {seconds / 60:.1f} min)")
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    n = 0
    for c in design(root):
        r = done.get(c["id"])
        if r and "oracle_allocated_gib" in r:
            w.writerow({k: r[k] for k in COLUMNS})
            n += 1
    with open(path, "w") as f:
        f.write("\n".join(old_header + [note]) + "\n")
        f.write(buf.getvalue())
    print(f"{path}: {n} rows ({len(added)} added)", flush=True)
    return 0


def generate(a):
    root = a.root
    if a.add:
        return add(a)
    path = f"{root}/tests/data/oracle-grid.csv"
    partial = f"{root}/target/oracle-grid.partial.jsonl"
    os.makedirs(os.path.dirname(partial), exist_ok=True)
    cases = design(root)
    if a.limit:
        cases = cases[:a.limit]
    done = load_partial(partial, a.resume)
    t0 = time.time()
    prev = sum(float(r.get("seconds") or 0) for r in done.values())
    # Run order: interleave the kinds of case (generation, training, ...) so that an interrupted run
    # still covers every kind; the file is written in design order, rewritten every 20 cases.
    kinds = {}
    for c in cases:
        kinds.setdefault((c["workload"], c["dtype"] == "fp32"), []).append(c)
    order = sorted(cases, key=lambda c: next(
        (j + 0.5) / len(v) for k, v in kinds.items() for j, x in enumerate(v) if x is c))
    with open(partial, "a") as sink:
        for i, c in enumerate(order):
            if i and i % 20 == 0:
                write_csv(root, path, cases, done, prev + time.time() - t0, final=False)
            if c["id"] in done:
                continue
            try:
                r = run(c, root)
            except Exception as e:
                print(f"[{i + 1}/{len(cases)}] {c['id']}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                rec = dict(id=c["id"], failed=f"{type(e).__name__}: {str(e)[:200]}")
            else:
                if r["peak_allocated_bytes"] / GIB > H200_GIB:
                    rec = dict(id=c["id"], too_big=r["peak_allocated_gib"])
                else:
                    rec = row_of(c, r)
                print(f"[{i + 1}/{len(cases)}] {c['id']}: {r['peak_allocated_gib']:.3f} GiB {r['peak_phase']} "
                      f"{r['seconds']:.1f}s", flush=True)
            done[c["id"]] = rec
            sink.write(json.dumps(rec) + "\n")
            sink.flush()
    write_csv(root, path, cases, done, prev + time.time() - t0)
    return 0


def csv_body(cases, done, columns, key):
    """The CSV text of the rows of `done` that have `key`, in the order of `cases`, and their count."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    n = 0
    for c in cases:
        r = done.get(c["id"])
        if r and key in r:
            w.writerow(r)
            n += 1
    return buf, n


def write_csv(root, path, cases, done, seconds, final=True):
    buf, n = csv_body(cases, done, COLUMNS, "oracle_allocated_gib")
    with open(path, "w") as f:
        f.write("\n".join(header(root, seconds if final else None)) + "\n")
        f.write(buf.getvalue())
    if final:
        print(f"{path}: {n} rows", flush=True)


def read_grid(path):
    lines = [l for l in open(path) if not l.startswith("#")]
    return list(csv.DictReader(lines))


RESERVED_COLUMNS = ["id", "config", "workload", "dtype", "batch", "context_tokens", "new_tokens",
                    "gradient_checkpointing", "optimizer", "lora_rank", "attention", "oracle_allocated_gib",
                    "oracle_reserved_gib", "weights_gib", "weight_segments_gib", "largest_tensor_gib",
                    "peak_phase", "reserved_phase", "seconds"]


def reserved_sample(root, n_inference, n_training):
    """A spread sample of the committed grid's rows for the reserved replay: every k-th inference row (in
    design order: every section, model, batch and context) whose replay is affordable (generation runs every
    decode step, so at most 64 new tokens; Whisper at most 64 decoded tokens), and every k-th training row."""
    rows = {r["id"] for r in read_grid(f"{root}/tests/data/oracle-grid.csv")}
    cases = [c for c in design(root) if c["id"] in rows]
    cheap = lambda c: (c["new_tokens"] or 0) <= 64 and not (c["config"].startswith("whisper") and c["batch"] > 32)
    inf = [c for c in cases if c["workload"] == "inference" and cheap(c)]
    tr = [c for c in cases if c["workload"] != "inference"]
    pick = lambda xs, n: [xs[int(i * len(xs) / n)] for i in range(min(n, len(xs)))]
    return pick(inf, n_inference) + pick(tr, n_training)


def reserved_row(c, r):
    g = lambda n: f"{n / GIB:.4f}"
    base = row_of(c, r)
    return dict({k: base[k] for k in RESERVED_COLUMNS if k in base},
                oracle_reserved_gib=g(r["peak_reserved_bytes"]),
                weight_segments_gib=g(r["reserved_breakdown_bytes"]["weight_segments"]),
                largest_tensor_gib=g(r["largest_tensor_bytes"]), reserved_phase=r["reserved_phase"])


def reserved(a):
    """tests/data/oracle-reserved.csv: peak max_memory_reserved of a sample of grid cases (allocator replay)."""
    import torch
    import transformers
    import peft
    root = a.root
    path = f"{root}/tests/data/oracle-reserved.csv"
    partial = f"{root}/target/oracle-reserved.partial.jsonl"
    os.makedirs(os.path.dirname(partial), exist_ok=True)
    cases = reserved_sample(root, a.inference, a.training)
    done = load_partial(partial, a.resume)
    with open(partial, "a") as sink:
        for i, c in enumerate(cases):
            if c["id"] in done:
                continue
            try:
                r = run(c, root, reserved=True)
            except Exception as e:
                print(f"[{i + 1}/{len(cases)}] {c['id']}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                rec = dict(id=c["id"], failed=f"{type(e).__name__}: {str(e)[:200]}")
            else:
                rec = dict(id=c["id"], oom=r["peak_reserved_gib"]) if r["reserved_oom"] else reserved_row(c, r)
                print(f"[{i + 1}/{len(cases)}] {c['id']}: allocated {r['peak_allocated_gib']:.3f} reserved "
                      f"{r['peak_reserved_gib']:.3f} GiB {r['reserved_phase']} {r['seconds']:.1f}s", flush=True)
            done[c["id"]] = rec
            sink.write(json.dumps(rec) + "\n")
            sink.flush()
    buf, n = csv_body(cases, done, RESERVED_COLUMNS, "oracle_reserved_gib")
    lines = [
        "# peakfit oracle, reserved memory: peak torch.cuda.max_memory_reserved (GiB) of a sample of the grid's",
        "# cases on an sm90 GPU, computed without a GPU by replaying tools/oracle/oracle.py's allocation stream",
        "# through tools/oracle/allocator.py (PyTorch's CUDA caching allocator, default settings; docs/oracle.md).",
        f"# command: scripts/oracle reserved --inference {a.inference} --training {a.training}",
        f"# torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}",
        f"# date {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"# machine {platform.machine()} {platform.system()} {platform.release()}, {os.cpu_count()} CPUs, no GPU",
        "# oracle_allocated_gib as in oracle-grid.csv (generate: prefill and last decode step); oracle_reserved_gib",
        "# from a run with every decode step and, for training, measure.py's 3 steps. weight_segments_gib: reserved",
        "# after the weights (measure.py's empty_cache); largest_tensor_gib: the largest storage of the run;",
        "# reserved_phase: where the last segment was made. seconds: both runs. Cases whose replay runs out of",
        "# an H200's 139.72 GiB for segments (after releasing its free ones, as the allocator does) are left out:",
        f"# {sum(1 for r in done.values() if 'oom' in r)} of {len(cases)}.",
        f"# {n} rows; {sum(float(r.get('seconds') or 0) for r in done.values()) / 60:.1f} min of oracle time "
        f"(seconds column summed)",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
        f.write(buf.getvalue())
    print(f"{path}: {n} rows", flush=True)
    return 0


# Long generations, where decode's KV relocations continue past the first step (docs/oracle.md, "What the
# model follows now"): every 2 MiB crossing of a layer's key and value makes segments of the grown size and
# strands the previous ones. The reserved sample holds generations of at most 64 new tokens (its replays run
# every decode step); these few longer ones are the known gap's own file.
LONG_GENERATIONS = [
    dict(config="qwen3-0.6b", dtype="bf16", batch=32, context_tokens=8192, new_tokens=128),
    dict(config="qwen3-0.6b", dtype="bf16", batch=32, context_tokens=8192, new_tokens=256),
    # Whisper decoding its whole window (`n_text_ctx`, as the presets size it): the self-attention
    # copies pass 10 MiB and cross 2 MiB sizes (hf::seq2seq_crossings).
    dict(config="whisper-small", dtype="fp16", batch=64, context_tokens=448, new_tokens=448),
    dict(config="whisper-large-v3", dtype="fp16", batch=16, context_tokens=448, new_tokens=448),
]


def long_generations(a):
    """tests/data/oracle-reserved-long.csv: the allocator replay of LONG_GENERATIONS."""
    import torch
    import transformers
    import peft
    rows = []
    for spec in LONG_GENERATIONS:
        c = dict(spec, workload="inference", gradient_checkpointing=None, optimizer=None,
                 lora_rank=None, attention="sdpa", kind=None)
        c["id"] = (f"{c['config']}-inference-{c['dtype']}-b{c['batch']}-t{c['context_tokens']}"
                   f"-n{c['new_tokens']}")
        r = run(c, a.root, reserved=True)
        print(f"{c['id']}: allocated {r['peak_allocated_gib']:.3f} reserved {r['peak_reserved_gib']:.3f} GiB "
              f"{r['reserved_phase']} {r['seconds']:.1f}s", flush=True)
        rows.append(reserved_row(c, r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, RESERVED_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    lines = [
        "# peakfit oracle, reserved memory of long generations: peak torch.cuda.max_memory_reserved (GiB),",
        "# the caching-allocator replay of every decode step (columns as in oracle-reserved.csv). Decode's KV",
        "# relocations past the first step (docs/oracle.md): the decoders' known gap, Whisper's whole window.",
        "# command: scripts/oracle long",
        f"# torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}",
        f"# date {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"# machine {platform.machine()} {platform.system()} {platform.release()}, {os.cpu_count()} CPUs, no GPU",
    ]
    with open(f"{a.root}/tests/data/oracle-reserved-long.csv", "w") as f:
        f.write("\n".join(lines) + "\n")
        f.write(buf.getvalue())
    return 0


# The rows a change of the oracle can move, by name: each selector says which rows, and why.
RERUN = {
    # SDPA rows whose attention runs torch's math kernel: fp32 on fewer kv heads than heads (the memory-efficient
    # kernel takes no grouped heads) and Falcon's multi-query attention (one kv head handed over without
    # enable_gqa, which cuDNN and flash refuse). Issue 20: cuDNN's head rule and _safe_softmax's temporaries.
    "math-kernel": (lambda cfg, row: row["attention"] == "sdpa" and (
        (cfg.get("model_type") == "falcon" and cfg.get("multi_query") and not cfg.get("new_decoder_architecture"))
        or (row["dtype"] == "fp32" and kv_heads(cfg) < heads(cfg))),
        "cuDNN's head rule and the math kernel's _safe_softmax temporaries (issue 20)"),
    # Training rows whose backward runs aten._softmax_backward_data, where CUDA's kernel makes `grad * output`
    # (Tracker.softmax_backward_temporary): eager attention's softmax, the math kernel's _safe_softmax (the rows
    # of "math-kernel" above) and the MoE routers' softmax (Mixtral's, Qwen3-MoE's: tokens x experts).
    "softmax-backward": (lambda cfg, row: row["workload"] != "inference" and (
        row["attention"] == "eager" or RERUN["math-kernel"][0](cfg, row)
        or bool(cfg.get("num_local_experts") or cfg.get("num_experts"))),
        "CUDA's softmax backward temporary `grad * output` (softmax_backward_cuda_out)"),
}


def heads(cfg):
    return cfg.get("num_attention_heads") or cfg.get("n_head") or cfg.get("encoder_attention_heads")


def kv_heads(cfg):
    kv = cfg.get("num_key_value_heads") or cfg.get("num_kv_heads")
    return kv or (1 if cfg.get("multi_query") else heads(cfg))


def rerun(a):
    """Rerun the rows of RERUN[a.select] in oracle-grid.csv (allocated) and oracle-reserved.csv (allocated and
    reserved); every other row, the order and the header stay, and each header gets a line saying which rows
    were rerun, when, why and with which versions. A rerun row that no longer fits is left out, as `generate`
    and `reserved` leave such cases out: over an H200's 141 GiB allocated, or a replay that runs out."""
    import torch
    import transformers
    import peft
    root = a.root
    pick, why = RERUN[a.select]
    by_id = {c["id"]: c for c in design(root)}
    for name, cols, reserved_run in (("oracle-grid.csv", COLUMNS, False),
                                     ("oracle-reserved.csv", RESERVED_COLUMNS, True)):
        path = f"{root}/tests/data/{name}"
        old_header = [l.rstrip("\n") for l in open(path) if l.startswith("#")]
        rows = read_grid(path)
        todo = [r for r in rows if pick(json.load(open(f"{root}/tests/data/oracle-configs/{r['config']}")), r)]
        if not todo:        # no row of this file runs what changed: leave it and its header as they are
            print(f"{path}: no row selected", flush=True)
            continue
        seconds = 0.0
        dropped = []
        for i, row in enumerate(todo):
            c = by_id[row["id"]]
            r = run(c, root, reserved=reserved_run)
            new = reserved_row(c, r) if reserved_run else row_of(c, r)
            old = float(row["oracle_allocated_gib"])
            print(f"{name} [{i + 1}/{len(todo)}] {row['id']}: allocated {old:.4f} -> {new['oracle_allocated_gib']}"
                  + (f", reserved {row['oracle_reserved_gib']} -> {new['oracle_reserved_gib']}" if reserved_run else "")
                  + f" {r['sdpa_backends']} {r['seconds']:.1f}s", flush=True)
            row.update({k: new[k] for k in cols})
            seconds += r["seconds"]
            if r["peak_allocated_bytes"] / GIB > H200_GIB or (reserved_run and r["reserved_oom"]):
                dropped.append(row["id"])
        rows = [row for row in rows if row["id"] not in dropped]
        left_out = (f"; {len(dropped)} of them left out, over an H200 now: {', '.join(dropped)}" if dropped else "")
        note = (f"# {len(todo)} rows rerun {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}"
                f" with `scripts/oracle rerun {a.select}` after {why} (torch {torch.__version__}, transformers "
                f"{transformers.__version__}, peft {peft.__version__}; {seconds / 60:.1f} min){left_out}")
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        for row in rows:
            w.writerow({k: row[k] for k in cols})
        with open(path, "w") as f:
            f.write("\n".join(old_header + [note]) + "\n")
            f.write(buf.getvalue())
        print(f"{path}: {len(rows)} rows ({len(todo)} rerun, {len(dropped)} left out)", flush=True)
    return 0


def check(a):
    """Rerun a sample of the committed rows and compare: N rows of the grid (allocated), and a quarter as many
    of oracle-reserved.csv (allocated and reserved, through the caching-allocator replay)."""
    root = a.root
    by_id = {c["id"]: c for c in design(root)}
    rng = random.Random(a.seed)
    bad = 0
    for name, n, cols, reserved in (
            ("oracle-grid.csv", a.n, ("oracle_allocated_gib",), False),
            ("oracle-reserved.csv", max(1, a.n // 4), ("oracle_allocated_gib", "oracle_reserved_gib"), True)):
        path = f"{root}/tests/data/{name}"
        if not os.path.exists(path):
            continue
        rows = read_grid(path)
        sample = rng.sample(rows, min(n, len(rows)))
        off = 0
        for row in sample:
            c = by_id.get(row["id"])
            if c is None:
                print(f"{row['id']}: not in the design any more")
                off += 1
                continue
            r = run(c, root, reserved=reserved)
            now = dict(oracle_allocated_gib=r["peak_allocated_bytes"] / GIB,
                       oracle_reserved_gib=r.get("peak_reserved_bytes", 0) / GIB)
            line = f"{row['id']:60s}"
            for col in cols:
                old, new = float(row[col]), now[col]
                diff = 100.0 * (new - old) / old
                ok = abs(diff) <= 0.5
                off += not ok
                line += f"  {col.split('_')[1]} committed {old:9.4f} now {new:9.4f} {diff:+.3f}% {'ok' if ok else 'DIFFERS'}"
            print(line, flush=True)
        print(f"{name}: {len(sample)} rows, {off} values off by more than 0.5 %")
        bad += off
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--root", required=True)
    g.add_argument("--resume", action="store_true", help="keep the rows of an interrupted run")
    g.add_argument("--limit", type=int, default=None)
    g.add_argument("--add", action="store_true", help="run only hunt()'s cases missing from the file")
    ch = sub.add_parser("check")
    ch.add_argument("--root", required=True)
    ch.add_argument("n", type=int, nargs="?", default=8)
    ch.add_argument("--seed", type=int, default=None)
    rs = sub.add_parser("reserved", help="tests/data/oracle-reserved.csv: the allocator replay on a grid sample")
    rs.add_argument("--root", required=True)
    rs.add_argument("--inference", type=int, default=60)
    rs.add_argument("--training", type=int, default=12)
    rs.add_argument("--resume", action="store_true", help="keep the rows of an interrupted run")
    rr = sub.add_parser("rerun", help="rerun the rows a change of the oracle touches, in both files")
    rr.add_argument("--root", required=True)
    rr.add_argument("select", choices=sorted(RERUN))
    ls = sub.add_parser("list")
    ls.add_argument("--root", required=True)
    lg = sub.add_parser("long", help="tests/data/oracle-reserved-long.csv: the replay of long generations")
    lg.add_argument("--root", required=True)
    a = ap.parse_args()
    if a.cmd == "generate":
        return generate(a)
    if a.cmd == "reserved":
        return reserved(a)
    if a.cmd == "rerun":
        return rerun(a)
    if a.cmd == "long":
        return long_generations(a)
    if a.cmd == "list":
        for c in design(a.root):
            print(c["id"])
        return 0
    return check(a)


if __name__ == "__main__":
    sys.exit(main())
