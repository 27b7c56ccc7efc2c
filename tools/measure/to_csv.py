#!/usr/bin/env python3
"""Turn measure.py's JSON lines into the real-GPU row format of tests/data/h200 (the columns of
../shared/data/memory-validation.md plus the three counters), one config file per row.

usage: to_csv.py [--date YYYY-MM-DD] OUT_DIR FILE.jsonl [FILE.jsonl ...]

The date is each result's `date` (measure.py writes it) or `--date` for lines from before it
did. Writes OUT_DIR/<folder>-<YYYY-MM>.csv (measured rows), OUT_DIR/<prefix>-oom.csv (cases that ran out of
memory: the allocation that failed, and what was allocated then, a lower bound on the peak) and
OUT_DIR/configs/<id>.json. A later line for the same id replaces an earlier one (a case rerun
alone after running out of memory beside others). A row whose allocator had to free its cache
and retry (`num_alloc_retries` > 0) keeps its allocated counter, but its reserved and NVML
counters were cut by the neighbours' memory: the row says so in `notes` and leaves them empty.
"""
import csv, json, os, re, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402  (the case list: a failed case's line holds only its id)

GIB = 2 ** 30
COLUMNS = ("id,model,params,layers,hidden_size,attention_heads,kv_heads,head_dim,vocab_size,"
           "intermediate_size,tied_embeddings,workload,dtype,kv_dtype,engine,gpu_memory_utilization,"
           "gpu_memory_total_gib,batch,context_tokens,tensor_parallel,data_parallel,zero_stage,optimizer,"
           "gradient_checkpointing,lora_rank,flash_attention,measured_gib,counter,source,notes,"
           "max_allocated_gib,max_reserved_gib,nvml_gib,weights_gib,cuda_context_gib,attention").split(",")
OOM_COLUMNS = ["id", "model", "workload", "dtype", "engine", "gpu_memory_total_gib", "batch", "context_tokens",
               "optimizer", "gradient_checkpointing", "lora_rank", "flash_attention", "allocated_at_oom_gib",
               "failed_request_gib", "min_peak_allocated_gib", "source", "notes"]


def shape(cfg):
    """The shape columns, from the config the model was built from (informational: the tests
    estimate from the config file itself)."""
    g = cfg.get
    if cfg["model_type"] == "whisper":
        layers = g("encoder_layers", 0) + g("decoder_layers", 0)
        hidden, heads, kv, ffn = g("d_model"), g("decoder_attention_heads"), g("decoder_attention_heads"), g("decoder_ffn_dim")
    else:
        layers = g("num_hidden_layers") or g("n_layer")
        hidden = g("hidden_size") or g("n_embd")
        heads = g("num_attention_heads") or g("n_head")
        kv = g("num_key_value_heads") or (1 if g("multi_query") else heads)
        ffn = g("intermediate_size") or g("n_inner") or (4 * hidden if hidden else None)
    hd = g("head_dim") or (hidden // heads if hidden and heads else None)
    return dict(layers=layers, hidden_size=hidden, attention_heads=heads, kv_heads=kv, head_dim=hd,
                vocab_size=g("vocab_size"), intermediate_size=ffn,
                tied_embeddings=str(g("tie_word_embeddings", True)).lower())


def versions(r):
    return (f"random-initialised weights, transformers {r['transformers']}, torch {r['torch']}, one {r['gpu']} "
            f"(driver {r['driver']})")


def annotation_optimizer(optim):
    """The `peakfit.io/optimizer` a row is scored with. measure.py's `adamw-foreach` (AdamW with
    `foreach=True`) is the annotation's `adamw`, torch's CUDA default; its `adamw`
    (`fused=False`, the per-tensor loop) is scored as `adamw` too, as the shared rows are: the
    annotation does not name the implementation, and the notes' `path` says which ran."""
    return {"adamw-foreach": "adamw"}.get(optim, optim or "")


def main(out_dir, files, date=None):
    results = {}
    for f in files:
        for line in open(f):
            r = json.loads(line)
            results[r["id"]] = r
    # A case that repeats a measured one to record the allocator's history (`rerun_of`; the
    # counters came out the same to the MiB) is not a row: its history is the product.
    reruns = {c["id"] for c in measure.CASES if c.get("rerun_of")}
    ok = [r for r in results.values() if r.get("ok") and r["id"] not in reruns]
    gpu_total = max(r["gpu_total"] for r in ok) / GIB
    failed = [r for r in results.values() if not r.get("ok")]
    for r in results.values():
        r.setdefault("date", date)
    if any(r["date"] is None for r in ok):
        sys.exit("to_csv: a result without a date (lines from before measure.py wrote one): pass --date")
    gpus = {r["gpu"] for r in ok}
    if len(gpus) != 1:
        sys.exit(f"to_csv: one GPU per folder, got {sorted(gpus)}")
    (gpu,) = gpus
    # Named for the folder and the month of its first rows, so that later leases add to the same file.
    prefix = f"{os.path.basename(os.path.normpath(out_dir))}-{min(r['date'] for r in ok)[:7]}"
    os.makedirs(os.path.join(out_dir, "configs"), exist_ok=True)
    source_of = lambda r: f"measured for peakfit: tools/measure/measure.py, one {gpu}, {r['date'] or '?'}"
    with open(os.path.join(out_dir, prefix + ".csv"), "w", newline="") as out:
        w = csv.DictWriter(out, COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in sorted(ok, key=lambda r: r["id"]):
            cfg = r["config"]
            with open(os.path.join(out_dir, "configs", r["id"] + ".json"), "w") as c:
                json.dump(cfg, c, indent=2, sort_keys=True)
                c.write("\n")
            training = r["workload"] != "inference"
            cut = bool(r.get("alloc_retries"))
            alloc, resv, nvml = r["max_allocated"] / GIB, r["max_reserved"] / GIB, r["nvml_peak"] / GIB
            notes = (f"{versions(r)}; counters: max_allocated {alloc:.3f}, max_reserved {resv:.3f}, nvml {nvml:.3f} GiB "
                     f"(process, CUDA context alone {r['nvml_context'] / GIB:.3f}); weights {r['weights_bytes'] / GIB:.3f} GiB; "
                     f"attention {r['attn']}; path {r['path']}")
            if r["path"] == "generate":
                notes += f"; HF generate, greedy, prompt {r['ctx'] - r['new']} + {r['new']} new tokens"
            elif r["path"] == "manual-greedy":
                notes += "; 30 s of audio (3000 mel frames) per sequence, greedy decode of context_tokens tokens, beams 1"
            elif training:
                notes += "; loss by the model from labels, 3 optimizer steps, use_cache off"
            if r["dtype"] == "fp16-amp":
                # measure.py's (and the H200 rows') fp16-amp: the 16-bit type autocast runs is bf16.
                notes += "; fp16-amp = fp32 weights under torch.autocast(cuda, bfloat16)"
            if r["workload"] == "lora":
                notes += f"; PEFT LoRA on all linear layers, alpha {2 * r['rank']}, dropout 0"
            if r.get("alloc_conf"):
                # Not an input the model reads: tests/model_rows leaves such rows out of the scoring.
                notes += f"; PYTORCH_CUDA_ALLOC_CONF={r['alloc_conf']}"
            if cut:
                notes += (f"; the caching allocator freed its cache and retried {r['alloc_retries']} time(s) "
                          "(cudaMalloc failed: neighbouring cases held part of the GPU, or the case outgrew it): "
                          "reserved and NVML are not this case's own peak and are left out")
            row = dict(id=r["id"], model=r["model"], params=r["params"], **shape(cfg), workload=r["workload"],
                       dtype=r["dtype"], kv_dtype="" if training else r["dtype"], engine="hf",
                       gpu_memory_total_gib=f"{r['gpu_total'] / GIB:.2f}", batch=r["batch"], context_tokens=r["ctx"],
                       tensor_parallel=1, data_parallel=1, zero_stage="0" if training else "",
                       optimizer=annotation_optimizer(r.get("optim")), gradient_checkpointing=r.get("ckpt") or "",
                       lora_rank=r.get("rank") or "", flash_attention="false" if r["attn"] == "eager" else "true",
                       measured_gib="" if cut else f"{nvml:.3f}", counter="nvml", source=source_of(r), notes=notes,
                       max_allocated_gib=f"{alloc:.3f}", max_reserved_gib="" if cut else f"{resv:.3f}",
                       nvml_gib="" if cut else f"{nvml:.3f}", weights_gib=f"{r['weights_bytes'] / GIB:.3f}",
                       cuda_context_gib=f"{r['nvml_context'] / GIB:.3f}", attention=r["attn"])
            w.writerow(row)
    with open(os.path.join(out_dir, prefix + "-oom.csv"), "w", newline="") as out:
        w = csv.DictWriter(out, OOM_COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in sorted(failed, key=lambda r: r["id"]):
            err = r.get("err", "")
            m = re.search(r"Tried to allocate ([\d.]+) (GiB|MiB).*?this process has ([\d.]+) GiB memory in use\. "
                          r"Of the allocated memory ([\d.]+) GiB is allocated by PyTorch", err, re.S)
            if not m:
                print(f"{r['id']}: no out-of-memory message, left out: {err[-200:]}", file=sys.stderr)
                continue
            req = float(m.group(1)) / (1024 if m.group(2) == "MiB" else 1)
            allocated = float(m.group(4))
            c = next(c for c in measure.CASES if c["id"] == r["id"])
            case = dict(model=c["model"], workload=c["workload"], dtype=c["dtype"], engine="hf",
                        gpu_memory_total_gib=f"{gpu_total:.2f}",
                        batch=c["batch"], context_tokens=c["ctx"], optimizer=c.get("optim") or "",
                        gradient_checkpointing=c.get("ckpt") or "", lora_rank=c.get("rank") or "",
                        flash_attention="false" if c.get("attn") == "eager" else "true")
            print(f"{r['id']}: OOM, allocated {allocated} + request {req}", file=sys.stderr)
            where = "backward pass" if "run the backward pass" in err or "backward" in err else "forward pass"
            w.writerow(dict(id=r["id"], allocated_at_oom_gib=f"{allocated:.2f}", failed_request_gib=f"{req:.2f}",
                            min_peak_allocated_gib=f"{allocated + req:.2f}", source=source_of(r),
                            notes=f"alone on the GPU; torch.OutOfMemoryError in the {where}", **case))


if __name__ == "__main__":
    args = sys.argv[1:]
    day = None
    if args[:1] == ["--date"]:
        day, args = args[1], args[2:]
    main(args[0], args[1:], date=day)
