//! Bind, the commit point: under the node's lock, re-check the fit against everything committed
//! since filter, choose the GPUs and record them in the ledger at once (so filter counts binds in
//! flight), then write the Binding, which carries the pod's annotations, and take the record back
//! if the API server refuses.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use tracing::instrument;

use super::Extender;
use super::wire::{ExtenderBindingArgs, ExtenderBindingResult};
use crate::clip::{MAX_MESSAGE_BYTES, clip, clip_to};
use crate::cluster::binding::{BindError, BindTarget};
use crate::cluster::index::{ASSIGNED_GPUS, Assignment, GPU_MEMORY_FRACTION, RESERVED_BYTES};
use crate::placement::place;

/// How a bind ended; its label is the `outcome` of `peakfit_extender_decisions_total{verb="bind"}`.
#[derive(Debug, thiserror::Error)]
pub enum BindRefusal {
    #[error("bind request lacks {0}")]
    Incomplete(String),
    #[error(
        "pod {0} is not in peakfit's cache nor on the API server (deleted before it was bound?)"
    )]
    PodGone(String),
    #[error("pod {pod} has UID {have}, the scheduler asked for {asked}: it was recreated")]
    Recreated {
        pod: String,
        have: String,
        asked: String,
    },
    #[error("pod {pod} is already bound to node {bound}; refusing to bind it to {asked}")]
    BoundElsewhere {
        pod: String,
        bound: String,
        asked: String,
    },
    #[error("node {0} is not in peakfit's cache")]
    UnknownNode(String),
    #[error("{0}")]
    InvalidAnnotation(String),
    /// The ledger moved since filter: another pod took the memory first. Normal under
    /// contention (kube-scheduler binds asynchronously), so not counted as an error.
    #[error("pod {pod} no longer fits on {node} ({reason}); the scheduler will retry")]
    Conflict {
        pod: String,
        node: String,
        reason: String,
    },
    #[error(transparent)]
    Api(#[from] BindError),
}

impl BindRefusal {
    /// A stable metric label.
    pub fn label(&self) -> &'static str {
        match self {
            BindRefusal::Incomplete(_) => "bad_request",
            BindRefusal::PodGone(_) => "pod_gone",
            BindRefusal::Recreated { .. } => "recreated",
            BindRefusal::BoundElsewhere { .. } => "bound_elsewhere",
            BindRefusal::UnknownNode(_) => "unknown_node",
            BindRefusal::InvalidAnnotation(_) => "invalid_annotation",
            BindRefusal::Conflict { .. } => "conflict",
            BindRefusal::Api(_) => "api_error",
        }
    }

    /// Whether `peakfit_extender_errors_total` (and so the errors alert) counts it.
    pub fn is_error(&self) -> bool {
        !matches!(self, BindRefusal::Conflict { .. })
    }
}

/// A bind that went through: `bound`, or `already_bound` for a repeat of a bind that did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    Bound,
    AlreadyBound,
}

impl Bound {
    pub fn label(self) -> &'static str {
        match self {
            Bound::Bound => "bound",
            Bound::AlreadyBound => "already_bound",
        }
    }
}

/// One bind at a time per pod: kube-scheduler retries binds, and a repeat must see the first's
/// result, not race it onto another node.
#[derive(Default)]
pub(super) struct PodLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

struct PodLockGuard<'a> {
    locks: &'a PodLocks,
    key: String,
    /// Released first in `drop`, so the map entry can be forgotten when nobody else holds it.
    held: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl PodLocks {
    async fn lock(&self, key: &str) -> PodLockGuard<'_> {
        let m = self.0.lock().entry(key.to_owned()).or_default().clone();
        PodLockGuard {
            locks: self,
            key: key.to_owned(),
            held: Some(m.lock_owned().await),
        }
    }
}

impl Drop for PodLockGuard<'_> {
    fn drop(&mut self) {
        self.held = None;
        let mut map = self.locks.0.lock();
        // Only the map holds it: nobody waits, forget it.
        if map
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            map.remove(&self.key);
        }
    }
}

impl Extender {
    pub async fn bind(&self, args: ExtenderBindingArgs) -> ExtenderBindingResult {
        self.bind_with_outcome(args).await.0
    }

