//! A burst of 200 GPU pods created at once over 20 nodes, behind the real kube-scheduler: every
//! pod that fits binds, no GPU is over-committed, and every pod left waiting is one no GPU has
//! room for, and kube-scheduler's message for it counts the nodes under one reason (refusals
//! among more than 16 nodes leave out each node's figures). Prints the refused binds
//! (conflicts) and the time to drain; asserts no timings.
//!
//! Needs `../shared/tools/k8s` and the fake NVML library; fails, never skips, without them.

mod e2e_support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use e2e_support::*;
use futures::StreamExt;
use kube::api::ListParams;

const NS: &str = "burst";
const NODES: usize = 20;
const PODS: usize = 200;
const MARGIN: u64 = 256 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_200_pods_over_20_nodes_binds_all_that_fit_and_overcommits_nothing() {
    let c = Cluster::up().await;
    c.namespace(NS).await;
    for n in 0..NODES {
        let name = format!("gpu-{n:02}");
        c.add_gpu_node(&name, (0..4).map(|i| Gpu::a100_40(&name, i)).collect())
            .await;
    }
    let ext = c.start_peakfit(&[]).await;

    // 10, 20 and 30 GiB, round robin: 4,000 GiB asked of 3,200 GiB.
    let sizes = [10u64, 20, 30];
    let size_of = |i: usize| sizes[i % sizes.len()];
    let start = Instant::now();
    futures::stream::iter(0..PODS)
        .for_each_concurrent(50, |i| {
            let c = &c;
            async move {
                let vram = format!("{}Gi", size_of(i));
                c.create_pod(NS, &format!("p-{i:03}"), &[("peakfit.io/vram", &vram)])
                    .await;
            }
        })
        .await;
    let created = start.elapsed();

    // Drained: every pod bound, or nothing bound for 10 s.
    let pods = c.pods(NS);
    let mut last_count = 0;
    let mut last_change = Instant::now();
    let mut drained_at = start.elapsed();
    loop {
        let bound = pods
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| !node_of(p).is_empty())
            .count();
        if bound != last_count {
            last_count = bound;
            last_change = Instant::now();
            drained_at = start.elapsed();
        }
        if bound == PODS || last_change.elapsed() > Duration::from_secs(10) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(240),
            "burst never drained"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // No GPU holds more than it has; every waiting pod is larger than any GPU's room.
    let reserved = c.assert_no_overcommit().await;
    let memory = c.gpu_memory();
    let best_free = memory
        .iter()
        .map(|(uuid, total)| total - reserved.get(uuid).copied().unwrap_or(0))
        .max()
        .unwrap();
    let all = pods.list(&ListParams::default()).await.unwrap().items;
    let mut waiting: HashMap<u64, usize> = HashMap::new();
    for p in &all {
        if node_of(p).is_empty() {
            let i: usize = p.metadata.name.as_ref().unwrap()[2..].parse().unwrap();
            let need = size_of(i) * GIB + MARGIN;
            assert!(
                need > best_free,
                "{} ({} GiB) waits though a GPU has {best_free} bytes free",
                p.metadata.name.as_ref().unwrap(),
                size_of(i)
            );
            *waiting.entry(size_of(i)).or_default() += 1;
        }
    }
    // Over more than 16 candidate nodes the refusals leave out each node's figures, so
    // kube-scheduler's message counts the 20 nodes under one reason instead of listing each.
    let waiting_pod = all
        .iter()
        .find(|p| node_of(p).is_empty())
        .expect("4,000 GiB asked of 3,200: some pod waits");
    let message = waiting_pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.starts_with(&format!("0/{NODES} nodes are available: {NODES} needs ")),
        "{message}"
    );
    assert_eq!(message.matches("needs ").count(), 1, "{message}");
    assert!(!message.contains("best free GPU"), "{message}");
    let conflicts = c.metric(&ext, "peakfit_extender_bind_conflicts_total", "");
    let errors = c.metric(&ext, "peakfit_extender_errors_total", r#"verb="bind""#);
    let binds = c.metric(
        &ext,
        "peakfit_extender_decisions_total",
        r#"verb="bind",outcome="bound""#,
    );
    println!(
        "e2e burst: {PODS} pods over {NODES} nodes x 4 A100-40GB: created in {:.2} s, {last_count} bound, \
         waiting by size (GiB) {waiting:?}; drained (last bind) {:.2} s after the first create; \
         bind conflicts (refused binds) {conflicts}, bind errors {errors}, binds {binds}",
        created.as_secs_f64(),
        drained_at.as_secs_f64()
    );
    assert_eq!(peakfit::convert::f64_to_usize(binds), last_count);
    assert_eq!(errors, 0.0, "{}", c.log_tail("extender", 20));
    assert!(last_count >= 100, "most pods fit: {last_count}");
}
