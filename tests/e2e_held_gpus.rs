//! GPUs the kubelet gave away, behind the real kube-apiserver and kube-scheduler v1.36.2 (issue
//! 23, items 2, 3 and 5c/5d). Node `mixed` has four L4s: its report says a device-plugin pod
//! (`ml/trainer-0`, `nvidia.com/gpu: 2`) holds GPUs 0 and 1 and a DRA claim (`ml/infer-0`) GPU 2,
//! as the agent reads them from the kubelet's `PodResources` API; node `spare` has one L4 nobody
//! holds. The reports are written here (`add_held_node`): there is no kubelet.
//!
//! - the webhook turns `nvidia.com/gpu: 1` of a pod in an opted-in namespace into a peakfit pod
//!   of one whole GPU, placed on a GPU nobody holds;
//! - peakfit pods fill only the GPU left; the next one waits with the holders named in its
//!   `FailedScheduling` event;
//! - no GPU is over-committed, counting the kubelet's allocations: no peakfit pod is assigned a
//!   held GPU;
//! - a report that then gives a peakfit pod's GPU to another pod (a race) puts one Warning event
//!   on each pod and `peakfit_gpu_holder_conflicts` at 1, and the ledger counts both.
//!
//! And a node whose agent cannot read the kubelet's `PodResources` API: where the Node advertises
//! `nvidia.com/gpu` (a device plugin could hand its GPUs out unseen) it takes no peakfit pod, with
//! the reason in the pod's event; a node that advertises none keeps taking pods. Once the agent
//! reads the API again, the pod refused there binds there (the extender nudges the scheduler),
//! not after kube-scheduler's 5-minute flush. The same where no device plugin runs but NVIDIA's
//! DRA driver publishes a `ResourceSlice` of devices for the node: refused, with the driver
//! named, until the slice is deleted.
//!
//! Needs `../shared/tools/k8s`; fails, never skips, without it.

mod e2e_support;

use std::collections::BTreeSet;
use std::time::Duration;

use e2e_support::*;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use peakfit::inventory::{DeviceHolder, HolderKind};
use serde_json::json;

const NS: &str = "ml";
/// Opted in by label: every pod there goes to peakfit.
const TRAIN: &str = "train";

fn holder(pod: &str, kind: HolderKind) -> DeviceHolder {
    let dra = kind == HolderKind::Dra;
    DeviceHolder {
        namespace: NS.into(),
        pod_name: pod.into(),
        container: "main".into(),
        kind,
        resource: if dra {
            "gpu.nvidia.com"
        } else {
            "nvidia.com/gpu"
        }
        .into(),
        claim: dra.then(|| format!("{NS}/gpus")),
    }
}

