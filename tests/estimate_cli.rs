//! `peakfit estimate` as a user runs it: the built binary, its JSON, and its refusals.

use std::path::Path;
use std::process::{Command, Output};

fn peakfit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peakfit"))
        .arg("estimate")
        .args(args)
        .env_remove("PEAKFIT_ANNOTATIONS")
        .env_remove("PEAKFIT_POD")
        .env_remove("PEAKFIT_GPU_MEMORY")
        .env_remove("PEAKFIT_JSON")
        .env_remove("PEAKFIT_PROFILE")
        .env_remove("PEAKFIT_LEARN")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("peakfit runs")
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

#[test]
fn json_has_the_counters_and_components() {
    let v = json(&peakfit(&[
        "-a",
        "peakfit.io/model=llama-3.1-8b",
        "-a",
        "context-tokens=8192",
        "--json",
    ]));
    let per_gpu = v["per_gpu_bytes"].as_u64().unwrap();
    let allocated = v["allocated_bytes"].as_u64().unwrap();
    assert_eq!(v["gpus"], 1);
    // 8.03B bf16 weights (14.96 GiB) + 1 GiB of KV + the 8,192-token prefill's activations
    // (0.9 GiB) + slack + context: between 16 and 19 GiB (the H200 measured 16.94 GiB at 4,096).
    let gib = per_gpu as f64 / (1u64 << 30) as f64;
    assert!((16.0..19.0).contains(&gib), "{gib}");
    assert!(allocated < per_gpu);
    let components = v["components"].as_object().unwrap();
    assert_eq!(components["weights"], 16_060_000_000u64);
    assert_eq!(components["kv-cache"], 128 * 1024 * 8192);
    let sum: u64 = components.values().map(|b| b.as_u64().unwrap()).sum();
    assert_eq!(sum, per_gpu);
    assert!(v["engine_fraction"].is_null());
    assert_eq!(v["demand"]["fixed_bytes"], per_gpu);
}

#[test]
fn fraction_engines_resolve_against_gpu_memory() {
    let run = |gpu: &str| {
        json(&peakfit(&[
            "-a",
            "model=llama-2-7b",
            "-a",
            "engine=vllm",
            "-a",
            "gpu-memory-utilization=0.5",
            "--gpu-memory",
            gpu,
            "--json",
        ]))
    };
    let (big, small) = (run("80Gi"), run("40Gi"));
    assert_eq!(big["engine_fraction"], 0.5);
    assert_eq!(big["demand"], small["demand"]);
    let diff = big["per_gpu_bytes"].as_u64().unwrap() - small["per_gpu_bytes"].as_u64().unwrap();
    assert_eq!(diff, 20 << 30, "half of the extra 40 GiB");
    assert_eq!(small["runs_on_gpu"], true);
    let tiny = run("16Gi");
    assert_eq!(
        tiny["runs_on_gpu"], false,
        "8 GiB cannot hold 12.6 GiB of weights"
    );
}

#[test]
fn reads_a_pod_manifest_and_lets_flags_override_it() {
    let pod = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/estimate-pod.yaml");
    let pod = pod.to_str().unwrap();
    let base = json(&peakfit(&["--pod", pod, "--json"]));
    let bigger = json(&peakfit(&["--pod", pod, "-a", "batch=4", "--json"]));
    // Training state at its peak: the optimizer's moments (gradients exist only at some of the
    // step's moments, the HF path shows the state at the peak).
    assert!(
        base["components"]["optimizer"].as_u64().unwrap() > 0,
        "{base}"
    );
    assert!(bigger["per_gpu_bytes"].as_u64() > base["per_gpu_bytes"].as_u64());
    // The same pod as JSON.
    let yaml = std::fs::read_to_string(pod).unwrap();
    let value: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let json_pod = dir.path().join("pod.json");
    std::fs::write(&json_pod, serde_json::to_vec(&value).unwrap()).unwrap();
    let from_json = json(&peakfit(&["--pod", json_pod.to_str().unwrap(), "--json"]));
    assert_eq!(from_json, base);
}

