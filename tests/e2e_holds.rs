//! Holds for pods that starve (issue 22) behind the real kube-scheduler: a four-GPU node filled
//! with small pods, a pod needing all four GPUs arrives and waits; past `--reserve-after` the
//! extender holds the node's GPUs for it (event on the pod, annotation `peakfit.io/hold`). The
//! small pods then finish one by one while new small pods keep arriving: those bind on a second
//! node or beside the hold, never on the memory it keeps, and the big pod binds on its held GPUs
//! within `--reserve-deadline`. The extender is restarted in the middle and finds the hold again
//! in the pod's annotation. Nothing is over-committed. With `--reserve-after off` the same stream
//! leaves the big pod pending: the small pods take each GPU's freed memory. And a hold that
//! reaches its deadline is removed from its pod's annotations.
//!
//! No kubelet: a pod "finishes" when the test deletes it; the reports stay as written (idle GPUs),
//! so the ledgers count the pods' reservations, as they do between two agent polls.
//!
//! Needs `../shared/tools/k8s`; fails, never skips, without it.

mod e2e_support;

use std::time::{Duration, Instant};

use e2e_support::*;
use kube::ResourceExt;
use peakfit::cluster::hold::{HOLD, HoldNote};

const NS: &str = "ml";
const BIG_NODE: &str = "h100-big";
const SPARE_NODE: &str = "h100-spare";
/// `--reserve-deadline`: the bound the big pod must bind within once its hold is made.
const DEADLINE: Duration = Duration::from_secs(120);

