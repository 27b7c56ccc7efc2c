//! Holds for pods that starve (issue 22): the extender's side of `placement::hold`.
//!
//! A pod that needs several nearly empty GPUs of one node waits while small pods take each
//! piece of memory as it frees. Once such a pod has waited `--reserve-after` since it was
//! created and filter finds it a node nowhere, filter chooses where it will go
//! (`placement::choose_hold`: the node whose GPUs free its share soonest, judged from the
//! ledger) and writes that choice on the pod as `peakfit.io/hold` (`cluster::hold`), with an
//! event. Every replica's pod watch reads the annotation into the node's ledger, where the held
//! bytes are committed for other pods of lower or equal priority (they bind there only beside
//! it) and free for the pod itself; so the hold survives restarts and leader failover. It ends
//! when the pod binds (anywhere), is deleted, or at `--reserve-deadline`; it may then be made
//! again.
//!
//! Waiting is counted from the pod's creation: the API server's timestamp is the same in every
//! replica and after a restart, where the first refusal a replica saw is not.
//!
//! The write is conditioned on the `resourceVersion` filter saw, and kube-scheduler records its
//! failed attempt on the pod (`PodScheduled=False`) at the same moment, so the write often meets
//! a conflict. `write_hold` then reads the pod again and writes on its new version, unless the
//! pod is no longer pending or another replica's hold is on it, which it adopts. An expired hold
//! is removed from its pod by the sweep (`clear_expired`), with the same care: only that very
//! annotation, on the version it was read at.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;

use super::Extender;
use crate::cluster::binding::{BindTarget, BindingWriter};
use crate::cluster::hold::{
    AfterConflict, ClearStep, HOLD, HoldNote, after_write_conflict, clear_step, clock_time,
    gpu_list,
};
use crate::cluster::index::{ExpiredHold, NodeState};
use crate::flags::parse_duration;
use crate::metrics::extender::{ExtenderMetrics, OutcomeLabels};
use crate::placement::{HoldConfig, NodeLedger, PodClass, PodKey, Rejection, choose_hold};

/// `--reserve-after`: a duration, or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReserveAfter(pub Option<Duration>);

pub fn parse_reserve_after(s: &str) -> Result<ReserveAfter, String> {
    if s.trim() == "off" {
        return Ok(ReserveAfter(None));
    }
    parse_duration(s)
        .map(|d| ReserveAfter(Some(d)))
        .map_err(|e| format!("--reserve-after (or PEAKFIT_RESERVE_AFTER): {e}, or off"))
}

/// `--reserve-max`: a fraction of the GPU nodes above 0 and at most 1.
pub fn parse_reserve_max(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!(
            "--reserve-max (or PEAKFIT_RESERVE_MAX) {s:?}: a fraction of the GPU nodes above 0 and \
             at most 1, such as 0.1"
        )),
    }
}

/// The flags of holds. The defaults are the simulation's (`docs/simulate.md`, "Holds for pods
/// that starve"): 30 minutes, the issue's figure and the lowest 70B p95 of the sweep; a one-hour
/// deadline, which bounds what a wrong guess idles; a tenth of the nodes, since every larger cap
/// made every kind of pod wait longer.
#[derive(Clone, Debug, clap::Args)]
pub struct HoldArgs {
    /// A pending pod that fits on no node once it has existed this long gets a hold: the node
    /// and GPUs it will get keep its memory (others bind there only beside it) until it binds
    /// (`off`: no holds).
    #[arg(
        long,
        env = "PEAKFIT_RESERVE_AFTER",
        default_value = "30m",
        value_name = "DURATION|off",
        value_parser = parse_reserve_after
    )]
    pub reserve_after: ReserveAfter,
    /// How long a hold lasts if its pod has not bound (it may then be made again).
    #[arg(long, env = "PEAKFIT_RESERVE_DEADLINE", default_value = "1h", value_parser = crate::flags::parse_nonzero_duration)]
    pub reserve_deadline: Duration,
    /// Holds at once, as a fraction of the GPU nodes (rounded up, at least one): each idles
    /// memory while its GPUs drain.
    #[arg(long, env = "PEAKFIT_RESERVE_MAX", default_value = "0.1", value_parser = parse_reserve_max)]
    pub reserve_max: f64,
}

/// Holds as the extender makes them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HoldSettings {
    pub after: Duration,
    pub deadline: Duration,
    /// Holds at once, as a fraction of the GPU nodes.
    pub per_node: f64,
}

impl HoldArgs {
    /// `None` under `--reserve-after off`.
    pub fn settings(&self) -> Option<HoldSettings> {
        self.reserve_after.0.map(|after| HoldSettings {
            after,
            deadline: self.reserve_deadline,
            per_node: self.reserve_max,
        })
    }
}

