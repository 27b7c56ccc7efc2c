//! Conflicts with the kubelet's own allocations (issue 23): a peakfit pod assigned a GPU that
//! the kubelet also gave to a pod peakfit did not place (a device plugin's `nvidia.com/gpu`, a
//! DRA claim). Filter never offers such a GPU, so this happens only when the two race (the
//! default scheduler binds a device-plugin pod while peakfit binds to the same node) or on a node
//! set up without the separation the chart README asks for. Whoever allocates last there runs
//! out of memory, so both pods are told: a Warning event on each, once per conflict.
//!
//! The ledger already counts both (`GpuLedger::committed_bytes`) and the metric
//! `peakfit_gpu_holder_conflicts` is read from it at scrape time; this loop only writes the
//! events. Both scheduler replicas run it (the extender does not know which one leads): each
//! event's name is made from the conflict, so the second replica's create is refused as a
//! duplicate (409) and the pod gets one event, also after a restart.

use std::collections::{BTreeSet, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, PostParams};

use super::Extender;
use crate::cluster::binding::FIELD_MANAGER;
use crate::cluster::index::HolderConflict;

/// How often the ledgers are searched for conflicts: a few seconds is soon enough to be told
/// before the pods allocate, and the search only reads the ledgers.
pub const INTERVAL: Duration = Duration::from_secs(2);

/// One event to write: on which pod, why, and its fixed name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConflictEvent {
    pub namespace: String,
    pub pod: String,
    pub uid: Option<String>,
    /// Fixed per conflict and pod, so replicas and restarts write it once.
    pub name: String,
    pub reason: &'static str,
    pub message: String,
}

/// The two events of one conflict: on the peakfit pod and on the holder.
pub fn events_of(c: &HolderConflict, holder_uid: Option<String>) -> [ConflictEvent; 2] {
    use crate::clip::clip;
    let gpu = format!(
        "GPU {} ({}) of node {}",
        c.gpu_index,
        clip(&c.gpu_uuid),
        clip(&c.node)
    );
    let holder = clip(&c.holder.describe()).into_owned();
    let (ns, pod) = &c.pod;
    let hash = {
        let mut h = foldhash::fast::FixedState::with_seed(0x7065_616b_6669_7423).build_hasher();
        h.write(c.key().as_bytes());
        h.finish()
    };
    // An event's name is a DNS subdomain (253 characters); a pod's name may be as long.
    let name = |pod: &str, side: &str| format!("{}.gpu-held-{side}-{hash:016x}", cut(pod, 200));
    [
        ConflictEvent {
            namespace: ns.clone(),
            pod: pod.clone(),
            uid: c.pod_uid.clone(),
            name: name(pod, "p"),
            reason: "GpuHeldByAnotherPod",
            message: format!(
                "peakfit: {gpu}, assigned to this pod, was also given by the kubelet to {holder}; \
                 whichever allocates last runs out of GPU memory. Move one of the two (delete this \
                 pod to have it placed again) and keep device-plugin and DRA pods off peakfit's \
                 GPUs (chart README, \"Supported set-ups\")"
            ),
        },
        ConflictEvent {
            namespace: c.holder.namespace.clone(),
            pod: c.holder.pod_name.clone(),
            uid: holder_uid,
            name: name(&c.holder.pod_name, "h"),
            reason: "GpuSharedWithPeakfit",
            message: format!(
                "peakfit: {gpu}, which the kubelet gave this pod ({}), is also assigned to \
                 peakfit pod {}/{}; whichever allocates last runs out of GPU memory. Keep \
                 device-plugin and DRA pods off peakfit's GPUs (chart README, \"Supported \
                 set-ups\")",
                clip(
                    &c.holder
                        .claim
                        .as_deref()
                        .map_or_else(|| c.holder.resource.clone(), |cl| format!("claim {cl}"))
                ),
                clip(ns),
                clip(pod),
            ),
        },
    ]
}

