//! The profile leader's loop: every `--profile-interval`, fold what the agents saw of each
//! running pod peakfit placed into its workload's profile, and write the profiles whose numbers
//! changed by server-side apply (field manager [`FIELD_MANAGER`]). Batched and bounded: one pass
//! per interval, at most [`MAX_WRITES_PER_PASS`] writes, and a profile whose numbers did not
//! change is written again only every [`REFRESH`] (so its `lastSeen` keeps it from expiring).
//! Profiles of workloads not seen running for `--profile-ttl` are deleted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, Patch, PatchParams};

use super::leader::ProfileLease;
use super::store::{ProfileStore, display_name, fold, quantity};
use super::{GpuWorkloadProfileStatus, gib, profile_name};
use crate::cluster::index::{Index, Observed};
use crate::cluster::workload::WorkloadKey;

/// The field manager of every profile write.
pub const FIELD_MANAGER: &str = "peakfit-profiles";

/// The most profiles one pass writes; the rest wait for the next pass.
pub const MAX_WRITES_PER_PASS: usize = 200;

/// A profile whose numbers did not change is written again after this long.
pub const REFRESH: Duration = Duration::from_secs(600);

/// The writer's settings (the extender's `--profile-*` flags).
#[derive(Clone, Copy, Debug)]
pub struct WriterConfig {
    pub interval: Duration,
    pub ttl: Duration,
}

/// What a profile says that sizing or people act on; a write is due when it changes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Fingerprint {
    pods_seen: u32,
    peak: u64,
    predicted: u64,
    trusted: u32,
    recommended: u64,
}

fn fingerprint(s: &GpuWorkloadProfileStatus, min_runtime_secs: u64) -> Fingerprint {
    let h = super::store::history_of(s, min_runtime_secs);
    Fingerprint {
        pods_seen: s.pods_seen,
        peak: s.observed_peak_bytes,
        predicted: s.predicted_bytes,
        trusted: h.pods_trusted,
        recommended: s.recommended_bytes,
    }
}

/// Starts the loop; it runs until the process ends. Each round first takes or renews the
/// Lease; only its holder writes.
pub fn spawn(
    client: kube::Client,
    index: Arc<Index>,
    store: Arc<ProfileStore>,
    lease: ProfileLease,
    config: WriterConfig,
) {
    use tracing::Instrument as _;
    tokio::spawn(
        async move {
            let mut written: HashMap<WorkloadKey, (Instant, Fingerprint)> = HashMap::new();
            let mut leading = false;
            let mut tick = tokio::time::interval(config.interval.max(Duration::from_millis(100)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let held = lease.try_hold().await;
                if held != leading {
                    tracing::info!(leading = held, "profile lease");
                    leading = held;
                    // A new leader starts from what the API server holds.
                    written.clear();
                }
                if held {
                    pass(&client, &index, &store, &mut written, config).await;
                }
            }
        }
        .instrument(tracing::info_span!("profiles")),
    );
}

async fn pass(
    client: &kube::Client,
    index: &Index,
    store: &ProfileStore,
    written: &mut HashMap<WorkloadKey, (Instant, Fingerprint)>,
    config: WriterConfig,
) {
    let now = jiff::Timestamp::now().as_second();
    let policy = store.policy();
    let observations = index.observations();
    let mut writes = 0;
    for (key, seen) in &observations {
        if writes >= MAX_WRITES_PER_PASS {
            break;
        }
        let previous = store.get(key);
        let status = fold(
            previous.as_ref().map(|k| &k.status),
            seen,
            now,
            policy.margin,
        );
        let fp = fingerprint(&status, policy.min_runtime_secs);
        let due = written
            .get(key)
            .is_none_or(|(at, f)| *f != fp || at.elapsed() >= REFRESH);
        if !due {
            continue;
        }
        writes += 1;
        match apply(client, key, &status, previous.is_none()).await {
            Ok(()) => {
                let changed = previous
                    .as_ref()
                    .map(|p| p.status.recommended_bytes)
                    .is_none_or(|r| r != status.recommended_bytes);
                if changed && status.recommended_bytes > 0 {
                    record_event(client, key, seen, &status).await;
                }
                tracing::debug!(workload = %display_name(key), pods = status.pods_seen, peak = status.observed_peak_bytes, "profile written");
                store.set(key.clone(), status);
                written.insert(key.clone(), (Instant::now(), fp));
            }
            Err(e) => {
                tracing::warn!(workload = %display_name(key), error = %e, "could not write the profile; retrying next pass");
            }
        }
    }
    // Expiry: profiles of workloads not running now and not seen for the TTL.
    let ttl = i64::try_from(config.ttl.as_secs()).unwrap_or(i64::MAX);
    for (key, known) in store.all() {
        if observations.contains_key(&key) {
            continue;
        }
        let last = known
            .status
            .last_seen
            .parse::<jiff::Timestamp>()
            .map_or(0, jiff::Timestamp::as_second);
        if now.saturating_sub(last) <= ttl {
            continue;
        }
        let api: Api<super::GpuWorkloadProfile> = Api::namespaced(client.clone(), &key.namespace);
        let name = profile_name(&key);
        let gone = match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => true,
            Err(kube::Error::Api(s)) if s.code == 404 => true,
            Err(e) => {
                tracing::warn!(workload = %display_name(&key), error = %e, "could not delete an expired profile");
                false
            }
        };
        if gone {
            tracing::info!(workload = %display_name(&key), "profile expired");
            store.remove(&key);
            written.remove(&key);
        }
    }
}

