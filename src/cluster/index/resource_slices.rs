//! Which nodes a DRA GPU driver (`--gpu-dra-drivers`) publishes devices on, from the
//! `resource.k8s.io/v1` `ResourceSlices` the watch feeds in. DRA devices never appear in a
//! Node's allocatable, so while a node's agent cannot read the kubelet's `PodResources` API, a
//! GPU the driver allocated to a `ResourceClaim` since the last good read would look free: a
//! slice of a listed driver naming the node is what marks it (`NodeState::dra_gpu_driver`), and
//! the mark goes when the last such slice for the node does.
//!
//! Only slices that name nodes count: `spec.nodeName`, or with `perDeviceNodeSelection` each
//! device's `nodeName`. A slice (or device) with `allNodes` or a `nodeSelector` describes
//! network-attached devices reachable from many nodes, not a node's local GPUs: peakfit places
//! pods on the GPUs its agents see through NVML, which are local, so such devices are never the
//! GPUs it shares, and marking every node a selector matches would refuse a whole pool of nodes
//! over devices none of them holds. A slice without devices (a `sharedCounters`-only slice)
//! publishes nothing to allocate and marks no node either.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::resource::v1::ResourceSlice;

use super::Index;

/// The slices of listed drivers that mark nodes, and how many mark each node per driver.
#[derive(Debug, Default)]
pub(super) struct SliceTable {
    /// Slice name → (driver, the nodes it marks).
    by_slice: HashMap<String, (String, Vec<String>)>,
    /// Node → driver → slices of that driver marking the node.
    by_node: HashMap<String, BTreeMap<String, usize>>,
}

impl SliceTable {
    /// The driver a node is marked by: the first by name when several are (one name is enough
    /// for the refusal's words, and the same one every time).
    pub(super) fn driver_of(&self, node: &str) -> Option<String> {
        self.by_node
            .get(node)
            .and_then(|d| d.keys().next().cloned())
    }

    /// Replaces slice `name`'s marks with `now` (`None`: the slice is gone or marks nothing);
    /// returns the nodes whose marks may have changed.
    fn set(&mut self, name: &str, now: Option<(String, Vec<String>)>) -> Vec<String> {
        let mut touched = Vec::new();
        if let Some((driver, nodes)) = self.by_slice.remove(name) {
            for node in nodes {
                if let Some(drivers) = self.by_node.get_mut(&node) {
                    if let Some(n) = drivers.get_mut(&driver) {
                        *n -= 1;
                        if *n == 0 {
                            drivers.remove(&driver);
                        }
                    }
                    if drivers.is_empty() {
                        self.by_node.remove(&node);
                    }
                }
                touched.push(node);
            }
        }
        if let Some((driver, nodes)) = now {
            for node in &nodes {
                *self
                    .by_node
                    .entry(node.clone())
                    .or_default()
                    .entry(driver.clone())
                    .or_default() += 1;
                touched.push(node.clone());
            }
            self.by_slice.insert(name.to_owned(), (driver, nodes));
        }
        touched.sort();
        touched.dedup();
        touched
    }
}

/// The nodes whose local devices `slice` publishes (see the module's words on network-attached
/// devices), each once.
fn local_nodes(slice: &ResourceSlice) -> Vec<String> {
    let spec = &slice.spec;
    let devices = spec.devices.as_deref().unwrap_or_default();
    if devices.is_empty() {
        return Vec::new();
    }
    let mut nodes: Vec<String> = if spec.per_device_node_selection == Some(true) {
        devices.iter().filter_map(|d| d.node_name.clone()).collect()
    } else {
        spec.node_name.iter().cloned().collect()
    };
    nodes.retain(|n| !n.is_empty());
    nodes.sort();
    nodes.dedup();
    nodes
}

impl Index {
    /// Records a `ResourceSlice` (new or changed): a slice of a listed driver marks the nodes
    /// it publishes local devices on; any other slice marks none (and drops what an earlier
    /// version of it marked). Only the nodes whose mark changes are rebuilt.
    pub fn apply_resource_slice(&self, slice: &ResourceSlice) {
        let Some(name) = slice.metadata.name.as_deref() else {
            return;
        };
        let now = Some(&slice.spec.driver)
            .filter(|d| self.gpu_resources.is_gpu_driver(d))
            .map(|d| (d.clone(), local_nodes(slice)))
            .filter(|(_, nodes)| !nodes.is_empty());
        self.update_slice(name, now);
    }

