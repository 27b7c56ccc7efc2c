//! The Measure section of issue 11, against the real `peakfit` binary over loopback (a bench
//! binary, harness = false; it replaces the Python probes `flood.py` and `rss.py`):
//!
//! - `flood`: bind and `/healthz` latency (median, p99, max) while 8 clients flood the extender
//!   with filters of 5,000 nodes × 8 GPUs (file mode);
//! - `scrape`: prioritize's latency over those nodes alone and while 8 clients scrape `/metrics`
//!   back to back (issue 24), and the ratio of the medians;
//! - `rss`: the extender's peak RSS (`VmHWM`) and what it keeps (`VmRSS`) under 8 concurrent large
//!   bodies, 250 MiB each (refused at the header, 413) and 30 MiB each (read, within the limits);
//! - `sigterm`: seconds from SIGTERM to exit with a half-sent request open, at the default
//!   `--shutdown-timeout` (10 s);
//! - `webhook`: `peakfit webhook`'s peak RSS answering a pod with 5,000 containers over TLS.
//!
//! ```text
//! cargo bench --bench hardening                          # all five
//! PEAKFIT_BENCH_ONLY=flood,webhook cargo bench --bench hardening
//! PEAKFIT_BENCH_SECONDS=20 (flood's measured window)  PEAKFIT_BIN=path (another binary)
//! ```
//!
//! Timings are printed, never asserted: they depend on the machine (and on what else runs).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

#[path = "../tests/webhook_support/mod.rs"]
mod webhook_support;

const NODES: usize = 5_000;
const BINDS: usize = 400;
const FLOODERS: usize = 8;
/// Alone/scraped window pairs per scrape mode.
const PAIRS: u32 = 5;

fn binary() -> PathBuf {
    std::env::var_os("PEAKFIT_BIN").map_or_else(|| env!("CARGO_BIN_EXE_peakfit").into(), Into::into)
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A child process, killed on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Running {
    /// A `/proc/PID/status` field (`VmRSS:`, `VmHWM:`) in MiB.
    fn status_mib(&self, field: &str) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib >> 10)
    }
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Starts `peakfit ARGS --listen ADDR` and returns once it accepts connections.
fn start(args: &[&std::ffi::OsStr], addr: SocketAddr) -> Running {
    let child = Command::new(binary())
        .args(args)
        .arg("--listen")
        .arg(addr.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting peakfit");
    let mut running = Running(child);
    let start = Instant::now();
    while TcpStream::connect(addr).is_err() {
        assert!(
            running.0.try_wait().unwrap().is_none(),
            "peakfit exited before listening"
        );
        assert!(start.elapsed() < Duration::from_secs(120), "never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    running
}

fn extender(cluster: &Path, addr: SocketAddr, extra: &[&str]) -> Running {
    let mut args: Vec<&std::ffi::OsStr> = ["extender", "--prescore-interval", "0", "--from-file"]
        .iter()
        .map(AsRef::as_ref)
        .collect();
    args.push(cluster.as_os_str());
    args.extend(extra.iter().map(|s| std::ffi::OsStr::new(*s)));
    start(&args, addr)
}

/// A kept-alive HTTP/1.1 connection.
struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    fn open(addr: SocketAddr) -> Self {
        let writer = TcpStream::connect(addr).unwrap();
        writer.set_nodelay(true).unwrap();
        writer
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        let reader = BufReader::new(writer.try_clone().unwrap());
        Self { reader, writer }
    }

    /// One request; the status and the body.
    fn call(&mut self, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        self.call_with(method, path, "", body)
    }

    /// [`Conn::call`] with `headers` (each line ending in CRLF) added.
    fn call_with(
        &mut self,
        method: &str,
        path: &str,
        headers: &str,
        body: &[u8],
    ) -> (u16, Vec<u8>) {
        write!(
            self.writer,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             {headers}Content-Length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        self.writer.write_all(body).unwrap();
        read_reply(&mut self.reader)
    }
}

fn read_reply(r: &mut impl BufRead) -> (u16, Vec<u8>) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut len = 0usize;
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    (status, body)
}

/// `q` (0..1) of `xs` in milliseconds.
fn pct(xs: &mut [Duration], q: f64) -> f64 {
    xs.sort();
    let i = peakfit::convert::f64_to_usize(q * xs.len() as f64).min(xs.len().saturating_sub(1));
    xs.get(i).map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
}

fn summary(name: &str, xs: &mut [Duration]) {
    println!(
        "  {name}: n={} median {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        xs.len(),
        pct(xs, 0.5),
        pct(xs, 0.99),
        pct(xs, 1.0)
    );
}

/// A file-mode cluster of `NODES` nodes × 8 H100s and `BINDS` pending pods, as a JSON List.
fn flood_cluster(dir: &Path) -> PathBuf {
    let mut items = Vec::with_capacity(2 * NODES + BINDS);
    for i in 0..NODES {
        let name = format!("node-{i}");
        items.push(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}));
        let gpus: Vec<_> = (0..8)
            .map(|g| {
                json!({"index": g, "uuid": format!("GPU-{i}-{g}"), "name": "NVIDIA H100 80GB HBM3",
                       "memoryTotalBytes": 85_520_809_984u64, "memoryUsedBytes": 0,
                       "memoryFreeBytes": 85_520_809_984u64, "memoryReservedBytes": 536_870_912,
                       "processes": []})
            })
            .collect();
        items.push(
            json!({"apiVersion": "peakfit.io/v1alpha1", "kind": "NodeGpuReport",
            "metadata": {"name": name}, "spec": {"nodeName": name},
            "status": {"observedAt": "2026-11-21T17:48:00Z", "nvml": {"up": true}, "gpus": gpus}}),
        );
    }
    for p in 0..BINDS {
        items.push(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("p{p}"), "namespace": "ml", "uid": format!("uid-{p}"),
                         "annotations": {"peakfit.io/vram": "10Gi"}},
            "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}));
    }
    let path = dir.join("cluster.json");
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    std::fs::write(&path, serde_json::to_vec(&list).unwrap()).unwrap();
    path
}