#[test]
fn table_is_readable() {
    let out = peakfit(&[
        "-a",
        "model=qwen3-8b",
        "-a",
        "workload=training",
        "-a",
        "zero-stage=3",
        "-a",
        "data-parallel=8",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for word in [
        "weights",
        "optimizer",
        "nccl",
        "per GPU (NVML)",
        "GiB",
        "80.00 GiB",
    ] {
        assert!(text.contains(word), "{word} missing from:\n{text}");
    }
}

#[test]
fn bad_annotations_exit_non_zero_naming_the_annotation() {
    let out = peakfit(&["-a", "model=llama-3.1-8b", "-a", "dtype=int3"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("peakfit.io/dtype") && err.contains("int3") && err.contains("nf4-dq"),
        "{err}"
    );

    let out = peakfit(&["-a", "gpu=2"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("peakfit.io/gpu") && err.contains("gpus"),
        "{err}"
    );

    let out = peakfit(&["-a", "model=llama-3.1-8b", "--gpu-memory", "80GB"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--gpu-memory"));

    let out = peakfit(&[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no peakfit.io input annotation"));
}

/// Issue 11: a model name with a space and parentheses that is no preset is a label. Without
/// the fields that size it the refusal names the first one missing; with them it estimates.
#[test]
fn any_model_name_is_a_label_when_the_shape_is_given() {
    let out = peakfit(&["-a", "model=llama-3.1-8b-Chat (v1)"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("peakfit.io/layers") && err.contains("llama-3.1-8b-Chat (v1)"),
        "{err}"
    );
    let v = json(&peakfit(&[
        "-a",
        "model=llama-3.1-8b-Chat (v1)",
        "-a",
        "layers=32",
        "-a",
        "hidden-size=4096",
        "-a",
        "kv-heads=8",
        "-a",
        "intermediate-size=14336",
        "-a",
        "vocab-size=128256",
        "--json",
    ]));
    let weights = v["components"]["weights"].as_f64().unwrap();
    // The Llama-3.1-8B shape: 8.03B bf16 parameters.
    assert!((weights / 2.0 / 8.03e9 - 1.0).abs() < 0.01, "{weights}");
}

/// A diffusion pipeline is sized by its phases, and offload and VAE slicing move the peak.
#[test]
fn diffusion_pipelines_follow_images_offload_and_vae_slicing() {
    let per_gpu = |extra: &[&str]| {
        let mut args = vec!["-a", "model=sdxl", "-a", "images=4", "--json"];
        args.extend_from_slice(extra);
        json(&peakfit(&args))["allocated_bytes"].as_u64().unwrap()
    };
    let full = per_gpu(&[]);
    let sliced = per_gpu(&["-a", "vae-decode=slicing"]);
    let sequential = per_gpu(&["-a", "vae-decode=slicing", "-a", "offload=sequential"]);
    assert!(
        full > sliced && sliced > sequential,
        "{full} {sliced} {sequential}"
    );
    let out = peakfit(&["-a", "model=llama-3.1-8b", "-a", "images=4"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("peakfit.io/images"));
}

/// `--model-config` reads a Hugging Face config.json; `-a` values override what it says.
#[test]
fn model_config_sizes_the_model_and_annotations_override_it() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/model-configs");
    let mixtral = dir.join("mixtral-8x7b-v0.1.json");
    let mixtral = mixtral.to_str().unwrap();
    let v = json(&peakfit(&["--model-config", mixtral, "--json"]));
    let weights = v["components"]["weights"].as_f64().unwrap();
    // All 46.7B parameters resident, bf16 from the config.
    assert!((weights / 2.0 / 46.7e9 - 1.0).abs() < 0.01, "{weights}");
    let int4 = json(&peakfit(&[
        "--model-config",
        mixtral,
        "-a",
        "dtype=int4-awq",
        "--json",
    ]));
    assert!(int4["components"]["weights"].as_f64().unwrap() < weights / 3.0);
    let table = peakfit(&["--model-config", mixtral]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("8 experts resident"));
    let missing = peakfit(&["--model-config", "/nonexistent/config.json"]);
    assert!(!missing.status.success());
    let not_json = peakfit(&["--model-config", file!()]);
    assert!(!not_json.status.success());
    assert!(String::from_utf8_lossy(&not_json.stderr).contains("not a JSON object"));
}

/// Each estimate says how far to trust it: its workload kind and the measured error band.
#[test]
fn estimates_carry_the_measured_confidence_of_their_kind() {
    let band = |kind: &str| {
        let band = peakfit::model::confidence::MEASURED
            .iter()
            .find(|b| b.kind == kind)
            .unwrap();
        peakfit::model::confidence::class(band)
    };
    let v = json(&peakfit(&["-a", "model=llama-3.1-8b", "--json"]));
    assert_eq!(v["confidence"]["kind"], "inference");
    assert_eq!(v["confidence"]["class"], band("inference"));
    let v = json(&peakfit(&[
        "-a",
        "model=bert-large",
        "-a",
        "batch=64",
        "--json",
    ]));
    assert_eq!(v["confidence"]["kind"], "encoder");
    assert_eq!(v["confidence"]["class"], "good", "p90 <= 10 % on real GPUs");
    let v = json(&peakfit(&[
        "-a",
        "model=llama-2-70b",
        "-a",
        "workload=lora",
        "-a",
        "zero-stage=3",
        "-a",
        "offload=optimizer+params",
        "--json",
    ]));
    assert_eq!(v["confidence"]["kind"], "offload");
    let measured = |kind: &str| {
        let band = peakfit::model::confidence::MEASURED
            .iter()
            .find(|b| b.kind == kind)
            .unwrap();
        peakfit::model::confidence::class(band)
    };
    assert_eq!(v["confidence"]["class"], measured("offload"));
    // A kind the model sizes less well says so.
    let v = json(&peakfit(&[
        "-a",
        "model=llama-3.1-8b",
        "-a",
        "workload=qlora",
        "--json",
    ]));
    assert_eq!(v["confidence"]["kind"], "qlora");
    assert_eq!(measured("qlora"), "fair");
    assert_eq!(v["confidence"]["class"], "fair");
    let table = peakfit(&["-a", "model=sdxl"]);
    let out = String::from_utf8_lossy(&table.stdout);
    assert!(
        out.contains("confidence:") && out.contains("diffusion workloads"),
        "{out}"
    );
}

/// A `GpuWorkloadProfile` of `deployment ml/chat` whose one pod peaked at `peak` GiB.
fn profile_file(dir: &std::path::Path, peak_gib: u64) -> std::path::PathBuf {
    let peak = peak_gib << 30;
    let profile = serde_json::json!({
        "apiVersion": "peakfit.io/v1alpha1", "kind": "GpuWorkloadProfile",
        "metadata": {"name": "deployment-chat-1", "namespace": "ml"},
        "spec": {"workloadKind": "Deployment", "workloadName": "chat", "inputs": "1"},
        "status": {
            "predictedBytes": 20u64 << 30, "observedPeakBytes": peak, "observedP95Bytes": peak,
            "podsSeen": 1, "gpuHours": 1.0,
            "firstSeen": "2026-11-26T10:00:00Z", "lastSeen": "2026-11-26T11:00:00Z",
            "recommendedBytes": peak, "summary": {"predicted": "", "observed": "", "recommended": ""},
            "pods": [{"uid": "u1", "name": "chat-1", "peakBytes": peak, "gpus": 1,
                      "started": "2026-11-26T10:00:00Z", "lastSeen": "2026-11-26T11:00:00Z"}],
        },
    });
    let path = dir.join("profile.json");
    std::fs::write(&path, serde_json::to_vec(&profile).unwrap()).unwrap();
    path
}

#[test]
fn a_profile_says_the_size_the_extender_would_place_the_pod_at_and_why() {
    let dir = tempfile::tempdir().unwrap();
    // Predicted 20 GiB (explicit vram, so `--learn all`), seen at 26 GiB: sized 26 × 1.05.
    let path = profile_file(dir.path(), 26);
    let path = path.to_str().unwrap();
    let out = peakfit(&[
        "-a",
        "vram=20Gi",
        "--profile",
        path,
        "--learn",
        "all",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sized = v["profile_sized_bytes"].as_u64().unwrap();
    assert_eq!(
        sized,
        peakfit::learn::LearnPolicy::default().with_margin(26 << 30)
    );
    let why = v["profile_sizing"].as_str().unwrap();
    assert!(why.contains("deployment ml/chat"), "{why}");
    assert!(why.contains("20.00 GiB"), "{why}");
    // Under the default `predicted` an explicit vram is the user's word: unchanged.
    let out = peakfit(&["-a", "vram=20Gi", "--profile", path, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["profile_sized_bytes"].as_u64(), Some(20 << 30));
    // The table says it too.
    let out = peakfit(&["-a", "vram=20Gi", "--profile", path, "--learn", "all"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("per GPU (from the profile)"), "{text}");
    assert!(text.contains("profile: sized"), "{text}");
}

#[test]
fn a_bad_profile_file_or_learn_mode_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "kind: [").unwrap();
    let out = peakfit(&["-a", "vram=20Gi", "--profile", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("GpuWorkloadProfile"), "{err}");
    let out = peakfit(&["-a", "vram=20Gi", "--learn", "sometimes"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sometimes") && err.contains("--learn"),
        "{err}"
    );
}

/// A reader that stops early (`peakfit estimate | head -3`) closes the pipe before the report is
/// written: the command still exits 0, without a panic (`println!` panics on `EPIPE`, and Rust
/// ignores `SIGPIPE`, so the write fails instead of killing the process). The same for every
/// command that prints a report: `simulate` on an openb list (table and `--json`) and
/// `recommend` from a file.
#[test]
fn a_reader_that_closes_the_pipe_early_is_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = dir.path().join("nodes.csv");
    let pods = dir.path().join("openb_pod_list_tiny.csv");
    std::fs::write(
        &nodes,
        "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,V100M16\n",
    )
    .unwrap();
    std::fs::write(
        &pods,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,\
         deletion_time,scheduled_time\np0,1000,1024,1,500,,LS,Running,0,10,0\n",
    )
    .unwrap();
    let profiles = dir.path().join("profiles.yaml");
    std::fs::write(&profiles, RECOMMEND_PROFILE).unwrap();
    let out = dir.path().join("out");
    let (nodes, pods, profiles, out) = (
        nodes.to_str().unwrap(),
        pods.to_str().unwrap(),
        profiles.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    let estimate = ["estimate", "-a", "model=llama-3.1-8b,workload=inference"];
    let simulate = [
        "simulate",
        "--nodes",
        nodes,
        "--pods",
        pods,
        "--seeds",
        "1",
        "--policies",
        "bestfit",
        "--out",
        out,
    ];
    let commands: [(&[&str], &[&str]); 5] = [
        (&estimate, &[]),
        (&estimate, &["--json"]),
        (&simulate, &[]),
        (&simulate, &["--json"]),
        (&["recommend", "--from-file", profiles], &[]),
    ];
    for (args, extra) in commands {
        let mut child = Command::new(env!("CARGO_BIN_EXE_peakfit"))
            .args(args)
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn peakfit");
        // Close the read end before the child has written anything.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{args:?} {extra:?}: {:?}\n{stderr}",
            out.status
        );
        assert!(!stderr.contains("panicked"), "{args:?} {extra:?}: {stderr}");
    }
}

/// One profile with a status, enough for `recommend` to print a row.
const RECOMMEND_PROFILE: &str = r"apiVersion: peakfit.io/v1alpha1
kind: GpuWorkloadProfile
metadata: {name: workload-chat, namespace: ml}
spec: {workloadKind: Deployment, workloadName: chat, inputs: 'abc'}
status:
  predictedBytes: 17179869184
  observedPeakBytes: 45097156608
  observedP95Bytes: 45097156608
  podsSeen: 1
  gpuHours: 2.0
  firstSeen: '2026-11-21T08:00:00Z'
  lastSeen: '2026-11-21T10:00:00Z'
  recommendedBytes: 47352014438
  summary: {predicted: 16.0Gi, observed: 42.0Gi, recommended: 44.1Gi}
";
