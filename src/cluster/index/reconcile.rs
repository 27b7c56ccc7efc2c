//! Keeping the pod table right when the watch and bind both write it: pods applied and deleted,
//! bind's record (and its undoing), a watch event older than bind's record, a pod recreated
//! under its name, and pods whose model-config ConfigMap changed.

use k8s_openapi::api::core::v1::{ConfigMap, Pod};

use super::{Assignment, Index, PodEntry, RESERVED_BYTES, pod_key};
use crate::cluster::model_config::MODEL_CONFIG;
use crate::placement::PodKey;

/// The node a pod's hold names, for a pending pod with one.
pub(super) fn held_node(entry: &PodEntry) -> Option<String> {
    entry
        .hold
        .as_ref()
        .filter(|_| entry.node.is_none())
        .map(|h| h.node.clone())
}

impl Index {
    /// Records a model-config ConfigMap (new, changed or unlabelled) and works out again the
    /// request of every indexed pod that names it.
    pub fn apply_model_config(&self, cm: &ConfigMap) {
        self.model_configs.apply(cm);
        self.reresolve(
            cm.metadata.namespace.as_deref().unwrap_or_default(),
            cm.metadata.name.as_deref().unwrap_or_default(),
        );
    }

    pub fn delete_model_config(&self, namespace: &str, name: &str) {
        self.model_configs.delete(namespace, name);
        self.reresolve(namespace, name);
    }

    fn reresolve(&self, namespace: &str, name: &str) {
        let naming: Vec<PodEntry> = self
            .pods
            .read()
            .by_key
            .values()
            .filter(|e| {
                e.namespace == namespace
                    && e.model_config
                        .as_ref()
                        .and_then(|a| a.get(MODEL_CONFIG))
                        .is_some_and(|v| v.trim() == name)
            })
            .map(|e| (**e).clone())
            .collect();
        for mut entry in naming {
            if let Some(annotations) = entry.model_config.as_deref() {
                entry.request = self.request_from(namespace, annotations);
            }
            self.upsert(entry);
        }
    }

