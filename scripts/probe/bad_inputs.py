#!/usr/bin/env python3
"""Hand-made bad requests against the real extender (issue 11, item 8): every reply's status,
whether its body is JSON, and whether the process survived.

    python3 scripts/probe/bad_inputs.py target/debug/peakfit [--port 18998]
"""
import argparse, http.client, json

import probe_common
from collections import Counter

ap = argparse.ArgumentParser()
ap.add_argument("binary")
ap.add_argument("--port", type=int, default=18998)
a = ap.parse_args()
proc = probe_common.extender(a.binary, a.port)

pod = {"metadata": {"name": "p", "namespace": "ml", "uid": "u", "annotations": {"peakfit.io/vram": "1Gi"}}}
bodies = [b"", b"{", b"null", b"[]", b"[{}]", b'"x"', b"1e999", b"{}", b'{"Pod":null}', b'{"Pod":5}',
          b'{"Pod":{},"NodeNames":"x"}', b"\xff\xfe", b"[" * 100000, b'{"Pod":' * 1000,
          json.dumps({"Pod": pod}).encode(), json.dumps({"Pod": pod, "NodeNames": ["ghost"] * 3}).encode(),
          json.dumps({"Pod": pod, "Nodes": {"items": [{"metadata": {}}]}}).encode(),
          json.dumps({"PodName": "x"}).encode(), json.dumps({"PodName": "p", "PodNamespace": "ml", "PodUID": "u", "Node": ""}).encode(),
          json.dumps({"Pod": pod, "NodeNameToMetaVictims": {"h100-0": {"Pods": [{"UID": 5}]}}}).encode()]
for ann in ["-1Gi", "1e999", "18446744073709551615", "0", "1.5.5Gi", "", "NaN", "9" * 400]:
    bodies.append(json.dumps({"Pod": {"metadata": {"name": "p", "annotations": {"peakfit.io/vram": ann, "peakfit.io/gpus": ann}}},
                              "NodeNames": ["h100-0", "a100-0", "l4-0"]}).encode())
requests = [("POST", v, b) for v in ["/filter", "/prioritize", "/bind", "/preempt", "/x/filter"] for b in bodies]
requests += [(m, p, b"") for m in ["GET", "PUT", "DELETE", "PATCH"] for p in ["/filter", "/prioritize", "/bind", "/preempt"]]
requests += [("POST", p, b"{}") for p in ["/", "/nope", "/a/b/filter", "/healthz", "/metrics"]]
requests += [("GET", p, b"") for p in ["/healthz", "/readyz", "/metrics", "/%00", "/" + "a" * 5000]]

statuses, non_json = Counter(), []
for method, path, body in requests:
    c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=30)
    c.request(method, path, body, {"Content-Type": "application/json"})
    r = c.getresponse(); data = r.read(); statuses[r.status] += 1
    if r.status != 200:
        try: json.loads(data)
        except ValueError: non_json.append(f"{method} {path[:20]} -> {r.status} {data[:40]!r}")
alive = proc.poll() is None
proc.terminate(); proc.wait()
print(f"{a.binary}: {len(requests)} requests, statuses {dict(sorted(statuses.items()))}, "
      f"non-JSON error replies {len(non_json)}, alive after: {alive}")
for line in non_json[:8]: print("  ", line)
