//! Filter: which of the candidate nodes have GPUs that hold the pod's peak, and in words an ML
//! engineer understands why the others do not.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::Extender;
use super::prioritize::NodeScoring;
use super::wire::{ExtenderArgs, ExtenderFilterResult, NodeList};
use crate::cluster::index::{NodeState, pod_key, soft_preference};
use crate::cluster::resources::host_request_of;
use crate::metrics::extender::{DecisionLabels, PreferenceLabels, ReasonLabels, ScoreSourceLabels};
use crate::placement::fit::{check_class, need_on, node_usable};
use crate::placement::{FitConfig, NodeLedger, PodShape, Rejection};

/// The candidate nodes of a request, in whichever mode the scheduler uses.
pub enum Candidates {
    /// `nodeCacheCapable: true`: names only.
    Names(Vec<String>),
    /// `nodeCacheCapable: false`: whole nodes, echoed back unmodified.
    Nodes(NodeList),
}

impl Candidates {
    pub fn from_args(args: ExtenderArgs) -> Result<(Pod, Self), String> {
        let pod = args
            .pod
            .ok_or("the request has no Pod (field `Pod` is null or missing)")?;
        super::record_pod(&pod);
        let c = match (args.node_names, args.nodes) {
            (Some(names), _) => Self::Names(names),
            (None, Some(nodes)) => Self::Nodes(nodes),
            (None, None) => {
                return Err("the request has neither `NodeNames` nor `Nodes`".into());
            }
        };
        Ok((pod, c))
    }

    pub fn names(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        match self {
            Self::Names(n) => Box::new(n.iter().map(String::as_str)),
            Self::Nodes(list) => Box::new(list.items.iter().map(|n| n.name.as_str())),
        }
    }

