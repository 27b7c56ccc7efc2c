"""Run measured training rows through the oracle and save each run's event log, with the op, shape and
dtype that made each block, for the caching-allocator analysis of a training step's slack.

    $PEAKFIT_ORACLE_VENV/bin/python tools/oracle/train_events.py --dir tests/data/h200b --out /tmp/ev ID...

Writes OUT/ID.pkl: {"case", "result" (the oracle's result without events), "events", "names"}.
With --large also OUT/ID.txt: the large pool's log after the weights as `train_replay`'s fixtures keep
it (each request's 512-byte-rounded size > 1 MiB, frees negative, comma-separated).
"""
import argparse
import os
import pickle
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402


def grid_case(i):
    """An oracle-reserved.csv training id (`qwen2.5-0.5b-training-fp16-amp-b4-t1024-gcnone-adamw-fused`) as a
    case of the oracle; its measured columns NaN."""
    import re
    m = re.match(r"(.+)-(training|lora)-(bf16|fp16-amp|fp16|fp32)-b(\d+)-t(\d+)-gc(none|full)-(adamw-fused|adamw-loop|adamw|sgd)"
                 r"(?:-r(\d+))?$", i)
    name, workload, dtype, b, t, gc, opt, r = m.groups()
    here = os.path.dirname(os.path.abspath(__file__))
    return dict(id=i, config=os.path.join(here, "../../tests/data/oracle-configs", f"{name}.json"), workload=workload,
                dtype=dtype, batch=int(b), context_tokens=int(t), gradient_checkpointing=gc, optimizer=opt,
                lora_rank=int(r) if r else None, attention="sdpa", measured_gib=float("nan"),
                measured_reserved_gib=float("nan"))


def large_log(events):
    """The large pool's requests and frees after the weights (the `("r",)` mark): sizes rounded up to
    512 bytes (`round_size`), frees negative, only those above 1 MiB (`kSmallSize`)."""
    live, out, started = {}, [], False
    for e in events:
        if e[0] == "r":
            started = True
        elif e[0] == "a":
            live[e[1]] = max(512, (e[2] + 511) // 512 * 512)
            if started:
                out.append(live[e[1]])
        elif e[0] == "f":
            size = live.pop(e[1], None)
            if size and started:
                out.append(-size)
    return [x for x in out if abs(x) > 1 << 20]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", help="a real-GPU folder whose rows the ids name")
    p.add_argument("--grid", action="store_true",
                   help="the ids are oracle-reserved.csv ids: config-workload-dtype-bB-tT-gcG-OPT[-rR]")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--large", action="store_true", help="also write OUT/ID.txt, the large pool's log")
    p.add_argument("--engine", help="hf-trainer: under fp16-amp, accelerate's convert_outputs_to_fp32 around "
                                    "the forward, as the Trainer runs it")
    p.add_argument("ids", nargs="+")
    a = p.parse_args(argv)
    names = {}
    track = oracle.Tracker.track

    def named(self, t, category="temporaries"):
        rec = track(self, t, category)
        names[rec[6]] = (str(rec[3]).replace("aten.", ""), tuple(rec[4]), str(rec[5]).replace("torch.", ""),
                         self.phase)
        return rec

    oracle.Tracker.track = named
    cases = {c["id"]: c for c in oracle.visible_cases(a.dir)} if a.dir else {}
    for i in a.ids:
        names.clear()
        c = dict(cases[i] if i in cases else grid_case(i), steps=a.steps)
        if a.engine:
            c["engine"] = a.engine
        res = oracle._run_case(c)
        events = res.pop("_events")
        with open(os.path.join(a.out, f"{i}.pkl"), "wb") as f:
            pickle.dump(dict(case=c, result=res, events=events, names=dict(names)), f)
        if a.large:
            with open(os.path.join(a.out, f"{i}.txt"), "w") as f:
                f.write(",".join(str(x) for x in large_log(events)) + "\n")
        gib = 1 << 30
        print(f"{i}: allocated {c['measured_gib']:.3f} / {res['peak_allocated_bytes'] / gib:.3f}  reserved "
              f"{c['measured_reserved_gib']:.3f} / {res['peak_reserved_bytes'] / gib:.3f}  "
              f"phase {res['peak_phase']} / {res['reserved_phase']}  {res['seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
