#!/usr/bin/env python3
"""Peak RSS of the extender under CLIENTS concurrent large bodies (issue 11, item 5).

Starts `BINARY extender --from-file deploy/examples/cluster.yaml` on 127.0.0.1:PORT, sends
CLIENTS concurrent `POST /filter` bodies of MIB MiB each (a JSON object with one long string, so
the body has to be read and decoded), then prints the status codes and the process's VmHWM (peak
RSS) and VmRSS (kept) from /proc.

    python3 scripts/probe/rss.py target/debug/peakfit --mib 250
    python3 scripts/probe/rss.py target/debug/peakfit --mib 30
"""
import argparse, socket, threading, time

import probe_common

ap = argparse.ArgumentParser()
ap.add_argument("binary")
ap.add_argument("--port", type=int, default=18995)
ap.add_argument("--mib", type=int, default=250)
ap.add_argument("--clients", type=int, default=8)
a = ap.parse_args()

proc = probe_common.extender(a.binary, a.port)
status = lambda field: probe_common.status_mib(proc, field)
base = status("VmRSS:")
n = a.mib << 20
body = b'{"Pod":null,"NodeNames":["' + b"a" * (n - 30) + b'"]}'
codes = []
def send():
    s = socket.create_connection(("127.0.0.1", a.port))
    s.settimeout(300)
    try:
        s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
        view = memoryview(body)
        for i in range(0, len(body), 1 << 20):
            s.sendall(view[i:i + (1 << 20)])
    except OSError:
        pass  # the server answered (413) and closed before the body was sent
    try:
        codes.append(s.recv(64).split(b" ")[1].decode())
    except (OSError, IndexError):
        codes.append("closed")
    s.close()
t0 = time.time()
ts = [threading.Thread(target=send) for _ in range(a.clients)]
for t in ts: t.start()
for t in ts: t.join()
time.sleep(1)
print(f"{a.binary}: {a.clients} x {a.mib} MiB bodies in {time.time() - t0:.1f} s, replies {sorted(codes)}")
print(f"  RSS before {base} MiB, peak (VmHWM) {status('VmHWM:')} MiB, after {status('VmRSS:')} MiB")
proc.terminate(); proc.wait()
