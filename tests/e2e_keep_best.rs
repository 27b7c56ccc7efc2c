//! `--filter-keep-best` behind the real kube-scheduler and kube-apiserver: filter answers with
//! only the best fitting node, naming the others in no failed list, and kube-scheduler still
//! binds each pod where peakfit ranks best, without a `FailedScheduling` event; a pod that fits
//! nowhere is explained exactly as without the flag ("0/N nodes are available" with every
//! node's reason).
//!
//! Needs `../shared/tools/k8s`; fails, never skips, without it.

mod e2e_support;

use std::time::Duration;

use e2e_support::*;

const NS: &str = "ml";
const NODES: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeping_the_best_node_binds_there_and_explains_a_pod_that_fits_nowhere() {
    let c = Cluster::up().await;
    c.namespace(NS).await;
    for n in 0..NODES {
        let name = format!("h100-{n}");
        c.add_reported_node(&name, (0..2).map(|i| Gpu::h100(&name, i)).collect())
            .await;
    }
    let ext = c
        .start_peakfit(&["--filter-keep-best", "1", "--max-report-age", "1h"])
        .await;
    let t = Duration::from_secs(30);

    // Six empty nodes fit the first pod: filter passes one, kube-scheduler binds it there.
    // The second pod fits all six again; peakfit packs it beside the first, and that node is
    // the one filter keeps.
    c.create_pod(NS, "first", &[("peakfit.io/vram", "30Gi")])
        .await;
    let first = node_of(&c.wait_bound(NS, "first", t).await);
    c.create_pod(NS, "second", &[("peakfit.io/vram", "30Gi")])
        .await;
    let second = node_of(&c.wait_bound(NS, "second", t).await);
    assert_eq!(first, second, "the second pod is packed beside the first");
    let ranked_out = c.metric(&ext, "peakfit_extender_filter_ranked_out_nodes_total", "");
    assert!(
        ranked_out >= (2 * (NODES - 1)) as f64,
        "filter left out the five nodes below the best for each pod: {ranked_out}"
    );
    for pod in ["first", "second"] {
        let events = c.event_messages(NS, pod).await;
        assert!(
            !events.iter().any(|m| m.starts_with("FailedScheduling")),
            "{pod}: {events:?}"
        );
    }

    // Fits nowhere: every node refused with its words, as without the flag.
    c.create_pod(NS, "huge", &[("peakfit.io/vram", "100Gi")])
        .await;
    let m = c.wait_event(NS, "huge", "FailedScheduling", t).await;
    assert!(
        m.starts_with(&format!("FailedScheduling: 0/{NODES} nodes are available")),
        "{m}"
    );
    assert!(m.contains("needs 100.2 GiB free per GPU"), "{m}");
    assert!(m.contains(&format!("{NODES} ")), "every node counted: {m}");
    let p = c.pods(NS).get("huge").await.unwrap();
    assert_eq!(node_of(&p), "", "huge must not bind");
    c.assert_no_overcommit().await;
}
