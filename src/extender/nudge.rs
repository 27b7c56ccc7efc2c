//! Telling kube-scheduler that a node can take waiting pods again.
//!
//! kube-scheduler does not watch `NodeGpuReports`, and a pod the extender refused waits in its
//! unschedulable queue until a Pod or Node event moves it, or its 5-minute flush: a node whose
//! report turned fresh again, whose agent reads the kubelet's `PodResources` API again, or whose
//! memory freed (a pod deleted while the scheduler's retry raced the extender's watch, or memory
//! freed only in a report), would leave its pods waiting for minutes. So while pods wait, each
//! tick compares every node's usability and free memory per GPU with what the nudger last saw
//! of it and, where they improved, bumps an annotation on the Node (field manager
//! `peakfit-extender`): an annotation change is a Node update event (kube-scheduler's
//! `UpdateNodeAnnotation`), and a pod an extender refused is requeued by any cluster event
//! (kube-scheduler registers the extender's rejections under every event), so it goes back to
//! the active queue.
//!
//! A node the nudger has not seen yet offered nothing as far as it knows: its first tick runs
//! before the watches have filled the index, so a node that was refused and recovered before
//! the nudger first saw it (a short `PodResources` outage right after a restart) must still
//! count as improved, or its pods wait for the flush. A patch that fails keeps the node's old
//! baseline, so the next tick tries again.
//!
//! Likewise a node filter refused as a whole (report missing or stale, NVML or `PodResources`
//! down) after the nudger last looked counts as having offered nothing: an outage shorter than
//! a tick is seen usable at both ticks, and its refused pods would wait for the flush.
//!
//! At most [`NUDGES_PER_TICK`] nodes are annotated a tick. One Node update already moves every
//! pod an extender refused (the scheduler queues them on any event), so more patches would move
//! nothing more; and the first tick that sees a large cluster while pods wait counts every
//! usable node as improved, which would otherwise be a write to every Node (5,000 at 5,000
//! nodes) on each extender start.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use super::Extender;
use crate::cluster::binding::FIELD_MANAGER;
use crate::placement::fit::node_usable;

/// The Node annotation bumped (RFC 3339 time of the change).
pub const CAPACITY_CHANGED_AT: &str = "peakfit.io/capacity-changed-at";

/// What a node offers now: whether it is usable, and the free bytes of each GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Offer {
    usable: bool,
    free: Vec<u64>,
}

impl Offer {
    /// What a node the nudger has not seen offered, as far as it knows.
    const NOTHING: Offer = Offer {
        usable: false,
        free: Vec::new(),
    };

    /// More than `before`: usable again, or usable with some GPU freer (a changed GPU set
    /// counts as more).
    fn improves_on(&self, before: &Offer) -> bool {
        self.usable
            && (!before.usable
                || self.free.len() != before.free.len()
                || self.free.iter().zip(&before.free).any(|(a, b)| a > b))
    }
}

/// Each node's offer, by node name.
type Offers = HashMap<String, Offer>;

/// The most Nodes annotated in one tick (module docs: one suffices to move the waiting pods; a
/// few name the nodes that improved for whoever reads the annotation, and survive one failing).
pub const NUDGES_PER_TICK: usize = 8;

/// The improved nodes to annotate this tick and those left out: the first [`NUDGES_PER_TICK`]
/// by name (sorted by `improved`, so a tick is reproducible).
fn to_annotate(mut improved: Vec<String>) -> (Vec<String>, Vec<String>) {
    let rest = improved.split_off(improved.len().min(NUDGES_PER_TICK));
    (improved, rest)
}

/// The nodes of `now` that offer more than in `before` (sorted); a node `before` lacks counts
/// as having offered nothing.
fn improved(before: &Offers, now: &Offers) -> Vec<String> {
    let mut names: Vec<String> = now
        .iter()
        .filter(|(name, offer)| offer.improves_on(before.get(*name).unwrap_or(&Offer::NOTHING)))
        .map(|(name, _)| name.clone())
        .collect();
    names.sort();
    names
}

/// The baseline for the next tick: what was seen now, except that a node whose nudge failed
/// keeps what it offered before (or stays unseen), so it counts as improved again.
fn next_baseline(before: &Offers, mut now: Offers, failed: &[String]) -> Offers {
    for name in failed {
        match before.get(name) {
            Some(offer) => now.insert(name.clone(), offer.clone()),
            None => now.remove(name),
        };
    }
    now
}

