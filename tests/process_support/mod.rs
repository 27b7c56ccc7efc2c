//! What every test that runs the real `peakfit` binary on loopback shares: the fake NVML library,
//! a child process killed on drop, a free port and a tiny HTTP/1.1 client. `agent_support` and
//! `e2e_support` re-export it, so the harnesses cannot drift apart; nothing here talks to a
//! cluster.
#![allow(dead_code)] // each test crate uses a different part

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

/// The fake library beside the `peakfit` test binary, or `FAKE_NVML_LIB`. Panics (the test fails,
/// it never passes without running) when it has not been built: `cargo test` does not build a
/// workspace cdylib, so run `cargo build -p fake-nvml` first (`scripts/test` does).
pub fn fake_nvml_lib() -> PathBuf {
    let lib = std::env::var_os("FAKE_NVML_LIB").map_or_else(
        || Path::new(env!("CARGO_BIN_EXE_peakfit")).with_file_name("libfake_nvml.so"),
        PathBuf::from,
    );
    assert!(
        lib.exists(),
        "{} not found; build it with `cargo build -p fake-nvml` (or set FAKE_NVML_LIB)",
        lib.display()
    );
    lib
}

/// A child process, killed on drop so a failing test leaves nothing running.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port nothing listens on (the OS's pick, released again for the test to use).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One request over a fresh connection; the status code and body, or `None` when nothing
/// listens yet.
pub fn request(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.get(9..12)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1.to_string();
    Some((code, body))
}

/// A plain HTTP GET on loopback: status and body (`None` while nothing listens).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    request(port, "GET", path, "")
}
