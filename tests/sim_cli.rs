//! `peakfit simulate` end to end through its `Args`: the built-in default writes its report and
//! charts, and the openb JSON contract has a point per integer arrived % from 0 to 130.

use std::path::Path;

use clap::Parser;
use peakfit::sim::{RunResult, SimulateArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: SimulateArgs,
}

fn args(extra: &[&str]) -> SimulateArgs {
    let mut argv = vec!["simulate"];
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).unwrap().args
}

#[test]
fn builtin_default_writes_report_and_charts() {
    let out = tempfile::tempdir().unwrap();
    let out_s = out.path().to_str().unwrap();
    peakfit::sim::run(&args(&[
        "--seeds",
        "1",
        "--policies",
        "bestfit,peakfit",
        "--out",
        out_s,
    ]))
    .unwrap();
    for f in [
        "builtin-report.json",
        "builtin-unallocated.svg",
        "builtin-ooms.svg",
    ] {
        assert!(out.path().join(f).is_file(), "{f} missing");
    }
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("builtin-report.json")).unwrap())
            .unwrap();
    let dynamic = report["dynamic"].as_array().unwrap();
    assert_eq!(dynamic.len(), 4);
    for accounting in ["peakfit", "learned"] {
        let run = dynamic
            .iter()
            .find(|d| d["accounting"] == accounting)
            .unwrap();
        assert_eq!(run["oom_events"], 0, "{accounting}");
        // Seven workloads, each with a second pod that ran.
        assert_eq!(
            run["second_pods"].as_array().unwrap().len(),
            7,
            "{accounting}"
        );
    }
    // The load check: one entry per seed, the seven sets of the three GPU models; the set of
    // all three confines every pod of the 24 h part.
    let load = report["load"].as_array().unwrap();
    assert_eq!(load.len(), 1);
    let sets = load[0]["sets"].as_array().unwrap();
    assert_eq!(sets.len(), 7);
    let all = &sets[6];
    assert_eq!(all["models"].as_array().unwrap().len(), 3);
    assert_eq!(all["pods"], dynamic[0]["pods"]);
    assert!(all["memory_load"].as_f64().unwrap() > 0.0, "{all}");
    let packing = report["packing"].as_array().unwrap();
    assert_eq!(packing.len(), 2);
    // The cutting-stock reference is per run, and the same for every policy of a seed (they
    // see the same pods); an offline cut of pods that fill the cluster leaves something over.
    let cut: Vec<f64> = packing
        .iter()
        .map(|r| r["cutting_stock_pct"].as_f64().unwrap())
        .collect();
    assert_eq!(cut[0], cut[1], "{cut:?}");
    assert!(cut[0] > 0.0 && cut[0] < 100.0, "{cut:?}");
}

#[test]
#[ignore = "needs ../shared/data"]
fn openb_json_has_a_point_per_arrived_percent() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/openb");
    assert!(dir.is_dir(), "{} not found", dir.display());
    let nodes = peakfit::sim::openb::load_nodes(&dir.join("openb_node_list_gpu_node.csv")).unwrap();
    let pods = peakfit::sim::openb::load_pods(&dir.join("openb_pod_list_multigpu50.csv")).unwrap();
    let r = peakfit::sim::run_one(
        "multigpu50",
        &nodes,
        &pods,
        peakfit::sim::Policy::Bestfit,
        42,
    );
    let json = serde_json::to_value(&r).unwrap();
    for key in ["trace", "policy", "seed", "unallocated_at_100", "curve"] {
        assert!(json.get(key).is_some(), "{key} missing");
    }
    let back: RunResult = serde_json::from_value(json).unwrap();
    let arrived: Vec<u32> = back.curve.iter().map(|c| c.arrived_pct).collect();
    assert_eq!(arrived, (0..=130).collect::<Vec<_>>());
    let p = &back.curve[100];
    assert!(p.allocated_pct > 80.0 && p.allocated_pct <= 100.0, "{p:?}");
    assert!(p.frag_ratio_pct >= 0.0 && p.frag_amount_pct >= 0.0);
}

#[test]
fn bad_flags_name_the_value_and_what_is_allowed() {
    let e = Cli::try_parse_from(["simulate", "--policies", "tetris"])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("tetris") && e.contains("fgd"), "{e}");
    let e = peakfit::sim::run(&args(&["--pods", "/nonexistent.csv"]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("--nodes"), "{e}");
}

#[test]
fn a_misspelt_deployment_switch_is_refused_naming_it() {
    // Through the environment variable (the fallback), before any run starts.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_peakfit"))
        .args(["simulate", "--jobs", "1"])
        .env("PEAKFIT_SIM_GPULESS", "default-schedular")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("PEAKFIT_SIM_GPULESS")
            && err.contains("--gpuless-pods")
            && err.contains("default-schedular")
            && err.contains("default-scheduler"),
        "{err}"
    );
    // Through the flag.
    let e = Cli::try_parse_from(["simulate", "--scheduler-profile", "charts"])
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("--scheduler-profile")
            && e.contains("charts")
            && e.contains("chart, default-plugins"),
        "{e}"
    );
}

