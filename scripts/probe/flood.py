#!/usr/bin/env python3
"""Bind latency while filters flood the extender (issue 11, item 10).

Generates a file-mode cluster (NODES nodes x 8 GPUs, BINDS pending pods), starts
`BINARY extender --from-file` on 127.0.0.1:PORT, runs FLOODERS threads posting NodeNames
filters for every node (real work: rayon over 5,000 nodes) and one thread binding the pending
pods one after another (and one GETting /healthz), then prints median/p99/max of each.

    python3 scripts/probe/flood.py target/debug/peakfit [--port 18990] [--seconds 20]
"""
import argparse, http.client, json, os, tempfile, threading, time

import probe_common

ap = argparse.ArgumentParser()
ap.add_argument("binary")
ap.add_argument("--port", type=int, default=18990)
ap.add_argument("--nodes", type=int, default=5000)
ap.add_argument("--binds", type=int, default=400)
ap.add_argument("--flooders", type=int, default=8)
ap.add_argument("--seconds", type=float, default=20)
a = ap.parse_args()

# A JSON List: the binary before issue 11 stopped YAML at 1,024 documents.
items = []
for i in range(a.nodes):
    items.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{i}"}})
    items.append({"apiVersion": "peakfit.io/v1alpha1", "kind": "NodeGpuReport",
                  "metadata": {"name": f"node-{i}"}, "spec": {"nodeName": f"node-{i}"},
                  "status": {"observedAt": "2026-11-21T17:48:00Z", "nvml": {"up": True},
                             "gpus": [{"index": g, "uuid": f"GPU-{i}-{g}", "name": "NVIDIA H100 80GB HBM3",
                                       "memoryTotalBytes": 85520809984, "memoryUsedBytes": 0,
                                       "memoryFreeBytes": 85520809984, "memoryReservedBytes": 536870912,
                                       "processes": []} for g in range(8)]}})
for p in range(a.binds):
    items.append({"apiVersion": "v1", "kind": "Pod",
                  "metadata": {"name": f"p{p}", "namespace": "ml", "uid": f"uid-{p}",
                               "annotations": {"peakfit.io/vram": "10Gi"}},
                  "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}})
tmp = tempfile.mkdtemp()
path = os.path.join(tmp, "cluster.json")
json.dump({"apiVersion": "v1", "kind": "List", "items": items}, open(path, "w"))

proc = probe_common.extender(a.binary, a.port, cluster=path)
def conn():
    return http.client.HTTPConnection("127.0.0.1", a.port, timeout=120)

names = [f"node-{i}" for i in range(a.nodes)]
filt = json.dumps({"Pod": {"metadata": {"name": "f", "namespace": "ml", "uid": "flood",
                                         "annotations": {"peakfit.io/vram": "20Gi"}}},
                   "NodeNames": names}).encode()
stop = threading.Event()
filters = [0]
def flood():
    c = conn()
    while not stop.is_set():
        c.request("POST", "/filter", filt, {"Content-Type": "application/json"})
        c.getresponse().read(); filters[0] += 1

lat = {"bind": [], "healthz": []}
def binds():
    c = conn(); p = 0
    while not stop.is_set() and p < a.binds:
        body = json.dumps({"PodName": f"p{p}", "PodNamespace": "ml", "PodUID": f"uid-{p}",
                           "Node": names[p % a.nodes]}).encode()
        t = time.perf_counter()
        c.request("POST", "/bind", body, {"Content-Type": "application/json"})
        r = c.getresponse().read()
        lat["bind"].append(time.perf_counter() - t)
        assert b'"Error":""' in r or b'"Error"' not in r, r
        p += 1; time.sleep(0.02)
def health():
    c = conn()
    while not stop.is_set():
        t = time.perf_counter(); c.request("GET", "/healthz"); c.getresponse().read()
        lat["healthz"].append(time.perf_counter() - t); time.sleep(0.02)

threads = [threading.Thread(target=flood) for _ in range(a.flooders)]
for t in threads: t.start()
time.sleep(2)
extra = [threading.Thread(target=binds), threading.Thread(target=health)]
for t in extra: t.start()
time.sleep(a.seconds)
stop.set()
for t in threads + extra: t.join()
proc.terminate(); proc.wait()

def pct(xs, q):
    xs = sorted(xs); return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000
print(f"{a.binary}: {filters[0]} filters of {a.nodes} nodes by {a.flooders} clients in {a.seconds + 2:.0f} s")
for k, xs in lat.items():
    print(f"  {k}: n={len(xs)} median {pct(xs, .5):.1f} ms, p99 {pct(xs, .99):.1f} ms, max {max(xs) * 1000:.1f} ms")