    /// Indexes a pod (new or changed). Terminal pods (Succeeded/Failed) hold nothing: deleted.
    pub fn apply_pod(&self, pod: &Pod) {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            self.delete_pod_key(&pod_key(pod));
            return;
        }
        let request = self.request_of(pod);
        if let Err(e) = &request {
            tracing::debug!(pod = ?pod.metadata.name, error = %e, "pod has an invalid peakfit annotation");
        }
        let entry = PodEntry::from_pod(pod, request);
        let raw = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RESERVED_BYTES));
        if let (Some(raw), Some(a)) = (raw, &entry.assignment)
            && a.reserved_bytes.is_none()
        {
            tracing::warn!(
                pod = %entry.name, namespace = %entry.namespace, value = %crate::clip::clip(raw),
                "{RESERVED_BYTES} is not a whole number of bytes up to 2^60; the pod's own request is reserved instead"
            );
            self.warn_metric("reserved_bytes_invalid");
        }
        if entry.node.is_none()
            && let Some(Err(e)) = super::pod::hold_of(pod)
        {
            tracing::warn!(
                pod = %entry.name, namespace = %entry.namespace, error = %e,
                "ignoring the pod's hold annotation"
            );
            self.warn_metric("hold_invalid");
        }
        self.upsert(entry);
    }

    pub(super) fn upsert(&self, mut entry: PodEntry) {
        let name_key = (entry.namespace.clone(), entry.name.clone());
        let other = self.pods.read().by_name.get(&name_key).cloned();
        if let Some(other) = other
            && other != entry.key
        {
            // Same name, another key: the pod was recreated (or first seen without its UID).
            self.delete_pod_key(&other);
        }
        let mut pods = self.pods.write();
        let old = pods.by_key.remove(&entry.key);
        if let Some(old) = &old {
            // Keep what our own bind recorded until the watch shows both the pod's annotations
            // and its node: the annotations arrive first, and dropping the node then would free
            // its GPUs while the Binding is still on its way.
            if old.bound_here && (entry.assignment.is_none() || entry.node.is_none()) {
                entry.assignment = entry.assignment.take().or(old.assignment.clone());
                entry.node = entry.node.take().or(old.node.clone());
                entry.bound_here = true;
            } else if !entry.bound_here
                && old.node.is_some()
                && old.node == entry.node
                && old.assignment.is_some()
                && entry.assignment != old.assignment
            {
                // From the watch (our own bind's record passes): the GPUs a bound pod runs on
                // were fixed when its containers started; an annotation edited afterwards (webhook and policy refuse it, but an API server
                // without them does not) would move its memory in the ledger onto GPUs it does
                // not use and free the ones it does.
                tracing::warn!(
                    namespace = %entry.namespace, pod = %entry.name,
                    "assignment annotations of a bound pod changed; keeping the first"
                );
                entry.assignment.clone_from(&old.assignment);
                entry.bound_here = old.bound_here;
            }
            if (&old.namespace, &old.name) != (&entry.namespace, &entry.name) {
                pods.by_name
                    .remove(&(old.namespace.clone(), old.name.clone()));
            }
        }
        if entry
            .hold
            .as_ref()
            .is_some_and(|h| pods.expired.contains(&(entry.key.clone(), h.made_unix)))
        {
            entry.hold = None;
        }
        let old_held = old.as_ref().and_then(|o| held_node(o));
        let new_held = held_node(&entry);
        let hold_moved = old_held != new_held
            || old.as_ref().is_some_and(|o| {
                new_held.is_some() && (o.hold != entry.hold || o.priority != entry.priority)
            });
        let old_node = old.as_ref().and_then(|o| o.node.clone());
        let new_node = entry.node.clone();
        let key = entry.key.clone();
        if new_held.is_some() {
            pods.held.insert(key.clone());
        } else {
            pods.held.remove(&key);
        }
        pods.by_name
            .insert((entry.namespace.clone(), entry.name.clone()), key.clone());
        pods.by_key.insert(key.clone(), Box::new(entry));
        if old_node != new_node
            && let Some(n) = &old_node
            && let Some(slot) = self.node(n)
        {
            let mut st = slot.state.write();
            st.pods.remove(&key);
            self.rebuild(&mut st, &pods.by_key);
        }
        if let Some(n) = &new_node {
            let slot = self.slot(n);
            let mut st = slot.state.write();
            st.pods.insert(key.clone());
            self.rebuild(&mut st, &pods.by_key);
        }
        if hold_moved {
            if let Some(n) = &old_held
                && let Some(slot) = self.node(n)
            {
                let mut st = slot.state.write();
                st.held.remove(&key);
                self.rebuild(&mut st, &pods.by_key);
            }
            if let Some(n) = &new_held {
                let slot = self.slot(n);
                let mut st = slot.state.write();
                st.held.insert(key);
                self.rebuild(&mut st, &pods.by_key);
            }
        }
    }

    /// Forgets a pod and releases what it held.
    pub fn delete_pod(&self, pod: &Pod) {
        self.delete_pod_key(&pod_key(pod));
    }

    pub fn delete_pod_key(&self, key: &str) {
        let mut pods = self.pods.write();
        let Some(old) = pods.by_key.remove(key) else {
            return;
        };
        let nk = (old.namespace.clone(), old.name.clone());
        if pods.by_name.get(&nk).map(String::as_str) == Some(key) {
            pods.by_name.remove(&nk);
        }
        if let Some(n) = &old.node
            && let Some(slot) = self.node(n)
        {
            let mut st = slot.state.write();
            st.pods.remove(key);
            self.rebuild(&mut st, &pods.by_key);
        }
        // An expired hold left `held` when it was swept; its mark goes with the pod all the same.
        pods.expired.retain(|(k, _)| k != key);
        if pods.held.remove(key)
            && let Some(n) = held_node(&old)
            && let Some(slot) = self.node(&n)
        {
            let mut st = slot.state.write();
            st.held.remove(key);
            self.rebuild(&mut st, &pods.by_key);
        }
    }

    /// The pods the index places on `node` (bound, or bound by our own bind in flight).
    /// `/preempt` reads them to add victims the scheduler's dry run spared: its node-level count
    /// cannot see that a GPU is full.
    pub fn pods_on(&self, node: &str) -> Vec<PodEntry> {
        let Some(slot) = self.node(node) else {
            return Vec::new();
        };
        // The node's lock is let go before the pod table's is taken (`upsert` takes them the
        // other way round).
        let keys: Vec<PodKey> = slot.read().pods.iter().cloned().collect();
        let pods = self.pods.read();
        keys.iter()
            .filter_map(|k| pods.by_key.get(k))
            .map(|p| PodEntry::clone(p))
            .collect()
    }

    /// Finds a pod by UID, else by namespace and name.
    pub fn find_pod(&self, uid: &str, namespace: &str, name: &str) -> Option<PodEntry> {
        let pods = self.pods.read();
        if !uid.is_empty()
            && let Some(p) = pods.by_key.get(uid)
        {
            return Some(PodEntry::clone(p));
        }
        let key = pods.by_name.get(&(namespace.to_owned(), name.to_owned()))?;
        pods.by_key.get(key).map(|p| PodEntry::clone(p))
    }

    /// Bind's commit: the pod now holds `assignment` on `node`. Bind calls it with the node's
    /// bind lock held as soon as it has chosen the GPUs, before its API calls, so that filter
    /// counts binds in flight; `revert_binding` undoes it when the API server refuses.
    pub fn record_binding(&self, key: &str, node: &str, assignment: Option<Assignment>) {
        let mut entry = match self.pods.read().by_key.get(key) {
            Some(e) => PodEntry::clone(e),
            None => return,
        };
        entry.node = Some(node.to_owned());
        if assignment.is_some() {
            entry.assignment = assignment;
            entry.bound_here = true;
        }
        self.upsert(entry);
    }

    /// Undoes a `record_binding` made while the bind was in flight, when the API server refused
    /// it: the pod is indexed as `before` again and its node's memory is released.
    pub fn revert_binding(&self, before: PodEntry) {
        if let Some(e) = self.pods.write().by_key.get_mut(&before.key) {
            // Not "bound here" any more, so `upsert` takes `before` as it is.
            e.bound_here = false;
            e.assignment = None;
        }
        self.upsert(before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::index::{ASSIGNED_GPUS, MAX_RESERVED_BYTES};
    use crate::cluster::test_support::{GIB, ledger, mk_node, mk_pod, mk_report, warnings};

    #[test]
    fn a_pods_request_follows_its_model_config_configmap() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let index = Index::new();
        index.apply_pod(&mk_pod(
            "m",
            None,
            &[
                ("peakfit.io/model-config", "llama"),
                ("peakfit.io/batch", "2"),
            ],
        ));
        let request = |index: &Index| index.find_pod("m", "", "").unwrap().request;
        let e = request(&index).unwrap_err().to_string();
        assert!(e.contains("no ConfigMap ml/llama"), "{e}");
        let cm = |json: &str| -> ConfigMap {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "llama", "namespace": "ml",
                             "labels": {"peakfit.io/model-config": "true"}},
                "data": {"config.json": json},
            }))
            .unwrap()
        };
        let llama = r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
            "vocab_size": 128256, "torch_dtype": "bfloat16"}"#;
        // The ConfigMap arrives after the pod: the pod's entry is sized from it.
        index.apply_model_config(&cm(llama));
        let sized = request(&index).unwrap().unwrap();
        // 7.5B parameters (tied embeddings, the config's default) in bf16: 14 GiB and more.
        assert!(sized.demand.fixed_bytes > 14 << 30, "{sized:?}");
        // Broken, then gone: the entry says why, other pods are untouched.
        index.apply_pod(&mk_pod("v", None, &[("peakfit.io/vram", "8Gi")]));
        index.apply_model_config(&cm("{}"));
        let e = request(&index).unwrap_err().to_string();
        assert!(e.contains("ConfigMap ml/llama key config.json"), "{e}");
        index.delete_model_config("ml", "llama");
        assert!(request(&index).is_err());
        assert!(index.find_pod("v", "", "").unwrap().request.is_ok());
    }

    #[test]
    fn reserved_bytes_beyond_the_vram_bound_fall_back_to_the_request() {
        let index = Index::new();
        index.apply_report(&mk_report("n1", &[("GPU-a", 80 * GIB, 0, &[])]));
        for uid in ["u1", "u2"] {
            index.apply_pod(&mk_pod(
                uid,
                Some("n1"),
                &[
                    ("peakfit.io/vram", "10Gi"),
                    (ASSIGNED_GPUS, "GPU-a"),
                    (RESERVED_BYTES, &u64::MAX.to_string()),
                ],
            ));
        }
        let l = ledger(&index, "n1");
        assert_eq!(l.gpus[0].committed_bytes(), 20 * GIB);
        assert_eq!(warnings(&index, "reserved_bytes_invalid"), 2);
        // At the bound it is believed (and the sums saturate rather than overflow).
        index.apply_pod(&mk_pod(
            "u3",
            Some("n1"),
            &[
                (ASSIGNED_GPUS, "GPU-a"),
                (RESERVED_BYTES, &MAX_RESERVED_BYTES.to_string()),
            ],
        ));
        assert_eq!(ledger(&index, "n1").gpus[0].free_bytes(), 0);
    }

    #[test]
    fn bound_pods_reserve_their_assigned_gpus_and_deleting_releases_them() {
        let index = Index::new();
        index.apply_node(&mk_node("n1"));
        index.apply_report(&mk_report(
            "n1",
            &[("GPU-a", 80 * GIB, 0, &[]), ("GPU-b", 80 * GIB, 0, &[])],
        ));
        let p = mk_pod(
            "u1",
            Some("n1"),
            &[
                ("peakfit.io/vram", "20Gi"),
                (ASSIGNED_GPUS, "GPU-b"),
                (RESERVED_BYTES, &(21 * GIB).to_string()),
            ],
        );
        index.apply_pod(&p);
        let l = ledger(&index, "n1");
        assert_eq!(l.gpus[0].free_bytes(), 80 * GIB);
        assert_eq!(l.gpus[1].free_bytes(), 59 * GIB);
        index.delete_pod(&p);
        assert_eq!(ledger(&index, "n1").gpus[1].free_bytes(), 80 * GIB);
        assert_eq!(index.pod_count(), 0);
    }

    #[test]
    fn a_bad_annotation_is_remembered_and_blocks_nobody() {
        let index = Index::new();
        index.apply_report(&mk_report("n1", &[("GPU-a", 80 * GIB, 0, &[])]));
        index.apply_pod(&mk_pod("bad", Some("n1"), &[("peakfit.io/vram", "lots")]));
        index.apply_pod(&mk_pod(
            "good",
            Some("n1"),
            &[("peakfit.io/vram", "10Gi"), (ASSIGNED_GPUS, "GPU-a")],
        ));
        let bad = index.find_pod("bad", "", "").unwrap();
        assert_eq!(bad.request.unwrap_err().key, "vram");
        assert_eq!(ledger(&index, "n1").gpus[0].free_bytes(), 70 * GIB);
    }

    #[test]
    fn a_bound_pod_keeps_its_first_assignment() {
        let index = Index::new();
        index.apply_node(&mk_node("n"));
        index.apply_report(&mk_report(
            "n",
            &[("GPU-a", 24 * GIB, 0, &[]), ("GPU-b", 24 * GIB, 0, &[])],
        ));
        let bound = |gpu: &str, bytes: &str| {
            mk_pod(
                "p1",
                Some("n"),
                &[
                    ("peakfit.io/vram", "20Gi"),
                    (ASSIGNED_GPUS, gpu),
                    (RESERVED_BYTES, bytes),
                ],
            )
        };
        index.apply_pod(&bound("GPU-a", &(20 * GIB).to_string()));
        // `kubectl annotate --overwrite` onto the other GPU with a token reservation.
        index.apply_pod(&bound("GPU-b", "1"));
        let l = ledger(&index, "n");
        assert_eq!(l.gpus[0].committed_bytes(), 20 * GIB);
        assert_eq!(l.gpus[1].committed_bytes(), 0);
        // Not yet bound, bind may still rewrite it.
        let pending = |gpu: &str, node| {
            mk_pod(
                "p2",
                node,
                &[
                    ("peakfit.io/vram", "1Gi"),
                    (ASSIGNED_GPUS, gpu),
                    (RESERVED_BYTES, "5"),
                ],
            )
        };
        index.apply_pod(&pending("GPU-a", None));
        index.apply_pod(&pending("GPU-b", Some("n")));
        assert_eq!(ledger(&index, "n").gpus[1].committed_bytes(), 5);
    }

    #[test]
    fn a_finished_pod_releases_its_gpu() {
        let index = Index::new();
        index.apply_report(&mk_report("n1", &[("GPU-a", 80 * GIB, 0, &[])]));
        let mut p = mk_pod(
            "u1",
            Some("n1"),
            &[("peakfit.io/vram", "10Gi"), (ASSIGNED_GPUS, "GPU-a")],
        );
        index.apply_pod(&p);
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        index.apply_pod(&p);
        assert_eq!(ledger(&index, "n1").gpus[0].free_bytes(), 80 * GIB);
    }

    #[test]
    fn our_binding_survives_a_stale_watch_event() {
        let index = Index::new();
        index.apply_report(&mk_report("n1", &[("GPU-a", 80 * GIB, 0, &[])]));
        let p = mk_pod("u1", None, &[("peakfit.io/vram", "10Gi")]);
        index.apply_pod(&p);
        index.record_binding(
            "u1",
            "n1",
            Some(Assignment {
                gpu_uuids: vec!["GPU-a".into()],
                reserved_bytes: Some(10 * GIB),
            }),
        );
        assert_eq!(ledger(&index, "n1").gpus[0].free_bytes(), 70 * GIB);
        // The watch delivers an update written before our patch.
        index.apply_pod(&p);
        assert_eq!(ledger(&index, "n1").gpus[0].free_bytes(), 70 * GIB);
    }

    #[test]
    fn a_pod_seen_again_with_its_uid_replaces_the_uidless_entry() {
        let index = Index::new();
        index.apply_report(&mk_report("n1", &[("GPU-a", 80 * GIB, 0, &[])]));
        let ann = [("peakfit.io/vram", "10Gi"), (ASSIGNED_GPUS, "GPU-a")];
        let mut p = mk_pod("u1", Some("n1"), &ann);
        p.metadata.uid = None;
        index.apply_pod(&p);
        index.apply_pod(&mk_pod("u1", Some("n1"), &ann));
        assert_eq!(index.pod_count(), 1);
        assert_eq!(ledger(&index, "n1").gpus[0].free_bytes(), 70 * GIB);
    }
}
