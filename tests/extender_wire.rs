//! The wire types against the exact bytes Go's `json.Marshal` writes (upstream's compatibility
//! strings, both apimachinery eras) and a filter result the kube-scheduler-simulator recorded.

use std::path::{Path, PathBuf};

use peakfit::extender::wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult,
    ExtenderPreemptionArgs, ExtenderPreemptionResult, HostPriority, to_go_json,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

const ERAS: [&str; 2] = ["k8s-1.21-to-1.33", "k8s-1.34plus"];

/// Go's bytes, shipped in `tests/fixtures` (`SOURCES.md` there says where each came from).
fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/extender-v1-types")
}

fn read(d: &Path, name: &str) -> String {
    std::fs::read_to_string(d.join(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .trim_end()
        .to_owned()
}

/// Decodes Go's bytes and writes them back: they must come out identical.
fn byte_exact<T: DeserializeOwned + Serialize>(d: &Path, name: &str) -> T {
    let go = read(d, name);
    let v: T = serde_json::from_str(&go).unwrap_or_else(|e| panic!("{name}: {e}"));
    let ours = String::from_utf8(to_go_json(&v).unwrap()).unwrap();
    assert_eq!(ours, go, "{name}");
    v
}

#[test]
fn results_and_small_types_round_trip_byte_for_byte() {
    let d = dir();
    for era in ERAS {
        let b: ExtenderBindingArgs =
            byte_exact(&d, &format!("compat-ExtenderBindingArgs.{era}.json"));
        assert_eq!(
            (
                b.pod_name.as_str(),
                b.pod_namespace.as_str(),
                b.pod_uid.as_str(),
                b.node.as_str()
            ),
            ("mypodname", "mypodnamespace", "mypoduid", "mynode")
        );
        let r: ExtenderBindingResult =
            byte_exact(&d, &format!("compat-ExtenderBindingResult.{era}.json"));
        assert_eq!(r.error, "myerror");
        let h: HostPriority = byte_exact(&d, &format!("compat-HostPriority.{era}.json"));
        assert_eq!((h.host.as_str(), h.score), ("myhost", 1));
        let p: ExtenderPreemptionResult =
            byte_exact(&d, &format!("compat-ExtenderPreemptionResult.{era}.json"));
        let foo = &p.node_name_to_meta_victims.unwrap()["foo"];
        assert_eq!(foo.pods.as_ref().unwrap()[0].uid, "myuid");
        assert_eq!(foo.num_pdb_violations, 1);
        // Nodes are echoed as received, so even the old era's `"creationTimestamp":null` survives.
        let f: ExtenderFilterResult =
            byte_exact(&d, &format!("compat-ExtenderFilterResult.{era}.json"));
        assert_eq!(f.nodes.unwrap().items[0].name, "nodename");
        assert_eq!(f.node_names.unwrap(), ["node1"]);
        assert_eq!(f.failed_nodes.unwrap()["foo"], "bar");
        assert_eq!(f.failed_and_unresolvable_nodes.unwrap()["baz"], "qux");
        assert_eq!(f.error, "myerror");
    }
}

#[test]
fn a_filter_result_recorded_by_the_simulator_round_trips() {
    let d = dir();
    let f: ExtenderFilterResult = byte_exact(&d, "simulator-capture-ExtenderFilterResult.json");
    assert_eq!(f.nodes.as_ref().unwrap().items[0].name, "node-tzjll");
    assert!(f.node_names.is_none());
    assert!(f.failed_and_unresolvable_nodes.is_none());
    // The echoed node still decodes as a real Node.
    let node = f.nodes.unwrap().items[0].to_node().unwrap();
    assert_eq!(node.status.unwrap().capacity.unwrap()["cpu"].0, "4");
}

/// Requests carry a Pod, which peakfit only reads: k8s-openapi writes it back with
/// `apiVersion`/`kind` and `containers: []`, so the Pod is compared by content and everything
/// else byte for byte.
#[test]
fn requests_decode_and_everything_but_the_pod_round_trips_exactly() {
    let d = dir();
    for era in ERAS {
        let name = format!("compat-ExtenderArgs.{era}.json");
        let go = read(&d, &name);
        let a: ExtenderArgs = serde_json::from_str(&go).unwrap();
        assert_eq!(
            a.pod.as_ref().unwrap().metadata.name.as_deref(),
            Some("podname")
        );
        let ours = String::from_utf8(to_go_json(&a).unwrap()).unwrap();
        let nodes_part = &go[go.find(r#","Nodes":"#).unwrap()..];
        assert!(ours.ends_with(nodes_part), "{name}: {ours}");
        assert_eq!(a.node_names.unwrap(), ["node1"]);

        let name = format!("compat-ExtenderPreemptionArgs.{era}.json");
        let go = read(&d, &name);
        let p: ExtenderPreemptionArgs = serde_json::from_str(&go).unwrap();
        let victims = &p.node_name_to_victims.as_ref().unwrap()["foo"];
        assert_eq!(victims.num_pdb_violations, 1);
        assert_eq!(
            victims.pods.as_ref().unwrap()[0].metadata.name.as_deref(),
            Some("podname")
        );
        let ours = String::from_utf8(to_go_json(&p).unwrap()).unwrap();
        let meta_part = &go[go.find(r#","NodeNameToMetaVictims":"#).unwrap()..];
        assert!(ours.ends_with(meta_part), "{name}: {ours}");
    }
}

#[test]
fn hami_bodies_without_a_pod_decode() {
    let d = dir();
    let v: serde_json::Value =
        serde_json::from_str(&read(&d, "hami-route-test-bodies.json")).unwrap();
    for key in ["pod_field_omitted", "pod_field_explicitly_null"] {
        let a: ExtenderArgs = serde_json::from_value(v[key].clone()).unwrap();
        assert!(a.pod.is_none(), "{key}");
        assert_eq!(a.node_names.unwrap(), ["node1"], "{key}");
    }
}