    /// The names, owned: moved out in node-cache mode rather than copied, since a reply
    /// naming every candidate would otherwise allocate each name again.
    pub fn into_names(self) -> Vec<String> {
        match self {
            Self::Names(n) => n,
            Self::Nodes(list) => list.items.into_iter().map(|n| n.name).collect(),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Self::Names(n) => n.len(),
            Self::Nodes(list) => list.items.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps the candidates `keep` says yes to, in the reply field of the request's mode.
    fn into_result(self, keep: &[bool]) -> ExtenderFilterResult {
        match self {
            Self::Names(names) => ExtenderFilterResult {
                node_names: Some(
                    names
                        .into_iter()
                        .zip(keep)
                        .filter_map(|(n, &k)| k.then_some(n))
                        .collect(),
                ),
                ..Default::default()
            },
            Self::Nodes(list) => ExtenderFilterResult {
                nodes: Some(NodeList {
                    metadata: list.metadata,
                    items: list
                        .items
                        .into_iter()
                        .zip(keep)
                        .filter_map(|(n, &k)| k.then_some(n))
                        .collect(),
                }),
                ..Default::default()
            },
        }
    }
}

/// Why filter refused one node, decided and worded on a worker thread.
struct Refusal {
    reason: &'static str,
    resolvable: bool,
    /// The node takes no pod now, whatever its size (`Rejection::is_node_wide`).
    node_wide: bool,
    words: String,
}

/// Whether evicting pods could ever make room: false when the node lacks the GPUs, its report
/// is missing or stale, or its GPUs are too small even with every pod gone (memory of no pod
/// with a reservation there, and the driver's share, cannot be evicted).
pub fn resolvable_by_preemption(
    ledger: &NodeLedger,
    shape: &PodShape,
    cfg: &FitConfig,
    r: &Rejection,
) -> bool {
    match r {
        Rejection::NotEnoughMemory { .. } => {
            let could = ledger
                .gpus
                .iter()
                .filter(|g| {
                    let (_, need) = need_on(&shape.demand, g, cfg.safety_margin_bytes);
                    shape.demand.runs_in(g.room(cfg.safety_margin_bytes))
                        && g.room_without_pods() >= need
                })
                .count();
            crate::convert::usize_to_u32(could) >= shape.gpus.max(1)
        }
        Rejection::NotEnoughCpu { .. } => true,
        Rejection::NoReport
        | Rejection::StaleReport { .. }
        | Rejection::NvmlDown { .. }
        | Rejection::PodResourcesDown { .. }
        | Rejection::TooFewGpus { .. }
        | Rejection::GpuTooSmall { .. } => false,
    }
}

/// The words naming the node's GPUs that the kubelet gave to pods peakfit did not place ("GPU 3
/// (GPU-…) is held by ml/trainer-0 through nvidia.com/gpu"), for a refusal about GPUs or memory,
/// and whether the pod would fit but for them (`fits`: the fit on the node with the holders
/// gone), which makes the reason `gpu_held`. `None` when no GPU of the node is held. Per node,
/// outside the per-state memo: nodes in one state can have different holders.
fn held_words(
    ledger: &NodeLedger,
    r: &Rejection,
    figures: bool,
    fits: impl Fn(&NodeLedger) -> bool,
) -> Option<(String, bool)> {
    if !matches!(
        r,
        Rejection::NotEnoughMemory { .. } | Rejection::TooFewGpus { .. }
    ) {
        return None;
    }
    let held: Vec<String> = ledger
        .gpus
        .iter()
        .filter_map(|g| g.granted().map(|grant| grant.describe(&g.uuid)))
        .collect();
    if held.is_empty() {
        return None;
    }
    let mut freed = ledger.clone();
    for g in &mut freed.gpus {
        g.set_granted(None);
    }
    // Among many nodes, the holders' names would make one message entry per node
    // (`NODE_FIGURES_UP_TO`); the node's `peakfit_ledger_gpu_held` says which.
    let who = if figures {
        held.join("; ")
    } else {
        "GPUs here are held by pods peakfit did not place".to_owned()
    };
    Some((
        format!("{who} (peakfit shares no GPU the kubelet gave to a pod it did not place)"),
        fits(&freed),
    ))
}

/// Up to this many candidate nodes, a refusal names the node's own figures (its best free
/// GPU's memory, its free CPU); beyond, the words every node of the same shape refusing for the
/// same cause shares (`Rejection::grouped_words`). kube-scheduler's `FitError` message, which
/// becomes the pod's `PodScheduled` condition and its `FailedScheduling` event, lists each
/// distinct reason once with its count of nodes: with per-node figures a 1,000-node cluster
/// gave ~420 entries, rewritten into the pod's status on every retry, which the operator cannot
/// read and which cost kube-scheduler's throughput under contention (README, "One node: the
/// default": at 1,000 nodes b/a 0.75-0.90, median 0.79, with them; 0.88-0.99 with a static
/// word per cause in a trial, 0.95 and 0.95 with these; kube-scheduler retried fewer pods).
/// Sixteen entries still read as a list. A hold's words still name its pod: holds are few
/// (`--reserve-max`).
pub const NODE_FIGURES_UP_TO: usize = 16;

impl Extender {
    #[tracing::instrument(skip_all, fields(verb = "filter", pod))]
    pub fn filter(&self, args: ExtenderArgs) -> ExtenderFilterResult {
        let (pod, candidates) = match Candidates::from_args(args) {
            Ok(x) => x,
            Err(e) => {
                self.count("filter", "error");
                return ExtenderFilterResult {
                    error: e,
                    ..Default::default()
                };
            }
        };
        let key = pod_key(&pod);
        let n = candidates.len();
        let mut failed = BTreeMap::new();
        let mut unresolvable = BTreeMap::new();
        let keep: Vec<bool> = match self.index.request_of(&pod) {
            Ok(None) => {
                self.count("filter", "pass_through");
                let mut r = candidates.into_result(&vec![true; n]);
                r.failed_nodes = Some(failed);
                r.failed_and_unresolvable_nodes = Some(unresolvable);
                return r;
            }
            Err(e) => {
                // The same for every node: said once, on the first candidate, and the others
                // left out of the reply. kube-scheduler (v1.36) gives a node the extender drops
                // without a word its absent-node status, UnschedulableAndUnresolvable with no
                // message, as this entry says: preemption skips them all and the pod's event
                // reads "0/N nodes are available: 1 <this reason>". N copies of a reason
                // quoting a 256 KiB annotation were a 1.31 GB reply at 5,000 nodes (issue 24);
                // the index already cut the value (`clip::annotation_error`).
                if let Some(first) = candidates.names().next() {
                    unresolvable.insert(
                        first.to_owned(),
                        format!(
                            "{e} (fix the pod's annotation; no node can take it as is: this \
                             holds for all {n} candidate nodes, named once)"
                        ),
                    );
                }
                self.metrics
                    .rejections
                    .get_or_create(&ReasonLabels {
                        reason: "invalid_annotation",
                    })
                    .inc_by(n as u64);
                self.set_pending(&key, Some("invalid_annotation"), Vec::new());
                vec![false; n]
            }
            Ok(Some(req)) => {
                let sizing = self.sized_pod(&req, &pod);
                let note = sizing.note;
                let req = sizing.request;
                if let Some(n) = &note {
                    tracing::debug!(sizing = %n, "sized from the workload's profile");
                }
                let shape = req.shape();
                let class = self.class_of(&req, &host_request_of(&pod));
                self.learn(&key, &class);
                let class_id = self.class_ids.lock().id(&class);
                let now = self.now();
                let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
                let names: Vec<&str> = candidates.names().collect();
                // A usable node's verdict and words depend only on its state (what scoring
                // reads, `placement::signature`) and the class: worked out once per state and
                // class, kept with the state for the next requests (`index::Verdicts`). Whether
                // the node is usable now moves with the clock, so that is checked for each node,
                // and a verdict that says it is not (the clock moved in between) is not kept.
                // A pod sized from its workload's profile says so in every refusal: the number
                // refused is not the one its annotations predict.
                let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
                // The node's own words (`known`: from the memo) only where they are used.
                let figures = names.len() <= NODE_FIGURES_UP_TO;
                let refusal =
                    |st: &NodeState, ledger: &NodeLedger, r: &Rejection, known: Option<&str>| {
                        let words = if figures {
                            known.map_or_else(|| r.to_string(), str::to_owned)
                        } else {
                            r.grouped_words()
                        };
                        let fits = |l: &NodeLedger| check_class(l, &class, &self.fit, now).is_ok();
                        let held = held_words(ledger, r, figures, fits);
                        let kept =
                            super::holds::hold_words(st, ledger, (&key, priority), r, now, fits);
                        let words = match held.as_ref() {
                            Some((h, _)) => format!("{words}; {h}"),
                            None => words,
                        };
                        let words = match kept.as_ref() {
                            Some((h, _)) => format!("{words}; {h}"),
                            None => words,
                        };
                        Refusal {
                            reason: if held.as_ref().is_some_and(|h| h.1) {
                                "gpu_held"
                            } else if kept.as_ref().is_some_and(|h| h.1) {
                                "held_for_pod"
                            } else {
                                r.reason()
                            },
                            resolvable: resolvable_by_preemption(ledger, &shape, &self.fit, r),
                            node_wide: r.is_node_wide(),
                            words: match &note {
                                Some(n) => format!("{words} ({n})"),
                                None => words,
                            },
                        }
                    };
                // Outer `None`: the index does not know the node; inner: it fits. The words
                // are written here, in parallel: for thousands of refused nodes they cost more
                // than the decisions.
                let verdicts: Vec<Option<Option<Refusal>>> = self.index.map_slots(&names, |slot| {
                    let st = slot?.read();
                    if let Err(r) = node_usable(&st.ledger, &self.fit, now) {
                        return Some(Some(refusal(&st, &st.ledger, &r, None)));
                    }
                    // Holds that do not bind this pod (its own, lower priority, past their
                    // deadline) make its view of the node its own: decided without the memo.
                    let view = st.seen_by(Some(&key), priority, now);
                    if let Cow::Owned(own) = &view {
                        return Some(
                            check_class(own, &class, &self.fit, now)
                                .err()
                                .map(|r| refusal(&st, own, &r, None)),
                        );
                    }
                    let known = st.scores().verdict.lock().get(class_id).cloned();
                    let verdict = known.unwrap_or_else(|| {
                        let v = check_class(&st.ledger, &class, &self.fit, now)
                            .err()
                            .map(|r| {
                                let words = r.to_string();
                                Arc::new((r, words))
                            });
                        // The node was usable a moment ago; a verdict that says it no longer
                        // is belongs to this instant, not to the state.
                        if !v.as_ref().is_some_and(|v| v.0.is_node_wide()) {
                            // Two threads may work one state out at once; both get the same.
                            st.scores().verdict.lock().put(class_id, v.clone());
                        }
                        v
                    });
                    Some(verdict.map(|v| refusal(&st, &st.ledger, &v.0, Some(&v.1))))
                });
                let (mut resolvable, mut not_resolvable) = (Vec::new(), Vec::new());
                let mut refused_whole = Vec::new();
                let keep: Vec<bool> = names
                    .iter()
                    .zip(verdicts)
                    .map(|(name, verdict)| {
                        let Some(verdict) = verdict else {
                            *counts.entry("no_report").or_default() += 1;
                            not_resolvable.push((
                                (*name).to_owned(),
                                "peakfit knows nothing of this node yet: no GPU report from \
                                 the peakfit agent (is the agent running there?)"
                                    .to_owned(),
                            ));
                            return false;
                        };
                        match verdict {
                            None => true,
                            Some(refusal) => {
                                *counts.entry(refusal.reason).or_default() += 1;
                                if refusal.node_wide {
                                    refused_whole.push((*name).to_owned());
                                }
                                let list = if refusal.resolvable {
                                    &mut resolvable
                                } else {
                                    &mut not_resolvable
                                };
                                list.push(((*name).to_owned(), refusal.words));
                                false
                            }
                        }
                    })
                    .collect();
                self.note_refused_whole(refused_whole);
                let preemptible: Vec<String> = resolvable
                    .iter()
                    .take(super::PREEMPTIBLE_NODES_KEPT)
                    .map(|(n, _)| n.clone())
                    .collect();
                // Built in bulk (sorted, then filled), not one insertion at a time.
                failed = resolvable.into_iter().collect();
                unresolvable = not_resolvable.into_iter().collect();
                for (reason, c) in &counts {
                    self.metrics
                        .rejections
                        .get_or_create(&ReasonLabels { reason })
                        .inc_by(*c);
                }
                let top = counts.iter().max_by_key(|(_, c)| **c).map(|(r, _)| *r);
                let none_fits = !keep.iter().any(|&k| k);
                self.set_pending(&key, if none_fits { top } else { None }, preemptible);
                if none_fits {
                    self.maybe_hold(&pod, &key, &class, &names, now);
                }
                let mut keep = keep;
                let mix = self.mix();
                let scoring = NodeScoring::request(
                    &class,
                    class_id,
                    &mix,
                    now,
                    Some((key.clone(), priority)),
                );
                self.keep_best(&pod, &names, &mut keep, &scoring);
                keep
            }
        };
        let outcome = if keep.iter().any(|&k| k) {
            "fits"
        } else {
            "fits_nowhere"
        };
        self.count("filter", outcome);
        let mut result = candidates.into_result(&keep);
        result.failed_nodes = Some(failed);
        result.failed_and_unresolvable_nodes = Some(unresolvable);
        result
    }

    /// With `--filter-keep-best N`, leaves only the `N` fitting nodes prioritize would score
    /// highest in `keep` (`Extender::best_first`'s order). kube-scheduler's scheduling cycle is
    /// serial, and after filter it runs its own score plugins on every node left, sends them
    /// all to prioritize and reads a score for each back: on 1,000 nodes that is ~420 nodes per
    /// pod (`numFeasibleNodesToFind`: 50 - 1,000/125 = 42 % of the nodes), most of them
    /// ones peakfit ranks far below its best. The dropped nodes are named in neither
    /// `NodeNames` nor `FailedNodes`: kube-scheduler (v1.36, `findNodesThatPassExtenders`) gives
    /// them no status, and since at least `N` nodes pass, the pod goes on to scoring and no
    /// `FailedScheduling` event, preemption or wait is affected (where peakfit is the last
    /// extender that filters: kube-scheduler feeds each the nodes the one before passed, and a
    /// later one refusing the `N` refuses the pod). A pod that fits nowhere is
    /// never cut (nothing changes then). The scores computed here stay in the nodes' memos, so
    /// prioritize then answers the `N` from memory.
    ///
    /// Nor is a pod with a preference kube-scheduler's score plugins weigh
    /// (`index::soft_preference`): a preferred node affinity term, for one, adds up to 200 of
    /// the `NodeAffinity` plugin to its node's total, and peakfit's own ranking of the `N`
    /// knows nothing of it, so the pod keeps every fitting node and kube-scheduler decides
    /// between them as with the flag off (`peakfit_extender_filter_keep_best_skipped_total`).
    fn keep_best(&self, pod: &Pod, names: &[&str], keep: &mut [bool], scoring: &NodeScoring) {
        let n = self.filter_keep_best;
        let fitting: Vec<usize> = (0..keep.len()).filter(|&i| keep[i]).collect();
        if n == 0 || fitting.len() <= n {
            return;
        }
        if let Some(preference) = soft_preference(pod) {
            self.metrics
                .filter_keep_best_skipped
                .get_or_create(&PreferenceLabels {
                    preference: preference.label(),
                })
                .inc();
            return;
        }
        let fitting_names: Vec<&str> = fitting.iter().map(|&i| names[i]).collect();
        let ranking = self.rank(&fitting_names, scoring, false);
        for &dropped in &self.best_first(&fitting_names, &ranking)[n..] {
            keep[fitting[dropped]] = false;
        }
        self.metrics
            .filter_ranked_out
            .inc_by((fitting.len() - n) as u64);
    }

    pub(crate) fn count_scores(&self, source: &'static str, n: u64) {
        if n > 0 {
            self.metrics
                .node_scores
                .get_or_create(&ScoreSourceLabels { source })
                .inc_by(n);
        }
    }

    pub(crate) fn count(&self, verb: &'static str, outcome: &'static str) {
        self.metrics
            .decisions
            .get_or_create(&DecisionLabels { verb, outcome })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::DeviceHolder;
    use crate::placement::{GpuLedger, Grant};

    const GI: u64 = 1 << 30;

    fn rejection() -> Rejection {
        Rejection::NotEnoughMemory {
            needed_per_gpu_bytes: GI,
            margin_bytes: 0,
            needed_gpus: 1,
            fitting_gpus: 0,
            gpus: 2,
            best_free_bytes: 0,
            best_gpu_total_bytes: GI,
        }
    }

    /// Filter keeps each state's verdict across requests: a node whose ledger changed is in
    /// another state and is decided again (a cache keyed by class alone would refuse the second
    /// pod with the first one's numbers, or let it onto a GPU filled since), and two nodes
    /// in one state share the words.
    #[test]
    fn a_changed_node_is_decided_again_not_served_the_last_verdict() {
        use crate::cluster::binding::MemoryBinder;
        use crate::cluster::index::Index;
        use crate::cluster::test_support::{mk_node, mk_pod, mk_report};
        use crate::extender::wire::ExtenderArgs;
        use crate::metrics::extender::ExtenderMetrics;

        let index = Arc::new(Index::new());
        let report = |node: &str, used: u64| {
            index.apply_report(&mk_report(
                node,
                &[("GPU-".to_owned() + node).as_str()]
                    .map(|u| (u, 80 * GI, used * GI, &[] as &[(&str, u64)])),
            ));
        };
        for n in ["a", "b"] {
            index.apply_node(&mk_node(n));
            report(n, 50);
        }
        let ext = Extender::new(
            index.clone(),
            Arc::new(ExtenderMetrics::new()),
            Arc::new(MemoryBinder::default()),
        );
        let filter = |uid: &str| {
            let pod = mk_pod(uid, None, &[("peakfit.io/vram", "40Gi")]);
            ext.index.apply_pod(&pod);
            ext.filter(ExtenderArgs {
                pod: Some(pod),
                nodes: None,
                node_names: Some(vec!["a".into(), "b".into()]),
            })
        };
        let refused = |r: &ExtenderFilterResult, node: &str| {
            r.failed_nodes
                .iter()
                .chain(&r.failed_and_unresolvable_nodes)
                .find_map(|m| m.get(node).cloned())
        };
        let first = filter("p1");
        assert_eq!(first.node_names.as_deref(), Some(&[] as &[String]));
        let words = refused(&first, "a").unwrap();
        assert!(words.contains("has 30.0 GiB free"), "{words}");
        assert_eq!(refused(&first, "b").as_ref(), Some(&words));
        // Node a frees memory, node b fills further: the same class asks again.
        report("a", 10);
        report("b", 60);
        let second = filter("p2");
        assert_eq!(second.node_names.as_deref(), Some(&["a".to_owned()][..]));
        let words_b = refused(&second, "b").unwrap();
        assert!(words_b.contains("has 20.0 GiB free"), "{words_b}");
        assert_ne!(words_b, words);
        // And back: a verdict kept for the old state is right again, word for word.
        report("b", 50);
        assert_eq!(refused(&filter("p3"), "b"), Some(words));
    }

    /// Held GPUs are named for refusals about GPUs or memory only, and make the reason
    /// `gpu_held` only when the pod would fit with the holders gone.
    #[test]
    fn held_gpus_are_named_and_decide_the_reason_only_when_they_are_why() {
        let mut node = NodeLedger::with_gpus(
            "n",
            vec![
                GpuLedger::new("GPU-a", 24 * GI),
                GpuLedger::new("GPU-b", 24 * GI),
            ],
        );
        assert_eq!(held_words(&node, &rejection(), true, |_| true), None);
        node.gpus[1].set_granted(Some(Grant {
            index: 1,
            holders: vec![DeviceHolder {
                namespace: "ml".into(),
                pod_name: "trainer-0".into(),
                resource: "nvidia.com/gpu".into(),
                ..Default::default()
            }],
        }));
        let fits_freed = |l: &NodeLedger| l.gpus.iter().all(|g| g.free_bytes() == 24 * GI);
        let (words, why) = held_words(&node, &rejection(), true, fits_freed).unwrap();
        assert!(
            words.starts_with("GPU 1 (GPU-b) is held by ml/trainer-0 through nvidia.com/gpu"),
            "{words}"
        );
        assert!(why);
        let (_, why) = held_words(&node, &rejection(), true, |_| false).unwrap();
        assert!(!why);
        // Among many nodes: no holder named, so every such node reads alike.
        let (words, why) = held_words(&node, &rejection(), false, fits_freed).unwrap();
        assert_eq!(
            words,
            "GPUs here are held by pods peakfit did not place (peakfit shares no GPU the \
             kubelet gave to a pod it did not place)"
        );
        assert!(why);
        assert_eq!(
            held_words(&node, &Rejection::NoReport, true, |_| true),
            None,
            "a node-wide refusal is not about GPUs"
        );
    }

    /// Fifteen nodes with one 80 GiB GPU each, filled 0-60 GiB in steps of 5 (thirteen nodes a
    /// 10 GiB pod fits), then 75 and 78 GiB; and an extender over them with `--filter-keep-best`.
    fn keep_best_cluster() -> (
        Arc<crate::cluster::index::Index>,
        Vec<String>,
        impl Fn(usize) -> Extender,
    ) {
        use crate::cluster::binding::MemoryBinder;
        use crate::cluster::index::Index;
        use crate::cluster::test_support::{mk_node, mk_report};
        use crate::metrics::extender::ExtenderMetrics;

        let index = Arc::new(Index::new());
        let mut names = Vec::new();
        for (i, used) in (0..=60).step_by(5).chain([75, 78]).enumerate() {
            let node = format!("n{i:02}");
            index.apply_node(&mk_node(&node));
            index.apply_report(&mk_report(
                &node,
                &[(
                    format!("GPU-{node}").as_str(),
                    80 * GI,
                    used * GI,
                    &[] as &[(&str, u64)],
                )],
            ));
            names.push(node);
        }
        let ext_index = index.clone();
        let ext = move |keep: usize| {
            Extender::new(
                ext_index.clone(),
                Arc::new(ExtenderMetrics::new()),
                Arc::new(MemoryBinder::default()),
            )
            .with_filter_keep_best(keep)
        };
        (index, names, ext)
    }

    /// `--filter-keep-best N`: filter answers with the `N` fitting nodes prioritize scores
    /// highest, names the dropped ones in no failed list (kube-scheduler then gives them no
    /// status: they are not refusals), keeps its words for the nodes it refuses, and cuts the
    /// same nodes whatever order the candidates come in. A pod that fits nowhere is answered
    /// as without the flag.
    #[test]
    fn keep_best_answers_with_the_nodes_prioritize_ranks_highest() {
        use crate::cluster::test_support::mk_pod;
        use crate::extender::wire::ExtenderArgs;

        // Thirteen nodes the pod fits, filled 0-60 GiB of 80, and two it does not.
        let (index, names, ext) = keep_best_cluster();
        let args = |uid: &str, vram: &str, names: &[String]| {
            let pod = mk_pod(uid, None, &[("peakfit.io/vram", vram)]);
            index.apply_pod(&pod);
            ExtenderArgs {
                pod: Some(pod),
                nodes: None,
                node_names: Some(names.to_vec()),
            }
        };
        let failed = |r: &ExtenderFilterResult| {
            let mut f: Vec<String> = r
                .failed_nodes
                .iter()
                .chain(&r.failed_and_unresolvable_nodes)
                .flat_map(|m| m.keys().cloned())
                .collect();
            f.sort();
            f
        };

        // Off: every node that fits, and prioritize's scores over them.
        let off = ext(0);
        let all = off.filter(args("p0", "10Gi", &names));
        let fitting = all.node_names.clone().unwrap();
        assert_eq!(fitting.len(), 13);
        assert_eq!(failed(&all), ["n13", "n14"]);
        let scores = off.prioritize(args("p0", "10Gi", &fitting));
        let score = |n: &str| scores.iter().find(|h| h.host == n).unwrap().score;

        let e = ext(3);
        let best = e.filter(args("p1", "10Gi", &names));
        let kept = best.node_names.clone().unwrap();
        assert_eq!(kept.len(), 3, "{kept:?}");
        // The refused nodes keep their words; the ranked-out ones are in no list.
        assert_eq!(failed(&best), ["n13", "n14"]);
        assert_eq!(
            best.failed_nodes.as_ref().unwrap().get("n13"),
            all.failed_nodes.as_ref().unwrap().get("n13")
        );
        // The kept nodes are prioritize's best: the one it gives 10, and none below a dropped one.
        let top = scores.iter().find(|h| h.score == 10).unwrap();
        assert!(kept.contains(&top.host), "{kept:?} lacks {}", top.host);
        let worst_kept = kept.iter().map(|n| score(n)).min().unwrap();
        for n in fitting.iter().filter(|n| !kept.contains(n)) {
            assert!(score(n) <= worst_kept, "{n} ({}) dropped", score(n));
        }
        assert_eq!(e.metrics.filter_ranked_out.get(), 10);
        // Prioritize, then called with the kept nodes, still gives the best its 10.
        let on_kept = e.prioritize(args("p1", "10Gi", &kept));
        assert_eq!(
            on_kept.iter().find(|h| h.score == 10).map(|h| &h.host),
            Some(&top.host)
        );
        // The same cut whatever order kube-scheduler lists the candidates in.
        let reversed: Vec<String> = names.iter().rev().cloned().collect();
        let mut again = e.filter(args("p2", "10Gi", &reversed)).node_names.unwrap();
        let mut sorted = kept.clone();
        again.sort();
        sorted.sort();
        assert_eq!(again, sorted);

        // Exactly N fit: nothing is cut.
        let few = e.filter(args("p3", "66Gi", &names));
        assert_eq!(few.node_names.as_ref().map(Vec::len), Some(3), "{few:?}");
        // None fits: the same answer as without the flag, every node refused with its words.
        let none = e.filter(args("p4", "81Gi", &names));
        let none_off = off.filter(args("p4", "81Gi", &names));
        assert_eq!(none.node_names.as_deref(), Some(&[] as &[String]));
        assert_eq!(none.failed_nodes, none_off.failed_nodes);
        assert_eq!(
            none.failed_and_unresolvable_nodes,
            none_off.failed_and_unresolvable_nodes
        );
        assert_eq!(failed(&none).len(), 15);
    }

    /// A pod with a preferred node affinity term gets every node it fits, whatever
    /// `--filter-keep-best` says: kube-scheduler's `NodeAffinity` score must see the node the
    /// pod prefers even where peakfit ranks it below the best `N`. The same pod without the
    /// term gets `N`, and so does one whose affinity is required only (a filter, already
    /// applied to the candidates). The skip is counted by what the pod prefers.
    #[test]
    fn keep_best_passes_every_fitting_node_to_a_pod_that_prefers_one() {
        use crate::cluster::test_support::mk_pod;
        use crate::extender::wire::ExtenderArgs;
        use k8s_openapi::api::core::v1::NodeSelectorRequirement;
        use k8s_openapi::api::core::v1::{Affinity, NodeAffinity, NodeSelector};
        use k8s_openapi::api::core::v1::{NodeSelectorTerm, PreferredSchedulingTerm};

        let (index, names, ext) = keep_best_cluster();
        let e = ext(3);
        // The emptiest node, the one peakfit ranks last.
        let term = NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: "kubernetes.io/hostname".into(),
                operator: "In".into(),
                values: Some(vec!["n00".into()]),
            }]),
            ..Default::default()
        };
        let filter = |uid: &str, affinity: Option<NodeAffinity>| {
            let mut pod = mk_pod(uid, None, &[("peakfit.io/vram", "10Gi")]);
            pod.spec.as_mut().unwrap().affinity = affinity.map(|a| Affinity {
                node_affinity: Some(a),
                ..Default::default()
            });
            index.apply_pod(&pod);
            e.filter(ExtenderArgs {
                pod: Some(pod),
                nodes: None,
                node_names: Some(names.clone()),
            })
            .node_names
            .unwrap()
        };
        let preferred = NodeAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                PreferredSchedulingTerm {
                    weight: 100,
                    preference: term.clone(),
                },
            ]),
            ..Default::default()
        };
        let all = filter("prefers", Some(preferred));
        assert_eq!(all.len(), 13, "{all:?}");
        assert!(all.contains(&"n00".to_owned()));
        let skipped = |label: &'static str| {
            e.metrics
                .filter_keep_best_skipped
                .get_or_create(&PreferenceLabels { preference: label })
                .get()
        };
        assert_eq!(skipped("node_affinity"), 1);
        assert_eq!(e.metrics.filter_ranked_out.get(), 0);

        let cut = filter("plain", None);
        assert_eq!(cut.len(), 3, "{cut:?}");
        assert!(!cut.contains(&"n00".to_owned()), "{cut:?}");
        let required = NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![term],
            }),
            ..Default::default()
        };
        assert_eq!(filter("requires", Some(required)), cut);
        assert_eq!(skipped("node_affinity"), 1);
        assert_eq!(e.metrics.filter_ranked_out.get(), 20);
    }

    /// The default, `--filter-keep-best 1`: filter answers with the one node prioritize would
    /// give 10, so kube-scheduler, with one feasible node, takes it without scoring
    /// (`schedulePod`: "When only one node after predicate, just use it") and never calls
    /// prioritize; with the chart's profile that is the node its scores would have chosen
    /// for a pod no other score plugin weighs. A `ReplicaSet`'s pod, which kube-scheduler's
    /// system default spread weighs, gets every node it fits, and the skip is counted.
    #[test]
    fn keep_best_one_answers_prioritizes_top_node_and_spares_a_replica() {
        use crate::cluster::test_support::mk_pod;
        use crate::extender::wire::ExtenderArgs;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

        assert_eq!(super::super::DEFAULT_FILTER_KEEP_BEST, 1);
        let (index, names, ext) = keep_best_cluster();
        let e = ext(super::super::DEFAULT_FILTER_KEEP_BEST);
        let args = |uid: &str, owner: Option<&str>, names: &[String]| {
            let mut pod = mk_pod(uid, None, &[("peakfit.io/vram", "10Gi")]);
            pod.metadata.owner_references = owner.map(|kind| {
                vec![OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: kind.into(),
                    name: "chat-7d9f".into(),
                    uid: "rs-1".into(),
                    controller: Some(true),
                    ..Default::default()
                }]
            });
            index.apply_pod(&pod);
            ExtenderArgs {
                pod: Some(pod),
                nodes: None,
                node_names: Some(names.to_vec()),
            }
        };
        let one = e.filter(args("p1", None, &names)).node_names.unwrap();
        // What prioritize would have answered over every fitting node (n00-n12).
        let scores = e.prioritize(args("p1", None, &names[..13]));
        let top = &scores.iter().find(|h| h.score == 10).unwrap().host;
        assert_eq!(&one, std::slice::from_ref(top));
        // A Job's pod is not spread by default: cut like a bare one.
        let job = e
            .filter(args("p2", Some("Job"), &names))
            .node_names
            .unwrap();
        assert_eq!(&job, std::slice::from_ref(top));
        let replica = e
            .filter(args("p3", Some("ReplicaSet"), &names))
            .node_names
            .unwrap();
        assert_eq!(replica.len(), 13, "{replica:?}");
        assert_eq!(
            e.metrics
                .filter_keep_best_skipped
                .get_or_create(&PreferenceLabels {
                    preference: "default_spread"
                })
                .get(),
            1
        );
    }

    /// Over more than `NODE_FIGURES_UP_TO` candidates, nodes of one shape that refuse a pod for
    /// the same cause give the same words, so kube-scheduler's message has one entry for them
    /// (with their count) instead of one per node; over a few, each names its own figures.
    #[test]
    fn refusals_among_many_nodes_share_their_words() {
        use crate::cluster::binding::MemoryBinder;
        use crate::cluster::index::Index;
        use crate::cluster::test_support::{mk_node, mk_pod, mk_report};
        use crate::extender::wire::ExtenderArgs;
        use crate::metrics::extender::ExtenderMetrics;

        let index = Arc::new(Index::new());
        let names: Vec<String> = (0..20).map(|i| format!("n{i:02}")).collect();
        for (i, node) in names.iter().enumerate() {
            index.apply_node(&mk_node(node));
            let used = 20 + i as u64;
            index.apply_report(&mk_report(
                node,
                &[(
                    format!("GPU-{node}").as_str(),
                    80 * GI,
                    used * GI,
                    &[] as &[(&str, u64)],
                )],
            ));
        }
        let e = Extender::new(
            index.clone(),
            Arc::new(ExtenderMetrics::new()),
            Arc::new(MemoryBinder::default()),
        );
        let pod = mk_pod("p", None, &[("peakfit.io/vram", "70Gi")]);
        index.apply_pod(&pod);
        let filter = |names: &[String]| {
            let r = e.filter(ExtenderArgs {
                pod: Some(pod.clone()),
                nodes: None,
                node_names: Some(names.to_vec()),
            });
            let mut words: Vec<String> = r
                .failed_nodes
                .into_iter()
                .chain(r.failed_and_unresolvable_nodes)
                .flat_map(BTreeMap::into_values)
                .collect();
            words.sort();
            words.dedup();
            words
        };
        let many = filter(&names);
        assert_eq!(
            many,
            [
                "needs 70.2 GiB free per GPU on 1 GPU(s) (peak 70.0 GiB + 256 MiB safety margin); \
              none of its 1 GPU(s) has that free"
            ]
        );
        let few = filter(&names[..NODE_FIGURES_UP_TO]);
        assert_eq!(few.len(), NODE_FIGURES_UP_TO, "{few:?}");
        assert!(
            few.iter().all(|w| w.contains("best free GPU has")),
            "{few:?}"
        );
    }
}