    /// Forgets slice `name`: a node none of the listed drivers' slices name any more is no
    /// longer marked.
    pub fn delete_resource_slice(&self, name: &str) {
        self.update_slice(name, None);
    }

    fn update_slice(&self, name: &str, now: Option<(String, Vec<String>)>) {
        // The table's lock is never held while a node's is taken: `slot` reads the table when
        // it makes a slot, under the node map's lock.
        let marks: Vec<(String, Option<String>)> = {
            let mut table = self.resource_slices.lock();
            let touched = table.set(name, now);
            touched
                .into_iter()
                .map(|n| {
                    let d = table.driver_of(&n);
                    (n, d)
                })
                .collect()
        };
        for (node, driver) in marks {
            // A node the index has no slot for gets its mark when the slot is made.
            let Some(slot) = self.node(&node) else {
                continue;
            };
            let pods = self.pods.read();
            let mut st = slot.state.write();
            if st.dra_gpu_driver != driver {
                st.dra_gpu_driver = driver;
                self.rebuild(&mut st, &pods.by_key);
            }
        }
    }

    /// The DRA GPU driver publishing devices on `node`, if any: what a new slot starts with.
    pub(super) fn dra_gpu_driver_of(&self, node: &str) -> Option<String> {
        self.resource_slices.lock().driver_of(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::test_support::{GIB, ledger, mk_node, mk_report};
    use crate::inventory::PodResourcesStatus;
    use crate::placement::{Allocators, NodeCondition};
    use serde_json::json;

    fn slice(name: &str, driver: &str, spec: &serde_json::Value) -> ResourceSlice {
        let mut s = json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": { "name": name },
            "spec": {
                "driver": driver,
                "pool": { "name": "p", "generation": 1, "resourceSliceCount": 1 },
                "devices": [{ "name": "gpu-0" }],
            },
        });
        for (k, v) in spec.as_object().unwrap() {
            s["spec"][k] = v.clone();
        }
        serde_json::from_value(s).unwrap()
    }

    fn on_node(name: &str, driver: &str, node: &str) -> ResourceSlice {
        slice(name, driver, &json!({ "nodeName": node }))
    }

    /// Node `n` (no device-plugin resource) and its report of one GPU, from an agent that cannot
    /// read the kubelet's `PodResources` API.
    fn add_down_node(index: &Index, n: &str) {
        index.apply_node(&mk_node(n));
        let mut r = mk_report(n, &[("GPU-a", 80 * GIB, 0, &[])]);
        r.status.as_mut().unwrap().gpus[0].uuid = format!("GPU-{n}");
        r.status.as_mut().unwrap().pod_resources = Some(PodResourcesStatus {
            up: false,
            reason: Some("connection refused".into()),
        });
        index.apply_report(&r);
    }

    fn index_with_down_nodes(names: &[&str]) -> Index {
        let index = Index::new();
        for n in names {
            add_down_node(&index, n);
        }
        index
    }

    fn dra_down(driver: &str) -> NodeCondition {
        NodeCondition::PodResourcesDown {
            reason: "connection refused".into(),
            by: Allocators {
                device_plugin: None,
                dra_driver: Some(driver.into()),
            },
        }
    }

    #[test]
    fn a_dra_gpu_slice_refuses_a_node_whose_pod_resources_are_down_until_it_goes() {
        let index = index_with_down_nodes(&["n1", "n2"]);
        assert_eq!(ledger(&index, "n1").condition, NodeCondition::Ready);

        index.apply_resource_slice(&on_node("n1-gpu", "gpu.nvidia.com", "n1"));
        assert_eq!(ledger(&index, "n1").condition, dra_down("gpu.nvidia.com"));
        assert_eq!(ledger(&index, "n2").condition, NodeCondition::Ready);

        // Two slices for the node (two pools): the mark stays until the last goes.
        index.apply_resource_slice(&on_node("n1-gpu-2", "gpu.nvidia.com", "n1"));
        index.delete_resource_slice("n1-gpu");
        assert_eq!(ledger(&index, "n1").condition, dra_down("gpu.nvidia.com"));
        index.delete_resource_slice("n1-gpu-2");
        assert_eq!(ledger(&index, "n1").condition, NodeCondition::Ready);

        // A slice moved to another node (an update, not a delete) unmarks the first.
        index.apply_resource_slice(&on_node("s", "gpu.nvidia.com", "n1"));
        index.apply_resource_slice(&on_node("s", "gpu.nvidia.com", "n2"));
        assert_eq!(ledger(&index, "n1").condition, NodeCondition::Ready);
        assert_eq!(ledger(&index, "n2").condition, dra_down("gpu.nvidia.com"));
        index.delete_resource_slice("s");
        assert_eq!(ledger(&index, "n2").condition, NodeCondition::Ready);
    }

