#!/usr/bin/env python3
"""What is live at a case's allocated peak, and which segments make its reserved peak.

usage: peak_live.py SNAPSHOT.pickle.gz [--top N]     (prints the summary as JSON)

`measure.py` records the caching allocator's history for a case marked `trace=True`
(`torch.cuda.memory._record_memory_history`, Python stacks) from the moment its weights are
loaded, and writes `torch.cuda.memory._snapshot()` with the allocated and reserved bytes at that
moment (`peakfit_base`). The history is every `alloc`, `free_completed`, `segment_alloc` and
`segment_free` of the run (`c10/cuda/CUDACachingAllocator.cpp` `record_trace`), so walking it
from the base gives the allocated and reserved bytes after every event: the peak's live blocks
(what the model must count) and the segments the reserve holds at its peak (what the slack
terms must count), each with the Python frames that asked for it. A mechanism is read from
these, not a number fitted to them.
"""
import gzip, json, pickle, sys

# The history's `alloc` and `free_completed` sizes are what was asked; the allocated counter counts
# the block, rounded up to 512 B (`CUDACachingAllocator.cpp` `round_size`, `kMinBlockSize`). It also
# counts the rest of a large free block it does not split (`should_split`: a rest of 1 MiB or less
# stays in the block), which the history does not show: `max_memory_allocated` can read higher
# than the walk by that much (0 to 119 MiB on the histories in tests/data/h200c/traces).
MIN_BLOCK = 512
# measure.py records at most this many events; a history that long may have lost its start.
MAX_ENTRIES = 1_000_000
GROWS = ("segment_alloc", "segment_map")      # `segment_map`: expandable segments growing
SHRINKS = ("segment_free", "segment_unmap")


def block(size):
    """The bytes the allocated counter adds for a request of `size`."""
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


def short(frames, n=6):
    out = []
    for f in frames or []:
        name = f.get("filename", "?")
        for cut in ("site-packages/", "dist-packages/", "tools/measure/"):
            if cut in name:
                name = name.split(cut, 1)[1]
        out.append(f"{name}:{f.get('line')} {f.get('name')}")
        if len(out) == n:
            break
    return out


def walk(events, base_alloc, base_resv):
    """The index of the event after which allocated, and reserved, were highest."""
    cur, resv = base_alloc, base_resv
    best, best_i, best_r, best_ri = cur, -1, resv, -1
    for i, e in enumerate(events):
        a = e["action"]
        if a == "alloc":
            cur += block(e["size"])
        elif a == "free_completed":
            cur -= block(e["size"])
        elif a in GROWS:
            resv += e["size"]
        elif a in SHRINKS:
            resv -= e["size"]
        if cur > best:
            best, best_i = cur, i
        if resv > best_r:
            best_r, best_ri = resv, i
    return best, best_i, best_r, best_ri


def state_at(events, upto):
    """Blocks and segments the history made that are live after event `upto`."""
    live, segs = {}, {}
    for i, e in enumerate(events[: upto + 1]):
        a = e["action"]
        if a == "alloc":
            live[e["addr"]] = i
        elif a == "free_completed":
            live.pop(e["addr"], None)
        elif a in GROWS:
            # The allocation that asked for the segment is the next one (`alloc_block` then
            # the block is split off it), possibly after the peak's event.
            asked = next((j for j in range(i + 1, len(events)) if events[j]["action"] == "alloc"), None)
            segs[e["addr"]] = (i, asked)
        elif a in SHRINKS:
            segs.pop(e["addr"], None)
    return live, segs


def summarize(snap, top=40):
    base = snap.get("peakfit_base", {"allocated": 0, "reserved": 0})
    events = snap["device_traces"][0]
    best, bi, best_r, bri = walk(events, base["allocated"], base["reserved"])
    live, _ = state_at(events, bi)
    groups = {}
    for addr, i in live.items():
        e = events[i]
        key = (block(e["size"]), tuple(short(e.get("frames"), 4)))
        g = groups.setdefault(key, [0, i])
        g[0] += 1
    blocks = sorted(groups.items(), key=lambda kv: -kv[0][0] * kv[1][0])[:top]
    _, segs = state_at(events, bri)
    seg_rows = []
    for addr, (si, ai) in segs.items():
        trig = events[ai] if ai is not None else None
        seg_rows.append(dict(event=si, size=events[si]["size"],
                             asked=trig["size"] if trig else None,
                             frames=short(trig.get("frames")) if trig else []))
    seg_rows.sort(key=lambda r: -r["size"])
    around = []
    for e in events[max(0, bi - 40): bi + 3]:
        if e["action"] in ("alloc", "free_completed", "segment_alloc", "segment_free"):
            around.append(f"{e['action']:14s} {e['size']:>14,d} " + " | ".join(short(e.get("frames"), 3)))
    return dict(
        events=len(events), base=base,
        peak_allocated=best, peak_event=bi, live_blocks_from_history=len(live),
        live_bytes_from_history=sum(block(events[i]["size"]) for i in live.values()),
        history_may_have_wrapped=len(events) >= MAX_ENTRIES,
        peak_reserved=best_r, peak_reserved_event=bri,
        blocks=[dict(size=k[0], count=v[0], first_event=v[1], frames=list(k[1])) for k, v in blocks],
        segments_at_reserved_peak=seg_rows[:top], segments_count=len(seg_rows),
        segments_bytes=sum(r["size"] for r in seg_rows),
        events_before_peak=around,
    )


def main():
    with gzip.open(sys.argv[1], "rb") as f:
        snap = pickle.load(f)
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 40
    print(json.dumps(summarize(snap, top), indent=1))


if __name__ == "__main__":
    main()
