//! The real `peakfit extender` binary, and the agent's `/metrics` listener, under clients that
//! misbehave at the connection level: half-sent bodies, silent connections, too many
//! connections, SIGTERM while a request hangs. Each extender test starts the binary in file mode
//! on the example cluster, on a loopback port; each agent test starts `peakfit agent --print`
//! without an NVML library (it keeps serving with zero GPUs).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod process_support;
use process_support::Running;

struct Server {
    /// Killed on drop.
    child: Running,
    addr: SocketAddr,
}

fn start(extra: &[&str]) -> Server {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/cluster.yaml");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_peakfit"));
    cmd.args(["extender", "--prescore-interval", "0", "--from-file"])
        .arg(example);
    spawn(cmd, extra)
}

/// `peakfit agent` serving `/metrics` and `/healthz`, with no NVML library to find.
fn start_agent(extra: &[&str]) -> Server {
    spawn(agent_command(), extra)
}

/// Starts one of the servers with extra flags.
type Launch = fn(&[&str]) -> Server;

/// `peakfit webhook` with the test certificate.
fn start_webhook(extra: &[&str]) -> Server {
    let tls = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/webhook-tls");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_peakfit"));
    cmd.arg("webhook")
        .arg("--tls-cert")
        .arg(tls.join("a.crt"))
        .arg("--tls-key")
        .arg(tls.join("a.key"));
    spawn(cmd, extra)
}

fn agent_command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_peakfit"));
    cmd.args([
        "agent",
        "--print",
        "--node-name",
        "n1",
        "--poll-interval",
        "1s",
    ])
    .args(["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"]);
    cmd
}

/// Starts `cmd` with `--listen` on a free loopback port and waits until it accepts.
fn spawn(cmd: Command, extra: &[&str]) -> Server {
    spawn_on(cmd, extra, "127.0.0.1".parse().unwrap())
}