/// The scenario up to the hold: the big node filled by eight 30 GiB pods (two per GPU, 20 GiB
/// left on each), a second node for the small pods, the four-GPU pod created and refused, and a
/// first small pod arriving past `--reserve-after` (an event that makes the scheduler retry).
/// The cluster, the extender, the fillers and when the big pod was created.
async fn up_to_the_hold(extra: &[&str]) -> (Cluster, Extender, Vec<String>, Instant) {
    let c = Cluster::up().await;
    c.namespace(NS).await;
    c.add_reported_node(BIG_NODE, (0..4).map(|i| Gpu::h100(BIG_NODE, i)).collect())
        .await;
    let mut flags = vec!["--max-report-age", "1h"];
    flags.extend_from_slice(extra);
    let ext = c.start_peakfit(&flags).await;
    let fillers: Vec<String> = (0..8).map(|i| format!("filler-{i}")).collect();
    for f in &fillers {
        c.create_pod(NS, f, &[("peakfit.io/vram", "30Gi")]).await;
    }
    for f in &fillers {
        let p = c.wait_bound(NS, f, Duration::from_secs(60)).await;
        assert_eq!(node_of(&p), BIG_NODE);
    }
    // Two GPUs: never enough for the big pod.
    c.add_reported_node(
        SPARE_NODE,
        (0..2).map(|i| Gpu::h100(SPARE_NODE, i)).collect(),
    )
    .await;
    // The big pod: 70 GiB on each of four GPUs. It fits nowhere.
    let created = Instant::now();
    c.create_pod(
        NS,
        "llama-70b",
        &[("peakfit.io/vram", "70Gi"), ("peakfit.io/gpus", "4")],
    )
    .await;
    c.wait_event(NS, "llama-70b", "FailedScheduling", Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    c.create_pod(NS, "small-00", &[("peakfit.io/vram", "8Gi")])
        .await;
    (c, ext, fillers, created)
}

/// One filler finishes and small pod `small-<i>` (8 GiB) arrives; its name.
async fn finish_and_arrive(c: &Cluster, filler: &str, i: usize) -> String {
    c.delete_pod(NS, filler).await;
    let name = format!("small-{i:02}");
    c.create_pod(NS, &name, &[("peakfit.io/vram", "8Gi")]).await;
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starving_four_gpu_pod_binds_within_its_hold_while_small_pods_keep_binding() {
    let (c, mut ext, fillers, created) =
        up_to_the_hold(&["--reserve-after", "5s", "--reserve-deadline", "2m"]).await;
    let event = c
        .wait_event(
            NS,
            "llama-70b",
            "holding GPUs 0-3 of node h100-big",
            Duration::from_secs(60),
        )
        .await;
    let held_at = Instant::now();
    println!(
        "e2e holds: hold made {:.1} s after the pod was created: {event}",
        created.elapsed().as_secs_f64()
    );
    let hold = |p: &k8s_openapi::api::core::v1::Pod| {
        HoldNote::parse(p.annotations().get(HOLD).expect("the hold annotation")).unwrap()
    };
    let note = hold(&c.pods(NS).get("llama-70b").await.unwrap());
    assert_eq!(note.node, BIG_NODE);
    assert_eq!(note.until_unix - note.made_unix, 120);
    let big_gpus: Vec<String> = c.gpus_of(BIG_NODE).into_iter().map(|g| g.uuid).collect();
    assert_eq!(note.gpus, big_gpus);

    // Small pods finish one by one while new ones keep arriving; the extender restarts midway.
    let mut small = vec!["small-00".to_owned()];
    for (i, f) in fillers.iter().enumerate() {
        small.push(finish_and_arrive(&c, f, i + 1).await);
        if i == 3 {
            c.restart_extender("extender", &mut ext);
            // Rebuilt from the annotation: in force on the new process, which made none.
            eventually(
                Duration::from_secs(20),
                "the restarted extender's hold",
                || {
                    let active = c.metric(&ext, "peakfit_holds_active", "");
                    async move { (active == 1.0).then_some(()) }
                },
            )
            .await;
            assert_eq!(c.metric(&ext, "peakfit_holds_made_total", ""), 0.0);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        c.assert_no_overcommit().await;
    }

    let big = c.wait_bound(NS, "llama-70b", DEADLINE).await;
    let waited = held_at.elapsed();
    println!(
        "e2e holds: the 4-GPU pod bound {:.1} s after its hold was made ({:.1} s after it was \
         created; bound: the 120 s deadline)",
        waited.as_secs_f64(),
        created.elapsed().as_secs_f64()
    );
    assert!(waited < DEADLINE, "bound after {waited:?}");
    assert_eq!(node_of(&big), BIG_NODE);
    let mut got = assignment(&big).0;
    got.sort();
    let mut want = big_gpus.clone();
    want.sort();
    assert_eq!(got, want, "on the GPUs held for it");
    assert_eq!(
        hold(&big),
        note,
        "the same hold throughout: never made twice"
    );

    let (mut beside, mut elsewhere) = (0, 0);
    for s in &small {
        let p = c.wait_bound(NS, s, Duration::from_secs(60)).await;
        if node_of(&p) == BIG_NODE {
            beside += 1;
        } else {
            elsewhere += 1;
        }
    }
    println!(
        "e2e holds: {} small pods arrived while the big pod waited: {beside} bound beside the \
         hold on {BIG_NODE}, {elsewhere} on {SPARE_NODE}",
        small.len()
    );
    let per_gpu = c.assert_no_overcommit().await;
    for g in &big_gpus {
        assert!(per_gpu[g] <= 80 * GIB, "{per_gpu:?}");
    }
}

/// The same stream with `--reserve-after off`: the small pods take the memory the big pod needs
/// as it frees, and the big pod is still pending well after the time it bound in with a hold.
/// What makes the test above able to fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_holds_the_same_stream_starves_the_four_gpu_pod() {
    let (c, _ext, fillers, created) = up_to_the_hold(&["--reserve-after", "off"]).await;
    let mut small = vec!["small-00".to_owned()];
    for (i, f) in fillers.iter().enumerate() {
        small.push(finish_and_arrive(&c, f, i + 1).await);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    for s in &small {
        c.wait_bound(NS, s, Duration::from_secs(60)).await;
    }
    tokio::time::sleep(Duration::from_secs(20)).await;
    let big = c.pods(NS).get("llama-70b").await.unwrap();
    assert_eq!(node_of(&big), "", "bound without a hold");
    assert!(!big.annotations().contains_key(HOLD));
    println!(
        "e2e holds off: the 4-GPU pod still pending {:.1} s after it was created",
        created.elapsed().as_secs_f64()
    );
    c.assert_no_overcommit().await;
}

/// An expired hold leaves the pod: one H100 with a 60 GiB pod on it, a 40 GiB pod that fits
/// nowhere gets a hold at once (`--reserve-after 0s`, so the hold's write races kube-scheduler's
/// own status update of the failed attempt, the conflict that is retried) lasting 5 s. The
/// filler never leaves, so the hold reaches its deadline; the sweep then removes the very
/// annotation from the pod within a couple of seconds (a later attempt may write a new hold,
/// never the old one back), and no annotation read meanwhile is long past its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_hold_is_removed_from_its_pod() {
    const NODE: &str = "h100-one";
    let c = Cluster::up().await;
    c.namespace(NS).await;
    c.add_reported_node(NODE, vec![Gpu::h100(NODE, 0)]).await;
    let ext = c
        .start_peakfit(&[
            "--max-report-age",
            "1h",
            "--reserve-after",
            "0s",
            "--reserve-deadline",
            "5s",
        ])
        .await;
    c.create_pod(NS, "filler", &[("peakfit.io/vram", "60Gi")])
        .await;
    c.wait_bound(NS, "filler", Duration::from_secs(60)).await;
    c.create_pod(NS, "waiting", &[("peakfit.io/vram", "40Gi")])
        .await;
    c.wait_event(
        NS,
        "waiting",
        "holding GPU 0 of node h100-one",
        Duration::from_secs(30),
    )
    .await;
    let pods = c.pods(NS);
    let note_of = |p: &k8s_openapi::api::core::v1::Pod| {
        p.annotations()
            .get(HOLD)
            .map(|v| HoldNote::parse(v).unwrap())
    };
    let first = eventually(Duration::from_secs(10), "the hold on the pod", || {
        let pods = pods.clone();
        async move { note_of(&pods.get("waiting").await.unwrap()) }
    })
    .await;
    assert_eq!(first.until_unix - first.made_unix, 5);

    // Until well past its deadline: every annotation read is in force or barely past it, and
    // the first one goes.
    let mut gone_at = None;
    loop {
        let now = jiff::Timestamp::now().as_second();
        if now > first.until_unix + 15 {
            break;
        }
        if let Some(note) = note_of(&pods.get("waiting").await.unwrap()) {
            assert!(
                note.until_unix + 3 >= now,
                "a hold {} s past its deadline is still on the pod: {note:?}",
                now - note.until_unix
            );
            if note != first {
                gone_at.get_or_insert(now);
            }
        } else {
            gone_at.get_or_insert(now);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let gone_at = gone_at.expect("the expired hold never left the pod");
    // `abs`: a series not yet exposed sums to -0.
    let count = |name: &str, labels: &str| c.metric(&ext, name, labels).abs();
    println!(
        "e2e holds: the expired hold left the pod {} s after its deadline; conflicts retried: {}, \
         holds made {}, expired {}, removed {}",
        gone_at - first.until_unix,
        count(
            "peakfit_holds_write_conflicts_total",
            r#"outcome="retried""#
        ),
        count("peakfit_holds_made_total", ""),
        count("peakfit_holds_expired_total", ""),
        count("peakfit_holds_cleared_total", ""),
    );
    assert!(count("peakfit_holds_cleared_total", "") >= 1.0);
    assert!(count("peakfit_holds_expired_total", "") >= 1.0);
    assert_eq!(node_of(&pods.get("waiting").await.unwrap()), "");
    c.assert_no_overcommit().await;
}
