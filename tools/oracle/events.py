"""Print the oracle's event log of a `generate`, op by op: every allocation and free after the weights'
`empty_cache()`, with the op, shape and dtype that made each block (docs/oracle.md, "Falcon in the prefill
replay"). For following a model's request sequence in `prefill_replay`.

    PEAKFIT_ORACLE_VENV=/work/oracle-venv; $PEAKFIT_ORACLE_VENV/bin/python tools/oracle/events.py \\
        --config tests/data/h100/configs/h100-falcon-7b-b1-8k.json --layers 2 --batch 4 \\
        --context-tokens 2102 --new-tokens 2
    ... --large   # only the large pool's blocks (> 1 MiB), comma-separated, frees negative: the
                  # form of prefill_replay's oracle-*-2-layers.txt

Lines: `event a handle block phase (op, shape, dtype)` and `event f handle block op`. The reserved and
allocated totals of the run go to stderr.
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--layers", type=int, help="cut the config to this many layers")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context-tokens", type=int, required=True)
    p.add_argument("--new-tokens", type=int, default=2)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--attention", default="sdpa")
    p.add_argument("--decode", default="all", help="all, synth or ends (oracle.run_inference)")
    p.add_argument("--large", action="store_true")
    a = p.parse_args(argv)
    cfg = json.load(open(a.config))
    if a.layers:
        cfg["num_hidden_layers"] = a.layers
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
    names = {}
    track = oracle.Tracker.track

    def named(self, t, category="temporaries"):
        rec = track(self, t, category)
        names[rec[6]] = (str(rec[3]).replace("aten.", ""), tuple(rec[4]), str(rec[5]).replace("torch.", ""))
        return rec

    oracle.Tracker.track = named
    res = oracle._run_case(dict(config=f.name, workload="inference", dtype=a.dtype, batch=a.batch,
                                context_tokens=a.context_tokens, new_tokens=a.new_tokens, decode=a.decode,
                                attention=a.attention))
    os.unlink(f.name)
    print(f"reserved {res['peak_reserved_bytes']} {res['reserved_breakdown_bytes']}, "
          f"allocated {res['peak_allocated_bytes']}", file=sys.stderr)
    events = res["_events"]
    start = next(i for i, e in enumerate(events) if e[0] == "r") + 1
    sizes, large = {}, []
    for i, e in enumerate(events[start:], start):
        if e[0] == "a":
            sizes[e[1]] = oracle.block(e[2])
            if a.large:
                if sizes[e[1]] > 1 << 20:
                    large.append(sizes[e[1]])
            else:
                print(i, "a", e[1], sizes[e[1]], e[3], names.get(e[1], ("?",)))
        elif e[0] == "f":
            n = sizes.get(e[1], 0)
            if a.large:
                if n > 1 << 20:
                    large.append(-n)
            else:
                print(i, "f", e[1], n, names.get(e[1], ("?",))[0])
    if a.large:
        print(",".join(map(str, large)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