/// Counts each node filter refused as a whole since the last tick as having offered nothing
/// then: it was refused after `last` saw it, so it may have been refused and usable again
/// between two ticks, and seen usable both times it would never count as improved.
fn forget_refused(last: &mut Offers, refused: impl IntoIterator<Item = String>) {
    for name in refused {
        last.insert(name, Offer::NOTHING);
    }
}

impl Extender {
    /// Remembers nodes filter refused as a whole, for the nudger's next tick.
    pub(super) fn note_refused_whole(&self, names: Vec<String>) {
        if !names.is_empty() && self.nudging.load(std::sync::atomic::Ordering::Relaxed) {
            self.refused_whole.lock().extend(names);
        }
    }

    /// The nodes refused as a whole since the last call.
    fn take_refused_whole(&self) -> std::collections::HashSet<String> {
        std::mem::take(&mut *self.refused_whole.lock())
    }

    /// What every node the index knows offers now.
    fn offers(&self) -> Offers {
        let now = self.now();
        self.index
            .all_slots()
            .iter()
            .map(|slot| {
                let st = slot.read();
                let offer = Offer {
                    usable: node_usable(&st.ledger, &self.fit, now).is_ok(),
                    free: st
                        .ledger
                        .gpus
                        .iter()
                        .map(peakfit_core::placement::GpuLedger::free_bytes)
                        .collect(),
                };
                (st.ledger.name.clone(), offer)
            })
            .collect()
    }

    /// Whether any pod waits after filter refused it everywhere (also one the Pod watch has not
    /// shown yet: `pending`), or (this extender's record lost in a restart or failover)
    /// kube-scheduler says a pod peakfit places is unschedulable.
    fn pods_wait(&self) -> bool {
        !self.pending_swept().is_empty() || self.index.any_pod_left_unschedulable()
    }
}

