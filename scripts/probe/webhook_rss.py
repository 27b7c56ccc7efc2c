#!/usr/bin/env python3
"""Peak RSS of `peakfit webhook` answering one pod with N containers (issue 11, item 5).

    python3 scripts/probe/webhook_rss.py target/debug/peakfit [--containers 5000]
"""
import argparse, http.client, json, ssl

import probe_common
ap = argparse.ArgumentParser()
ap.add_argument("binary"); ap.add_argument("--port", type=int, default=18443); ap.add_argument("--containers", type=int, default=5000)
a = ap.parse_args()
proc = probe_common.start([a.binary, "webhook", "--listen", f"127.0.0.1:{a.port}",
                           "--tls-cert", "tests/fixtures/webhook-tls/a.crt",
                           "--tls-key", "tests/fixtures/webhook-tls/a.key"], a.port)
status = lambda field: probe_common.status_mib(proc, field)
review = {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {
    "uid": "u", "operation": "CREATE", "namespace": "ml", "name": "big",
    "kind": {"group": "", "version": "v1", "kind": "Pod"}, "resource": {"group": "", "version": "v1", "resource": "pods"},
    "userInfo": {}, "object": {"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "big", "namespace": "ml", "annotations": {"peakfit.io/vram": "10Gi"}},
        "spec": {"containers": [{"name": f"c{i}", "image": "i"} for i in range(a.containers)]}}}}
body = json.dumps(review).encode()
base = status("VmRSS:")
ctx = ssl._create_unverified_context()
c = http.client.HTTPSConnection("127.0.0.1", a.port, context=ctx, timeout=120)
c.request("POST", "/mutate", body, {"Content-Type": "application/json"})
r = c.getresponse(); data = r.read()
print(f"{a.binary}: pod with {a.containers} containers ({len(body) // 1024} KB request) -> {r.status}, "
      f"{len(data) // 1024} KB reply; RSS before {base} MiB, peak (VmHWM) {status('VmHWM:')} MiB")
proc.terminate(); proc.wait()