    /// Bind, and whether its refusal is an error (a conflict is not).
    #[instrument(skip_all, fields(verb = "bind", pod = %clip(&format!("{}/{}", args.pod_namespace, args.pod_name))))]
    pub async fn bind_with_outcome(
        &self,
        args: ExtenderBindingArgs,
    ) -> (ExtenderBindingResult, Result<Bound, BindRefusal>) {
        let outcome = self.try_bind(&args).await;
        let result = match &outcome {
            Ok(b) => {
                self.count("bind", b.label());
                ExtenderBindingResult::default()
            }
            Err(refusal) => {
                // The request's names are anyone's strings: cut in the log and the reply.
                let error = clip_to(&refusal.to_string(), MAX_MESSAGE_BYTES).into_owned();
                let node = clip(&args.node);
                if refusal.is_error() {
                    tracing::warn!(%node, %error, "bind refused");
                } else {
                    tracing::info!(%node, %error, "bind conflict");
                    self.metrics.bind_conflicts.inc();
                }
                self.count("bind", refusal.label());
                ExtenderBindingResult { error }
            }
        };
        (result, outcome)
    }

    async fn try_bind(&self, args: &ExtenderBindingArgs) -> Result<Bound, BindRefusal> {
        let missing: Vec<&str> = [
            ("PodName", &args.pod_name),
            ("PodNamespace", &args.pod_namespace),
            ("Node", &args.node),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.is_empty().then_some(k))
        .collect();
        if !missing.is_empty() {
            return Err(BindRefusal::Incomplete(missing.join(", ")));
        }
        let pod_ref = format!("{}/{}", args.pod_namespace, args.pod_name);
        let find = || {
            self.index
                .find_pod(&args.pod_uid, &args.pod_namespace, &args.pod_name)
        };
        if find().is_none() {
            // The scheduler's informer can be ahead of ours: read the pod from the API server.
            if let Some(pod) = self
                .binder
                .get_pod(&args.pod_namespace, &args.pod_name)
                .await?
            {
                self.index.apply_pod(&pod);
            }
        }
        let key = find()
            .ok_or_else(|| BindRefusal::PodGone(pod_ref.clone()))?
            .key;
        let _pod_lock = self.bind_locks.lock(&key).await;
        // Again under the pod's lock: a bind of the same pod may have just finished.
        let entry = find().ok_or_else(|| BindRefusal::PodGone(pod_ref.clone()))?;
        if let Some(uid) = entry.uid()
            && !args.pod_uid.is_empty()
            && uid != args.pod_uid
        {
            return Err(BindRefusal::Recreated {
                pod: pod_ref,
                have: uid.to_owned(),
                asked: args.pod_uid.clone(),
            });
        }
        if let Some(bound) = &entry.node {
            return if *bound == args.node {
                Ok(Bound::AlreadyBound)
            } else {
                Err(BindRefusal::BoundElsewhere {
                    pod: pod_ref,
                    bound: bound.clone(),
                    asked: args.node.clone(),
                })
            };
        }
        let slot = self
            .index
            .node(&args.node)
            .ok_or_else(|| BindRefusal::UnknownNode(args.node.clone()))?;
        let target = BindTarget {
            namespace: args.pod_namespace.clone(),
            name: args.pod_name.clone(),
            uid: (!args.pod_uid.is_empty())
                .then(|| args.pod_uid.clone())
                .or(entry.uid().map(str::to_owned)),
            node: args.node.clone(),
        };
        let request = match &entry.request {
            Err(e) => return Err(BindRefusal::InvalidAnnotation(e.to_string())),
            Ok(r) => r.clone(),
        };
        let Some(request) = request else {
            // Not ours to place: bind it as the default binder would.
            self.binder.bind(&target, &BTreeMap::new()).await?;
            self.index.record_binding(&entry.key, &args.node, None);
            return Ok(Bound::Bound);
        };
        // Sized as filter and prioritize sized it: the reservation bind writes is the learned
        // size, so the running pod is counted at it (and at its observed peak if higher).
        let request = self
            .sized(
                &request,
                || entry.workload.as_deref().cloned(),
                entry.explicit,
            )
            .request;
        let class = self.class_of(&request, &entry.host);
        let mix = self.shapes.lock().mix();
        let (annotations, assignment) = {
            let _held = slot.bind_lock.lock().await;
            let (uuids, per_gpu, totals) = {
                let st = slot.read();
                // The same choice prioritize scored: the policy's GPUs on the current ledger.
                // As the pod sees the node: its own hold (and any that does not bind it) free.
                let now = self.now();
                let placement = place(
                    &st.seen_by(Some(entry.key.as_str()), entry.priority, now),
                    &class,
                    self.scoring,
                    &mix,
                    &self.fit,
                    now,
                )
                .map(|s| s.placement)
                .map_err(|r| BindRefusal::Conflict {
                    pod: pod_ref.clone(),
                    node: args.node.clone(),
                    reason: r.to_string(),
                })?;
                let uuids: Vec<String> = placement
                    .gpu_indices
                    .iter()
                    .map(|&i| st.ledger.gpus[i].uuid.clone())
                    .collect();
                let totals: Vec<u64> = placement
                    .gpu_indices
                    .iter()
                    .map(|&i| st.ledger.gpus[i].total_bytes)
                    .collect();
                (uuids, placement.per_gpu_bytes, totals)
            };
            // One number per pod: the largest per-GPU share (they differ only on mixed GPU sizes).
            let reserved = per_gpu.iter().copied().max().unwrap_or(0);
            let mut annotations = BTreeMap::from([
                (ASSIGNED_GPUS.to_owned(), uuids.join(",")),
                (RESERVED_BYTES.to_owned(), reserved.to_string()),
            ]);
            let fraction = request.engine_fraction.or_else(|| {
                request
                    .fraction_engine
                    .then(|| fraction_within(&per_gpu, &totals))
            });
            if let Some(f) = fraction {
                annotations.insert(GPU_MEMORY_FRACTION.to_owned(), format!("{f:.4}"));
            }
            let assignment = Assignment {
                gpu_uuids: uuids,
                reserved_bytes: Some(reserved),
            };
            // In flight from here: filter and the next bind on this node see the reservation.
            self.index
                .record_binding(&entry.key, &args.node, Some(assignment.clone()));
            (annotations, assignment)
        };
        if let Err(e) = self.binder.bind(&target, &annotations).await {
            self.index.revert_binding(entry);
            return Err(e.into());
        }
        // The watch may have replaced the entry meanwhile; make sure the assignment stands.
        self.index
            .record_binding(&entry.key, &args.node, Some(assignment));
        self.set_pending(&entry.key, None, Vec::new());
        Ok(Bound::Bound)
    }
}