/// Server-side apply of the profile: its spec when it is new (or gone), then its status.
async fn apply(
    client: &kube::Client,
    key: &WorkloadKey,
    status: &GpuWorkloadProfileStatus,
    new: bool,
) -> Result<(), kube::Error> {
    let api: Api<super::GpuWorkloadProfile> = Api::namespaced(client.clone(), &key.namespace);
    let name = profile_name(key);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let spec = serde_json::json!({
        "apiVersion": "peakfit.io/v1alpha1",
        "kind": "GpuWorkloadProfile",
        "metadata": {"name": name},
        "spec": {
            "workloadKind": key.kind,
            "workloadName": key.name,
            "inputs": key.inputs,
        },
    });
    let with_status = serde_json::json!({
        "apiVersion": "peakfit.io/v1alpha1",
        "kind": "GpuWorkloadProfile",
        "metadata": {"name": name},
        "status": status,
    });
    if new {
        api.patch(&name, &params, &Patch::Apply(&spec)).await?;
    }
    match api
        .patch_status(&name, &params, &Patch::Apply(&with_status))
        .await
    {
        Ok(_) => Ok(()),
        // Deleted behind our back: make it again.
        Err(kube::Error::Api(s)) if s.code == 404 && !new => {
            api.patch(&name, &params, &Patch::Apply(&spec)).await?;
            api.patch_status(&name, &params, &Patch::Apply(&with_status))
                .await
                .map(drop)
        }
        Err(e) => Err(e),
    }
}

/// A `RecommendationChanged` event on the workload's newest pod, saying what to annotate (best
/// effort).
async fn record_event(
    client: &kube::Client,
    key: &WorkloadKey,
    seen: &[Observed],
    status: &GpuWorkloadProfileStatus,
) {
    let Some(newest) = seen.iter().max_by_key(|p| p.started_unix) else {
        return;
    };
    let message = format!(
        "peakfit: {} peaked at {} per GPU over {} pods (predicted {}); annotate \
         peakfit.io/vram: {} (GpuWorkloadProfile {})",
        display_name(key),
        gib(status.observed_peak_bytes),
        status.pods_seen,
        gib(status.predicted_bytes),
        quantity(status.recommended_bytes),
        profile_name(key),
    );
    crate::cluster::events::record(
        client,
        &crate::cluster::events::PodRef {
            namespace: &key.namespace,
            name: &newest.name,
            uid: Some(&newest.uid),
        },
        "RecommendationChanged",
        &message,
        FIELD_MANAGER,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_due_when_what_sizing_reads_changes() {
        let t0 = 1_800_000_000;
        let pod = |peak| Observed {
            uid: "a".into(),
            name: "chat-a".into(),
            predicted_bytes: 10 << 30,
            explicit: false,
            gpus: 1,
            started_unix: t0,
            peak_bytes: peak,
        };
        let s1 = fold(None, &[pod(12 << 30)], t0 + 60, 0.05);
        // A minute on, nothing new: only the times moved.
        let s2 = fold(Some(&s1), &[pod(12 << 30)], t0 + 120, 0.05);
        assert_ne!(s1, s2);
        assert_eq!(fingerprint(&s1, 3600), fingerprint(&s2, 3600));
        // A higher peak, or the pod passing the trusted runtime, is due.
        let s3 = fold(Some(&s2), &[pod(13 << 30)], t0 + 180, 0.05);
        assert_ne!(fingerprint(&s2, 3600), fingerprint(&s3, 3600));
        let s4 = fold(Some(&s2), &[pod(12 << 30)], t0 + 3600, 0.05);
        assert_ne!(fingerprint(&s2, 3600), fingerprint(&s4, 3600));
    }
}