#[test]
fn deployment_flags_default_to_the_charts_and_take_the_old_switch_values() {
    use peakfit::sim::{
        GpulessPods, SchedulerProfile, parse_gpuless_pods, parse_scheduler_profile,
    };
    let d = args(&[]).deployment();
    assert_eq!(d.profile, SchedulerProfile::Chart);
    assert_eq!(d.gpuless, GpulessPods::Peakfit);
    let d = args(&[
        "--scheduler-profile",
        "default-plugins",
        "--gpuless-pods",
        "default-scheduler",
    ])
    .deployment();
    assert_eq!(d.profile, SchedulerProfile::DefaultPlugins);
    assert_eq!(d.gpuless, GpulessPods::DefaultScheduler);
    // `PEAKFIT_SIM_DEFAULT_PLUGINS` took on|off before the flag existed.
    assert_eq!(
        parse_scheduler_profile("on"),
        Ok(SchedulerProfile::DefaultPlugins)
    );
    assert_eq!(parse_scheduler_profile("off"), Ok(SchedulerProfile::Chart));
    assert!(parse_gpuless_pods("on").is_err());
    // Both flags name their environment fallback in --help.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_peakfit"))
        .args(["simulate", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for s in [
        "--scheduler-profile",
        "PEAKFIT_SIM_DEFAULT_PLUGINS",
        "--gpuless-pods",
        "PEAKFIT_SIM_GPULESS",
    ] {
        assert!(help.contains(s), "{s} missing from --help:\n{help}");
    }
}

/// `peakfit simulate` as the README's first command runs it, without `--log`: the tables and
/// nothing else. It printed 13,319 INFO lines (one per simulated bind) around them (issue 22);
/// a person's commands now log warnings only unless asked.
#[test]
fn simulate_logs_warnings_only_unless_asked() {
    let out = tempfile::tempdir().unwrap();
    let run = |log: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_peakfit"));
        cmd.args(["simulate", "--seeds", "1", "--policies", "peakfit", "--out"])
            .arg(out.path())
            .env_remove("PEAKFIT_LOG")
            .env_remove("RUST_LOG");
        if let Some(log) = log {
            cmd.args(["--log", log]);
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (stdout, stderr) = run(None);
    assert!(stdout.contains("peakfit"), "no tables: {stdout}");
    assert!(
        !stderr.contains("INFO") && !stderr.contains("bound (in memory)"),
        "{} bytes of logs: {}",
        stderr.len(),
        &stderr[..stderr.len().min(500)]
    );
    // Asked for, they are there.
    let (_, stderr) = run(Some("info"));
    assert!(stderr.contains("INFO"), "--log info logged nothing");
}

/// The built-in run's holds: on by default, `off` for today's extender, a bad cap refused.
#[test]
fn reserve_flags_set_the_holds_or_turn_them_off() {
    let on = args(&[]).reserve().unwrap();
    assert_eq!((on.after_min, on.deadline_min, on.per_node), (30, 60, 0.1));
    let set = args(&[
        "--reserve-after",
        "90m",
        "--reserve-deadline",
        "2h",
        "--reserve-max",
        "0.5",
    ])
    .reserve()
    .unwrap();
    assert_eq!(
        (set.after_min, set.deadline_min, set.per_node),
        (90, 120, 0.5)
    );
    assert_eq!(args(&["--reserve-after", "off"]).reserve(), None);
    let mut argv = vec!["simulate", "--reserve-max", "0"];
    assert!(Cli::try_parse_from(&argv).is_err());
    argv[2] = "-1";
    assert!(Cli::try_parse_from(&argv).is_err());
}

/// The learned accounting's flags: the core's defaults, set values, and bad values refused with
/// the flag, the variable and what is allowed.
#[test]
fn learn_flags_set_the_policy_and_refuse_bad_values() {
    use peakfit::learn::{LearnMode, LearnPolicy};
    assert_eq!(args(&[]).learn_policy(), LearnPolicy::default());
    let set = args(&[
        "--learn",
        "all",
        "--learn-margin",
        "0.1",
        "--learn-min-runtime",
        "90m",
    ])
    .learn_policy();
    assert_eq!(
        (
            set.mode,
            set.margin,
            set.min_runtime_secs,
            set.min_pods_down
        ),
        (LearnMode::All, 0.1, 5400, 2)
    );
    assert_eq!(
        args(&["--learn", "off"]).learn_policy().mode,
        LearnMode::Off
    );
    for (flag, value, says) in [
        ("--learn", "sometimes", "PEAKFIT_SIM_LEARN"),
        ("--learn-margin", "11", "from 0 to 10"),
        ("--learn-margin", "five", "PEAKFIT_SIM_LEARN_MARGIN"),
        ("--learn-min-runtime", "soon", "--learn-min-runtime"),
    ] {
        let err = Cli::try_parse_from(["simulate", flag, value])
            .err()
            .unwrap_or_else(|| panic!("{flag} {value} accepted"))
            .to_string();
        assert!(err.contains(says), "{flag} {value}: {err}");
    }
}