/// [`spawn`] listening on `ip`.
fn spawn_on(mut cmd: Command, extra: &[&str], ip: std::net::IpAddr) -> Server {
    let addr = TcpListener::bind((ip, 0)).unwrap().local_addr().unwrap();
    let child = cmd
        .arg("--listen")
        .arg(addr.to_string())
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut server = Server {
        child: Running(child),
        addr,
    };
    let start = Instant::now();
    while TcpStream::connect(addr).is_err() {
        assert!(
            server.child.0.try_wait().unwrap().is_none(),
            "the server exited before listening"
        );
        assert!(start.elapsed() < Duration::from_secs(30), "never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

/// Sends the headers of a bind declaring a 100-byte body, and 1 byte of it.
fn half_sent_bind(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(
        b"POST /bind HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
    )
    .unwrap();
    s
}

fn sigterm(child: &Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

/// Waits up to `bound` for the process to exit; `None` if it is still running.
fn wait_exit(child: &mut Child, bound: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < bound {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn read_all(s: &mut TcpStream, bound: Duration) -> String {
    s.set_read_timeout(Some(bound)).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Sends a request's first header line and nothing more.
fn half_sent_headers(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    s
}

/// The probe found the extender still running 65 s after SIGTERM with such a request open: the
/// body and idle timeouts are a minute here, so only the shutdown deadline (1 s) can end it.
#[test]
fn sigterm_with_a_half_sent_bind_exits_after_the_shutdown_deadline() {
    let mut server = start(&[
        "--shutdown-timeout",
        "1s",
        "--body-timeout",
        "60s",
        "--idle-timeout",
        "60s",
    ]);
    let _hanging = half_sent_bind(server.addr);
    std::thread::sleep(Duration::from_millis(300));
    sigterm(&server.child.0);
    let status = wait_exit(&mut server.child.0, Duration::from_secs(20))
        .expect("the extender still runs 20 s after SIGTERM with a half-sent request");
    assert!(status.success(), "{status}");
}

/// The agent's listener had no header timeout and no shutdown deadline: a client that stopped
/// half-way through its headers kept the agent running after SIGTERM for as long as it stayed
/// connected. Only the shutdown deadline (1 s) can end it here.
#[test]
fn agent_sigterm_with_half_sent_headers_exits_after_the_shutdown_deadline() {
    let mut server = start_agent(&["--shutdown-timeout", "1s", "--idle-timeout", "60s"]);
    let _hanging = half_sent_headers(server.addr);
    std::thread::sleep(Duration::from_millis(300));
    sigterm(&server.child.0);
    let status = wait_exit(&mut server.child.0, Duration::from_secs(20))
        .expect("the agent still runs 20 s after SIGTERM with half-sent headers");
    assert!(status.success(), "{status}");
}

#[test]
fn agent_half_sent_headers_are_dropped_after_the_idle_timeout() {
    let server = start_agent(&["--idle-timeout", "1s"]);
    let mut s = half_sent_headers(server.addr);
    let start = Instant::now();
    let reply = read_all(&mut s, Duration::from_secs(20));
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "the half-sent request was held open: {reply:?}"
    );
}

/// The webhook's listener: a client that connects and never completes its TLS handshake does
/// not keep the webhook alive after SIGTERM past the shutdown deadline (1 s; the handshake's own
/// timeout is 10 s).
#[test]
fn webhook_sigterm_with_a_silent_connection_exits_after_the_shutdown_deadline() {
    let mut server = start_webhook(&["--shutdown-timeout", "1s", "--idle-timeout", "60s"]);
    let mut silent = TcpStream::connect(server.addr).unwrap();
    // The start of a ClientHello, and no more.
    silent.write_all(&[0x16, 0x03, 0x01]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    sigterm(&server.child.0);
    let status = wait_exit(&mut server.child.0, Duration::from_secs(8))
        .expect("the webhook still runs 8 s after SIGTERM with a half-sent handshake");
    assert!(status.success(), "{status}");
}

#[test]
fn a_body_slower_than_the_body_timeout_gets_a_json_408() {
    let server = start(&["--body-timeout", "1s"]);
    let mut s = half_sent_bind(server.addr);
    let reply = read_all(&mut s, Duration::from_secs(20));
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains(r#""verb":"bind""#), "{reply}");
    assert!(reply.contains("took longer than 1s"), "{reply}");
}

#[test]
fn a_silent_connection_is_closed_after_the_idle_timeout() {
    let server = start(&["--idle-timeout", "1s"]);
    let mut s = TcpStream::connect(server.addr).unwrap();
    // A kept-alive connection: one request answered, then silence.
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let reply = read_all(&mut s, Duration::from_secs(20));
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // read_all returned: the server closed the connection (else it would wait the 20 s bound
    // and this assertion would still pass, so check the time too).
    let silent = TcpStream::connect(server.addr).unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 16];
    let mut silent = silent;
    silent
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let n = silent.read(&mut buf);
    assert!(
        matches!(n, Ok(0)) || n.is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the silent connection was not closed"
    );
    assert!(start.elapsed() < Duration::from_secs(15));
}

#[test]
fn connections_beyond_the_cap_wait_for_a_slot() {
    connections_beyond_the_cap_wait(&start(&["--max-connections", "2", "--idle-timeout", "60s"]));
}

#[test]
fn agent_connections_beyond_the_cap_wait_for_a_slot() {
    connections_beyond_the_cap_wait(&start_agent(&[
        "--max-connections",
        "2",
        "--idle-timeout",
        "60s",
    ]));
}

/// Holds every slot of a server started with `--max-connections 2`, then asks `/healthz` on a
/// third connection and checks it gets no answer within 700 ms: the held ones, and the third.
fn fill_two_slots(server: &Server) -> (Vec<TcpStream>, TcpStream) {
    let held: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(server.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut third = TcpStream::connect(server.addr).unwrap();
    third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    third
        .set_read_timeout(Some(Duration::from_millis(700)))
        .unwrap();
    assert!(
        third.read(&mut [0u8; 64]).is_err(),
        "a third connection was served while two were held"
    );
    (held, third)
}

fn connections_beyond_the_cap_wait(server: &Server) {
    let (held, mut third) = fill_two_slots(server);
    drop(held);
    let reply = read_all(&mut third, Duration::from_secs(20));
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

#[test]
fn an_empty_file_is_served_with_a_warning() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.yaml");
    std::fs::write(&empty, "").unwrap();
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_peakfit"))
        .args(["extender", "--prescore-interval", "0", "--listen"])
        .arg(addr.to_string())
        .arg("--from-file")
        .arg(&empty)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut warned = false;
    for line in stderr.lines() {
        let line = line.unwrap();
        if line.contains("WARN") && line.contains("holds no Node, Pod or NodeGpuReport") {
            warned = true;
            break;
        }
        if line.contains("peakfit extender serving") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(warned, "no warning about the empty file");
}

/// Issue 24: a connection must complete its first request's headers within --header-timeout
/// (here 1 s) of being accepted, though kept-alive connections may idle for --idle-timeout (60 s):
/// silent connections held every slot for a minute.
#[test]
fn a_connection_without_a_request_is_closed_after_the_header_timeout() {
    let server = start(&["--header-timeout", "1s", "--idle-timeout", "60s"]);
    for first in [&b""[..], b"GET /healthz HTTP/1.1\r\nHo"] {
        let mut s = TcpStream::connect(server.addr).unwrap();
        s.write_all(first).unwrap();
        let start = Instant::now();
        let reply = read_all(&mut s, Duration::from_secs(20));
        assert!(reply.is_empty(), "{reply}");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "a connection without a request was held {:?}",
            start.elapsed()
        );
    }
    // Past its first request, a connection has the idle timeout.
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = [0u8; 256];
    for _ in 0..2 {
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let n = s.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
        std::thread::sleep(Duration::from_millis(1_500));
    }
}

/// This machine's address on its default route, if it has one that is not loopback.
fn non_loopback_ip() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// Issue 24: one peer held every slot of a listener with idle connections (64 on the agent made
/// the kubelet's liveness probe fail). A peer now holds at most --max-connections-per-peer; a
/// further connection of it is closed at once, and its slots come back when it lets go.
#[test]
fn one_peer_holds_at_most_its_share_of_the_connections() {
    let Some(ip) = non_loopback_ip() else {
        eprintln!("skipped: this machine has no address but loopback to connect from");
        return;
    };
    let server = spawn_on(
        agent_command(),
        &[
            "--max-connections",
            "8",
            "--max-connections-per-peer",
            "2",
            "--header-timeout",
            "60s",
        ],
        ip,
    );
    // Each held connection is served once (so it is counted), then kept open. The start-up
    // probe's connection (spawn_on's connect) holds one of the peer's two slots until the server
    // has seen it close, which on a loaded machine can be after the first tries: a refused try
    // is retried, for up to 10 s.
    let held: Vec<TcpStream> = (0..2)
        .map(|_| {
            let start = Instant::now();
            loop {
                let mut s = TcpStream::connect(server.addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut buf = [0u8; 256];
                let served = s
                    .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    .and_then(|()| s.read(&mut buf));
                match served {
                    Ok(n) if n > 0 => {
                        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
                        break s;
                    }
                    _ => {
                        assert!(start.elapsed() < Duration::from_secs(10), "{served:?}");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        })
        .collect();
    let mut third = TcpStream::connect(server.addr).unwrap();
    let _ = third.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    let reply = read_all(&mut third, Duration::from_secs(10));
    assert!(
        reply.is_empty(),
        "a third connection of one peer was served: {reply}"
    );
    // Its slots come back once the server has seen it close them.
    drop(held);
    let start = Instant::now();
    loop {
        let mut again = TcpStream::connect(server.addr).unwrap();
        let _ = again.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let reply = read_all(&mut again, Duration::from_secs(10));
        if reply.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the peer's slots did not come back: {reply:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// With every connection slot of the main listener held (the probe's 512 idle connections,
/// scaled down to 2), the kubelet's probes still get their answer: `--probe-listen` is a
/// listener of its own, which the chart's network policy opens to nobody.
#[test]
fn the_probe_listener_answers_while_the_main_one_is_full() {
    let probe = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let full = [
        "--max-connections",
        "2",
        "--header-timeout",
        "60s",
        "--probe-listen",
        probe.as_str(),
    ];
    // One at a time: both bind the same probe port.
    let servers: [(Launch, &[&str]); 3] = [
        (start, &["/healthz", "/readyz"]),
        (start_agent, &["/healthz"]),
        (start_webhook, &["/healthz"]),
    ];
    for (launch, paths) in servers {
        let server = launch(&full);
        let probe: SocketAddr = probe.parse().unwrap();
        let (held, _blocked) = fill_two_slots(&server);
        for path in paths {
            let start = Instant::now();
            let mut s = TcpStream::connect(probe).unwrap();
            write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let reply = read_all(&mut s, Duration::from_secs(5));
            assert!(reply.starts_with("HTTP/1.1 200"), "{path}: {reply}");
            // Blocked behind the full slots, it would wait for them (held until the end):
            // `read_all` would give up at 5 s with nothing. The bound only says it did not
            // wait that long; a loaded runner may take a second or two to answer.
            assert!(
                start.elapsed() < Duration::from_secs(4),
                "{path} took {:?}",
                start.elapsed()
            );
        }
        // Only the probes are served there.
        let mut s = TcpStream::connect(probe).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let reply = read_all(&mut s, Duration::from_secs(5));
        assert!(reply.starts_with("HTTP/1.1 404"), "/metrics: {reply}");
        drop(held);
        drop(server);
        // The next server binds the same probe port once this one has gone.
        std::thread::sleep(Duration::from_millis(300));
    }
}
