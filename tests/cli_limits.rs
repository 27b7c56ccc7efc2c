//! The CLIs under careless input, as the hostile probe ran them: an endless `--pod` file, an
//! absurd `--jobs`, and a missing file (whose cause must print once).

use std::process::{Command, Output};

fn peakfit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peakfit"))
        .args(args)
        .env_remove("PEAKFIT_ANNOTATIONS")
        .env_remove("PEAKFIT_POD")
        .env_remove("PEAKFIT_SIM_JOBS")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("peakfit runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// It grew to 22 GB before: now it reads at most the cap and says so.
#[test]
#[cfg(unix)]
fn estimate_refuses_an_endless_pod_file() {
    let out = peakfit(&["estimate", "--pod", "/dev/zero"]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(e.contains("/dev/zero is larger than 1536 KiB"), "{e}");
}

#[test]
fn a_missing_file_names_its_cause_once() {
    let out = peakfit(&["estimate", "--pod", "/nonexistent/pod.yaml"]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert_eq!(e.matches("No such file or directory").count(), 1, "{e}");
    assert!(e.contains("/nonexistent/pod.yaml"), "{e}");
    // A thiserror error that names its source in its message (file mode's reading error).
    let out = peakfit(&[
        "extender",
        "--listen",
        "127.0.0.1:0",
        "--from-file",
        "/nonexistent/cluster.yaml",
    ]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert_eq!(e.matches("No such file or directory").count(), 1, "{e}");
}

/// 100,000 threads hung the machine: clamped to the cores, and the run completes.
#[test]
fn simulate_clamps_jobs_to_the_cores() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, pods) = (dir.path().join("nodes.csv"), dir.path().join("pods.csv"));
    std::fs::write(
        &nodes,
        "sn,cpu_milli,memory_mib,gpu,model\nn1,32000,262144,8,V100M32\n",
    )
    .unwrap();
    std::fs::write(
        &pods,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np1,1000,1024,1,500,\n",
    )
    .unwrap();
    let out = peakfit(&[
        "simulate",
        "--jobs",
        "100000",
        "--nodes",
        nodes.to_str().unwrap(),
        "--pods",
        pods.to_str().unwrap(),
        "--seeds",
        "1",
        "--policies",
        "bestfit",
        "--out",
        dir.path().join("out").to_str().unwrap(),
    ]);
    let e = stderr(&out);
    assert!(out.status.success(), "{e}");
    assert!(e.contains("--jobs clamped to the number of cores"), "{e}");
}

/// File mode ignores `--max-report-age` (a file is a snapshot); `--help` says so, and the flags
/// that bound what a client costs are listed for every server, the agent's `/metrics` included.
#[test]
fn help_says_what_file_mode_ignores_and_lists_the_connection_limits() {
    let out = peakfit(&["extender", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Ignored with --from-file"), "{help}");
    for cmd in ["extender", "webhook", "agent"] {
        let out = peakfit(&[cmd, "--help"]);
        let help = String::from_utf8_lossy(&out.stdout);
        for flag in [
            "--idle-timeout",
            "--body-timeout",
            "--shutdown-timeout",
            "--max-connections",
        ] {
            assert!(help.contains(flag), "peakfit {cmd} --help lacks {flag}");
        }
    }
}
