"""What every probe script shares: start the binary on a loopback port and wait until it listens."""
import socket, subprocess, sys, time


def start(argv, port):
    """Starts `argv` (quiet) and returns the process once 127.0.0.1:`port` accepts connections."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                sys.exit(f"{argv[0]} exited before listening")
            time.sleep(0.1)


def extender(binary, port, cluster="deploy/examples/cluster.yaml"):
    return start([binary, "extender", "--listen", f"127.0.0.1:{port}", "--from-file", cluster,
                  "--prescore-interval", "0"], port)


def status_mib(proc, field):
    """A /proc/PID/status field in MiB (VmRSS:, VmHWM:)."""
    return next(int(l.split()[1]) // 1024 for l in open(f"/proc/{proc.pid}/status") if l.startswith(field))
