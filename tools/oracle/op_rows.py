#!/usr/bin/env python3
"""Which committed training rows run an aten op: a shrunk run of each row's case (2 layers, batch 1, 128 tokens, one
step, no replay) counting the op's calls. Whether an op runs depends on the model, the attention, the dtype
and the workload, not on the batch, the length or the depth (the SDPA kernel's choice reads dtypes, heads and
head dims), so the shrunk run answers for the row in seconds. For choosing the rows a change of the oracle
must rerun (grid.py RERUN) and the measured rows it must be checked on (docs/oracle.md).

  op_rows.py --root R --op _softmax_backward_data [--csv oracle-grid.csv ...] [--dir tests/data/h200c ...]
  (--csv: files in tests/data, by default the three oracle CSVs; --dir: measured folders, under R)
"""
import argparse
import collections
import csv
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402

LAYER_KEYS = ("num_hidden_layers", "n_layer")


def shrunk_config(path, out_dir):
    """The config with 2 layers (per-layer lists such as `layer_types` cut to match), written to out_dir."""
    with open(path) as f:
        d = json.load(f)
    n = None
    for k in LAYER_KEYS:
        if k in d:
            n, d[k] = d[k], 2
    for k, v in list(d.items()):
        if isinstance(v, list) and n and len(v) == n:
            d[k] = v[:2]
    out = os.path.join(out_dir, os.path.basename(path))
    with open(out, "w") as f:
        json.dump(d, f)
    return out


def grid_cases(root, name):
    """The rows of a grid-style CSV (oracle-grid.csv, oracle-reserved*.csv) as oracle cases."""
    with open(os.path.join(root, "tests/data", name)) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    for r in rows:
        yield dict(id=r["id"], config=os.path.join(root, "tests/data/oracle-configs", r["config"]),
                   workload=r["workload"], dtype=r["dtype"], gradient_checkpointing=r["gradient_checkpointing"] or "none",
                   optimizer=r["optimizer"] or None, lora_rank=int(r["lora_rank"]) if r["lora_rank"] else None,
                   attention=r["attention"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True)
    ap.add_argument("--op", required=True, help="an aten op's name, e.g. _softmax_backward_data")
    ap.add_argument("--csv", nargs="*", default=["oracle-grid.csv", "oracle-reserved.csv",
                                                 "oracle-reserved-long.csv"])
    ap.add_argument("--dir", nargs="*", default=[], help="measured folders (their rows as `visible` reads them)")
    a = ap.parse_args()
    op = getattr(torch_ops(), a.op).default
    calls = collections.Counter()

    class Counting(oracle.Tracker):
        """Counts the op where the tracker notes each op it runs (`last_op`): a setter, so no frame of this
        file is on the stack when the run reads a value (Tracker.read_value names the reading frame)."""

        @property
        def last_op(self):
            return self.__dict__.get("_last_op")

        @last_op.setter
        def last_op(self, func):
            if func is op:
                calls[func] += 1
            self.__dict__["_last_op"] = func

    oracle.Tracker = Counting
    sources = [(name, list(grid_cases(a.root, name))) for name in a.csv]
    sources += [(d, oracle.visible_cases(os.path.join(a.root, d))) for d in a.dir]
    seen = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cases in sources:
            runs = 0
            for c in cases:
                if c["workload"] == "inference":
                    continue
                key = (os.path.basename(c["config"]), c["workload"], c["dtype"], c["gradient_checkpointing"],
                       c.get("lora_rank"), c["attention"])
                if key not in seen:
                    calls.clear()
                    small = dict(c, config=shrunk_config(c["config"], tmp), batch=1, context_tokens=128,
                                 reserved=False, steps=1)
                    try:
                        oracle.run_case(small)
                        seen[key] = calls[op]
                    except Exception as e:  # report, keep going
                        seen[key] = f"FAILED {type(e).__name__}: {str(e)[:200]}"
                n = seen[key]
                runs += isinstance(n, int) and n > 0
                print(f"{name} {c['id']}: {n}", flush=True)
            print(f"{name}: {runs} rows run {a.op}", flush=True)
    return 0


def torch_ops():
    import torch
    return torch.ops.aten


if __name__ == "__main__":
    sys.exit(main())
