//! The profiles every extender replica knows (from the watch, and the leader's own writes at
//! once), what they say of a workload's history, and the pure fold of new observations into a
//! profile's status.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use super::{
    GpuWorkloadProfile, GpuWorkloadProfileStatus, MAX_POD_RECORDS, PodRecord, ProfileSummary, gib,
};
use crate::cluster::index::Observed;
use crate::cluster::workload::WorkloadKey;
use crate::model::PodRequest;
use peakfit_core::learn::{LearnMode, LearnPolicy, SizeBasis, WorkloadHistory, size_pod};

/// What the store keeps of one profile: its status, and the history sizing reads from it
/// (worked out once, when the profile arrives).
#[derive(Clone, Debug)]
pub struct Known {
    pub status: GpuWorkloadProfileStatus,
    pub history: WorkloadHistory,
}

/// Profiles by workload. Cheap to read: filter looks one up per request.
#[derive(Default)]
pub struct ProfileStore {
    by_key: RwLock<HashMap<WorkloadKey, Arc<Known>>>,
    /// `namespace/name` of each profile object, to its workload (a watch deletion names the
    /// object only).
    names: RwLock<HashMap<String, WorkloadKey>>,
    policy: RwLock<LearnPolicy>,
    /// Bumped on every change, so a cache of sizes can tell it is stale.
    generation: AtomicU64,
}

impl std::fmt::Debug for ProfileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfileStore")
            .field("profiles", &self.by_key.read().len())
            .finish_non_exhaustive()
    }
}

/// A pod's per-GPU size for placement, and why.
#[derive(Clone, Debug)]
pub struct Sizing {
    /// The request with its demand set to the size used.
    pub request: PodRequest,
    pub basis: SizeBasis,
    /// The model's (or the annotation's) per-GPU bytes.
    pub predicted_bytes: u64,
    /// What filter reasons and `estimate` say when the size is not the prediction.
    pub note: Option<String>,
}

