//! A hold as the API server keeps it: the `peakfit.io/hold` annotation on the pending pod it is
//! for (issue 22). The pod itself is the store: every replica's pod watch reads it into the
//! index, so a hold survives a restart or a leader failover with nothing else to keep, and it
//! goes with the pod when the pod is deleted. The extender writes it with the pod's
//! `resourceVersion` as precondition, so two replicas cannot both make one for a pod; after a
//! conflict it reads the pod again and decides here (`after_write_conflict`) whether to write
//! again. An expired hold is removed from its pod the same way (`clear_step`), so `kubectl
//! describe` shows no stale hold.

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

pub use crate::model::annotations::HOLD;

/// The most GPUs a hold names: more than any node has, few enough that a hostile annotation
/// cannot make the index keep a long list.
pub const MAX_HOLD_GPUS: usize = 64;

/// The annotation's value: where the pod's memory is kept and until when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HoldNote {
    pub node: String,
    /// The held GPUs' UUIDs, as `peakfit.io/assigned-gpus` names them: a GPU's index can change
    /// when the report does, its UUID cannot.
    pub gpus: Vec<String>,
    /// Bytes kept on each GPU, in the order of `gpus`: the pod's share there, so that every
    /// replica keeps the same bytes whatever its own sizing of the pod says later.
    pub bytes: Vec<u64>,
    pub made_unix: i64,
    pub until_unix: i64,
}

/// Why an annotation is not a hold: the field, its value, and what is allowed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("annotation {HOLD}: {field} {value} is not valid: {allowed}")]
pub struct HoldNoteError {
    pub field: &'static str,
    pub value: String,
    pub allowed: &'static str,
}

impl HoldNote {
    /// Parses and checks an annotation's value.
    pub fn parse(value: &str) -> Result<Self, HoldNoteError> {
        let bad = |field, value: String, allowed| HoldNoteError {
            field,
            value: crate::clip::clip(&value).into_owned(),
            allowed,
        };
        let note: Self = serde_json::from_str(value).map_err(|e| {
            bad(
                "value",
                format!("{value:?} ({e})"),
                "a JSON object {\"node\", \"gpus\", \"bytes\", \"madeUnix\", \"untilUnix\"}",
            )
        })?;
        if note.node.is_empty() {
            return Err(bad("node", "\"\"".into(), "a node name"));
        }
        if note.gpus.is_empty() || note.gpus.len() > MAX_HOLD_GPUS {
            return Err(bad(
                "gpus",
                format!("{} GPUs", note.gpus.len()),
                "1 to 64 GPU UUIDs",
            ));
        }
        if note.bytes.len() != note.gpus.len() {
            return Err(bad(
                "bytes",
                format!("{} entries for {} GPUs", note.bytes.len(), note.gpus.len()),
                "one byte count per GPU",
            ));
        }
        if let Some(b) = note
            .bytes
            .iter()
            .find(|&&b| b == 0 || b > crate::cluster::index::MAX_RESERVED_BYTES)
        {
            return Err(bad("bytes", b.to_string(), "1 to 2^60 bytes per GPU"));
        }
        if note.until_unix <= note.made_unix {
            return Err(bad(
                "untilUnix",
                note.until_unix.to_string(),
                "a time after madeUnix",
            ));
        }
        Ok(note)
    }

    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("a hold note serialises")
    }

    /// Whether the hold still stands at `now` (Unix seconds).
    pub fn active_at(&self, now: i64) -> bool {
        self.until_unix > now
    }
}

/// What a hold's writer does after the API server refused its write with a conflict, given the
/// pod as it is now: the `resourceVersion` filter saw is often stale by then, because
/// kube-scheduler records its failed attempt (`PodScheduled=False`) on the pod at the same time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterConflict {
    /// The same pod, still pending, with no hold in force: write again on this version.
    WriteAgain { resource_version: String },
    /// Another replica's hold is in force: keep it rather than overwrite it.
    Adopt(HoldNote),
    /// Nothing to write, and why.
    GiveUp(&'static str),
}

/// The pod read back, if it is still the pending pod `uid` names; else why it takes no write: it
/// is gone, another pod under its name, being deleted, or bound.
fn pending_pod<'a>(pod: Option<&'a Pod>, uid: Option<&str>) -> Result<&'a Pod, &'static str> {
    let pod = pod.ok_or("the pod is gone")?;
    if uid.is_some_and(|u| pod.metadata.uid.as_deref() != Some(u)) {
        return Err("the pod was recreated under its name");
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Err("the pod is being deleted");
    }
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
    {
        return Err("the pod is bound");
    }
    Ok(pod)
}

fn hold_annotation(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HOLD))
        .map(String::as_str)
}

