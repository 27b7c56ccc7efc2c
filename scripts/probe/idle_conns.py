#!/usr/bin/env python3
"""Open N idle connections to the extender; print its open descriptors (issue 11, item 1).

    python3 scripts/probe/idle_conns.py target/debug/peakfit [--n 3000]
"""
import argparse, os, socket, time

import probe_common
ap = argparse.ArgumentParser()
ap.add_argument("binary"); ap.add_argument("--port", type=int, default=18994); ap.add_argument("--n", type=int, default=3000)
a = ap.parse_args()
proc = probe_common.extender(a.binary, a.port)
socks = []
for _ in range(a.n):
    s = socket.socket(); s.setblocking(False)
    try: s.connect(("127.0.0.1", a.port))
    except BlockingIOError: pass
    socks.append(s)
time.sleep(3)
print(f"{a.binary}: {a.n} idle connections -> {len(os.listdir(f'/proc/{proc.pid}/fd'))} open descriptors")
proc.terminate(); proc.wait()
