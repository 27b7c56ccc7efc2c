//! What kube-scheduler's `NodeResourcesFit` sees of Nodes and Pods: allocatable CPU and memory,
//! and each pod's effective requests. The index keeps them in the ledger so placement scores
//! CPU balance in the extender as it does in the simulation.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The node label GPU Feature Discovery sets to the GPU's product name (NVML's name with
/// spaces as dashes), which pods select to ask for a GPU model.
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";

/// A pod's claim on its node outside the GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostRequest {
    pub cpu_milli: u64,
    pub memory_bytes: u64,
    /// GPU products the pod restricts itself to (its `nvidia.com/gpu.product` node selector or
    /// required node affinity); empty for any.
    pub gpu_products: Vec<String>,
}

/// A CPU quantity in millicores, rounded up as the API server's `MilliValue` does; `None` when
/// it does not parse (the API server would have refused it).
pub fn parse_cpu_milli(q: &str) -> Option<u64> {
    let s = q.trim();
    let milli = match s.strip_suffix('m') {
        Some(m) => m.parse::<f64>().ok()?,
        None => match s.parse::<f64>() {
            Ok(cores) => cores * 1000.0,
            // Decimal SI suffixes (`1k`) are rare for CPU; reuse the byte parser's grammar.
            Err(_) => crate::model::quantity::parse_bytes(s).ok()? as f64 * 1000.0,
        },
    };
    (milli.is_finite() && milli >= 0.0).then(|| crate::convert::f64_to_u64(milli.ceil()))
}

fn parse_memory(q: &Quantity) -> Option<u64> {
    crate::model::quantity::parse_bytes(&q.0).ok()
}

/// (CPU millicores, memory bytes) a container requests: its requests, else its limits (the
/// API server defaults requests to limits).
fn container_request(c: &Container) -> (u64, u64) {
    let Some(r) = &c.resources else { return (0, 0) };
    let pick = |key: &str| {
        r.requests
            .as_ref()
            .and_then(|m| m.get(key))
            .or_else(|| r.limits.as_ref().and_then(|m| m.get(key)))
    };
    (
        pick("cpu").and_then(|q| parse_cpu_milli(&q.0)).unwrap_or(0),
        pick("memory").and_then(parse_memory).unwrap_or(0),
    )
}

/// The pod's effective request, as kube-scheduler computes it: the larger of the app
/// containers' sum and the largest init container, plus the pod overhead. (Sidecar init
/// containers, `restartPolicy: Always`, are counted as init containers: a small over-count
/// only while a pod starts.) With its GPU products: for a pod peakfit places (see
/// [`host_claim_of`] for the others).
pub fn host_request_of(pod: &Pod) -> HostRequest {
    HostRequest {
        gpu_products: gpu_products_of(pod),
        ..host_claim_of(pod)
    }
}

/// [`host_request_of`] without the GPU products: all a pod peakfit does not place is to the
/// ledger (the CPU and memory it holds on its node). The Pod watch sees every pod in every
/// namespace, so a foreign pod's affinity list, however long, is never read.
pub fn host_claim_of(pod: &Pod) -> HostRequest {
    let Some(spec) = &pod.spec else {
        return HostRequest::default();
    };
    let (mut cpu, mut mem) = spec
        .containers
        .iter()
        .map(container_request)
        .fold((0u64, 0u64), |(c, m), (c2, m2)| {
            (c.saturating_add(c2), m.saturating_add(m2))
        });
    for init in spec.init_containers.iter().flatten() {
        let (c, m) = container_request(init);
        cpu = cpu.max(c);
        mem = mem.max(m);
    }
    if let Some(o) = &spec.overhead {
        cpu = cpu.saturating_add(
            o.get("cpu")
                .and_then(|q| parse_cpu_milli(&q.0))
                .unwrap_or(0),
        );
        mem = mem.saturating_add(o.get("memory").and_then(parse_memory).unwrap_or(0));
    }
    HostRequest {
        cpu_milli: cpu,
        memory_bytes: mem,
        gpu_products: Vec::new(),
    }
}

