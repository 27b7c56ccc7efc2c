//! The extender killed mid-stream and restarted: its ledger is rebuilt from the pods' annotations,
//! no GPU is double-booked and nothing bound is lost. Then two scheduler + extender replicas under
//! the chart's leader election: the leader is killed and the standby takes over.
//!
//! Needs `../shared/tools/k8s` and the fake NVML library; fails, never skips, without them.

mod e2e_support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use e2e_support::*;
use kube::api::ListParams;

const NS: &str = "ml";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_extender_and_a_standby_replica_keep_every_binding() {
    let c = Cluster::up().await;
    c.namespace(NS).await;
    for n in 0..3 {
        let name = format!("h100-{n}");
        c.add_gpu_node(&name, (0..2).map(|i| Gpu::h100(&name, i)).collect())
            .await;
    }
    c.wait_reports().await;
    let mut ext = c.start_extender("extender", &[]);
    c.start_scheduler("scheduler-a", ext.port);

    // A stream of 16 pods of 20 GiB (at most 3 per 80 GiB GPU with the margin: room for 18);
    // the extender is killed after the 6th and restarted after the 10th.
    for i in 0..16 {
        c.create_pod(NS, &format!("s-{i:02}"), &[("peakfit.io/vram", "20Gi")])
            .await;
        if i == 6 {
            c.kill_extender(&mut ext);
        }
        if i == 10 {
            c.restart_extender("extender", &mut ext);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = bound_pods(&c).await;
    for i in 0..16 {
        c.wait_bound(NS, &format!("s-{i:02}"), Duration::from_secs(60))
            .await;
    }
    let after = bound_pods(&c).await;
    for (name, gpus) in &before {
        assert_eq!(after.get(name), Some(gpus), "{name} kept its binding");
    }
    let per_gpu = c.assert_no_overcommit().await;
    // Each GPU holds at most three 20 GiB pods (plus margins): the restarted ledger counted
    // the earlier ones.
    assert!(
        per_gpu.values().all(|&b| b <= 3 * (20 * GIB + (256 << 20))),
        "{per_gpu:?}"
    );

    // The standby: a second scheduler + extender on the same Lease.
    let standby = c.start_extender("extender-b", &[]);
    c.start_scheduler("scheduler-b", standby.port);
    c.create_pod(NS, "on-leader", &[("peakfit.io/vram", "10Gi")])
        .await;
    c.wait_bound(NS, "on-leader", Duration::from_secs(30)).await;
    let standby_binds = || {
        c.metric(
            &standby,
            "peakfit_extender_decisions_total",
            r#"verb="bind""#,
        )
    };
    assert_eq!(standby_binds(), 0.0, "only the leader binds");

    let killed = Instant::now();
    c.kill_scheduler("scheduler-a");
    c.kill_extender(&mut ext);
    c.create_pod(NS, "after-failover", &[("peakfit.io/vram", "10Gi")])
        .await;
    let p = c
        .wait_bound(NS, "after-failover", Duration::from_secs(60))
        .await;
    println!(
        "e2e failover: standby bound a pod {:.1} s after the leader was killed (leaseDuration 15s)",
        killed.elapsed().as_secs_f64()
    );
    assert_eq!(assignment(&p).0.len(), 1);
    assert!(standby_binds() >= 1.0);
    c.assert_no_overcommit().await;
}

/// Bound pods of the namespace and their GPUs.
async fn bound_pods(c: &Cluster) -> HashMap<String, Vec<String>> {
    c.pods(NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| !node_of(p).is_empty())
        .map(|p| (p.metadata.name.clone().unwrap(), assignment(&p).0))
        .collect()
}
