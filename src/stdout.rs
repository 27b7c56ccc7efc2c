//! Writing a command's report to stdout.
//!
//! A person reads `peakfit estimate | head -3` or `peakfit simulate ... | less` and quits early:
//! the reader has what it wanted, so a closed pipe is not an error. Rust ignores `SIGPIPE`, so
//! the write fails with `EPIPE` instead of killing the process, and `print!` panics on it. Every
//! command that prints a report writes it here, in one piece.

use std::io::Write as _;

/// Writes `text` to stdout; a reader that closed the pipe ends the write quietly.
///
/// # Errors
/// Any other write error (a full disk behind a redirect).
pub fn emit(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}