/// The share of the GPU a fraction engine given fixed bytes (`vram`) may take: the smallest
/// bytes/total over its GPUs (the engine takes one fraction for all of them), rounded down to
/// the four decimals the annotation carries, so the engine never budgets past its reservation.
fn fraction_within(per_gpu: &[u64], totals: &[u64]) -> f64 {
    per_gpu
        .iter()
        .zip(totals)
        .filter(|(_, t)| **t > 0)
        .map(|(&b, &t)| (b as f64 / t as f64 * 1e4).floor() / 1e4)
        .fold(1.0, f64::min)
}

#[cfg(test)]
mod tests {
    use super::fraction_within;

    #[test]
    fn a_fixed_reservation_becomes_the_smallest_share_rounded_down() {
        const GIB: u64 = 1 << 30;
        assert_eq!(fraction_within(&[20 * GIB], &[80 * GIB]), 0.25);
        // 30 / 81 = 0.37037..: rounded down, never up past the reservation.
        assert_eq!(fraction_within(&[30 * GIB], &[81 * GIB]), 0.3703);
        // Mixed sizes: the engine's one fraction must hold on the smaller share.
        assert_eq!(
            fraction_within(&[20 * GIB, 20 * GIB], &[40 * GIB, 80 * GIB]),
            0.25
        );
        assert_eq!(fraction_within(&[90 * GIB], &[80 * GIB]), 1.0);
    }
}
