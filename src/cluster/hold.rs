//! A hold as the API server keeps it: the `peakfit.io/hold` annotation on the pending pod it is
//! for (issue 22). The pod itself is the store: every replica's pod watch reads it into the
//! index, so a hold survives a restart or a leader failover with nothing else to keep, and it
//! goes with the pod when the pod is deleted. The extender writes it with the pod's
//! `resourceVersion` as precondition, so two replicas cannot both make one for a pod.

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
}