fn flood(dir: &Path, seconds: f64) {
    let cluster = flood_cluster(dir);
    let addr = free_addr();
    let _server = extender(&cluster, addr, &[]);
    let names: Vec<String> = (0..NODES).map(|i| format!("node-{i}")).collect();
    let filter = Arc::new(
        serde_json::to_vec(&json!({
            "Pod": {"metadata": {"name": "f", "namespace": "ml", "uid": "flood",
                                 "annotations": {"peakfit.io/vram": "20Gi"}}},
            "NodeNames": names,
        }))
        .unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let filters = Arc::new(AtomicU64::new(0));
    let flooders: Vec<_> = (0..FLOODERS)
        .map(|_| {
            let (filter, stop, filters) = (filter.clone(), stop.clone(), filters.clone());
            std::thread::spawn(move || {
                let mut c = Conn::open(addr);
                while !stop.load(Ordering::Relaxed) {
                    let (status, _) = c.call("POST", "/filter", &filter);
                    assert_eq!(status, 200);
                    filters.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let binder = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = Conn::open(addr);
            let mut lat = Vec::new();
            for p in 0..BINDS {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let body = json!({"PodName": format!("p{p}"), "PodNamespace": "ml",
                                  "PodUID": format!("uid-{p}"), "Node": format!("node-{}", p % NODES)});
                let body = serde_json::to_vec(&body).unwrap();
                let t = Instant::now();
                let (status, reply) = c.call("POST", "/bind", &body);
                lat.push(t.elapsed());
                assert_eq!(status, 200);
                assert!(
                    reply.windows(10).any(|w| w == br#""Error":"""#),
                    "{}",
                    String::from_utf8_lossy(&reply)
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            lat
        })
    };
    let health = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = Conn::open(addr);
            let mut lat = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let (status, _) = c.call("GET", "/healthz", b"");
                lat.push(t.elapsed());
                assert_eq!(status, 200);
                std::thread::sleep(Duration::from_millis(20));
            }
            lat
        })
    };
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut binds = binder.join().unwrap();
    let mut healthz = health.join().unwrap();
    for f in flooders {
        f.join().unwrap();
    }
    println!(
        "flood: {} filters of {NODES} nodes by {FLOODERS} clients in {:.0} s; meanwhile",
        filters.load(Ordering::Relaxed),
        seconds + 2.0
    );
    summary("bind", &mut binds);
    summary("healthz", &mut healthz);
}

/// Prioritize's latency over `NODES` nodes with no scraper, then while `FLOODERS` clients scrape
/// `/metrics` back to back (issue 24: 14 MB per render at 5,000 nodes took p50 from 2.5 ms to
/// 291 ms when every scrape rendered).
fn scrape(dir: &Path, seconds: f64) {
    let cluster = flood_cluster(dir);
    let addr = free_addr();
    let _server = extender(&cluster, addr, &[]);
    let names: Vec<String> = (0..NODES).map(|i| format!("node-{i}")).collect();
    let body = serde_json::to_vec(&json!({
        "Pod": {"metadata": {"name": "s", "namespace": "ml", "uid": "scored",
                             "annotations": {"peakfit.io/vram": "20Gi"}}},
        "NodeNames": names,
    }))
    .unwrap();
    let prioritize = |c: &mut Conn, until: Instant| {
        let mut lat = Vec::new();
        while Instant::now() < until {
            let t = Instant::now();
            let (status, _) = c.call("POST", "/prioritize", &body);
            lat.push(t.elapsed());
            assert_eq!(status, 200);
        }
        lat
    };
    let mut c = Conn::open(addr);
    println!("scrape: prioritize of {NODES} nodes, alone and beside {FLOODERS} scrapers");
    // Alone and scraped alternate in short windows (`PAIRS` of each per mode), so a shared
    // machine's load drifting over the run falls on both sides alike.
    let window = Duration::from_secs_f64(seconds / f64::from(3 * 2 * PAIRS));
    // As a plain HTTP client asks, then as Prometheus does (`Accept-Encoding: gzip` on every
    // scrape): back to back (a stress: each scraper takes all it can get), then each once a
    // second, Prometheus' most eager `scrape_interval` in practice.
    let gzip = "Accept-Encoding: gzip\r\n";
    for (coding, headers, every) in [
        ("identity", "", Duration::ZERO),
        ("gzip", gzip, Duration::ZERO),
        ("gzip, each every 1 s", gzip, Duration::from_secs(1)),
    ] {
        let (stop, active) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (scrapes, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let scrapers: Vec<_> = (0..FLOODERS)
            .map(|_| {
                let (stop, active) = (stop.clone(), active.clone());
                let (scrapes, bytes) = (scrapes.clone(), bytes.clone());
                std::thread::spawn(move || {
                    let mut c = Conn::open(addr);
                    while !stop.load(Ordering::Relaxed) {
                        if !active.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(5));
                            continue;
                        }
                        let next = Instant::now() + every;
                        let (status, body) = c.call_with("GET", "/metrics", headers, b"");
                        assert_eq!(status, 200);
                        assert!(!body.is_empty());
                        scrapes.fetch_add(1, Ordering::Relaxed);
                        bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                        while active.load(Ordering::Relaxed) && Instant::now() < next {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                })
            })
            .collect();
        let (mut quiet, mut busy) = (Vec::new(), Vec::new());
        for _ in 0..PAIRS {
            active.store(false, Ordering::Relaxed);
            // A scrape in flight when the window turns finishes in the quiet one's first
            // moments; they are not counted.
            std::thread::sleep(Duration::from_millis(200));
            quiet.extend(prioritize(&mut c, Instant::now() + window));
            active.store(true, Ordering::Relaxed);
            busy.extend(prioritize(&mut c, Instant::now() + window));
        }
        stop.store(true, Ordering::Relaxed);
        for s in scrapers {
            s.join().unwrap();
        }
        let n = scrapes.load(Ordering::Relaxed);
        summary(&format!("alone, beside the {coding} windows"), &mut quiet);
        summary(
            &format!(
                "scraped, {coding} ({n} scrapes, {:.1} MB each)",
                bytes.load(Ordering::Relaxed) as f64 / n.max(1) as f64 / 1e6
            ),
            &mut busy,
        );
        println!(
            "  p50 ratio scraped ({coding})/alone: {:.2}",
            pct(&mut busy, 0.5) / pct(&mut quiet, 0.5)
        );
    }
}

/// 8 clients at once each send a `POST /filter` of `mib` MiB (one long node name, so the body
/// must be read and decoded); the replies' statuses.
fn large_bodies(addr: SocketAddr, mib: usize) -> Vec<String> {
    let n = mib << 20;
    let mut body = br#"{"Pod":null,"NodeNames":[""#.to_vec();
    body.resize(n - 3, b'a');
    body.extend_from_slice(br#""]}"#);
    let body = Arc::new(body);
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let body = body.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
                let head = format!(
                    "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                // The server may answer (413) and close before the body is sent.
                let _ = s
                    .write_all(head.as_bytes())
                    .and_then(|()| s.write_all(&body));
                let mut reply = [0u8; 64];
                match s.read(&mut reply) {
                    Ok(n) if n >= 12 => String::from_utf8_lossy(&reply[9..12]).into_owned(),
                    _ => "closed".to_owned(),
                }
            })
        })
        .collect();
    let mut codes: Vec<String> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    codes.sort();
    codes
}

fn rss() {
    for mib in [250, 30] {
        let addr = free_addr();
        let server = extender(&repo("deploy/examples/cluster.yaml"), addr, &[]);
        let before = server.status_mib("VmRSS:");
        let t = Instant::now();
        let codes = large_bodies(addr, mib);
        let secs = t.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_secs(1));
        println!(
            "rss: 8 x {mib} MiB bodies in {secs:.1} s, replies {codes:?}; extender RSS before \
             {before} MiB, peak (VmHWM) {} MiB, after {} MiB",
            server.status_mib("VmHWM:"),
            server.status_mib("VmRSS:")
        );
    }
}

