//! Learning from what pods used (issue 21, items 3, 4 and 7), behind a real kube-apiserver and
//! kube-scheduler: a Deployment whose pods use 30 % more than predicted has its next replica
//! placed at the learned peak, and its `GpuWorkloadProfile` says so; one whose pods use half of
//! the prediction is sized down only after the minimum runtime, over two pods; an extender
//! restart keeps the profile and the sizing.
//!
//! No controller-manager runs here, so the replicas are created as the Deployment controller
//! makes them (owned by its `<deployment>-<pod-template-hash>` `ReplicaSet`, labelled with the
//! hash), and their status set Running as a kubelet would. The reports, with the pods' peaks, are
//! written by the agent's own publisher (`Cluster::publish_pod_peaks`), as the agent writes
//! them once it sees the pods' processes.
//!
//! Needs `../shared/tools/k8s`; fails, never skips, without it. Prints the timings.

mod e2e_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use e2e_support::*;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use peakfit::cluster::profile::GpuWorkloadProfile;
use peakfit::learn::LearnPolicy;
use serde_json::json;

const NS: &str = "ml";
/// A model the estimator sizes with fixed bytes (no engine fraction): about 15.8 GiB per GPU.
const MODEL: [(&str, &str); 2] = [
    ("peakfit.io/model", "llama-3.1-8b"),
    ("peakfit.io/engine", "transformers"),
];
const MIN_RUNTIME_SECS: u64 = 15;

/// A replica of Deployment `deployment` as its `ReplicaSet` makes it.
fn replica(deployment: &str, name: &str) -> Pod {
    let mut pod = gpu_pod(name, &MODEL);
    let hash = "7d9f8c6b5";
    pod.metadata.labels = Some(BTreeMap::from([("pod-template-hash".into(), hash.into())]));
    pod.metadata.owner_references = Some(vec![
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{deployment}-{hash}"),
            "uid": "6f1b2c3d-0000-4000-8000-000000000001", "controller": true,
        }))
        .unwrap(),
    ]);
    pod
}

async fn create_bound(c: &Cluster, deployment: &str, name: &str) -> Pod {
    c.pods(NS)
        .create(&PostParams::default(), &replica(deployment, name))
        .await
        .unwrap_or_else(|e| panic!("creating {name}: {e}"));
    c.wait_bound(NS, name, Duration::from_secs(60)).await
}