    #[test]
    fn other_drivers_network_attached_and_empty_slices_mark_no_node() {
        let index = index_with_down_nodes(&["n1"]);
        for s in [
            on_node("nic", "dra.net", "n1"),
            on_node("cd", "compute-domain.nvidia.com", "n1"),
            slice("fabric", "gpu.nvidia.com", &json!({ "allNodes": true })),
            slice(
                "rack",
                "gpu.nvidia.com",
                &json!({ "nodeSelector": { "nodeSelectorTerms": [{ "matchFields": [
                    { "key": "metadata.name", "operator": "In", "values": ["n1"] }
                ] }] } }),
            ),
            slice(
                "counters",
                "gpu.nvidia.com",
                &json!({ "nodeName": "n1", "devices": [] }),
            ),
        ] {
            let name = s.metadata.name.clone().unwrap();
            index.apply_resource_slice(&s);
            assert_eq!(
                ledger(&index, "n1").condition,
                NodeCondition::Ready,
                "{name}"
            );
        }
        // A slice whose driver changes to an unlisted one drops its mark.
        index.apply_resource_slice(&on_node("s", "gpu.nvidia.com", "n1"));
        assert_eq!(ledger(&index, "n1").condition, dra_down("gpu.nvidia.com"));
        index.apply_resource_slice(&on_node("s", "dra.net", "n1"));
        assert_eq!(ledger(&index, "n1").condition, NodeCondition::Ready);
    }

    #[test]
    fn per_device_node_names_mark_their_nodes() {
        let index = index_with_down_nodes(&["n1", "n2", "n3"]);
        index.apply_resource_slice(&slice(
            "per-device",
            "gpu.nvidia.com",
            &json!({ "perDeviceNodeSelection": true, "devices": [
                { "name": "gpu-0", "nodeName": "n1" },
                { "name": "gpu-1", "nodeName": "n2" },
                { "name": "link", "allNodes": true },
            ] }),
        ));
        assert_eq!(ledger(&index, "n1").condition, dra_down("gpu.nvidia.com"));
        assert_eq!(ledger(&index, "n2").condition, dra_down("gpu.nvidia.com"));
        assert_eq!(ledger(&index, "n3").condition, NodeCondition::Ready);
    }

    /// The slice may arrive before the node's Node or report (the watches are independent):
    /// the node's slot starts with the mark.
    #[test]
    fn a_slice_seen_before_its_node_marks_it_when_the_node_arrives() {
        let index = Index::new();
        index.apply_resource_slice(&on_node("early", "gpu.nvidia.com", "n1"));
        assert!(index.node("n1").is_none(), "a slice alone makes no node");
        add_down_node(&index, "n1");
        assert_eq!(ledger(&index, "n1").condition, dra_down("gpu.nvidia.com"));
    }

    /// `--gpu-dra-drivers` decides which drivers count; with `none`, no slice marks a node.
    #[test]
    fn the_listed_drivers_decide() {
        let custom = |drivers: &[&str]| {
            let index = Index::new().with_gpu_resources(
                crate::gpu_resources::GpuResources::new(
                    &[],
                    &drivers.iter().map(|d| (*d).to_owned()).collect::<Vec<_>>(),
                )
                .unwrap(),
            );
            add_down_node(&index, "n1");
            index.apply_resource_slice(&on_node("a", "gpu.nvidia.com", "n1"));
            index.apply_resource_slice(&on_node("b", "gpu.example.com", "n1"));
            ledger(&index, "n1").condition
        };
        assert_eq!(custom(&["gpu.example.com"]), dra_down("gpu.example.com"));
        assert_eq!(
            custom(&["gpu.nvidia.com", "gpu.example.com"]),
            dra_down("gpu.example.com"),
            "the first driver by name is named"
        );
        assert_eq!(custom(&["none"]), NodeCondition::Ready);
    }
}
