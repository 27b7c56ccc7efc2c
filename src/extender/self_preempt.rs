//! Self-preemption: the extender evicts lower-priority pods for a waiting pod where
//! kube-scheduler's preemption cannot.
//!
//! kube-scheduler's preemption dry run (`DryRunPreemption` → `SelectVictimsOnNode`,
//! `pkg/scheduler/framework/preemption`, v1.36) runs its own filter plugins only, never the
//! extender's filter. Where they accept the pod with every victim reprieved (a one-GPU pod on a
//! node whose GPUs are each too full but whose node-level sum of `peakfit.io/gpu-memory-mib`
//! has room), the node gets "expected at least one victim pod on node" and is no candidate; the
//! extender's `/preempt` is never asked about it (`callExtenders` only sees candidates). Upstream
//! PR #135486 ("Fix default-preemption error when using filter extenders": keep such nodes, with
//! an empty victim list, for preemption-capable extenders) was still under review in September
//! 2026, after the v1.36.2 these tests run (vendored by a 2026-08-21 commit), and changes what
//! extenders receive, so it is not expected in a 1.36 patch release; `/preempt` already chooses
//! victims for an empty list should it arrive.
//!
//! So, while such a pod waits, this loop does the scheduler's part for it:
//!
//! - which pods: those filter refused on every node, some only for reasons eviction can fix
//!   (`Pending::preemptible`: nodes that passed every kube-scheduler plugin, since the scheduler
//!   sends the extender only those), waiting at least `--self-preempt-after`, and about which
//!   `/preempt` was not called within that time (when it is, the scheduler's own preemption is at
//!   work and this loop stays out of its way). The pod, read fresh, must be unbound, not being
//!   deleted, not `preemptionPolicy: Never`, and not nominated (unless by this loop, with every
//!   victim it evicted gone: then it may try again);
//! - which victims: on each such node, the lower-priority pods whose eviction lets it fit, the
//!   fewest, lowest priority first (`preempt::victims_needed`, as for `/preempt`); never a pod of
//!   the preemptor's priority or above. The node is chosen as kube-scheduler's
//!   `pickOneNodeForPreemption` does, less its PDB criterion: lowest highest victim priority,
//!   then lowest sum of priorities, then fewest victims;
//! - how: the Eviction API (policy/v1), first as a dry run for every victim (a refusal, 429, is a
//!   `PodDisruptionBudget` that allows no disruption: that node is skipped), then for real. Unlike
//!   the scheduler, which deletes its victims and only prefers sparing PDBs, this never breaks a
//!   budget. Each victim gets a `Preempted` event. Then the pod's `status.nominatedNodeName` is set
//!   to the node (a status patch), as the scheduler's preemption does: the scheduler tries the
//!   nominated node first and counts the pod there when placing lower-priority pods (in its own
//!   plugins: the extender's filter does not see nominations). The victims' deletions, and the
//!   nudge of the node whose memory they free, move the pod back to the active queue.
//!
//! Why in the extender and not a kube-scheduler plugin: the deployed scheduler is upstream's
//! binary, and the extender already knows, per GPU, what a pod needs and who holds what.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams, Patch, PatchParams, PostParams};

use super::Extender;
use super::preempt::{Victim, victims_needed};
use crate::cluster::binding::FIELD_MANAGER;
use crate::cluster::index::PodEntry;

/// A waiting pod this loop may act for, and where.
#[derive(Debug)]
pub(crate) struct Waiting {
    pub key: String,
    pub preemptible: Vec<String>,
}

/// One node's plan: its victims, highest priority first.
#[derive(Debug)]
pub(crate) struct Plan {
    pub node: String,
    pub victims: Vec<Victim>,
}

impl Plan {
    /// kube-scheduler's order of preference (`pickOneNodeForPreemption`, without PDBs): the
    /// lowest highest-priority victim, the lowest sum of priorities, the fewest victims.
    fn rank(&self) -> (i32, i64, usize) {
        (
            self.victims
                .iter()
                .map(|v| v.priority)
                .max()
                .unwrap_or(i32::MIN),
            self.victims.iter().map(|v| i64::from(v.priority)).sum(),
            self.victims.len(),
        )
    }
}

/// What this loop evicted for a pod, to know when it may try again.
#[derive(Debug)]
struct Done {
    node: String,
    victims: Vec<String>,
}