/// A pod already running on `node` outside peakfit (no scheduler runs it: `nodeName` is set).
async fn running_elsewhere(c: &Cluster, name: &str, node: &str, gpus: u32) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "nodeName": node, "containers": [{ "name": "main", "image": "trainer",
            "resources": { "limits": { "nvidia.com/gpu": gpus.to_string() } } }] },
    }))
    .unwrap();
    c.pods(NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

/// The events of a pod with this reason.
async fn events_with(c: &Cluster, ns: &str, pod: &str, reason: &str) -> Vec<String> {
    c.event_messages(ns, pod)
        .await
        .into_iter()
        .filter(|m| m.starts_with(&format!("{reason}: ")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peakfit_never_shares_a_gpu_the_device_plugin_or_dra_gave_away() {
    let c = Cluster::up().await;
    c.namespace(NS).await;
    c.namespace(TRAIN).await;
    let ns: Api<Namespace> = Api::all(c.client.clone());
    ns.patch(
        TRAIN,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"metadata": {"labels": {"peakfit.io/enabled": "true"}}})),
    )
    .await
    .unwrap();
    let mixed: Vec<Gpu> = (0..4).map(|i| Gpu::l4("mixed", i)).collect();
    let held = [
        (0, holder("trainer-0", HolderKind::DevicePlugin)),
        (1, holder("trainer-0", HolderKind::DevicePlugin)),
        (2, holder("infer-0", HolderKind::Dra)),
    ];
    let held_uuids: BTreeSet<String> = held.iter().map(|(i, _)| mixed[*i].uuid.clone()).collect();
    c.add_held_node("mixed", mixed.clone(), &held).await;
    c.add_held_node("spare", vec![Gpu::l4("spare", 0)], &[])
        .await;
    running_elsewhere(&c, "trainer-0", "mixed", 2).await;
    running_elsewhere(&c, "infer-0", "mixed", 0).await;
    let ext = c.start_peakfit(&["--max-report-age", "1h"]).await;
    c.start_webhook().await;
    c.wait_gpu_memory_requests(NS).await;

    // 5c's other direction: a device-plugin request in an opted-in namespace becomes peakfit's.
    let converted: Pod = serde_json::from_value(json!({
        "metadata": { "name": "whole-0" },
        "spec": { "containers": [{ "name": "main", "image": "trainer",
            "resources": { "limits": { "nvidia.com/gpu": "1" } } }] },
    }))
    .unwrap();
    let created = c
        .pods(TRAIN)
        .create(&PostParams::default(), &converted)
        .await
        .unwrap();
    let a = created.annotations();
    assert_eq!(
        (a.get("peakfit.io/gpus"), a.get("peakfit.io/gpu-share")),
        (Some(&"1".to_owned()), Some(&"1".to_owned())),
        "{a:?}"
    );
    let limits = created.spec.as_ref().unwrap().containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    assert!(!limits.contains_key("nvidia.com/gpu"), "{limits:?}");
    let whole = c
        .wait_bound(TRAIN, "whole-0", Duration::from_secs(30))
        .await;
    let (whole_gpus, _, _) = assignment(&whole);
    assert_eq!(whole_gpus.len(), 1, "{whole_gpus:?}");
    assert!(!held_uuids.contains(&whole_gpus[0]), "{whole_gpus:?}");

    // One free GPU is left (mixed's GPU 3 or spare's): two 10 GiB pods, then a third waits.
    let mut placed = Vec::new();
    for name in ["small-0", "small-1"] {
        c.create_pod(NS, name, &[("peakfit.io/vram", "10Gi")]).await;
        let p = c.wait_bound(NS, name, Duration::from_secs(30)).await;
        let (gpus, _, _) = assignment(&p);
        assert!(
            gpus.iter()
                .all(|g| !held_uuids.contains(g) && *g != whole_gpus[0]),
            "{name} on {gpus:?}"
        );
        placed.push((name, node_of(&p), gpus[0].clone()));
    }
    c.create_pod(NS, "small-2", &[("peakfit.io/vram", "10Gi")])
        .await;
    let event = c
        .wait_event(
            NS,
            "small-2",
            "is held by ml/trainer-0 through nvidia.com/gpu",
            Duration::from_secs(30),
        )
        .await;
    // The words of every held GPU are checked through the router in `extender_fixtures`; here
    // the first, since kube-scheduler's event may cut a long message.
    assert!(
        event.contains(&format!("GPU 0 ({}) is held by", mixed[0].uuid)),
        "{event}"
    );
    // Counting the kubelet's allocations: no peakfit pod on a held GPU, none over-committed.
    let sums = c.assert_no_overcommit().await;
    assert!(sums.keys().all(|g| !held_uuids.contains(g)), "{sums:?}");
    assert_eq!(
        c.metric(&ext, "peakfit_gpu_holder_conflicts", r#"node="mixed""#),
        0.0
    );

    // A race: the kubelet gives small-0's GPU to rogue-0 as well.
    let (_, node, uuid) = placed[0].clone();
    let index = c
        .gpus_of(&node)
        .iter()
        .position(|g| g.uuid == uuid)
        .unwrap();
    running_elsewhere(&c, "rogue-0", &node, 1).await;
    let mut now_held = if node == "mixed" {
        held.to_vec()
    } else {
        Vec::new()
    };
    now_held.push((index, holder("rogue-0", HolderKind::DevicePlugin)));
    c.set_holders(&node, &now_held).await;
    let on_pod = c
        .wait_event(
            NS,
            "small-0",
            "GpuHeldByAnotherPod",
            Duration::from_secs(30),
        )
        .await;
    assert!(
        on_pod.contains("ml/rogue-0 through nvidia.com/gpu")
            && on_pod.contains(&uuid)
            && on_pod.ends_with("\"Supported set-ups\")"),
        "{on_pod}"
    );
    c.wait_event(
        NS,
        "rogue-0",
        "is also assigned to peakfit pod ml/small-0",
        Duration::from_secs(30),
    )
    .await;
    let labels = format!(r#"node="{node}""#);
    assert_eq!(
        c.metric(&ext, "peakfit_gpu_holder_conflicts", &labels),
        // One GPU, however many peakfit pods it has.
        1.0
    );
    let gpu = format!(r#"node="{node}",uuid="{uuid}""#);
    assert!(
        c.metric(&ext, "peakfit_ledger_gpu_committed_bytes", &gpu)
            > c.metric(&ext, "peakfit_ledger_gpu_total_bytes", &gpu),
        "the ledger counts the holder and the peakfit pods at once"
    );
    // Once per conflict, not per search (every 2 s): still one event each a while later.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        events_with(&c, NS, "small-0", "GpuHeldByAnotherPod")
            .await
            .len(),
        1
    );
    // The holder gets one per peakfit pod on its GPU (both small pods share the last free GPU).
    let sharing = placed.iter().filter(|(_, _, g)| *g == uuid).count();
    assert_eq!(
        events_with(&c, NS, "rogue-0", "GpuSharedWithPeakfit")
            .await
            .len(),
        sharing
    );
}

/// Both nodes' agents report `PodResources` unreadable, then peakfit starts (with `args`): the
/// first 20 GiB pod (one per L4) lands on `free`, the second waits, unbound, with a
/// `FailedScheduling` event naming the read's error and `words` (what hands GPUs out on the
/// other node), and no GPU is over-committed.
async fn second_pod_waits_naming(
    c: &Cluster,
    args: &[&str],
    free: &str,
    other: &str,
    words: &str,
) -> Extender {
    let reason = "connecting to /var/lib/kubelet/pod-resources/kubelet.sock: permission denied";
    for node in [free, other] {
        c.set_pod_resources_down(node, reason).await;
    }
    let ext = c.start_peakfit(args).await;
    c.create_pod(NS, "first", &[("peakfit.io/vram", "20Gi")])
        .await;
    let first = c.wait_bound(NS, "first", Duration::from_secs(30)).await;
    assert_eq!(node_of(&first), free);
    c.create_pod(NS, "second", &[("peakfit.io/vram", "20Gi")])
        .await;
    let event = c
        .wait_event(NS, "second", words, Duration::from_secs(30))
        .await;
    assert!(
        event.contains("cannot read the kubelet's PodResources API")
            && event.contains("permission denied"),
        "{event}"
    );
    assert_eq!(node_of(&c.pods(NS).get("second").await.unwrap()), "");
    c.assert_no_overcommit().await;
    ext
}

/// A control plane with two one-L4 nodes: `dedicated` advertises no `nvidia.com/gpu`, `mixed`
/// advertises its one.
async fn dedicated_and_mixed() -> Cluster {
    let c = Cluster::up().await;
    c.namespace(NS).await;
    c.add_reported_node_advertising("dedicated", vec![Gpu::l4("dedicated", 0)], 0)
        .await;
    c.add_reported_node("mixed", vec![Gpu::l4("mixed", 0)])
        .await;
    c
}

#[tokio::test]
async fn a_mixed_node_whose_agent_cannot_read_pod_resources_takes_no_pod() {
    let c = dedicated_and_mixed().await;
    // The nudger's first tick runs as the extender starts, before its watches fill the index;
    // with a long interval its second comes after the agent reads `PodResources` again below,
    // so it first sees `mixed` recovered: the window where the waiting pod used to stay in
    // kube-scheduler's unschedulable pool until its 5-minute flush (issue 23).
    // 45 s: room for a slow runner to start the extender and refuse the pod (about 1 s here)
    // before the 12 s below, with the recovery still before the second tick.
    let nudge_every = Duration::from_secs(45);
    let started = std::time::Instant::now();
    let interval = format!("{}s", nudge_every.as_secs());
    let ext = second_pod_waits_naming(
        &c,
        &["--max-report-age", "1h", "--nudge-interval", &interval],
        "dedicated",
        "mixed",
        "the node's device plugin advertises nvidia.com/gpu",
    )
    .await;

    // The outage lasts past kube-scheduler's longest backoff (10 s): the pod still waits, now in
    // its unschedulable pool, which only a cluster event (or the 5-minute flush) empties.
    let refused = std::time::Instant::now();
    while refused.elapsed() < Duration::from_secs(12) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(node_of(&c.pods(NS).get("second").await.unwrap()), "");
    }
    assert!(
        started.elapsed() + Duration::from_secs(5) < nudge_every,
        "too slow to test the window: {:?} since the extender started",
        started.elapsed()
    );
    // The agent reads `PodResources` again: the nudger's next tick sees `mixed` usable and
    // nudges it, and the waiting pod binds there.
    let read_again = std::time::Instant::now();
    c.set_pod_resources_up("mixed").await;
    let second = c
        .wait_bound(NS, "second", nudge_every + Duration::from_secs(15))
        .await;
    eprintln!(
        "e2e: extender started, {:.1} s later refused `second`; PodResources read again {:.1} s \
         after the refusal; bound {:.1} s after that (nudge interval {} s); nudges {}",
        refused.duration_since(started).as_secs_f64(),
        read_again.duration_since(refused).as_secs_f64(),
        read_again.elapsed().as_secs_f64(),
        nudge_every.as_secs(),
        c.metric(&ext, "peakfit_extender_node_nudges_total", "")
    );
    assert_eq!(node_of(&second), "mixed");
    c.assert_no_overcommit().await;
}

/// An extender restarted while a pod it refused waits in kube-scheduler's unschedulable pool
/// has no record of that refusal; the nudger reads the pod's `PodScheduled` condition instead,
/// so when the mixed node's agent reads `PodResources` again the pod still binds within
/// seconds, not after the scheduler's 5-minute flush.
#[tokio::test]
async fn a_pod_refused_before_an_extender_restart_binds_when_its_node_recovers() {
    let c = dedicated_and_mixed().await;
    let mut ext = second_pod_waits_naming(
        &c,
        &["--max-report-age", "1h"],
        "dedicated",
        "mixed",
        "the node's device plugin advertises nvidia.com/gpu",
    )
    .await;
    // Past the scheduler's longest backoff (10 s): the pod is in its unschedulable pool.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(node_of(&c.pods(NS).get("second").await.unwrap()), "");
    c.restart_extender("extender", &mut ext);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let read_again = std::time::Instant::now();
    c.set_pod_resources_up("mixed").await;
    let second = c.wait_bound(NS, "second", Duration::from_secs(30)).await;
    eprintln!(
        "e2e: restarted extender; bound {:.1} s after PodResources was read again; nudges {}",
        read_again.elapsed().as_secs_f64(),
        c.metric(&ext, "peakfit_extender_node_nudges_total", "")
    );
    assert_eq!(node_of(&second), "mixed");
    c.assert_no_overcommit().await;
}

/// DRA devices are not in allocatable: neither Node advertises `nvidia.com/gpu`, but a
/// `ResourceSlice` of `gpu.nvidia.com` (NVIDIA's DRA driver) publishes a device on `dra`. With
/// both agents unable to read `PodResources`, `dra` takes no pod and the waiting pod's event
/// names the driver; once the slice is deleted, the mark goes and the pod lands there (the
/// deletion is itself an event that requeues it: the nudge after a recovery is shown by the
/// mixed-node test above). A slice of another driver on `plain` refuses nothing.
#[tokio::test]
async fn a_node_a_dra_gpu_driver_publishes_on_takes_no_pod_while_pod_resources_is_down() {
    let c = Cluster::up().await;
    c.namespace(NS).await;
    for node in ["plain", "dra"] {
        c.add_reported_node_advertising(node, vec![Gpu::l4(node, 0)], 0)
            .await;
    }
    c.create_resource_slice("dra-gpu.nvidia.com", "gpu.nvidia.com", "dra")
        .await;
    c.create_resource_slice("plain-dra.net", "dra.net", "plain")
        .await;
    let _ext = second_pod_waits_naming(
        &c,
        &["--max-report-age", "1h", "--nudge-interval", "100ms"],
        "plain",
        "dra",
        "DRA driver gpu.nvidia.com publishes GPUs on this node",
    )
    .await;

    c.delete_resource_slice("dra-gpu.nvidia.com").await;
    let second = c.wait_bound(NS, "second", Duration::from_secs(30)).await;
    assert_eq!(node_of(&second), "dra");
    c.assert_no_overcommit().await;
}