impl HoldSettings {
    /// The core's settings for a cluster of `nodes` nodes, as the simulator builds them.
    pub fn config(&self, nodes: usize) -> HoldConfig {
        let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
        HoldConfig {
            after_secs: secs(self.after),
            deadline_secs: secs(self.deadline),
            max_holds: crate::convert::f64_to_usize((self.per_node * nodes as f64).ceil()).max(1),
        }
    }
}

/// `45 s`, `31 min`, `5 h 20 min`: how long a pod waited, as its event says it.
fn waited_words(secs: i64) -> String {
    match secs {
        ..120 => format!("{secs} s"),
        120..7200 => format!("{} min", secs / 60),
        _ => format!("{} h {} min", secs / 3600, secs % 3600 / 60),
    }
}

/// Pods whose hold is being written, so a filter repeated meanwhile does not write a second.
pub(super) type InFlight = Arc<Mutex<HashSet<PodKey>>>;

/// The words added to a refusal when holds in force keep this pod out of a node's memory
/// ("GPUs 0-3's memory is held for ml/llama-70b until 15:30:00 UTC (peakfit.io/hold) ..."), and
/// whether the pod would fit without them, which makes the reason `held_for_pod`. `None` when no
/// hold binds the pod there or the refusal is not about memory or GPUs.
pub(super) fn hold_words(
    st: &NodeState,
    ledger: &NodeLedger,
    (pod, priority): (&str, i32),
    r: &Rejection,
    now: i64,
    fits: impl Fn(&NodeLedger) -> bool,
) -> Option<(String, bool)> {
    if !matches!(
        r,
        Rejection::NotEnoughMemory { .. } | Rejection::TooFewGpus { .. }
    ) {
        return None;
    }
    let binding: Vec<_> = st.holds_binding(Some(pod), priority, now).collect();
    if binding.is_empty() {
        return None;
    }
    let mut freed = ledger.clone();
    let words: Vec<String> = binding
        .iter()
        .map(|h| {
            freed.unhold(&h.pod);
            let gpus: Vec<u32> = h
                .gpus
                .iter()
                .map(|&i| crate::convert::usize_to_u32(i))
                .collect();
            format!(
                "{}'s memory is held for {}/{} until {} ({HOLD}: it waited too long and fits \
                 nowhere else; pods that fit beside it still bind, pods of higher priority \
                 than its {} are not kept out)",
                gpu_list(&gpus),
                h.namespace,
                h.name,
                clock_time(h.until_unix, now),
                h.priority
            )
        })
        .collect();
    Some((words.join("; "), fits(&freed)))
}

/// Writes after the first that a hold's write or removal may take when the pod keeps changing
/// under it: kube-scheduler writes a pending pod once per attempt, so a second conflict in a
/// row is already rare, and a pod that changes faster than this gets its hold on a later filter.
pub const WRITE_RETRIES: usize = 3;

/// How a hold's write ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HoldWrite {
    /// Written (after `conflicts` conflicts).
    Written { conflicts: usize },
    /// Another replica's hold was on the pod: this one, to record instead.
    Adopted(HoldNote),
    /// Not written, and why.
    NotWritten(String),
}

/// Writes the hold `value` on `target`, first on `resource_version` (the version filter saw);
/// after a conflict, reads the pod again and writes on its new version as
/// `cluster::hold::after_write_conflict` decides, at most `WRITE_RETRIES` more times. Each
/// conflict is counted in `peakfit_holds_write_conflicts_total` by what followed it.
pub async fn write_hold(
    binder: &dyn BindingWriter,
    metrics: &ExtenderMetrics,
    (target, value, event): (&BindTarget, &str, &str),
    resource_version: Option<String>,
    now: i64,
) -> HoldWrite {
    let conflict = |outcome| {
        metrics
            .holds_write_conflicts
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    };
    let mut version = resource_version;
    let mut conflicts = 0;
    loop {
        let err = match binder.hold(target, value, version.as_deref(), event).await {
            Ok(()) => return HoldWrite::Written { conflicts },
            Err(e) if e.is_conflict() => e,
            Err(e) => return HoldWrite::NotWritten(e.to_string()),
        };
        conflicts += 1;
        if conflicts > WRITE_RETRIES {
            conflict("given_up");
            return HoldWrite::NotWritten(format!("{err} ({conflicts} conflicts in a row)"));
        }
        let fresh = match binder.get_pod(&target.namespace, &target.name).await {
            Ok(p) => p,
            Err(e) => {
                conflict("given_up");
                return HoldWrite::NotWritten(format!("{err}; then {e}"));
            }
        };
        match after_write_conflict(fresh.as_ref(), target.uid.as_deref(), now) {
            AfterConflict::WriteAgain { resource_version } => {
                conflict("retried");
                tracing::debug!(
                    pod = %format!("{}/{}", target.namespace, target.name),
                    %resource_version, "the hold met a conflict; writing it on the pod's new version"
                );
                version = Some(resource_version);
            }
            AfterConflict::Adopt(note) => {
                conflict("adopted");
                return HoldWrite::Adopted(note);
            }
            AfterConflict::GiveUp(why) => {
                conflict("given_up");
                return HoldWrite::NotWritten(format!("{err}; read again: {why}"));
            }
        }
    }
}