impl Extender {
    /// Pods that waited at least `after` with nodes eviction could open, and that `/preempt`
    /// did not hear about within `after`; highest priority first, then the longest waiting.
    pub(crate) fn waiting_for_preemption(&self, after: Duration) -> Vec<Waiting> {
        let mut out: Vec<(i32, Instant, Waiting)> = {
            let pending = self.pending.lock();
            pending
                .iter()
                .filter(|(_, p)| !p.preemptible.is_empty() && p.since.elapsed() >= after)
                .map(|(k, p)| {
                    (
                        p.since,
                        Waiting {
                            key: k.clone(),
                            preemptible: p.preemptible.clone(),
                        },
                    )
                })
                .collect::<Vec<_>>()
        }
        .into_iter()
        .filter(|(_, w)| {
            self.last_preempt_call(&w.key)
                .is_none_or(|t| t.elapsed() >= after)
        })
        .filter_map(|(since, w)| {
            let e = self.index.find_pod(&w.key, "", "")?;
            Some((e.priority, since, w))
        })
        .collect();
        out.sort_by_key(|(priority, since, _)| (std::cmp::Reverse(*priority), *since));
        out.into_iter().map(|(_, _, w)| w).collect()
    }

    /// The nodes where evicting lower-priority pods lets `pod` fit, best first.
    pub(crate) fn self_preemption_plans(
        &self,
        pod: &PodEntry,
        priority: i32,
        nodes: &[String],
    ) -> Vec<Plan> {
        let Ok(Some(req)) = &pod.request else {
            return Vec::new();
        };
        let shape = req.shape();
        let now = self.now();
        let mut plans: Vec<Plan> = nodes
            .iter()
            .filter_map(|node| {
                let ledger = self
                    .index
                    .node(node)?
                    .read()
                    .seen_by(Some(&pod.key), priority, now)
                    .into_owned();
                let extra = self.lower_priority_pods(node, priority, &pod.key, &[]);
                let victims = victims_needed(&self.fit, &ledger, &shape, Vec::new(), extra, now)?;
                Some(Plan {
                    node: node.clone(),
                    victims,
                })
            })
            .collect();
        plans.sort_by_key(Plan::rank);
        plans
    }
}

/// Why one eviction did not happen.
#[derive(Debug, thiserror::Error)]
enum EvictError {
    #[error("a PodDisruptionBudget allows no disruption of {0} now")]
    Budget(String),
    #[error("evicting {0}: {1}")]
    Api(String, kube::Error),
}

/// Evicts one pod (`dry_run`: only asks whether it may be); a pod already gone counts as done.
async fn evict(
    client: &kube::Client,
    ns: &str,
    name: &str,
    dry_run: bool,
) -> Result<(), EvictError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let params = EvictParams {
        delete_options: None,
        post_options: PostParams {
            dry_run,
            field_manager: Some(FIELD_MANAGER.into()),
        },
    };
    match pods.evict(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 429 => {
            Err(EvictError::Budget(format!("{ns}/{name}")))
        }
        Err(e) => Err(EvictError::Api(format!("{ns}/{name}"), e)),
    }
}

/// A `Preempted` event on the victim, as kube-scheduler writes for its own (best effort).
async fn record_event(client: &kube::Client, victim: &PodEntry, preemptor: &Pod, node: &str) {
    let who = format!(
        "{}/{}",
        preemptor.metadata.namespace.as_deref().unwrap_or_default(),
        preemptor.metadata.name.as_deref().unwrap_or_default()
    );
    crate::cluster::events::record(
        client,
        &crate::cluster::events::PodRef {
            namespace: &victim.namespace,
            name: &victim.name,
            uid: victim.uid(),
        },
        "Preempted",
        &format!(
            "peakfit: evicted on node {node} to free GPU memory for {who}, of higher priority \
             (kube-scheduler's preemption counts GPU memory per node and found no victim)"
        ),
        FIELD_MANAGER,
    )
    .await;
}

/// Runs the loop until the process ends: every half `after` (at most a second apart).
pub fn spawn(ext: Arc<Extender>, client: kube::Client, after: Duration) {
    tokio::spawn(async move {
        let mut done: HashMap<String, Done> = HashMap::new();
        let mut tick = tokio::time::interval(
            (after / 2).clamp(Duration::from_millis(100), Duration::from_secs(1)),
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            done.retain(|k, _| ext.index.contains_pod(k));
            for w in ext.waiting_for_preemption(after) {
                act_for(&ext, &client, &w, &mut done).await;
            }
        }
    });
}