/// At most `max` bytes of `s`, cut on a character boundary.
fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Which conflicts are new since the last search, and forgets those that ended (so that one
/// coming back is told again).
pub fn new_conflicts(seen: &mut BTreeSet<String>, now: Vec<HolderConflict>) -> Vec<HolderConflict> {
    let keys: HashSet<String> = now.iter().map(HolderConflict::key).collect();
    seen.retain(|k| keys.contains(k));
    now.into_iter().filter(|c| seen.insert(c.key())).collect()
}

/// Writes one Warning event; an event of that name already there (the other replica's, or
/// this one's before a restart) counts as written.
pub async fn write(client: &kube::Client, e: &ConflictEvent) -> Result<(), kube::Error> {
    let pod = crate::cluster::events::PodRef {
        namespace: &e.namespace,
        name: &e.pod,
        uid: e.uid.as_deref(),
    };
    // An event's note is at most 1 KiB (events.k8s.io/v1); the names in it are cut already.
    let message = crate::clip::clip_to(&e.message, crate::clip::MAX_MESSAGE_BYTES);
    let event =
        crate::cluster::events::pod_event(&pod, e.reason, "Warning", &message, FIELD_MANAGER);
    let event = Event {
        metadata: kube::api::ObjectMeta {
            name: Some(e.name.clone()),
            generate_name: None,
            ..event.metadata
        },
        ..event
    };
    let api: Api<Event> = Api::namespaced(client.clone(), &e.namespace);
    match api.create(&PostParams::default(), &event).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Runs the loop until the process ends.
pub fn spawn(ext: Arc<Extender>, client: kube::Client, every: Duration) {
    tokio::spawn(async move {
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let index = ext.index.clone();
            let Ok(now) = tokio::task::spawn_blocking(move || index.holder_conflicts()).await
            else {
                continue;
            };
            for c in new_conflicts(&mut seen, now) {
                tracing::warn!(
                    node = %c.node, gpu = %c.gpu_uuid, pod = %format!("{}/{}", c.pod.0, c.pod.1),
                    holder = %c.holder.describe(),
                    "a GPU assigned to a peakfit pod was also given by the kubelet to another pod"
                );
                let holder_uid = ext
                    .index
                    .find_pod("", &c.holder.namespace, &c.holder.pod_name)
                    .and_then(|p| p.uid().map(str::to_owned));
                for e in events_of(&c, holder_uid) {
                    if let Err(err) = write(&client, &e).await {
                        // Told again at the next search: the conflict is forgotten so it is new.
                        tracing::warn!(error = %err, pod = %e.pod, "could not record the conflict event");
                        seen.remove(&c.key());
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{DeviceHolder, HolderKind};

    fn conflict(holder: &str) -> HolderConflict {
        HolderConflict {
            node: "n1".into(),
            gpu_uuid: "GPU-0".into(),
            gpu_index: 0,
            pod: ("ml".into(), "shared-1".into()),
            pod_uid: Some("u1".into()),
            holder: DeviceHolder {
                namespace: "ml".into(),
                pod_name: holder.into(),
                container: "main".into(),
                kind: HolderKind::DevicePlugin,
                resource: "nvidia.com/gpu".into(),
                claim: None,
            },
        }
    }

    #[test]
    fn a_conflict_is_new_once_and_again_after_it_ended() {
        let mut seen = BTreeSet::new();
        assert_eq!(new_conflicts(&mut seen, vec![conflict("a")]).len(), 1);
        assert!(new_conflicts(&mut seen, vec![conflict("a")]).is_empty());
        assert_eq!(
            new_conflicts(&mut seen, vec![conflict("a"), conflict("b")]),
            vec![conflict("b")]
        );
        assert!(new_conflicts(&mut seen, vec![]).is_empty());
        assert_eq!(new_conflicts(&mut seen, vec![conflict("a")]).len(), 1);
    }

    #[test]
    fn both_pods_get_an_event_with_a_name_fixed_by_the_conflict() {
        let [p, h] = events_of(&conflict("trainer-0"), Some("u2".into()));
        assert_eq!((p.pod.as_str(), p.uid.as_deref()), ("shared-1", Some("u1")));
        assert_eq!(
            (h.pod.as_str(), h.uid.as_deref()),
            ("trainer-0", Some("u2"))
        );
        assert!(
            p.message.contains("GPU 0 (GPU-0) of node n1")
                && p.message.contains("ml/trainer-0 through nvidia.com/gpu"),
            "{}",
            p.message
        );
        assert!(
            h.message.contains("peakfit pod ml/shared-1"),
            "{}",
            h.message
        );
        // The same conflict names the same events (replicas, restarts); another does not.
        let [p2, _] = events_of(&conflict("trainer-0"), None);
        assert_eq!(p.name, p2.name);
        let [p3, _] = events_of(&conflict("trainer-1"), None);
        assert_ne!(p.name, p3.name);
        assert!(p.name.starts_with("shared-1.gpu-held-p-"), "{}", p.name);
        // A pod name of the longest kind still makes a valid event name.
        let mut long = conflict("x");
        long.pod.1 = "p".repeat(253);
        let [p, _] = events_of(&long, None);
        assert!(p.name.len() <= 253, "{}", p.name.len());
    }
}
