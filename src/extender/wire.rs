//! kube-scheduler's extender wire types (`k8s.io/kube-scheduler/extender/v1`), byte-compatible
//! with what Go's `encoding/json` writes.
//!
//! The Go structs carry no json tags, so the keys are the Go field names (PascalCase) and nil
//! pointers, maps and slices travel as `null`, never left out. Fields Go sends as nil pointers,
//! maps or slices are `Option`; the rest are plain values (strings also read `null` as empty). All
//! carry `#[serde(default)]` so that a missing key reads like Go's zero value, and the lower-case
//! spellings of pre-1.17 schedulers (and of Go's case-insensitive decoder) are accepted as aliases.
//!
//! Nodes in full-node mode are kept as the raw JSON the scheduler sent: the protocol wants them
//! echoed back unmodified, and re-encoding them through k8s-openapi would add `apiVersion`/`kind`
//! and drop Go's `null`s. Only each node's name is decoded.

use std::collections::BTreeMap;
use std::io;

use k8s_openapi::api::core::v1::Pod;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// The most an extender may score a node; the scheduler multiplies it by the weight and by 10.
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// Arguments of filter and prioritize.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ExtenderArgs {
    /// The pod being scheduled (managedFields stripped, no apiVersion/kind).
    #[serde(rename = "Pod", alias = "pod", default)]
    pub pod: Option<Pod>,
    /// Candidate nodes as whole objects; set only when `nodeCacheCapable: false`.
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    /// Candidate node names; set only when `nodeCacheCapable: true`.
    #[serde(
        rename = "NodeNames",
        alias = "nodenames",
        alias = "nodeNames",
        default
    )]
    pub node_names: Option<Vec<String>>,
}

/// A `v1.NodeList` as kube-scheduler writes it: `{"metadata":{},"items":[...]}`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeList {
    /// Always `{}` from the scheduler; kept verbatim.
    #[serde(default = "empty_object")]
    pub metadata: Box<RawValue>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub items: Vec<WireNode>,
}

fn empty_object() -> Box<RawValue> {
    RawValue::from_string("{}".to_owned()).expect("`{}` is valid JSON")
}

/// One Node exactly as received, with its name decoded.
#[derive(Debug)]
pub struct WireNode {
    pub name: String,
    raw: Box<RawValue>,
}

impl WireNode {
    pub fn raw_json(&self) -> &str {
        self.raw.get()
    }

    /// A node built from a k8s-openapi `Node` (tests, tools); it carries what serde writes.
    pub fn from_node(node: &k8s_openapi::api::core::v1::Node) -> serde_json::Result<Self> {
        let raw = serde_json::value::to_raw_value(node)?;
        Ok(Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            raw,
        })
    }

    /// Decodes the whole object; only callers that need more than the name pay for it.
    pub fn to_node(&self) -> serde_json::Result<k8s_openapi::api::core::v1::Node> {
        serde_json::from_str(self.raw.get())
    }
}

impl Clone for WireNode {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            raw: self.raw.clone(),
        }
    }
}

impl<'de> Deserialize<'de> for WireNode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Meta {
            #[serde(default)]
            name: Option<String>,
        }
        #[derive(Deserialize)]
        struct Named {
            #[serde(default)]
            metadata: Option<Meta>,
        }
        let raw = Box::<RawValue>::deserialize(d)?;
        let named: Named = serde_json::from_str(raw.get()).map_err(D::Error::custom)?;
        let name = named
            .metadata
            .and_then(|m| m.name)
            .ok_or_else(|| D::Error::custom("a node in Nodes.items has no metadata.name"))?;
        Ok(Self { name, raw })
    }
}

impl Serialize for WireNode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(s)
    }
}

/// Node name → why the pod cannot go there.
pub type FailedNodesMap = BTreeMap<String, String>;

/// The answer to filter.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ExtenderFilterResult {
    /// Nodes that pass, in full-node mode (the received objects, echoed).
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    /// Nodes that pass, in node-cache mode.
    #[serde(
        rename = "NodeNames",
        alias = "nodenames",
        alias = "nodeNames",
        default
    )]
    pub node_names: Option<Vec<String>>,
    /// Refused nodes where preemption might help.
    #[serde(rename = "FailedNodes", alias = "failedNodes", default)]
    pub failed_nodes: Option<FailedNodesMap>,
    /// Refused nodes where preemption cannot help; wins over `FailedNodes`.
    #[serde(
        rename = "FailedAndUnresolvableNodes",
        alias = "failedAndUnresolvableNodes",
        default
    )]
    pub failed_and_unresolvable_nodes: Option<FailedNodesMap>,
    /// Non-empty means the whole call failed.
    #[serde(
        rename = "Error",
        alias = "error",
        default,
        deserialize_with = "null_as_default"
    )]
    pub error: String,
}

/// One node's score from prioritize; the reply is a JSON array of these.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    #[serde(
        rename = "Host",
        alias = "host",
        default,
        deserialize_with = "null_as_default"
    )]
    pub host: String,
    #[serde(rename = "Score", alias = "score", default)]
    pub score: i64,
}

pub type HostPriorityList = Vec<HostPriority>;