/// The GPU products a pod selects: its node selector's value, else the values of a required
/// node affinity whose every term restricts the label with `In` (terms are `OR`ed: the union,
/// in first-seen order). Linear in the list: duplicates are found with a hash set (a 242,234-value
/// list took 92 s with a scan per value, issue 24).
pub fn gpu_products_of(pod: &Pod) -> Vec<String> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    if let Some(v) = spec
        .node_selector
        .as_ref()
        .and_then(|s| s.get(GPU_PRODUCT_LABEL))
    {
        return vec![v.clone()];
    }
    let Some(terms) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| &r.node_selector_terms)
    else {
        return Vec::new();
    };
    let mut seen: HashSet<&str> = HashSet::new();
    let mut out: Vec<String> = Vec::new();
    for term in terms {
        let Some(e) = term
            .match_expressions
            .iter()
            .flatten()
            .find(|e| e.key == GPU_PRODUCT_LABEL && e.operator == "In")
        else {
            // A term without the restriction admits every model.
            return Vec::new();
        };
        for v in e.values.iter().flatten() {
            if seen.insert(v) {
                out.push(v.clone());
            }
        }
    }
    out
}

/// The node's allocatable (CPU millicores, memory bytes), each `None` when absent.
pub fn allocatable_of(node: &Node) -> (Option<u64>, Option<u64>) {
    let Some(a) = node.status.as_ref().and_then(|s| s.allocatable.as_ref()) else {
        return (None, None);
    };
    (
        a.get("cpu").and_then(|q| parse_cpu_milli(&q.0)),
        a.get("memory").and_then(parse_memory),
    )
}

/// The first resource of `gpus` the node's allocatable advertises with a quantity other than
/// zero (one that does not parse counts: refusing a node wrongly costs less than sharing a GPU
/// someone holds); `None` when it advertises none. DRA devices are not in allocatable, so a
/// node whose GPUs only DRA hands out has none.
pub fn advertised_gpu(node: &Node, gpus: &crate::gpu_resources::GpuResources) -> Option<String> {
    let a = node.status.as_ref()?.allocatable.as_ref()?;
    a.iter()
        .find(|(name, q)| gpus.is_gpu_resource(name) && parse_cpu_milli(&q.0) != Some(0))
        .map(|(name, _)| name.clone())
}

/// Whether a GPU product label value names this NVML model (GFD writes spaces as dashes).
pub fn product_matches(label: &str, model: &str) -> bool {
    label == model
        || (label.len() == model.len()
            && label
                .bytes()
                .zip(model.bytes())
                .all(|(l, m)| l == m || (l == b'-' && m == b' ')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use std::collections::BTreeMap;

    fn container(cpu: &str, mem: &str) -> Container {
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([
                    ("cpu".into(), Quantity(cpu.into())),
                    ("memory".into(), Quantity(mem.into())),
                ])),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn cpu_quantities_round_up_to_millicores() {
        assert_eq!(parse_cpu_milli("500m"), Some(500));
        assert_eq!(parse_cpu_milli("2"), Some(2000));
        assert_eq!(parse_cpu_milli("0.0005"), Some(1));
        assert_eq!(parse_cpu_milli("lots"), None);
    }

    #[test]
    fn effective_request_is_the_larger_of_apps_and_init_plus_overhead() {
        let pod = Pod {
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                containers: vec![container("1", "1Gi"), container("500m", "1Gi")],
                init_containers: Some(vec![container("4", "1Gi")]),
                overhead: Some(BTreeMap::from([("cpu".into(), Quantity("100m".into()))])),
                node_selector: Some(BTreeMap::from([(
                    GPU_PRODUCT_LABEL.into(),
                    "NVIDIA-A100-SXM4-40GB".into(),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = host_request_of(&pod);
        assert_eq!(r.cpu_milli, 4100);
        assert_eq!(r.memory_bytes, 2 << 30);
        assert_eq!(r.gpu_products, ["NVIDIA-A100-SXM4-40GB"]);
        assert!(product_matches(&r.gpu_products[0], "NVIDIA A100-SXM4-40GB"));
        assert!(!product_matches("NVIDIA-A100", "NVIDIA A100-SXM4-40GB"));
    }
}
