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

/// `--pod /dev/zero` grew to 22 GB, and then `--model-config /dev/zero` did too (issue 24); a
/// FIFO hung. Both flags now refuse what is not a regular file before opening it, and read a
/// regular one only up to their cap.
#[test]
#[cfg(unix)]
fn estimate_refuses_endless_and_oversized_input_files() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let big = dir.path().join("config.json");
    std::fs::write(&big, vec![b' '; (1 << 20) + 1]).unwrap();
    let fifo = fifo.to_str().unwrap();
    for (flag, path, says) in [
        ("--pod", "/dev/zero", "--pod /dev/zero: not a regular file"),
        (
            "--model-config",
            "/dev/zero",
            "--model-config /dev/zero: not a regular file",
        ),
        ("--model-config", fifo, "not a regular file"),
        (
            "--model-config",
            big.to_str().unwrap(),
            "larger than 1024 KiB",
        ),
    ] {
        let out = peakfit(&["estimate", flag, path]);
        assert!(!out.status.success(), "{flag} {path}");
        let e = stderr(&out);
        assert!(e.contains(says), "{flag} {path}: {e}");
    }
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

/// Issue 23: the extender reads `--gpu-resources` with the agent's parser, and a bad entry stops
/// it at start, naming the flag, the entry and what is allowed.
#[test]
fn the_extender_refuses_a_bad_gpu_resources_entry_naming_it() {
    let out = peakfit(&[
        "extender",
        "--from-file",
        "/dev/null",
        "--gpu-resources",
        "nvidia.com/gpu,*",
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(r#"--gpu-resources: entry "*" is not allowed: entries are names"#),
        "{err}"
    );
}

/// The extender reads `--gpu-dra-drivers` too (the `ResourceSlice` watch marks the nodes its
/// drivers publish devices on): a bad entry stops it at start like the agent, naming the flag.
#[test]
fn the_extender_refuses_a_bad_gpu_dra_drivers_entry_naming_it() {
    let out = peakfit(&[
        "extender",
        "--from-file",
        "/dev/null",
        "--gpu-dra-drivers",
        "gpu.nvidia.com,gpu.*",
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(r#"--gpu-dra-drivers: entry "gpu.*" is not allowed"#),
        "{err}"
    );
}