/// Removes the expired hold `expired` from its pod if the pod still carries exactly it: reads
/// the pod, decides (`cluster::hold::clear_step`) and removes it on the version read; after a
/// conflict (another replica removed it first, or the pod changed) reads it again, at most
/// `WRITE_RETRIES` more times. Whether this call removed it.
pub async fn clear_expired(
    binder: &dyn BindingWriter,
    expired: &ExpiredHold,
) -> Result<bool, String> {
    let target = BindTarget {
        namespace: expired.namespace.clone(),
        name: expired.name.clone(),
        uid: expired.uid.clone(),
        node: expired.note.node.clone(),
    };
    for _ in 0..=WRITE_RETRIES {
        let fresh = binder
            .get_pod(&target.namespace, &target.name)
            .await
            .map_err(|e| e.to_string())?;
        let resource_version =
            match clear_step(fresh.as_ref(), target.uid.as_deref(), &expired.note) {
                ClearStep::Clear { resource_version } => resource_version,
                ClearStep::Leave(why) => {
                    tracing::debug!(
                        pod = %format!("{}/{}", target.namespace, target.name),
                        why, "the expired hold is not removed"
                    );
                    return Ok(false);
                }
            };
        match binder.clear_hold(&target, &resource_version).await {
            Ok(()) => return Ok(true),
            Err(e) if e.is_conflict() => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Err(format!(
        "the pod changed under each of {} removals",
        WRITE_RETRIES + 1
    ))
}

impl Extender {
    /// Holds as `holds` says. Holds that expire from now on are this replica's to count (see
    /// `sweep_holds`): call it after `with_clock`.
    pub fn with_holds(mut self, holds: Option<HoldSettings>) -> Self {
        self.holds = holds;
        self.holds_since = self.now();
        self
    }

    /// Filter found `pod` a node nowhere: if it has waited long enough, has no hold in force
    /// and the cap leaves room, chooses its hold among the candidates and writes it (in the
    /// background: filter answers at once, and the scheduler retries the pod when the
    /// annotation changes it).
    pub(super) fn maybe_hold(
        &self,
        pod: &Pod,
        key: &str,
        class: &PodClass,
        names: &[&str],
        now: i64,
    ) {
        let Some(settings) = self.holds else { return };
        if self.index.hold_of(key).is_some_and(|h| h.active_at(now)) {
            return;
        }
        let Some(created) = pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second())
        else {
            return;
        };
        let waited = now.saturating_sub(created);
        if waited < i64::try_from(settings.after.as_secs()).unwrap_or(i64::MAX) {
            return;
        }
        // Counting the GPU nodes reads every slot: only for a pod that has waited long enough,
        // not on each refusal of a young pod (the common case).
        let cfg = settings.config(self.index.gpu_node_count());
        if self.index.holds_active(now) >= cfg.max_holds {
            return;
        }
        if !self.hold_writes.lock().insert(key.to_owned()) {
            return;
        }
        // The candidates as any pod sees them, holds past their deadline dropped: the choice
        // skips GPUs another pod holds.
        let ledgers: Vec<NodeLedger> = self
            .index
            .map_slots(names, |slot| {
                slot.map(|s| s.read().seen_by(None, i32::MIN, now).into_owned())
            })
            .into_iter()
            .flatten()
            .collect();
        let chosen = choose_hold(
            &ledgers,
            key,
            class,
            &self.fit,
            |k| self.index.started_of(k),
            now,
        );
        let Some((n, placement)) = chosen else {
            self.hold_writes.lock().remove(key);
            tracing::debug!("no node could ever take the pod: no hold");
            return;
        };
        let node = &ledgers[n];
        let note = HoldNote {
            node: node.name.clone(),
            gpus: placement
                .gpu_indices
                .iter()
                .map(|&i| node.gpus[i].uuid.clone())
                .collect(),
            bytes: placement.per_gpu_bytes.clone(),
            made_unix: now,
            until_unix: now.saturating_add(cfg.deadline_secs),
        };
        let gpus: Vec<u32> = placement
            .gpu_indices
            .iter()
            .map(|&i| crate::convert::usize_to_u32(i))
            .collect();
        let event = format!(
            "holding {} of node {} until {}: the pod waited {} and fits nowhere; pods that fit \
             beside it still bind",
            gpu_list(&gpus),
            note.node,
            clock_time(note.until_unix, now),
            waited_words(waited)
        );
        let target = BindTarget {
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().filter(|u| !u.is_empty()),
            node: note.node.clone(),
        };
        let resource_version = pod.metadata.resource_version.clone();
        let (binder, index, metrics, writes) = (
            self.binder.clone(),
            self.index.clone(),
            self.metrics.clone(),
            self.hold_writes.clone(),
        );
        let key = key.to_owned();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            writes.lock().remove(&key);
            return;
        };
        runtime.spawn(async move {
            let value = note.to_annotation();
            let written = write_hold(
                binder.as_ref(),
                &metrics,
                (&target, &value, &event),
                resource_version,
                now,
            )
            .await;
            let pod = format!("{}/{}", target.namespace, target.name);
            match written {
                HoldWrite::Written { conflicts } => {
                    tracing::info!(%pod, node = %note.node, %event, conflicts, "hold made");
                    index.record_hold(&key, note);
                    metrics.holds_made.inc();
                }
                HoldWrite::Adopted(theirs) => {
                    tracing::info!(
                        %pod, node = %theirs.node,
                        "another replica's hold is on the pod: kept, none written"
                    );
                    index.record_hold(&key, theirs);
                }
                // The pod bound, went, or changed under every retry; the next filter sees it.
                HoldWrite::NotWritten(why) => {
                    tracing::info!(%pod, error = %why, "the hold was not written");
                }
            }
            writes.lock().remove(&key);
        });
    }

    /// Ends the holds past their deadline and sets the holds gauge: every second in the
    /// background, and at each scrape. Each ended hold is removed from its pod (in the
    /// background), so `kubectl describe` shows no stale hold; of several replicas sweeping it,
    /// the first removal wins and the others find it gone. `peakfit_holds_expired_total` counts
    /// only holds that expire while this replica runs: one already past its deadline when the
    /// watch first brought it (after a restart, say) was counted by the process that saw it end.
    pub fn sweep_holds(&self) {
        let now = self.now();
        let runtime = tokio::runtime::Handle::try_current().ok();
        for expired in self.index.expire_holds(now) {
            let pod = format!("{}/{}", expired.namespace, expired.name);
            if expired.note.until_unix > self.holds_since {
                tracing::info!(
                    %pod, node = %expired.note.node,
                    "the hold reached its deadline before the pod bound"
                );
                self.metrics.holds_expired.inc();
            } else {
                tracing::debug!(%pod, "a hold past its deadline before this replica started");
            }
            let Some(runtime) = &runtime else { continue };
            let (binder, metrics) = (self.binder.clone(), self.metrics.clone());
            runtime.spawn(async move {
                match clear_expired(binder.as_ref(), &expired).await {
                    Ok(true) => {
                        tracing::info!(%pod, "the expired hold was removed from the pod");
                        metrics.holds_cleared.inc();
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!(%pod, error = %e, "the expired hold stays on the pod"),
                }
            });
        }
        self.metrics
            .holds_active
            .set(i64::try_from(self.index.holds_active(now)).unwrap_or(i64::MAX));
    }
}

/// Sweeps the holds every second (`Extender::sweep_holds`).
pub fn spawn_sweeper(ext: Arc<Extender>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            ext.sweep_holds();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_and_name_themselves_when_wrong() {
        assert_eq!(parse_reserve_after("off"), Ok(ReserveAfter(None)));
        assert_eq!(
            parse_reserve_after("5s"),
            Ok(ReserveAfter(Some(Duration::from_secs(5))))
        );
        let e = parse_reserve_after("soon").unwrap_err();
        assert!(
            e.contains("PEAKFIT_RESERVE_AFTER") && e.contains("off"),
            "{e}"
        );
        assert_eq!(parse_reserve_max("0.1"), Ok(0.1));
        for bad in ["0", "-1", "1.5", "NaN", "lots"] {
            let e = parse_reserve_max(bad).unwrap_err();
            assert!(e.contains("--reserve-max"), "{e}");
        }
        let s = HoldSettings {
            after: Duration::from_secs(1800),
            deadline: Duration::from_secs(3600),
            per_node: 0.1,
        };
        assert_eq!(
            s.config(20),
            HoldConfig {
                after_secs: 1800,
                deadline_secs: 3600,
                max_holds: 2
            }
        );
        assert_eq!(s.config(1).max_holds, 1, "at least one");
        assert_eq!(s.config(0).max_holds, 1);
        assert_eq!(waited_words(6), "6 s");
        assert_eq!(waited_words(1860), "31 min");
        assert_eq!(waited_words(19_200), "5 h 20 min");
    }
}