/// Decides the next step of a hold's write refused with a conflict, from `fresh`, the pod as a
/// GET returned it (`None`: not found), `uid` the pod the hold is for and `now` (Unix seconds).
/// A malformed or expired annotation is no hold: it is overwritten, as the watch ignores it.
pub fn after_write_conflict(fresh: Option<&Pod>, uid: Option<&str>, now: i64) -> AfterConflict {
    let pod = match pending_pod(fresh, uid) {
        Ok(pod) => pod,
        Err(why) => return AfterConflict::GiveUp(why),
    };
    if let Some(note) = hold_annotation(pod)
        .and_then(|v| HoldNote::parse(v).ok())
        .filter(|n| n.active_at(now))
    {
        return AfterConflict::Adopt(note);
    }
    match pod.metadata.resource_version.as_deref() {
        Some(rv) if !rv.is_empty() => AfterConflict::WriteAgain {
            resource_version: rv.to_owned(),
        },
        _ => AfterConflict::GiveUp("the pod has no resourceVersion to write on"),
    }
}

/// Whether to remove an expired hold from its pod, given the pod as a GET returned it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClearStep {
    /// The pod still carries exactly the expired hold: remove it on this version.
    Clear { resource_version: String },
    /// Leave the pod as it is, and why.
    Leave(&'static str),
}

/// Decides whether the expired hold `expired` is removed from `fresh` (the pod as a GET returned
/// it; `None`: not found), the pod `uid` names. Only the very annotation that expired is removed:
/// a new hold written meanwhile (by any replica) stands, and a bound pod keeps its annotation as
/// the record of where it waited.
pub fn clear_step(fresh: Option<&Pod>, uid: Option<&str>, expired: &HoldNote) -> ClearStep {
    let pod = match pending_pod(fresh, uid) {
        Ok(pod) => pod,
        Err(why) => return ClearStep::Leave(why),
    };
    match hold_annotation(pod) {
        None => return ClearStep::Leave("the annotation is already gone"),
        Some(v) if HoldNote::parse(v).as_ref() != Ok(expired) => {
            return ClearStep::Leave("the pod carries another hold now");
        }
        Some(_) => {}
    }
    match pod.metadata.resource_version.as_deref() {
        Some(rv) if !rv.is_empty() => ClearStep::Clear {
            resource_version: rv.to_owned(),
        },
        _ => ClearStep::Leave("the pod has no resourceVersion to write on"),
    }
}

/// `15:30 UTC` (or the date too when it is not today's): when a hold ends, in an event or a
/// refusal an operator reads.
pub fn clock_time(unix: i64, now: i64) -> String {
    let (Ok(t), Ok(n)) = (
        jiff::Timestamp::from_second(unix),
        jiff::Timestamp::from_second(now),
    ) else {
        return format!("{unix} (Unix seconds)");
    };
    let (t, n) = (
        t.to_zoned(jiff::tz::TimeZone::UTC),
        n.to_zoned(jiff::tz::TimeZone::UTC),
    );
    if t.date() == n.date() {
        t.strftime("%H:%M:%S UTC").to_string()
    } else {
        t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string()
    }
}