/// What a kubelet writes once the containers run.
async fn set_running(c: &Cluster, name: &str) {
    let status =
        json!({"status": {"phase": "Running", "startTime": jiff::Timestamp::now().to_string()}});
    c.pods(NS)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// The peaks the fake agents report, per node, as `(pod UID, GPU UUID, bytes)`.
#[derive(Default)]
struct Peaks(BTreeMap<String, Vec<(String, String, u64)>>);

impl Peaks {
    /// Records that `pod` peaked at `bytes` on its GPU and republishes its node's report.
    async fn observe(&mut self, c: &Cluster, pod: &Pod, bytes: u64) {
        let node = node_of(pod);
        let (gpus, _, _) = assignment(pod);
        let list = self.0.entry(node.clone()).or_default();
        list.push((pod.uid().unwrap(), gpus[0].clone(), bytes));
        let peaks: Vec<(&str, &str, u64)> = list
            .iter()
            .map(|(p, g, b)| (p.as_str(), g.as_str(), *b))
            .collect();
        c.publish_pod_peaks(&node, &peaks).await;
    }
}

async fn profile_of(c: &Cluster, deployment: &str) -> Option<GpuWorkloadProfile> {
    let api: Api<GpuWorkloadProfile> = Api::namespaced(c.client.clone(), NS);
    api.list(&ListParams::default())
        .await
        .ok()?
        .items
        .into_iter()
        .find(|p| p.spec.workload_kind == "Deployment" && p.spec.workload_name == deployment)
}

async fn wait_profile(
    c: &Cluster,
    deployment: &str,
    what: &str,
    ok: impl Fn(&peakfit::cluster::profile::GpuWorkloadProfileStatus) -> bool,
) -> GpuWorkloadProfile {
    eventually(Duration::from_secs(60), what, || async {
        let p = profile_of(c, deployment).await?;
        ok(p.status.as_ref()?).then_some(p)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_sized_from_what_their_workload_used() {
    let c = Cluster::up().await;
    c.namespace(NS).await;
    for node in ["gpu-a", "gpu-b"] {
        c.add_reported_node(node, (0..2).map(|i| Gpu::h100(node, i)).collect())
            .await;
    }
    let min_runtime = format!("{MIN_RUNTIME_SECS}s");
    let mut ext = c
        .start_peakfit(&[
            "--max-report-age",
            "1h",
            "--profile-interval",
            "1s",
            "--learn-min-runtime",
            &min_runtime,
        ])
        .await;
    let policy = LearnPolicy::default();
    let mut peaks = Peaks::default();

    // 1. chat: its pods use 30 % more than predicted.
    let first = create_bound(&c, "chat", "chat-0").await;
    let (_, predicted, _) = assignment(&first);
    assert!(predicted > 14 * GIB && predicted < 20 * GIB, "{predicted}");
    set_running(&c, "chat-0").await;
    let over = predicted * 13 / 10;
    let observed_at = Instant::now();
    peaks.observe(&c, &first, over).await;
    let profile = wait_profile(&c, "chat", "chat's profile with its observed peak", |s| {
        s.observed_peak_bytes == over
    })
    .await;
    let to_profile = observed_at.elapsed();
    let status = profile.status.unwrap();
    assert_eq!(status.predicted_bytes, predicted);
    assert_eq!(status.pods_seen, 1);
    assert_eq!(status.model_error, Some(0.3));
    assert!(status.recommended_bytes >= policy.with_margin(over));
    let managers: Vec<String> = profile
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        managers.iter().any(|m| m == "peakfit-profiles"),
        "{managers:?}"
    );
    let second = create_bound(&c, "chat", "chat-1").await;
    let to_sized = observed_at.elapsed();
    let (_, reserved, _) = assignment(&second);
    assert_eq!(
        reserved,
        policy.with_margin(over),
        "chat-1 placed at the learned peak"
    );
    // The newest pod was told what to annotate.
    c.wait_event(
        NS,
        "chat-0",
        &format!("annotate peakfit.io/vram: {}", status.summary.recommended),
        Duration::from_secs(30),
    )
    .await;

    // 2. embed: two pods use half the prediction; sized down only once both ran the minimum.
    let started = Instant::now();
    let mut embed = Vec::new();
    for name in ["embed-0", "embed-1"] {
        let p = create_bound(&c, "embed", name).await;
        set_running(&c, name).await;
        embed.push(p);
    }
    let half = predicted / 2;
    for p in &embed {
        peaks.observe(&c, p, half).await;
    }
    wait_profile(&c, "embed", "embed's profile with both pods", |s| {
        s.pods_seen == 2
    })
    .await;
    let early = create_bound(&c, "embed", "embed-2").await;
    let early_secs = started.elapsed().as_secs();
    assert!(
        early_secs < MIN_RUNTIME_SECS,
        "embed-2 bound {early_secs} s after the pods started: the test needs it sooner"
    );
    assert_eq!(
        assignment(&early).1,
        predicted,
        "before the minimum runtime a pod keeps its prediction"
    );
    tokio::time::sleep(Duration::from_secs(MIN_RUNTIME_SECS).saturating_sub(started.elapsed()))
        .await;
    let trusted_at = Instant::now();
    // Once the profile leader has folded the pods' runtime in, the next replica is sized down.
    let ran = |r: &peakfit::cluster::profile::PodRecord| {
        let t = |s: &str| {
            s.parse::<jiff::Timestamp>()
                .map_or(0, jiff::Timestamp::as_second)
        };
        t(&r.last_seen) - t(&r.started) >= i64::try_from(MIN_RUNTIME_SECS).unwrap()
    };
    wait_profile(
        &c,
        "embed",
        "embed's two pods past the minimum runtime",
        |s| s.pods.iter().filter(|r| ran(r)).count() == 2,
    )
    .await;
    let later = create_bound(&c, "embed", "embed-3").await;
    let to_down = trusted_at.elapsed();
    assert_eq!(
        assignment(&later).1,
        policy.with_margin(half),
        "embed-3 sized down"
    );

    // 3. An extender restart keeps the profile, and the sizing from it.
    let restarted = Instant::now();
    c.restart_extender("extender", &mut ext);
    let after = create_bound(&c, "chat", "chat-2").await;
    let to_after_restart = restarted.elapsed();
    assert_eq!(assignment(&after).1, policy.with_margin(over));
    let kept = profile_of(&c, "chat").await.unwrap().status.unwrap();
    assert_eq!(kept.pods_seen, 1);

    c.assert_no_overcommit().await;
    eprintln!(
        "e2e_profiles timings: observed -> profile written {to_profile:?}; observed -> next \
         replica bound at the learned size {to_sized:?}; minimum runtime reached -> replica \
         sized down {to_down:?}; extender restart -> replica bound at the learned size \
         {to_after_restart:?}"
    );
}