/// Runs the nudger every `every` until the process ends.
pub fn spawn(ext: Arc<Extender>, client: kube::Client, every: Duration) {
    ext.nudging
        .store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::spawn(async move {
        let nodes: Api<Node> = Api::all(client);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let mut last = Offers::new();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // Taken before the offers: a node refused after this is seen at the next tick.
            forget_refused(&mut last, ext.take_refused_whole());
            let now = ext.offers();
            let improved = improved(&last, &now);
            if improved.is_empty() || !ext.pods_wait() {
                // Pods refused from now on are refused against what is seen now.
                last = now;
                continue;
            }
            let at = jiff::Timestamp::now().to_string();
            let patch =
                serde_json::json!({ "metadata": { "annotations": { CAPACITY_CHANGED_AT: at } } });
            let (annotate, left_out) = to_annotate(improved);
            let mut failed = Vec::new();
            for name in &annotate {
                match nodes.patch(name, &params, &Patch::Merge(&patch)).await {
                    Ok(_) => {
                        ext.metrics.node_nudges.inc();
                        tracing::debug!(node = %name, "node can take waiting pods: nudged the scheduler");
                    }
                    Err(e) => {
                        tracing::warn!(node = %name, error = %e, "could not annotate the node to retry waiting pods; trying again next tick");
                        failed.push(name.clone());
                    }
                }
            }
            if failed.len() == annotate.len() {
                // Nothing moved the waiting pods: the nodes left out improved for them too.
                failed.extend(left_out);
            }
            last = next_baseline(&last, now, &failed);
        }
    });
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::{
        NUDGES_PER_TICK, Offer, Offers, forget_refused, improved, next_baseline, to_annotate,
    };
    use crate::cluster::binding::MemoryBinder;
    use crate::cluster::index::Index;
    use crate::cluster::test_support::{mk_node, mk_node_allocatable, mk_report};
    use crate::extender::Extender;
    use crate::inventory::PodResourcesStatus;
    use crate::metrics::extender::ExtenderMetrics;

    const GIB: u64 = 1 << 30;

    fn o(usable: bool, free: &[u64]) -> Offer {
        Offer {
            usable,
            free: free.to_vec(),
        }
    }

    #[test]
    fn more_free_memory_or_usable_again_is_an_improvement() {
        assert!(o(true, &[10, 5]).improves_on(&o(true, &[10, 4])));
        assert!(o(true, &[1]).improves_on(&o(false, &[1])));
        assert!(!o(true, &[10, 4]).improves_on(&o(true, &[10, 5])));
        assert!(!o(true, &[10]).improves_on(&o(true, &[10])));
        assert!(!o(false, &[20]).improves_on(&o(true, &[10])));
    }

    /// An extender whose index has node `mixed`: one 24 GiB GPU, a device plugin advertising
    /// `nvidia.com/gpu`, and a report whose agent reads `PodResources` (`up`) or cannot.
    fn mixed(ext: &Extender, up: bool) {
        ext.index
            .apply_node(&mk_node_allocatable("mixed", &[("nvidia.com/gpu", "1")]));
        let mut report = mk_report("mixed", &[("GPU-m", 24 * GIB, 0, &[])]);
        report.status.as_mut().unwrap().pod_resources = Some(PodResourcesStatus {
            up,
            reason: (!up).then(|| "permission denied".into()),
        });
        ext.index.apply_report(&report);
    }

    fn extender() -> Extender {
        Extender::new(
            Arc::new(Index::new()),
            Arc::new(ExtenderMetrics::new()),
            Arc::new(MemoryBinder::default()),
        )
        .with_fit(crate::placement::FitConfig {
            safety_margin_bytes: 0,
            max_report_age_secs: None,
        })
    }

    /// Issue 23: a node refused while its agent could not read `PodResources` counts as improved
    /// once it can, whether the nudger saw it refused or first sees it recovered (its first tick
    /// runs before the watches fill the index; the recovery came before its next).
    #[test]
    fn a_node_whose_pod_resources_are_read_again_is_improved_even_if_first_seen_so() {
        let ext = extender();
        let before_watches = ext.offers();
        assert!(before_watches.is_empty());
        mixed(&ext, false);
        let refused = ext.offers();
        assert_eq!(refused["mixed"], o(false, &[24 * GIB]));
        mixed(&ext, true);
        let read_again = ext.offers();
        assert_eq!(read_again["mixed"], o(true, &[24 * GIB]));

        assert_eq!(improved(&refused, &read_again), ["mixed"]);
        assert_eq!(improved(&before_watches, &read_again), ["mixed"]);
        assert!(improved(&read_again, &read_again).is_empty());
        assert!(improved(&before_watches, &refused).is_empty());
    }

    #[test]
    fn a_failed_nudge_keeps_the_old_baseline_so_the_next_tick_tries_again() {
        let before: Offers = HashMap::from([
            ("a".to_owned(), o(false, &[1])),
            ("b".to_owned(), o(false, &[1])),
        ]);
        let now: Offers = HashMap::from([
            ("a".to_owned(), o(true, &[1])),
            ("b".to_owned(), o(true, &[1])),
            ("c".to_owned(), o(true, &[1])),
        ]);
        let next = next_baseline(&before, now.clone(), &["b".to_owned(), "c".to_owned()]);
        assert_eq!(next["a"], now["a"]);
        assert_eq!(next["b"], before["b"]);
        assert!(!next.contains_key("c"));
        assert_eq!(improved(&next, &now), ["b", "c"]);
    }

    /// A tick annotates at most `NUDGES_PER_TICK` nodes, the first by name; fewer pass whole.
    #[test]
    fn a_tick_annotates_a_few_nodes_not_every_improved_one() {
        let names: Vec<String> = (0..20).map(|i| format!("n{i:02}")).collect();
        let (annotate, rest) = to_annotate(names.clone());
        assert_eq!(annotate, names[..NUDGES_PER_TICK]);
        assert_eq!(rest, names[NUDGES_PER_TICK..]);
        let (annotate, rest) = to_annotate(names[..3].to_vec());
        assert_eq!(annotate, names[..3]);
        assert!(rest.is_empty());
    }

    /// A node refused as a whole between two ticks that saw it usable both times is improved.
    #[test]
    fn a_node_refused_and_usable_again_within_a_tick_is_improved() {
        let usable = Offer {
            usable: true,
            free: vec![10 * GIB],
        };
        let mut last: Offers = [
            ("n1".to_owned(), usable.clone()),
            ("n2".to_owned(), usable.clone()),
        ]
        .into_iter()
        .collect();
        let now = last.clone();
        assert!(improved(&last, &now).is_empty());
        forget_refused(&mut last, ["n1".to_owned()]);
        assert_eq!(improved(&last, &now), ["n1"]);
    }

    /// Filter notes the nodes it refuses as a whole (here `PodResources` down on a mixed node),
    /// not those it refuses for this pod's size, and only while a nudger runs to take them.
    #[test]
    fn filter_notes_the_nodes_it_refused_as_a_whole() {
        let ext = extender();
        mixed(&ext, false);
        ext.index.apply_node(&mk_node("small"));
        let pod = crate::cluster::test_support::mk_pod("p0", None, &[("peakfit.io/vram", "20Gi")]);
        ext.index.apply_pod(&pod);
        let args = |pod| crate::extender::wire::ExtenderArgs {
            pod: Some(pod),
            nodes: None,
            node_names: Some(vec!["mixed".into(), "small".into()]),
        };
        // No nudger: nothing would ever take the notes, so none are kept.
        let _ = ext.filter(args(pod));
        assert!(ext.take_refused_whole().is_empty());
        ext.nudging
            .store(true, std::sync::atomic::Ordering::Relaxed);
        ext.index
            .apply_report(&mk_report("small", &[("GPU-s", 8 * GIB, 0, &[])]));
        let pod = crate::cluster::test_support::mk_pod("p1", None, &[("peakfit.io/vram", "20Gi")]);
        ext.index.apply_pod(&pod);
        assert!(ext.take_refused_whole().is_empty());
        let out = ext.filter(args(pod));
        assert_eq!(out.node_names.as_deref(), Some(&[] as &[String]));
        assert_eq!(
            ext.take_refused_whole(),
            ["mixed".to_owned()].into_iter().collect()
        );
        assert!(ext.take_refused_whole().is_empty(), "taken once");
    }

    /// Issue 23: filter's own record of a refusal makes pods wait before the Pod watch shows
    /// the pod (a tick landing between the refusal and the watch event used to drop it), and
    /// the record goes once the pod binds, or is deleted after the index showed it.
    #[test]
    fn a_refusal_counts_before_the_watch_shows_the_pod_until_it_binds_or_goes() {
        let ext = extender();
        ext.index
            .apply_report(&mk_report("small", &[("GPU-s", 8 * GIB, 0, &[])]));
        let refuse = |uid: &str| {
            let pod =
                crate::cluster::test_support::mk_pod(uid, None, &[("peakfit.io/vram", "20Gi")]);
            let out = ext.filter(crate::extender::wire::ExtenderArgs {
                pod: Some(pod.clone()),
                nodes: None,
                node_names: Some(vec!["small".into()]),
            });
            assert_eq!(out.node_names.as_deref(), Some(&[] as &[String]));
            pod
        };
        for gone_by in ["binding", "deletion"] {
            let pod = refuse(gone_by);
            assert!(
                ext.index.find_pod(gone_by, "", "").is_none(),
                "the watch has not shown it"
            );
            assert!(
                ext.pods_wait(),
                "{gone_by}: waits before the watch shows it"
            );
            ext.index.apply_pod(&pod);
            assert!(ext.pods_wait(), "{gone_by}: waits once shown");
            if gone_by == "binding" {
                let mut bound = pod.clone();
                bound.spec.as_mut().unwrap().node_name = Some("small".into());
                ext.index.apply_pod(&bound);
                assert!(!ext.pods_wait(), "bound: no longer waits");
                ext.index.delete_pod(&bound);
            } else {
                ext.index.delete_pod(&pod);
                assert!(!ext.pods_wait(), "deleted: no longer waits");
            }
        }
    }

    /// After a restart the extender's record of refused pods is empty; a pod kube-scheduler
    /// marked unschedulable still makes pods wait, and only a pod peakfit places, unbound.
    #[test]
    fn a_pod_the_scheduler_left_unschedulable_waits_after_a_restart() {
        use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
        let ext = extender();
        let mut pod =
            crate::cluster::test_support::mk_pod("w1", None, &[("peakfit.io/vram", "20Gi")]);
        ext.index.apply_pod(&pod);
        assert!(!ext.pods_wait(), "pending, not yet marked");
        pod.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        ext.index.apply_pod(&pod);
        assert!(ext.pods_wait());
        let mut foreign = pod.clone();
        foreign.metadata.uid = Some("f1".into());
        foreign.metadata.name = Some("f1".into());
        foreign.metadata.annotations = None;
        ext.index.delete_pod(&pod);
        ext.index.apply_pod(&foreign);
        assert!(!ext.pods_wait(), "not a pod peakfit places");
    }
}