impl ProfileStore {
    pub fn set_policy(&self, policy: LearnPolicy) {
        *self.policy.write() = policy;
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    pub fn policy(&self) -> LearnPolicy {
        *self.policy.read()
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.by_key.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A profile object from the watch (or read from a file). An echo of an older write than
    /// the one already recorded (the leader records its own at once) is not taken: folding from
    /// it again would count its GPU-hours twice.
    pub fn apply(&self, profile: &GpuWorkloadProfile) {
        let key = profile.key();
        let object = format!(
            "{}/{}",
            key.namespace,
            profile.metadata.name.as_deref().unwrap_or_default()
        );
        self.names.write().insert(object, key.clone());
        let status = profile.status.clone().unwrap_or_default();
        if let Some(known) = self.get(&key)
            && unix(&known.status.last_seen) > unix(&status.last_seen)
        {
            return;
        }
        self.set(key, status);
    }

    /// Forgets a profile (expired and deleted by the leader).
    pub fn remove(&self, key: &WorkloadKey) {
        self.names.write().retain(|_, k| k != key);
        self.by_key.write().remove(key);
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// A profile object gone (`namespace/name`).
    pub fn delete_object(&self, object: &str) {
        if let Some(key) = self.names.write().remove(object) {
            self.by_key.write().remove(&key);
            self.generation.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a status (the leader's own write, before the watch echoes it).
    pub fn set(&self, key: WorkloadKey, status: GpuWorkloadProfileStatus) {
        let history = history_of(&status, self.policy().min_runtime_secs);
        self.by_key
            .write()
            .insert(key, Arc::new(Known { status, history }));
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, key: &WorkloadKey) -> Option<Arc<Known>> {
        self.by_key.read().get(key).cloned()
    }

    /// Every profile, for the writer's expiry and the metrics.
    pub fn all(&self) -> Vec<(WorkloadKey, Arc<Known>)> {
        self.by_key
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The size a new pod of `workload` is placed at (issue 21, item 4): its request, with the
    /// per-GPU bytes `size_pod` chooses from the workload's history under the policy. Pods of a
    /// fraction engine (vLLM and the like, which take the share they are told whatever they
    /// need) keep their prediction.
    ///
    /// `workload` is asked for only when a profile could matter (learning on, a fixed-size
    /// request, profiles known): a request that cannot be sized from a profile costs a flag
    /// check.
    pub fn size(
        &self,
        request: &PodRequest,
        workload: impl FnOnce() -> Option<WorkloadKey>,
        explicit: bool,
    ) -> Sizing {
        let predicted = request.demand.fixed_bytes;
        let unchanged = |basis| Sizing {
            request: request.clone(),
            basis,
            predicted_bytes: predicted,
            note: None,
        };
        let policy = self.policy();
        let plain = if explicit {
            SizeBasis::Explicit
        } else {
            SizeBasis::Predicted
        };
        if policy.mode == LearnMode::Off || request.demand.gpu_fraction > 0.0 || self.is_empty() {
            return unchanged(plain);
        }
        let Some(workload) = workload() else {
            return unchanged(plain);
        };
        let known = self.get(&workload);
        let sized = size_pod(
            predicted,
            explicit,
            known.as_ref().map(|k| &k.history),
            &policy,
        );
        if sized.bytes == predicted
            && matches!(sized.basis, SizeBasis::Predicted | SizeBasis::Explicit)
        {
            return unchanged(sized.basis);
        }
        let mut request = request.clone();
        request.demand = crate::learn::resized(request.demand, sized.bytes);
        let note = sized
            .basis
            .describe(sized.bytes, predicted, &display_name(&workload));
        Sizing {
            request,
            basis: sized.basis,
            predicted_bytes: predicted,
            note: Some(note),
        }
    }
}

/// How texts name a workload: `deployment ml/chat`.
pub fn display_name(key: &WorkloadKey) -> String {
    format!(
        "{} {}/{}",
        key.kind.to_ascii_lowercase(),
        key.namespace,
        key.name
    )
}

/// What a profile says of its workload for sizing: lifetime pods and peak, and among the listed
/// pods those that ran at least `min_runtime_secs` (trusted to size it down).
pub fn history_of(status: &GpuWorkloadProfileStatus, min_runtime_secs: u64) -> WorkloadHistory {
    let min = i64::try_from(min_runtime_secs).unwrap_or(i64::MAX);
    let trusted: Vec<u64> = status
        .pods
        .iter()
        .filter(|p| match (unix(&p.started), unix(&p.last_seen)) {
            (Some(s), Some(l)) => l.saturating_sub(s) >= min,
            _ => false,
        })
        .map(|p| p.peak_bytes)
        .collect();
    WorkloadHistory {
        pods_observed: status.pods_seen,
        max_peak_bytes: status.observed_peak_bytes,
        pods_trusted: u32::try_from(trusted.len()).unwrap_or(u32::MAX),
        trusted_max_peak_bytes: trusted.iter().copied().max().unwrap_or(0),
    }
}

fn unix(rfc3339: &str) -> Option<i64> {
    rfc3339
        .parse::<jiff::Timestamp>()
        .ok()
        .map(jiff::Timestamp::as_second)
}

fn rfc3339(unix: i64) -> String {
    jiff::Timestamp::from_second(unix).map_or_else(|_| String::new(), |t| t.to_string())
}

/// Folds what is seen now of a workload's running pods into its profile: new pods are counted,
/// peaks only rise, GPU-hours grow by the time since each pod was last seen, and the listed
/// pods are the [`MAX_POD_RECORDS`] seen last.
pub fn fold(
    previous: Option<&GpuWorkloadProfileStatus>,
    seen: &[Observed],
    now_unix: i64,
    margin: f64,
) -> GpuWorkloadProfileStatus {
    let mut s = previous.cloned().unwrap_or_default();
    if s.first_seen.is_empty() {
        s.first_seen = rfc3339(now_unix);
    }
    let mut hours = 0.0;
    for pod in seen {
        match s.pods.iter_mut().find(|r| r.uid == pod.uid) {
            Some(r) => {
                let since = unix(&r.last_seen).unwrap_or(now_unix);
                hours += f64::from(pod.gpus) * (now_unix - since).max(0) as f64 / 3600.0;
                r.peak_bytes = r.peak_bytes.max(pod.peak_bytes);
                r.last_seen = rfc3339(now_unix);
                r.gpus = pod.gpus;
            }
            None => {
                s.pods_seen = s.pods_seen.saturating_add(1);
                hours += f64::from(pod.gpus) * (now_unix - pod.started_unix).max(0) as f64 / 3600.0;
                s.pods.push(PodRecord {
                    uid: pod.uid.clone(),
                    name: pod.name.clone(),
                    peak_bytes: pod.peak_bytes,
                    gpus: pod.gpus,
                    started: rfc3339(pod.started_unix),
                    last_seen: rfc3339(now_unix),
                });
            }
        }
    }
    s.gpu_hours += hours;
    // The newest pod says what the model predicts now.
    if let Some(newest) = seen.iter().max_by_key(|p| p.started_unix) {
        s.predicted_bytes = newest.predicted_bytes;
        s.explicit = newest.explicit;
    }
    // Every pod running now stays listed (up to `MAX_LIVE_RECORDS`), or it would be counted
    // again as new at the next fold; finished ones fill the list up to `MAX_POD_RECORDS`.
    s.pods
        .sort_by_key(|r| (unix(&r.last_seen), unix(&r.started)));
    let now_text = rfc3339(now_unix);
    let live = s.pods.iter().filter(|r| r.last_seen == now_text).count();
    let keep = MAX_POD_RECORDS.max(live.min(MAX_LIVE_RECORDS));
    let excess = s.pods.len().saturating_sub(keep);
    s.pods.drain(..excess);
    s.observed_peak_bytes = s
        .pods
        .iter()
        .map(|r| r.peak_bytes)
        .fold(s.observed_peak_bytes, u64::max);
    s.observed_p95_bytes = p95(s.pods.iter().map(|r| r.peak_bytes).collect());
    if !seen.is_empty() {
        s.last_seen = rfc3339(now_unix);
    }
    s.model_error = (s.predicted_bytes > 0).then(|| {
        let p = s.predicted_bytes as f64;
        ((s.observed_peak_bytes as f64 - p) / p * 1000.0).round() / 1000.0
    });
    s.recommended_bytes = recommend(s.observed_peak_bytes, margin);
    s.summary = ProfileSummary {
        predicted: gib(s.predicted_bytes),
        observed: gib(s.observed_peak_bytes),
        recommended: quantity(s.recommended_bytes),
    };
    s
}

/// The nearest-rank 95th percentile.
fn p95(mut v: Vec<u64>) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    let rank = (v.len() * 95).div_ceil(100).max(1);
    v[rank - 1]
}

/// The most running pods a profile lists (about 150 bytes each: 150 KB of object).
pub const MAX_LIVE_RECORDS: usize = 1024;

/// Granularity of a recommendation: half a GiB, so it reads as an annotation a person writes.
const STEP: u64 = 512 << 20;

/// The observed peak × (1 + margin), rounded up to [`STEP`].
pub fn recommend(observed_peak: u64, margin: f64) -> u64 {
    if observed_peak == 0 {
        return 0;
    }
    let raw = crate::convert::f64_to_u64((observed_peak as f64 * (1.0 + margin.max(0.0))).ceil());
    raw.div_ceil(STEP).saturating_mul(STEP)
}

/// Bytes as the `peakfit.io/vram` value to write: `24Gi`, `22.5Gi`.
pub fn quantity(bytes: u64) -> String {
    let gib = 1u64 << 30;
    if bytes.is_multiple_of(gib) {
        format!("{}Gi", bytes / gib)
    } else if bytes.is_multiple_of(STEP) {
        format!("{}.5Gi", bytes / gib)
    } else {
        format!("{}Mi", bytes.div_ceil(1 << 20))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn seen(uid: &str, started: i64, peak: u64) -> Observed {
        Observed {
            uid: uid.into(),
            name: format!("chat-{uid}"),
            predicted_bytes: 20 * GIB,
            explicit: false,
            gpus: 2,
            started_unix: started,
            peak_bytes: peak,
        }
    }

    #[test]
    fn folding_counts_new_pods_keeps_the_highest_peak_and_adds_gpu_hours() {
        let t0 = 1_800_000_000;
        let first = fold(None, &[seen("a", t0, 22 * GIB)], t0 + 3600, 0.05);
        assert_eq!(first.pods_seen, 1);
        assert_eq!(first.observed_peak_bytes, 22 * GIB);
        // 2 GPUs for an hour.
        assert_eq!(first.gpu_hours, 2.0);
        assert_eq!(first.model_error, Some(0.1));
        // 22 GiB × 1.05 = 23.1 GiB, up to 23.5.
        assert_eq!(first.recommended_bytes, 47 * (GIB / 2));
        assert_eq!(first.summary.recommended, "23.5Gi");
        assert_eq!(first.summary.predicted, "20.0Gi");
        // Same pod half an hour later, lower now: the peak stays, an hour of GPU more; a new pod.
        let second = fold(
            Some(&first),
            &[seen("a", t0, 21 * GIB), seen("b", t0 + 5400, 18 * GIB)],
            t0 + 5400,
            0.05,
        );
        assert_eq!(second.pods_seen, 2);
        assert_eq!(second.observed_peak_bytes, 22 * GIB);
        assert_eq!(second.gpu_hours, 3.0);
        assert_eq!(second.pods.len(), 2);
        // Nothing running: the lifetime figures stay, last_seen does not move.
        let idle = fold(Some(&second), &[], t0 + 9000, 0.05);
        assert_eq!(idle.pods_seen, 2);
        assert_eq!(idle.last_seen, second.last_seen);
    }

    #[test]
    fn the_listed_pods_are_bounded_and_the_lifetime_peak_outlives_them() {
        let t0 = 1_800_000_000;
        let mut s = fold(None, &[seen("big", t0, 40 * GIB)], t0 + 60, 0.0);
        for i in 0..100 {
            s = fold(
                Some(&s),
                &[seen(&format!("p{i}"), t0 + i, 10 * GIB)],
                t0 + 120 + i,
                0.0,
            );
        }
        assert_eq!(s.pods.len(), MAX_POD_RECORDS);
        // More pods running at once than are listed: folding them again counts none twice.
        let many: Vec<Observed> = (0..100)
            .map(|i| seen(&format!("m{i}"), t0 + 500, GIB))
            .collect();
        let once = fold(Some(&s), &many, t0 + 600, 0.0);
        let again = fold(Some(&once), &many, t0 + 660, 0.0);
        assert_eq!(once.pods_seen, 201);
        assert_eq!(again.pods_seen, 201);
        assert!(s.pods.iter().all(|p| p.uid != "big"));
        assert_eq!(s.pods_seen, 101);
        assert_eq!(s.observed_peak_bytes, 40 * GIB);
        assert_eq!(s.observed_p95_bytes, 10 * GIB);
    }

    #[test]
    fn only_pods_that_ran_the_minimum_runtime_are_trusted() {
        let t0 = 1_800_000_000;
        let s = fold(
            None,
            &[seen("old", t0, 12 * GIB), seen("new", t0 + 3000, 15 * GIB)],
            t0 + 3600,
            0.05,
        );
        let h = history_of(&s, 1800);
        assert_eq!(h.pods_observed, 2);
        assert_eq!(h.max_peak_bytes, 15 * GIB);
        assert_eq!(h.pods_trusted, 1);
        assert_eq!(h.trusted_max_peak_bytes, 12 * GIB);
        assert_eq!(history_of(&s, 0).pods_trusted, 2);
    }

    fn request(bytes: u64) -> PodRequest {
        crate::model::pod_request(&std::collections::BTreeMap::from([(
            "peakfit.io/vram".to_owned(),
            bytes.to_string(),
        )]))
        .unwrap()
        .unwrap()
    }

    fn chat() -> WorkloadKey {
        WorkloadKey {
            namespace: "ml".into(),
            kind: "Deployment".into(),
            name: "chat".into(),
            inputs: "0".into(),
        }
    }

    /// A pod of a workload seen 30 % above its prediction is placed at the observed peak plus
    /// the margin, and says so; other workloads, learning off, and a fraction engine are not.
    #[test]
    fn a_pending_pod_is_sized_from_its_workloads_profile() {
        let store = ProfileStore::default();
        store.set_policy(LearnPolicy::default());
        let t0 = 1_800_000_000;
        let mut over = seen("a", t0, 26 * GIB);
        over.predicted_bytes = 20 * GIB;
        store.set(chat(), fold(None, &[over], t0 + 60, 0.05));
        let sized = store.size(&request(20 * GIB), || Some(chat()), false);
        assert_eq!(sized.basis, SizeBasis::LearnedUp { pods: 1 });
        assert_eq!(
            sized.request.demand.fixed_bytes,
            LearnPolicy::default().with_margin(26 * GIB)
        );
        assert_eq!(sized.predicted_bytes, 20 * GIB);
        let note = sized.note.unwrap();
        assert!(
            note.contains("from 1 observed pod of deployment ml/chat"),
            "{note}"
        );
        assert!(note.contains("the model predicts 20.00 GiB"), "{note}");
        // Another workload: its prediction.
        let other = WorkloadKey {
            name: "other".into(),
            ..chat()
        };
        let plain = store.size(&request(20 * GIB), || Some(other), false);
        assert_eq!(plain.basis, SizeBasis::Predicted);
        assert_eq!(plain.request.demand.fixed_bytes, 20 * GIB);
        assert!(plain.note.is_none());
        // An explicit peakfit.io/vram is kept under `predicted`.
        let explicit = store.size(&request(20 * GIB), || Some(chat()), true);
        assert_eq!(explicit.basis, SizeBasis::Explicit);
        // Learning off: the prediction, and the workload is not even worked out.
        store.set_policy(LearnPolicy {
            mode: LearnMode::Off,
            ..LearnPolicy::default()
        });
        let off = store.size(&request(20 * GIB), || panic!("not asked"), false);
        assert_eq!(off.request.demand.fixed_bytes, 20 * GIB);
    }

    #[test]
    fn an_older_echo_of_a_profile_does_not_replace_a_newer_one() {
        let store = ProfileStore::default();
        let t0 = 1_800_000_000;
        let older = fold(None, &[seen("a", t0, 10 * GIB)], t0 + 60, 0.0);
        let newer = fold(Some(&older), &[seen("a", t0, 10 * GIB)], t0 + 120, 0.0);
        store.set(chat(), newer.clone());
        let mut echo = GpuWorkloadProfile::new(
            &super::super::profile_name(&chat()),
            super::super::GpuWorkloadProfileSpec {
                workload_kind: "Deployment".into(),
                workload_name: "chat".into(),
                inputs: "0".into(),
            },
        );
        echo.metadata.namespace = Some("ml".into());
        echo.status = Some(older);
        store.apply(&echo);
        assert_eq!(store.get(&chat()).unwrap().status, newer);
        // A deletion by object name forgets it.
        store.delete_object(&format!("ml/{}", super::super::profile_name(&chat())));
        assert!(store.get(&chat()).is_none());
    }

    #[test]
    fn recommendations_read_as_annotations() {
        assert_eq!(quantity(24 * GIB), "24Gi");
        assert_eq!(quantity(45 * (GIB / 2)), "22.5Gi");
        assert_eq!(recommend(0, 0.05), 0);
        assert_eq!(recommend(GIB, 0.0), GIB);
        assert_eq!(recommend(GIB + 1, 0.0), GIB + STEP);
        assert_eq!(p95((1..=100).collect()), 95);
        assert_eq!(p95(vec![7]), 7);
    }
}
