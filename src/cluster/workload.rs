//! A pod's workload: what its next replica, or its next run, will be. What was observed of one pod
//! can only size the next one if both are known to be the same thing (issue 21, item 2), so a
//! workload is the pod's controller chain as far as the pod itself shows it, plus its
//! `peakfit.io/*` inputs: a changed batch or context is a different workload, whose history says
//! nothing of it.
//!
//! Read from the pod alone, without fetching its owners: the Pod watch already holds every pod,
//! and a lookup per pod would cost the API server a request per replica. The chain is resolved
//! from what Kubernetes' own controllers write on the pods they make:
//! - a `ReplicaSet` named `<deployment>-<pod-template-hash>` whose pods carry that
//!   `pod-template-hash` label is its Deployment's (the Deployment controller names it so);
//! - a Job named `<cronjob>-<n>`, `n` the scheduled time in minutes since the epoch (8 digits or
//!   more, as the `CronJob` controller names its Jobs), is its `CronJob`'s: every run of a `CronJob` is
//!   one workload;
//! - a pod labelled `leaderworkerset.sigs.k8s.io/name` is that `LeaderWorkerSet`'s, whichever of
//!   its `StatefulSets` made it;
//! - any other controller is itself (`StatefulSet`, a bare `ReplicaSet` or Job, other kinds);
//! - a pod without a controller is its own workload, by name.
//!
//! `peakfit.io/workload-name: NAME` overrides all of it, for chains the pod cannot show (an
//! operator making Jobs of its own names, say). The issue asked for `peakfit.io/workload`, but
//! that key already says what the pod runs (inference, training, LoRA).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::model::annotations::{OUTPUT_KEYS, PREFIX, WORKLOAD_NAME};

/// The label the Deployment controller puts on its pods and in its `ReplicaSets`' names.
const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// The label `LeaderWorkerSet` puts on the pods of every group.
const LWS_NAME: &str = "leaderworkerset.sigs.k8s.io/name";

/// The longest name kept (a Kubernetes object name's limit): a longer override is cut, so a
/// workload key stays small whatever a pod says.
const MAX_NAME: usize = 253;

/// One workload: a namespace, what made the pods (kind and name), and their inputs.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadKey {
    pub namespace: String,
    /// `Deployment`, `CronJob`, `StatefulSet`, `LeaderWorkerSet`, `Job`, `ReplicaSet`, another
    /// owner's kind, `Pod` for a pod without a controller, or `Workload` for the override.
    pub kind: String,
    pub name: String,
    /// The pod's `peakfit.io/*` inputs as a stable hash (16 hex digits): bind's outputs and the
    /// override itself are left out, so only what sizes the pod tells two workloads apart.
    pub inputs: String,
}

/// The workload `pod` belongs to.
pub fn workload_of(pod: &Pod) -> WorkloadKey {
    let meta = &pod.metadata;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let annotations = meta.annotations.as_ref();
    let labels = meta.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    let inputs = inputs_hash(annotations);
    let key = |kind: &str, name: &str| WorkloadKey {
        namespace: namespace.clone(),
        kind: kind.to_owned(),
        name: clip_name(name),
        inputs: inputs.clone(),
    };
    if let Some(name) = annotations
        .and_then(|a| a.get(WORKLOAD_NAME))
        .map(|n| n.trim())
        .filter(|n| !n.is_empty())
    {
        return key("Workload", name);
    }
    if let Some(lws) = label(LWS_NAME).filter(|n| !n.is_empty()) {
        return key("LeaderWorkerSet", lws);
    }
    let controller = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    let Some(owner) = controller else {
        return key("Pod", meta.name.as_deref().unwrap_or_default());
    };
    match owner.kind.as_str() {
        "ReplicaSet" => match label(POD_TEMPLATE_HASH)
            .and_then(|h| owner.name.strip_suffix(h))
            .and_then(|rest| rest.strip_suffix('-'))
            .filter(|d| !d.is_empty())
        {
            Some(deployment) => key("Deployment", deployment),
            None => key("ReplicaSet", &owner.name),
        },
        "Job" => match cronjob_of(&owner.name) {
            Some(cronjob) => key("CronJob", cronjob),
            None => key("Job", &owner.name),
        },
        kind => key(kind, &owner.name),
    }
}

/// The `CronJob` a Job's name says made it: `<cronjob>-<minutes since the epoch>` (the `CronJob`
/// controller's naming; 8 digits from 1970-03-11 on, so any run made today has 8 or more).
fn cronjob_of(job: &str) -> Option<&str> {
    let (cronjob, minutes) = job.rsplit_once('-')?;
    (minutes.len() >= 8 && minutes.bytes().all(|b| b.is_ascii_digit()) && !cronjob.is_empty())
        .then_some(cronjob)
}

fn clip_name(name: &str) -> String {
    let mut end = name.len().min(MAX_NAME);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_owned()
}

