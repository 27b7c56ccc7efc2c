//! Bind, the commit point: under the node's lock, re-check the fit against everything committed
//! since filter, choose the GPUs, write the pod's annotations and its Binding, and only then
//! record the reservation.

use std::collections::BTreeMap;

use super::Extender;
use super::wire::{ExtenderBindingArgs, ExtenderBindingResult};
use crate::cluster::binding::BindTarget;
use crate::cluster::index::{ASSIGNED_GPUS, Assignment, GPU_MEMORY_FRACTION, RESERVED_BYTES};
use crate::placement::place;

impl Extender {
    pub async fn bind(&self, args: ExtenderBindingArgs) -> ExtenderBindingResult {
        match self.try_bind(&args).await {
            Ok(()) => {
                self.count("bind", "bound");
                ExtenderBindingResult::default()
            }
            Err((outcome, error)) => {
                tracing::warn!(pod = %format!("{}/{}", args.pod_namespace, args.pod_name), node = %args.node, %error, "bind refused");
                self.count("bind", outcome);
                ExtenderBindingResult { error }
            }
        }
    }

    async fn try_bind(&self, args: &ExtenderBindingArgs) -> Result<(), (&'static str, String)> {
        let missing: Vec<&str> = [
            ("PodName", &args.pod_name),
            ("PodNamespace", &args.pod_namespace),
            ("Node", &args.node),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.is_empty().then_some(k))
        .collect();
        if !missing.is_empty() {
            return Err((
                "error",
                format!("bind request lacks {}", missing.join(", ")),
            ));
        }
        let pod_ref = format!("{}/{}", args.pod_namespace, args.pod_name);
        let entry = self
            .index
            .find_pod(&args.pod_uid, &args.pod_namespace, &args.pod_name)
            .ok_or_else(|| {
                (
                    "error",
                    format!(
                        "pod {pod_ref} is not in peakfit's cache yet; the scheduler will retry"
                    ),
                )
            })?;
        if let Some(uid) = entry.uid()
            && !args.pod_uid.is_empty()
            && uid != args.pod_uid
        {
            return Err((
                "error",
                format!(
                    "pod {pod_ref} has UID {uid} in peakfit's cache, the scheduler asked for {}: it was recreated",
                    args.pod_uid
                ),
            ));
        }
        let slot = self.index.node(&args.node).ok_or_else(|| {
            (
                "error",
                format!("node {} is not in peakfit's cache", args.node),
            )
        })?;
        let target = BindTarget {
            namespace: args.pod_namespace.clone(),
            name: args.pod_name.clone(),
            uid: (!args.pod_uid.is_empty())
                .then(|| args.pod_uid.clone())
                .or(entry.uid().map(str::to_owned)),
            node: args.node.clone(),
        };
        let request = match &entry.request {
            Err(e) => return Err(("invalid_annotation", e.to_string())),
            Ok(r) => r.clone(),
        };
        let Some(request) = request else {
            // Not ours to place: bind it as the default binder would.
            self.binder
                .bind(&target, &BTreeMap::new())
                .await
                .map_err(|e| ("api_error", e.to_string()))?;
            self.index.record_binding(&entry.key, &args.node, None);
            return Ok(());
        };
        let class = self.class_of(&request, &entry.host);
        let mix = self.shapes.lock().mix();
        let _held = slot.bind_lock.lock().await;
        let (uuids, per_gpu, totals) = {
            let st = slot.read();
            // The same choice prioritize scored: the policy's GPUs on the current ledger.
            let placement = place(
                &st.ledger,
                &class,
                self.scoring,
                &mix,
                &self.fit,
                self.now(),
            )
            .map(|s| s.placement)
            .map_err(|r| {
                (
                    "conflict",
                    format!(
                        "pod {pod_ref} no longer fits on {} ({r}); the scheduler will retry",
                        args.node
                    ),
                )
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
        self.binder
            .bind(&target, &annotations)
            .await
            .map_err(|e| ("api_error", e.to_string()))?;
        self.index.record_binding(
            &entry.key,
            &args.node,
            Some(Assignment {
                gpu_uuids: uuids,
                reserved_bytes: Some(reserved),
            }),
        );
        self.set_pending(&entry.key, None);
        Ok(())
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
