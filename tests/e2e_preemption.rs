//! Preemption for GPU memory behind the real kube-scheduler: the agents advertise each node's GPU
//! memory as the extended resource `peakfit.io/gpu-memory-mib`, the webhook requests each pod's
//! least GPU memory in it, so the scheduler's own fit and preemption dry run see node-level GPU
//! memory; `/preempt` keeps the fewest victims that free a GPU; the victims are deleted and the
//! high-priority pod binds. Also: bind's output on a bound pod cannot be overwritten.
//!
//! There is no kubelet: the scheduler deletes victims gracefully (their 30 s grace period), and a
//! bound pod being deleted stays, with a deletionTimestamp, until its kubelet confirms the
//! containers stopped. The test plays that kubelet: it deletes terminating pods with grace 0.
//!
//! Needs `../shared/tools/k8s` and the fake NVML library; fails, never skips, without them.

mod e2e_support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e_support::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NS: &str = "ml";
const RESOURCE: &str = "peakfit.io/gpu-memory-mib";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_pod_evicts_the_fewest_gpu_memory_holders_and_binds() {
    let c = Cluster::up().await;
    c.namespace(NS).await;
    c.add_gpu_node("a100-p", vec![Gpu::a100_40("a100-p", 0)])
        .await;
    c.wait_reports().await;
    let ext = c.start_extender("extender", &[]);
    c.start_scheduler("peakfit-scheduler", ext.port);
    c.start_webhook().await;
    // The API server calls the webhook a moment after its configuration is created: wait until a
    // dry-run pod comes back with the GPU memory request.
    eventually(Duration::from_secs(20), "the webhook in effect", || async {
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let p = c
            .pods(NS)
            .create(&dry, &gpu_pod("probe", &[("peakfit.io/vram", "1Gi")]))
            .await
            .ok()?;
        let r = p.spec?.containers[0].resources.clone()?.requests?;
        r.contains_key(RESOURCE).then_some(())
    })
    .await;

    // The agent advertised the GPU's 40 GiB on the Node.
    let nodes: Api<Node> = Api::all(c.client.clone());
    let advertised = eventually(
        Duration::from_secs(30),
        "GPU memory on the Node",
        || async {
            let n = nodes.get("a100-p").await.ok()?;
            let a = n.status?.allocatable?;
            a.get(RESOURCE).map(|q| q.0.clone())
        },
    )
    .await;
    assert_eq!(advertised, "40960");

    let classes: Api<PriorityClass> = Api::all(c.client.clone());
    for (name, value) in [("low", 100), ("high", 1_000_000)] {
        let pc: PriorityClass =
            serde_json::from_value(json!({"metadata": {"name": name}, "value": value})).unwrap();
        classes.create(&PostParams::default(), &pc).await.unwrap();
    }

    // Three low-priority pods hold 12 + 12 + 13 GiB of the GPU and nothing else of note.
    for (name, vram) in [("low-a", "12Gi"), ("low-b", "12Gi"), ("low-c", "13Gi")] {
        create(&c, name, vram, "low").await;
        c.wait_bound(NS, name, Duration::from_secs(30)).await;
    }
    let low = c.pods(NS).get("low-c").await.unwrap();
    let requested = &low.spec.as_ref().unwrap().containers[0]
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()[RESOURCE];
    assert_eq!(requested.0, "13312", "the webhook requests 13 GiB in MiB");

    // The kubelet's part of a graceful deletion.
    let stop = Arc::new(AtomicBool::new(false));
    let kubelet = tokio::spawn(finish_deletions(c.pods(NS), stop.clone()));

    // 21 GiB: any one victim frees at most 13 + 3 = 16 GiB of the GPU; two are needed.
    let started = Instant::now();
    create(&c, "high", "21Gi", "high").await;
    let high = c.wait_bound(NS, "high", Duration::from_secs(60)).await;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let deleted = kubelet.await.unwrap();

    assert_eq!(node_of(&high), "a100-p");
    let left: BTreeSet<String> = c
        .pods(NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(kube::ResourceExt::name_any)
        .collect();
    let evicted: Vec<&str> = ["low-a", "low-b", "low-c"]
        .into_iter()
        .filter(|n| !left.contains(*n))
        .collect();
    assert_eq!(evicted.len(), 2, "evicted {evicted:?}, left {left:?}");
    for v in &evicted {
        assert!(
            deleted.contains(*v),
            "{v} was not deleted gracefully: {deleted:?}"
        );
        let events = c.event_messages(NS, v).await;
        assert!(
            events
                .iter()
                .any(|e| e.contains("Preempted") || e.contains("preempt")),
            "{v}: {events:?}"
        );
    }
    let (_, reserved, _) = assignment(&high);
    assert!(reserved >= 21 * GIB, "{reserved}");
    c.assert_no_overcommit().await;
    println!(
        "preemption: high-priority pod bound {:.2} s after creation; evicted {evicted:?}; preempt decisions: {}",
        elapsed.as_secs_f64(),
        c.metric(
            &ext,
            "peakfit_extender_decisions_total",
            r#"verb="preempt",outcome="nodes_kept""#
        )
    );

    bind_output_on_a_bound_pod_cannot_be_overwritten(&c, &high).await;
}

/// `kubectl annotate --overwrite peakfit.io/assigned-gpus=<other> peakfit.io/reserved-bytes=1`
/// is refused by the webhook, and the ledger still counts the pod where it runs.
async fn bind_output_on_a_bound_pod_cannot_be_overwritten(c: &Cluster, high: &Pod) {
    let before = c.assert_no_overcommit().await;
    let patch = json!({"metadata": {"annotations": {
        ASSIGNED_GPUS: "GPU-00000000-0000-0000-0000-000000000000",
        RESERVED_BYTES: "1",
    }}});
    let err = c
        .pods(NS)
        .patch(
            &high.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect_err("overwriting bind's output must be refused");
    let text = err.to_string();
    assert!(
        text.contains("peakfit.io/assigned-gpus from") && text.contains("only peakfit's bind"),
        "{text}"
    );
    let now = c.pods(NS).get(&high.name_any()).await.unwrap();
    assert_eq!(assignment(&now), assignment(high));
    assert_eq!(c.assert_no_overcommit().await, before);
}

async fn create(c: &Cluster, name: &str, vram: &str, class: &str) {
    let mut pod = gpu_pod(name, &[("peakfit.io/vram", vram)]);
    let spec = pod.spec.as_mut().unwrap();
    spec.priority_class_name = Some(class.into());
    // The webhook sets the scheduler; the pod names none, as users' pods do.
    spec.scheduler_name = None;
    c.pods(NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating {name}: {e}"));
}

/// Deletes with grace 0 every pod that is terminating, until `stop`; the names it finished.
async fn finish_deletions(pods: Api<Pod>, stop: Arc<AtomicBool>) -> BTreeSet<String> {
    let mut done = BTreeSet::new();
    while !stop.load(Ordering::Relaxed) {
        if let Ok(list) = pods.list(&ListParams::default()).await {
            for p in list.items {
                if p.metadata.deletion_timestamp.is_some()
                    && pods
                        .delete(&p.name_any(), &DeleteParams::default().grace_period(0))
                        .await
                        .is_ok()
                {
                    done.insert(p.name_any());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done
}