/// FNV-1a (64 bits) over the sorted `key=value` lines of the pod's `peakfit.io/*` inputs. Not
/// std's `DefaultHasher`, whose output may change between Rust releases: the hash names a
/// profile that outlives the process that computed it.
fn inputs_hash(annotations: Option<&BTreeMap<String, String>>) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    let mut h = OFFSET;
    // A BTreeMap iterates in key order: the same inputs in any order hash alike.
    for (k, v) in annotations.into_iter().flatten() {
        if !k.starts_with(PREFIX) || OUTPUT_KEYS.contains(&k.as_str()) || k == WORKLOAD_NAME {
            continue;
        }
        for b in k.bytes().chain([b'=']).chain(v.bytes()).chain([b'\n']) {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn pod(owner: Option<(&str, &str)>, labels: &[(&str, &str)], ann: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("p-0".into());
        p.metadata.namespace = Some("ml".into());
        p.metadata.owner_references = owner.map(|(kind, name)| {
            vec![OwnerReference {
                kind: kind.into(),
                name: name.into(),
                controller: Some(true),
                ..OwnerReference::default()
            }]
        });
        let map = |kv: &[(&str, &str)]| {
            (!kv.is_empty()).then(|| {
                kv.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            })
        };
        p.metadata.labels = map(labels);
        p.metadata.annotations = map(ann);
        p
    }

    fn who(p: &Pod) -> (String, String) {
        let w = workload_of(p);
        (w.kind, w.name)
    }

    fn pair(kind: &str, name: &str) -> (String, String) {
        (kind.to_owned(), name.to_owned())
    }

    #[test]
    fn the_controller_chain_is_read_from_the_pod() {
        let hash = [(POD_TEMPLATE_HASH, "7d9f8c6b5")];
        // Deployment chat-api → ReplicaSet chat-api-7d9f8c6b5 → pod.
        let rs = pod(Some(("ReplicaSet", "chat-api-7d9f8c6b5")), &hash, &[]);
        assert_eq!(who(&rs), pair("Deployment", "chat-api"));
        // A ReplicaSet of its own (no template hash in its name): itself.
        let bare = pod(Some(("ReplicaSet", "frontend")), &hash, &[]);
        assert_eq!(who(&bare), pair("ReplicaSet", "frontend"));
        // CronJob nightly-eval → Job nightly-eval-29416320 → pod; a Job of its own: itself.
        let run = pod(Some(("Job", "nightly-eval-29416320")), &[], &[]);
        assert_eq!(who(&run), pair("CronJob", "nightly-eval"));
        let job = pod(Some(("Job", "finetune-v2")), &[], &[]);
        assert_eq!(who(&job), pair("Job", "finetune-v2"));
        let short = pod(Some(("Job", "train-42")), &[], &[]);
        assert_eq!(who(&short), pair("Job", "train-42"));
        let sts = pod(Some(("StatefulSet", "vllm")), &[], &[]);
        assert_eq!(who(&sts), pair("StatefulSet", "vllm"));
        // LeaderWorkerSet: leader and workers live in different StatefulSets.
        let worker = pod(
            Some(("StatefulSet", "llama-70b-0")),
            &[(LWS_NAME, "llama-70b")],
            &[],
        );
        assert_eq!(who(&worker), pair("LeaderWorkerSet", "llama-70b"));
        // No controller: the pod itself, by name.
        assert_eq!(who(&pod(None, &[], &[])), pair("Pod", "p-0"));
        // The override wins, cut to an object name's length.
        let named = pod(Some(("Job", "x")), &[], &[(WORKLOAD_NAME, "team-a/eval")]);
        assert_eq!(who(&named), pair("Workload", "team-a/eval"));
        let long = "w".repeat(10_000);
        let named = pod(None, &[], &[(WORKLOAD_NAME, long.as_str())]);
        assert_eq!(workload_of(&named).name.len(), MAX_NAME);
        // A non-controller owner is not a controller.
        let mut p = pod(Some(("ReplicaSet", "chat-api-7d9f8c6b5")), &hash, &[]);
        p.metadata.owner_references.as_mut().unwrap()[0].controller = None;
        assert_eq!(who(&p), pair("Pod", "p-0"));
    }

    /// A changed input is a different workload; bind's outputs, the override and annotations of
    /// other tools are not inputs.
    #[test]
    fn only_the_peakfit_inputs_tell_workloads_apart() {
        let owner = Some(("ReplicaSet", "chat-api-7d9f8c6b5"));
        let base = [
            ("peakfit.io/model", "llama-3.1-8b"),
            ("peakfit.io/batch", "8"),
        ];
        let inputs = |ann: &[(&str, &str)]| workload_of(&pod(owner, &[], ann)).inputs;
        let same = inputs(&base);
        assert_eq!(same.len(), 16);
        assert_ne!(
            inputs(&[
                ("peakfit.io/model", "llama-3.1-8b"),
                ("peakfit.io/batch", "16")
            ]),
            same
        );
        assert_ne!(inputs(&base[..1]), same);
        let mut more = base.to_vec();
        more.extend([
            ("peakfit.io/assigned-gpus", "GPU-a"),
            ("peakfit.io/reserved-bytes", "1000"),
            (WORKLOAD_NAME, "w"),
            ("prometheus.io/scrape", "true"),
        ]);
        assert_eq!(inputs(&more), same);
        // Key and value are kept apart: `a=bc` is not `ab=c`.
        assert_ne!(
            inputs(&[("peakfit.io/a", "bc")]),
            inputs(&[("peakfit.io/ab", "c")])
        );
        // Stable across processes and releases: a fixed input, a fixed hash.
        assert_eq!(inputs(&[]), format!("{:016x}", 0xcbf2_9ce4_8422_2325_u64));
    }
}