/// `GPUs 0-3`, `GPU 2`, `GPUs 0, 2, 5`: report indices as an operator reads them.
pub fn gpu_list(indices: &[u32]) -> String {
    let mut sorted = indices.to_vec();
    sorted.sort_unstable();
    let contiguous = sorted.windows(2).all(|w| w[1] == w[0] + 1);
    match sorted.as_slice() {
        [] => "no GPU".into(),
        [one] => format!("GPU {one}"),
        [first, .., last] if contiguous => format!("GPUs {first}-{last}"),
        many => format!(
            "GPUs {}",
            many.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note() -> HoldNote {
        HoldNote {
            node: "node-7".into(),
            gpus: vec!["GPU-a".into(), "GPU-b".into()],
            bytes: vec![70 << 30, 70 << 30],
            made_unix: 1_000,
            until_unix: 4_600,
        }
    }

    #[test]
    fn the_annotation_round_trips() {
        let text = note().to_annotation();
        assert_eq!(
            text,
            r#"{"node":"node-7","gpus":["GPU-a","GPU-b"],"bytes":[75161927680,75161927680],"madeUnix":1000,"untilUnix":4600}"#
        );
        assert_eq!(HoldNote::parse(&text), Ok(note()));
        assert!(note().active_at(4_599));
        assert!(!note().active_at(4_600), "ends at its deadline");
    }

    #[test]
    fn a_malformed_annotation_names_the_field() {
        let err = |v: &str| HoldNote::parse(v).unwrap_err();
        assert_eq!(err("not json").field, "value");
        assert_eq!(
            err(r#"{"node":"n","gpus":["a"],"bytes":[1],"madeUnix":1,"untilUnix":2,"x":1}"#).field,
            "value",
            "unknown fields are refused"
        );
        assert_eq!(
            err(r#"{"node":"","gpus":["a"],"bytes":[1],"madeUnix":1,"untilUnix":2}"#).field,
            "node"
        );
        assert_eq!(
            err(r#"{"node":"n","gpus":[],"bytes":[],"madeUnix":1,"untilUnix":2}"#).field,
            "gpus"
        );
        let e = err(r#"{"node":"n","gpus":["a","b"],"bytes":[1],"madeUnix":1,"untilUnix":2}"#);
        assert_eq!(e.field, "bytes");
        assert!(e.to_string().contains("one byte count per GPU"), "{e}");
        assert_eq!(
            err(r#"{"node":"n","gpus":["a"],"bytes":[0],"madeUnix":1,"untilUnix":2}"#).field,
            "bytes"
        );
        assert_eq!(
            err(r#"{"node":"n","gpus":["a"],"bytes":[1],"madeUnix":2,"untilUnix":2}"#).field,
            "untilUnix"
        );
    }

    #[test]
    fn times_and_gpus_read_as_an_operator_writes_them() {
        // 2026-11-26 15:30:00 UTC.
        let t = 1_795_707_000;
        assert_eq!(clock_time(t, t - 60), "15:30:00 UTC");
        assert_eq!(clock_time(t + 86_400, t), "2026-11-27 15:30:00 UTC");
        assert_eq!(gpu_list(&[3, 1, 2, 0]), "GPUs 0-3");
        assert_eq!(gpu_list(&[2]), "GPU 2");
        assert_eq!(gpu_list(&[0, 2, 5]), "GPUs 0, 2, 5");
    }

    /// The pending pod `uid-big` at resourceVersion `rv`, with `hold` as its annotation.
    fn fresh(rv: &str, hold: Option<&str>) -> Pod {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "big", "namespace": "ml", "uid": "uid-big", "resourceVersion": rv},
            "spec": {"containers": [{"name": "main"}]},
        }))
        .unwrap();
        if let Some(h) = hold {
            pod.metadata.annotations = Some([(HOLD.to_owned(), h.to_owned())].into());
        }
        pod
    }

    #[test]
    fn after_a_conflict_the_fresh_pod_decides_write_again_adopt_or_give_up() {
        let uid = Some("uid-big");
        let again = |rv: &str| AfterConflict::WriteAgain {
            resource_version: rv.into(),
        };
        // kube-scheduler's status update came first: no hold, write on the new version.
        assert_eq!(
            after_write_conflict(Some(&fresh("43", None)), uid, 2_000),
            again("43")
        );
        // An expired or malformed hold is no hold: overwritten.
        let old = note().to_annotation();
        assert_eq!(
            after_write_conflict(Some(&fresh("44", Some(&old))), uid, 4_600),
            again("44")
        );
        assert_eq!(
            after_write_conflict(Some(&fresh("45", Some("{}"))), uid, 2_000),
            again("45")
        );
        // Another replica's hold in force: adopted, not overwritten.
        assert_eq!(
            after_write_conflict(Some(&fresh("46", Some(&old))), uid, 4_599),
            AfterConflict::Adopt(note())
        );
        // Not the pending pod any more.
        let give_up = |pod: Option<&Pod>| match after_write_conflict(pod, uid, 2_000) {
            AfterConflict::GiveUp(why) => why,
            other => panic!("{other:?}"),
        };
        assert_eq!(give_up(None), "the pod is gone");
        let mut other = fresh("47", None);
        other.metadata.uid = Some("uid-new".into());
        assert_eq!(
            give_up(Some(&other)),
            "the pod was recreated under its name"
        );
        let mut bound = fresh("48", None);
        bound.spec.as_mut().unwrap().node_name = Some("node-1".into());
        assert_eq!(give_up(Some(&bound)), "the pod is bound");
        let mut going = fresh("49", None);
        going.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
        assert_eq!(give_up(Some(&going)), "the pod is being deleted");
        assert!(give_up(Some(&fresh("", None))).contains("resourceVersion"));
        // A pod without a UID (file mode) is matched by name alone.
        assert_eq!(
            after_write_conflict(Some(&fresh("50", None)), None, 2_000),
            again("50")
        );
    }

    #[test]
    fn only_the_very_hold_that_expired_is_cleared() {
        let uid = Some("uid-big");
        let old = note().to_annotation();
        assert_eq!(
            clear_step(Some(&fresh("60", Some(&old))), uid, &note()),
            ClearStep::Clear {
                resource_version: "60".into()
            }
        );
        let leave = |pod: Option<&Pod>| match clear_step(pod, uid, &note()) {
            ClearStep::Leave(why) => why,
            ClearStep::Clear { .. } => panic!("cleared"),
        };
        assert_eq!(
            leave(Some(&fresh("61", None))),
            "the annotation is already gone"
        );
        let mut newer = note();
        newer.made_unix = 4_600;
        newer.until_unix = 8_200;
        assert_eq!(
            leave(Some(&fresh("62", Some(&newer.to_annotation())))),
            "the pod carries another hold now"
        );
        let mut bound = fresh("63", Some(&old));
        bound.spec.as_mut().unwrap().node_name = Some("node-7".into());
        assert_eq!(leave(Some(&bound)), "the pod is bound");
        assert_eq!(leave(None), "the pod is gone");
    }
}
