//! `--filter-keep-best` behind the real kube-scheduler and kube-apiserver: filter answers with
//! only the best fitting node, naming the others in no failed list, and kube-scheduler still
//! binds each pod where peakfit ranks best, without a `FailedScheduling` event; a pod that fits
//! nowhere is explained exactly as without the flag ("0/N nodes are available" with every
//! node's reason); and a pod with a preferred node affinity term is not cut, so kube-scheduler's
//! `NodeAffinity` score puts it on the node it prefers where peakfit alone ranks another first.
//!
//! Needs `../shared/tools/k8s`; fails, never skips, without it.

mod e2e_support;

use std::time::Duration;

use e2e_support::*;
use kube::api::PostParams;
use peakfit::placement::stable_name_hash;

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

    let names: Vec<String> = (0..NODES).map(|n| format!("h100-{n}")).collect();
    let by_hash = |pick: fn(u64, u64) -> bool| {
        names
            .iter()
            .reduce(|a, b| {
                if pick(stable_name_hash(b), stable_name_hash(a)) {
                    b
                } else {
                    a
                }
            })
            .unwrap()
            .clone()
    };

    // On six identical empty nodes peakfit ranks first the one whose name hashes highest
    // (prioritize's last tie-break) and last the lowest: with the cut, filter would pass the
    // first only. A pod that prefers the last by node affinity keeps every node, and
    // kube-scheduler's NodeAffinity score (100 x weight 2) outweighs peakfit's one step between
    // them (9 against 10, x weight 5 x 10).
    let best = by_hash(|a, b| a > b);
    let preferred = by_hash(|a, b| a < b);
    assert_ne!(best, preferred);
    let mut chooser = gpu_pod("chooser", &[("peakfit.io/vram", "30Gi")]);
    chooser.spec.as_mut().unwrap().affinity = Some(
        serde_json::from_value(serde_json::json!({"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {
                "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                      "values": [preferred]}]}}]}}))
        .unwrap(),
    );
    c.pods(NS)
        .create(&PostParams::default(), &chooser)
        .await
        .unwrap();
    let on = node_of(&c.wait_bound(NS, "chooser", t).await);
    assert_eq!(on, preferred, "peakfit alone would put it on {best}");
    let skipped = c.metric(
        &ext,
        "peakfit_extender_filter_keep_best_skipped_total",
        "preference=\"node_affinity\"",
    );
    assert!(skipped >= 1.0, "the skipped cut is counted: {skipped}");
    assert_eq!(
        c.metric(&ext, "peakfit_extender_filter_ranked_out_nodes_total", ""),
        0.0,
        "nothing was cut for it"
    );

    // Six nodes fit the first pod: filter passes one, kube-scheduler binds it there (beside
    // the chooser: peakfit packs). The second pod fits all six again; peakfit packs it beside
    // the first, and that node is the one filter keeps.
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
    for pod in ["chooser", "first", "second"] {
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