/// Evicts and nominates for one waiting pod, if it still needs it and a node allows it.
async fn act_for(
    ext: &Extender,
    client: &kube::Client,
    w: &Waiting,
    done: &mut HashMap<String, Done>,
) {
    let Some(entry) = ext.index.find_pod(&w.key, "", "") else {
        return;
    };
    if entry.node.is_some() {
        return;
    }
    // Planned on the index first: most waiting pods have no plan, and cost no API call.
    if ext
        .self_preemption_plans(&entry, entry.priority, &w.preemptible)
        .is_empty()
    {
        return;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &entry.namespace);
    let pod = match pods.get(&entry.name).await {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(pod = %entry.name, error = %e, "self-preemption: could not read the pod");
            return;
        }
    };
    let spec = pod.spec.as_ref();
    let nominated = pod
        .status
        .as_ref()
        .and_then(|s| s.nominated_node_name.as_deref())
        .filter(|n| !n.is_empty());
    if entry
        .uid()
        .is_some_and(|u| pod.metadata.uid.as_deref() != Some(u))
        || spec
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty())
        || pod.metadata.deletion_timestamp.is_some()
        || spec.and_then(|s| s.preemption_policy.as_deref()) == Some("Never")
    {
        return;
    }
    if let Some(node) = nominated {
        // Nominated by the scheduler, or by this loop with victims still terminating: wait.
        let retry = done.get(&entry.key).is_some_and(|d| {
            d.node == node && d.victims.iter().all(|v| !ext.index.contains_pod(v))
        });
        if !retry {
            return;
        }
    }
    let priority = spec.and_then(|s| s.priority).unwrap_or(entry.priority);
    let plans = ext.self_preemption_plans(&entry, priority, &w.preemptible);
    let mut blocked = false;
    for plan in plans {
        let victims: Vec<PodEntry> = plan
            .victims
            .iter()
            .filter_map(|v| ext.index.find_pod(&v.key, "", ""))
            .collect();
        if victims.len() != plan.victims.len() {
            continue;
        }
        let mut allowed = true;
        for v in &victims {
            if let Err(e) = evict(client, &v.namespace, &v.name, true).await {
                tracing::info!(pod = %entry.name, node = %plan.node, error = %e, "self-preemption: node skipped");
                blocked |= matches!(e, EvictError::Budget(_));
                allowed = false;
                break;
            }
        }
        if !allowed {
            continue;
        }
        let mut evicted = Vec::new();
        for v in &victims {
            match evict(client, &v.namespace, &v.name, false).await {
                Ok(()) => {
                    record_event(client, v, &pod, &plan.node).await;
                    evicted.push(v.key.clone());
                }
                Err(e) => {
                    tracing::warn!(pod = %entry.name, node = %plan.node, error = %e, "self-preemption: eviction failed");
                    ext.count("self_preempt", "error");
                }
            }
        }
        if evicted.is_empty() {
            return;
        }
        let patch = serde_json::json!({ "status": { "nominatedNodeName": plan.node } });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        if let Err(e) = pods
            .patch_status(&entry.name, &params, &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(pod = %entry.name, node = %plan.node, error = %e, "self-preemption: could not nominate the node");
        }
        tracing::info!(
            pod = %entry.name, namespace = %entry.namespace, node = %plan.node,
            victims = evicted.len(), "self-preemption: evicted lower-priority pods and nominated the node"
        );
        ext.count("self_preempt", "evicted");
        done.insert(
            entry.key.clone(),
            Done {
                node: plan.node,
                victims: evicted,
            },
        );
        return;
    }
    if blocked {
        ext.count("self_preempt", "pdb_blocked");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::binding::MemoryBinder;
    use crate::cluster::index::Index;
    use crate::cluster::test_support::{mk_node, mk_pod, mk_report};
    use crate::metrics::extender::ExtenderMetrics;

    const GIB: u64 = 1 << 30;

    /// Node `n` with eight 80 GiB GPUs, GPU `i` held by pod `p{i}` (70 GiB) of `priorities[i]`,
    /// and a waiting pod `w` of priority 500 that wants `gpus` GPUs of 70 GiB.
    fn full(priorities: [i32; 8], gpus: &str) -> Extender {
        let index = Arc::new(Index::new());
        index.apply_node(&mk_node("n"));
        let uuids: Vec<String> = (0..8).map(|i| format!("GPU-{i}")).collect();
        let procs: Vec<Vec<(&str, u64)>> = vec![Vec::new(); 8];
        let gpus_report: Vec<crate::cluster::test_support::MkGpu<'_>> = uuids
            .iter()
            .zip(&procs)
            .map(|(u, p)| (u.as_str(), 80 * GIB, 0, p.as_slice()))
            .collect();
        index.apply_report(&mk_report("n", &gpus_report));
        for (i, prio) in priorities.iter().enumerate() {
            let mut p = mk_pod(
                &format!("p{i}"),
                Some("n"),
                &[
                    ("peakfit.io/vram", "70Gi"),
                    ("peakfit.io/assigned-gpus", &uuids[i]),
                    ("peakfit.io/reserved-bytes", &(70 * GIB).to_string()),
                ],
            );
            p.spec.as_mut().unwrap().priority = Some(*prio);
            index.apply_pod(&p);
        }
        let mut w = mk_pod(
            "w",
            None,
            &[("peakfit.io/vram", "70Gi"), ("peakfit.io/gpus", gpus)],
        );
        w.spec.as_mut().unwrap().priority = Some(500);
        index.apply_pod(&w);
        Extender::new(
            index,
            Arc::new(ExtenderMetrics::new()),
            Arc::new(MemoryBinder::default()),
        )
        .with_fit(crate::placement::FitConfig {
            safety_margin_bytes: 0,
            max_report_age_secs: None,
        })
    }

    fn plan(ext: &Extender) -> Vec<(String, Vec<String>)> {
        let w = ext.index.find_pod("w", "", "").unwrap();
        ext.self_preemption_plans(&w, 500, &["n".to_owned()])
            .into_iter()
            .map(|p| (p.node, p.victims.into_iter().map(|v| v.key).collect()))
            .collect()
    }

    #[test]
    fn a_one_gpu_pod_on_a_full_eight_gpu_node_evicts_the_one_lowest_priority_pod() {
        let ext = full([100, 40, 300, 40, 100, 200, 100, 400], "1");
        // p1 and p3 tie at 40; the first in the index's order goes.
        let got = plan(&ext);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1.len(), 1, "{got:?}");
        assert!(["p1", "p3"].contains(&got[0].1[0].as_str()), "{got:?}");
    }

    #[test]
    fn pods_of_the_preemptor_s_priority_or_above_are_never_victims() {
        // Only p0 (100) is below 500: a 2-GPU pod cannot be made room for.
        let ext = full([100, 500, 900, 500, 600, 500, 700, 800], "2");
        assert!(plan(&ext).is_empty());
        let ext = full([100, 500, 900, 500, 600, 500, 700, 800], "1");
        assert_eq!(plan(&ext), vec![("n".to_owned(), vec!["p0".to_owned()])]);
    }

    #[test]
    fn an_eight_gpu_pod_takes_all_eight() {
        let ext = full([1, 2, 3, 4, 5, 6, 7, 8], "8");
        let got = plan(&ext);
        assert_eq!(got[0].1.len(), 8);
        // Highest priority first, as kube-scheduler's node choice reads victims.
        assert_eq!(got[0].1[0], "p7");
    }

    #[test]
    fn waiting_pods_are_offered_after_the_delay_unless_preempt_heard_of_them() {
        let ext = full([1; 8], "1");
        ext.set_pending("w", Some("not_enough_memory"), vec!["n".into()]);
        assert_eq!(ext.waiting_for_preemption(Duration::ZERO).len(), 1);
        assert!(
            ext.waiting_for_preemption(Duration::from_secs(3600))
                .is_empty()
        );
        ext.note_preempt_call("w");
        assert!(
            ext.waiting_for_preemption(Duration::from_secs(3600))
                .is_empty()
        );
        assert!(ext.waiting_for_preemption(Duration::ZERO).len() == 1);
        // No node that eviction could open: nothing to do.
        ext.set_pending("w", Some("gpu_too_small"), Vec::new());
        assert!(ext.waiting_for_preemption(Duration::ZERO).is_empty());
    }
}