fn sigterm() {
    let addr = free_addr();
    let mut server = extender(&repo("deploy/examples/cluster.yaml"), addr, &[]);
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(
        b"POST /bind HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = loop {
        if let Some(s) = server.0.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "still running");
        std::thread::sleep(Duration::from_millis(10));
    };
    println!(
        "sigterm: with a half-sent bind open, exited ({status}) {:.2} s after SIGTERM \
         (--shutdown-timeout 10s, the default)",
        t.elapsed().as_secs_f64()
    );
}

fn webhook(n: usize) {
    use tokio_rustls::rustls::pki_types::ServerName;
    use tokio_rustls::rustls::{ClientConnection, StreamOwned};

    let tls = repo("tests/fixtures/webhook-tls");
    let addr = free_addr();
    let server = start(
        &[
            "webhook".as_ref(),
            "--tls-cert".as_ref(),
            tls.join("a.crt").as_os_str(),
            "--tls-key".as_ref(),
            tls.join("a.key").as_os_str(),
        ],
        addr,
    );
    let body = serde_json::to_vec(&webhook_support::big_pod_review(n)).unwrap();
    let before = server.status_mib("VmRSS:");
    let config = webhook_support::client_config_trusting(&tls.join("a.crt"));
    let name = ServerName::try_from("localhost").unwrap();
    let conn = ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut stream = StreamOwned::new(conn, tcp);
    let t = Instant::now();
    write!(
        stream,
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    stream.write_all(&body).unwrap();
    let (status, reply) = read_reply(&mut BufReader::new(stream));
    println!(
        "webhook: pod with {n} containers ({} KB request) -> {status}, {} KB reply in {:.0} ms; \
         RSS before {before} MiB, peak (VmHWM) {} MiB",
        body.len() / 1024,
        reply.len() / 1024,
        t.elapsed().as_secs_f64() * 1e3,
        server.status_mib("VmHWM:")
    );
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read from the command line.
    let only = std::env::var("PEAKFIT_BENCH_ONLY").unwrap_or_default();
    let run = |name: &str| only.is_empty() || only.split(',').any(|o| o.trim() == name);
    let seconds = std::env::var("PEAKFIT_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20.0);
    println!("peakfit binary: {}", binary().display());
    let dir = tempfile::tempdir().unwrap();
    if run("flood") {
        flood(dir.path(), seconds);
    }
    if run("scrape") {
        scrape(dir.path(), seconds);
    }
    if run("rss") {
        rss();
    }
    if run("sigterm") {
        sigterm();
    }
    if run("webhook") {
        webhook(5_000);
    }
}