/// Arguments of bind: the extender creates the Binding itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingArgs {
    #[serde(
        rename = "PodName",
        alias = "podName",
        default,
        deserialize_with = "null_as_default"
    )]
    pub pod_name: String,
    #[serde(
        rename = "PodNamespace",
        alias = "podNamespace",
        default,
        deserialize_with = "null_as_default"
    )]
    pub pod_namespace: String,
    #[serde(
        rename = "PodUID",
        alias = "podUID",
        default,
        deserialize_with = "null_as_default"
    )]
    pub pod_uid: String,
    #[serde(
        rename = "Node",
        alias = "node",
        default,
        deserialize_with = "null_as_default"
    )]
    pub node: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingResult {
    /// Non-empty means the bind failed and the scheduler retries the pod.
    #[serde(
        rename = "Error",
        alias = "error",
        default,
        deserialize_with = "null_as_default"
    )]
    pub error: String,
}

/// Arguments of preempt: per node, the pods the scheduler would evict.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ExtenderPreemptionArgs {
    #[serde(rename = "Pod", alias = "pod", default)]
    pub pod: Option<Pod>,
    /// Whole victim pods; set only when `nodeCacheCapable: false`.
    #[serde(rename = "NodeNameToVictims", alias = "nodeNameToVictims", default)]
    pub node_name_to_victims: Option<BTreeMap<String, Victims>>,
    /// Victim UIDs; set only when `nodeCacheCapable: true`.
    #[serde(
        rename = "NodeNameToMetaVictims",
        alias = "nodeNameToMetaVictims",
        default
    )]
    pub node_name_to_meta_victims: Option<BTreeMap<String, MetaVictims>>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Victims {
    #[serde(rename = "Pods", alias = "pods", default)]
    pub pods: Option<Vec<Pod>>,
    #[serde(rename = "NumPDBViolations", alias = "numPDBViolations", default)]
    pub num_pdb_violations: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaPod {
    #[serde(
        rename = "UID",
        alias = "uid",
        default,
        deserialize_with = "null_as_default"
    )]
    pub uid: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaVictims {
    #[serde(rename = "Pods", alias = "pods", default)]
    pub pods: Option<Vec<MetaPod>>,
    #[serde(rename = "NumPDBViolations", alias = "numPDBViolations", default)]
    pub num_pdb_violations: i64,
}

/// The answer to preempt: always the Meta form, whatever the mode.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderPreemptionResult {
    #[serde(
        rename = "NodeNameToMetaVictims",
        alias = "nodeNameToMetaVictims",
        default
    )]
    pub node_name_to_meta_victims: Option<BTreeMap<String, MetaVictims>>,
}

/// Go decodes `null` into a string or slice as its zero value; serde would refuse it.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Writes JSON the way Go's `json.Marshal` does: compact, and with `<`, `>`, `&`, U+2028 and
/// U+2029 escaped inside strings, so replies match Go's bytes even when a reason quotes a value.
pub fn to_go_json<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoFormatter);
    value.serialize(&mut ser)?;
    Ok(out)
}

struct GoFormatter;

impl serde_json::ser::Formatter for GoFormatter {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        // Node names and most reasons have nothing to escape: one byte scan, then one write
        // (a reply to a 5,000-node prioritize was a tenth of its time decoding chars here).
        // U+2028 and U+2029 both start with the byte 0xE2.
        if !fragment
            .bytes()
            .any(|b| matches!(b, b'<' | b'>' | b'&' | 0xE2))
        {
            return writer.write_all(fragment.as_bytes());
        }
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            let esc = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[start..i])?;
            writer.write_all(esc.as_bytes())?;
            start = i + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_fields_are_null_like_go() {
        let r = ExtenderFilterResult {
            node_names: Some(vec!["a".into()]),
            ..Default::default()
        };
        assert_eq!(
            String::from_utf8(to_go_json(&r).unwrap()).unwrap(),
            r#"{"Nodes":null,"NodeNames":["a"],"FailedNodes":null,"FailedAndUnresolvableNodes":null,"Error":""}"#
        );
    }

    #[test]
    fn go_escapes_html_characters() {
        let r = ExtenderBindingResult {
            error: "a<b>&c\u{2028}é".into(),
        };
        assert_eq!(
            String::from_utf8(to_go_json(&r).unwrap()).unwrap(),
            r#"{"Error":"a\u003cb\u003e\u0026c\u2028é"}"#
        );
        // Other characters starting with the byte 0xE2 (€, U+2029's neighbours) pass as they
        // are; a fragment with nothing to escape too.
        for (error, json) in [
            (
                "5 € \u{2027}\u{2029}",
                "{\"Error\":\"5 € \u{2027}\\u2029\"}",
            ),
            ("gpu-node-00042", "{\"Error\":\"gpu-node-00042\"}"),
        ] {
            let r = ExtenderBindingResult {
                error: error.into(),
            };
            assert_eq!(String::from_utf8(to_go_json(&r).unwrap()).unwrap(), json);
        }
    }

    #[test]
    fn lower_case_keys_of_old_schedulers_are_accepted() {
        let a: ExtenderArgs =
            serde_json::from_str(r#"{"pod":{"metadata":{"name":"p"}},"nodenames":["n"]}"#).unwrap();
        assert_eq!(a.node_names.unwrap(), ["n"]);
        assert_eq!(a.pod.unwrap().metadata.name.as_deref(), Some("p"));
    }

    #[test]
    fn a_node_without_a_name_is_refused_with_the_field_named() {
        let e = serde_json::from_str::<ExtenderArgs>(r#"{"Nodes":{"items":[{"spec":{}}]}}"#)
            .unwrap_err();
        assert!(e.to_string().contains("metadata.name"), "{e}");
    }
}
