//! A pod as the index keeps it: its key, node, assignment and request, parsed once from its
//! annotations when it is indexed (and again when its model-config ConfigMap changes).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::Index;
use crate::cluster::hold::{HOLD, HoldNote};
use crate::cluster::model_config::MODEL_CONFIG;
use crate::cluster::resources::{HostRequest, host_claim_of, host_request_of};
use crate::cluster::workload::{WorkloadKey, workload_of};
use crate::model::{self, AnnotationError, PodRequest};
use crate::placement::PodKey;

pub use crate::model::annotations::{ASSIGNED_GPUS, GPU_MEMORY_FRACTION, RESERVED_BYTES};

/// Where a pod's GPU memory is committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub gpu_uuids: Vec<String>,
    /// Per GPU; `None` when the pod carries `assigned-gpus` only (then its request decides).
    pub reserved_bytes: Option<u64>,
}

/// What the index keeps of a pod: a few hundred bytes, not the object.
// Its flags are independent facts read off the pod (or bind's own record), not the states of
// one machine that an enum would name.
#[allow(clippy::struct_excessive_bools)]
#[derive(Clone, Debug)]
pub struct PodEntry {
    pub key: PodKey,
    pub namespace: String,
    pub name: String,
    /// Whether `key` is the pod's UID (else it is `namespace/name`).
    pub has_uid: bool,
    pub node: Option<String>,
    pub priority: i32,
    /// `Ok(None)`: no peakfit annotation (pass-through).
    pub request: Result<Option<PodRequest>, AnnotationError>,
    pub assignment: Option<Assignment>,
    /// Recorded by our own bind before the watch shows the pod's new annotations.
    pub bound_here: bool,
    /// CPU, memory and GPU products it asks of its node, as kube-scheduler counts them.
    pub host: HostRequest,
    /// A pod naming a `peakfit.io/model-config` ConfigMap keeps its `peakfit.io/` annotations,
    /// so that its request is worked out again when that ConfigMap arrives, changes or goes.
    pub model_config: Option<Box<BTreeMap<String, String>>>,
    /// The workload of a pod peakfit places (`cluster::workload`), whose profile sizes it and
    /// which its observed peak goes to; `None` for pods peakfit does not place.
    pub workload: Option<Arc<WorkloadKey>>,
    /// Whether the pod states its own `peakfit.io/vram` (learning corrects it only under
    /// `--learn all`).
    pub explicit: bool,
    /// When its containers started (`status.startTime`): how long it has been observed.
    pub started_unix: Option<i64>,
    /// Its `peakfit.io/hold`, read while it is pending (a bound pod's is history and ignored);
    /// `None` also for a malformed one, which `Index::apply_pod` warns about.
    pub hold: Option<HoldNote>,
    /// A pod peakfit places, unbound, that kube-scheduler marked unschedulable (`PodScheduled`
    /// false, reason `Unschedulable`): it waits in the scheduler's unschedulable pool, which
    /// the nudger must empty when a node improves, also after an extender restart forgot which
    /// pods its filter refused.
    pub unschedulable: bool,
}

/// The key a pod is indexed under: its UID, or `namespace/name` for objects without one
/// (hand-written files).
pub fn pod_key(pod: &Pod) -> PodKey {
    match &pod.metadata.uid {
        Some(uid) if !uid.is_empty() => uid.clone(),
        _ => format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            pod.metadata.name.as_deref().unwrap_or_default()
        ),
    }
}

/// The pod's own request, parsed from its annotations alone: a pod sized from a
/// `peakfit.io/model-config` ConfigMap is refused here (see [`Index::request_of`]).
pub fn pod_request_of(pod: &Pod) -> Result<Option<PodRequest>, AnnotationError> {
    model::pod_request(annotations_of(pod))
}

fn annotations_of(pod: &Pod) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    pod.metadata.annotations.as_ref().unwrap_or(&EMPTY)
}

/// The largest `reserved-bytes` the index believes: the bound `peakfit.io/vram` has (1 EiB).
/// Only bind writes the annotation, but anyone who can edit a pod can change it, and an
/// unbounded value summed with others overflowed the ledger.
pub const MAX_RESERVED_BYTES: u64 = 1 << 60;

/// `reserved-bytes` as written by bind (plain decimal bytes), if within `MAX_RESERVED_BYTES`;
/// otherwise `None`, so the pod's own request decides what it holds.
fn reserved_bytes(v: &str) -> Option<u64> {
    v.trim()
        .parse::<u64>()
        .ok()
        .filter(|&b| b <= MAX_RESERVED_BYTES)
}

/// The annotation by which a pod states its per-GPU bytes.
const VRAM: &str = "peakfit.io/vram";

/// Whether the pod states its per-GPU bytes itself (`peakfit.io/vram`) rather than have the
/// model predict them.
pub fn is_explicit(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(VRAM))
}

/// The pod's `peakfit.io/hold`, parsed; `None` without one.
pub fn hold_of(pod: &Pod) -> Option<Result<HoldNote, crate::cluster::hold::HoldNoteError>> {
    annotations_of(pod).get(HOLD).map(|v| HoldNote::parse(v))
}

/// A preference the pod asks kube-scheduler's score plugins to weigh between nodes that all
/// fit it, which `--filter-keep-best` would otherwise let them weigh among the best `N` only:
/// filter then answers with every fitting node (`Extender::keep_best`). Each names the
/// kube-scheduler (v1.36) score plugin that reads it, the reason the cut is skipped; the
/// `label` is the bounded value of `peakfit_extender_filter_keep_best_skipped_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SoftPreference {
    /// `affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution`: the
    /// `NodeAffinity` plugin's Score sums the weights of the terms a node matches.
    NodeAffinity,
    /// `affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution`: the
    /// `InterPodAffinity` plugin's Score, toward nodes whose domain runs matching pods.
    PodAffinity,
    /// `affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution`: the same
    /// plugin's Score, away from them.
    PodAntiAffinity,
    /// A `topologySpreadConstraints` entry with `whenUnsatisfiable: ScheduleAnyway`: the
    /// `PodTopologySpread` plugin scores nodes by the skew they would leave (`DoNotSchedule`
    /// entries are its Filter, decided before the extender, and do not count here).
    TopologySpread,
    /// No spread constraints of its own, and a controller owner that kube-scheduler's system
    /// default spread covers: `PodTopologySpread` (`defaultingType: System`, which the chart's
    /// profile keeps) then scores nodes by `ScheduleAnyway` constraints it builds itself
    /// (hostname, max skew 3; zone, max skew 5), selecting the pods that the `ReplicaSets`,
    /// `StatefulSets`, `ReplicationControllers` and Services selecting this one select
    /// (`buildDefaultConstraints`, `helper.DefaultSelector`). Read from the pod's controller
    /// reference (`DEFAULT_SPREAD_OWNERS`); a pod that only a Service selects is not seen
    /// (documented).
    DefaultSpread,
}

/// The controller owners (API version, kind) whose pods kube-scheduler's system default spread
/// covers: `DefaultSelector` reads `ReplicaSets`, `StatefulSets` and `ReplicationControllers`,
/// each looked up by the pod's controller reference in these groups only, so another group's
/// `StatefulSet` (`OpenKruise`'s) or a non-controller reference does not count. Deployments act
/// through their `ReplicaSets`, `LeaderWorkerSets` through their `StatefulSets`.
const DEFAULT_SPREAD_OWNERS: [(&str, &str); 3] = [
    ("apps/v1", "ReplicaSet"),
    ("apps/v1", "StatefulSet"),
    ("v1", "ReplicationController"),
];

impl SoftPreference {
    pub fn label(self) -> &'static str {
        match self {
            Self::NodeAffinity => "node_affinity",
            Self::PodAffinity => "pod_affinity",
            Self::PodAntiAffinity => "pod_anti_affinity",
            Self::TopologySpread => "topology_spread",
            Self::DefaultSpread => "default_spread",
        }
    }
}

/// The first preference kube-scheduler scores for this pod (in the order of
/// [`SoftPreference`]): its own spec's, then the system default spread its owner brings;
/// `None` when its placement among fitting nodes is peakfit's alone to rank as far as the pod
/// is concerned. Required terms and `DoNotSchedule` spread are filters, already applied to
/// the candidates kube-scheduler sends, so they do not count (and a pod with spread
/// constraints of its own gets no default ones). Not read: preferences that come from
/// elsewhere (other pods' preferred terms toward this one, a Service selecting a bare pod,
/// `PreferNoSchedule` taints, images already on a node), which are documented as what the cut
/// can still narrow.
pub fn soft_preference(pod: &Pod) -> Option<SoftPreference> {
    fn any<T>(terms: Option<&Vec<T>>) -> bool {
        terms.is_some_and(|t| !t.is_empty())
    }
    let spec = pod.spec.as_ref()?;
    if let Some(a) = &spec.affinity {
        let node = a.node_affinity.as_ref();
        let toward = a.pod_affinity.as_ref();
        let away = a.pod_anti_affinity.as_ref();
        if any(node.and_then(|n| {
            n.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })) {
            return Some(SoftPreference::NodeAffinity);
        }
        if any(toward.and_then(|p| {
            p.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })) {
            return Some(SoftPreference::PodAffinity);
        }
        if any(away.and_then(|p| {
            p.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })) {
            return Some(SoftPreference::PodAntiAffinity);
        }
    }
    match spec.topology_spread_constraints.as_deref() {
        Some(own) if !own.is_empty() => own
            .iter()
            .any(|c| c.when_unsatisfiable == "ScheduleAnyway")
            .then_some(SoftPreference::TopologySpread),
        _ => pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| {
                o.controller == Some(true)
                    && DEFAULT_SPREAD_OWNERS.contains(&(o.api_version.as_str(), o.kind.as_str()))
            })
            .then_some(SoftPreference::DefaultSpread),
    }
}

impl PodEntry {
    pub fn uid(&self) -> Option<&str> {
        self.has_uid.then_some(self.key.as_str())
    }

    /// The entry of a pod whose request is `request` (see [`Index::request_of`]).
    pub fn from_pod(pod: &Pod, request: Result<Option<PodRequest>, AnnotationError>) -> Self {
        let ann = pod.metadata.annotations.as_ref();
        let assignment = ann
            .and_then(|a| a.get(ASSIGNED_GPUS))
            .map(|gpus| Assignment {
                gpu_uuids: gpus
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
                reserved_bytes: ann
                    .and_then(|a| a.get(RESERVED_BYTES))
                    .and_then(|v| reserved_bytes(v)),
            })
            .filter(|a| !a.gpu_uuids.is_empty());
        let spec = pod.spec.as_ref();
        let placed = matches!(request, Ok(Some(_)));
        let node = spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty());
        let unschedulable = placed
            && node.is_none()
            && pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter().any(|c| {
                        c.type_ == "PodScheduled"
                            && c.status == "False"
                            && c.reason.as_deref() == Some("Unschedulable")
                    })
                });
        Self {
            unschedulable,
            key: pod_key(pod),
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: pod.metadata.name.clone().unwrap_or_default(),
            has_uid: pod.metadata.uid.as_deref().is_some_and(|u| !u.is_empty()),
            hold: hold_of(pod)
                .filter(|_| placed && node.is_none())
                .and_then(Result::ok),
            node,
            priority: spec.and_then(|s| s.priority).unwrap_or(0),
            // Only a pod peakfit places needs its GPU products (bind's class); the watch sees
            // every pod, and a foreign one's affinity list is not read.
            host: if placed {
                host_request_of(pod)
            } else {
                host_claim_of(pod)
            },
            request,
            assignment,
            bound_here: false,
            workload: placed.then(|| Arc::new(workload_of(pod))),
            explicit: is_explicit(pod),
            started_unix: pod
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .map(|t| t.0.as_second()),
            model_config: ann.filter(|a| a.contains_key(MODEL_CONFIG)).map(|a| {
                Box::new(
                    a.iter()
                        .filter(|(k, _)| k.starts_with(model::PREFIX))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                )
            }),
        }
    }
}

impl Index {
    /// A pod's request: its annotations over its `peakfit.io/model-config` ConfigMap's, if it
    /// names one; a missing or unusable ConfigMap is this pod's error only. Answered from the
    /// memo of requests (`request_memo`) when a pod with the same model inputs was asked about
    /// before: filter, prioritize and preempt call this on every request.
    pub fn request_of(&self, pod: &Pod) -> Result<Option<PodRequest>, AnnotationError> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        self.request_from(namespace, annotations_of(pod))
    }

    pub(super) fn request_from(
        &self,
        namespace: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<Option<PodRequest>, AnnotationError> {
        // Cut once here: the error is kept with the pod and quoted by filter, bind and logs.
        let merged = self
            .model_configs
            .resolve(namespace, annotations)
            .map_err(crate::clip::annotation_error)?;
        // What the model reads: the merge with the ConfigMap, not the pod's own annotations,
        // so that a changed ConfigMap is a new key of the memo.
        let inputs = merged.as_ref().unwrap_or(annotations);
        self.request_memo.get_or_compute(inputs, self.platform, || {
            model::annotations::pod_request_on(inputs, self.platform)
                .map_err(crate::clip::annotation_error)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::test_support::mk_pod;
    use k8s_openapi::api::core::v1::Pod;

    /// Each preference kube-scheduler scores triggers the exemption alone, with its label;
    /// required terms, `DoNotSchedule` spread and empty lists do not.
    #[test]
    fn soft_preference_is_each_scored_field_alone_and_no_filter() {
        const PREFERRED: &str = "preferredDuringSchedulingIgnoredDuringExecution";
        const REQUIRED: &str = "requiredDuringSchedulingIgnoredDuringExecution";
        use k8s_openapi::api::core::v1::{Pod, TopologySpreadConstraint};
        let pod = |spec: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": spec,
            }))
            .unwrap()
        };
        let node_term = serde_json::json!({"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]});
        let pod_term = serde_json::json!({"topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"app": "chat"}}});
        let spread = |when: &str| {
            serde_json::json!([{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": when, "labelSelector": {"matchLabels": {"app": "chat"}}}])
        };
        let affinity = |kind: &str, rule: &str, terms: serde_json::Value| serde_json::json!({"affinity": {kind: {rule: terms}}});
        let weighted_pod = serde_json::json!([{"weight": 10, "podAffinityTerm": pod_term}]);
        let cases = [
            ("nothing", serde_json::json!({}), None),
            (
                "preferred node affinity",
                affinity(
                    "nodeAffinity",
                    PREFERRED,
                    serde_json::json!([{"weight": 10, "preference": node_term}]),
                ),
                Some(SoftPreference::NodeAffinity),
            ),
            (
                "required node affinity",
                affinity(
                    "nodeAffinity",
                    REQUIRED,
                    serde_json::json!({"nodeSelectorTerms": [node_term]}),
                ),
                None,
            ),
            (
                "an empty preferred list",
                affinity("nodeAffinity", PREFERRED, serde_json::json!([])),
                None,
            ),
            (
                "preferred pod affinity",
                affinity("podAffinity", PREFERRED, weighted_pod.clone()),
                Some(SoftPreference::PodAffinity),
            ),
            (
                "required pod affinity",
                affinity("podAffinity", REQUIRED, serde_json::json!([pod_term])),
                None,
            ),
            (
                "preferred pod anti-affinity",
                affinity("podAntiAffinity", PREFERRED, weighted_pod),
                Some(SoftPreference::PodAntiAffinity),
            ),
            (
                "required pod anti-affinity",
                affinity("podAntiAffinity", REQUIRED, serde_json::json!([pod_term])),
                None,
            ),
            (
                "ScheduleAnyway spread",
                serde_json::json!({"topologySpreadConstraints": spread("ScheduleAnyway")}),
                Some(SoftPreference::TopologySpread),
            ),
            (
                "DoNotSchedule spread",
                serde_json::json!({"topologySpreadConstraints": spread("DoNotSchedule")}),
                None,
            ),
        ];
        for (what, spec, want) in cases {
            assert_eq!(soft_preference(&pod(spec)), want, "{what}");
        }
        assert_eq!(
            soft_preference(&Pod::default()),
            None,
            "a pod without a spec"
        );
        // One ScheduleAnyway entry among DoNotSchedule ones is enough.
        let mut mixed = pod(serde_json::json!({"topologySpreadConstraints":
            spread("DoNotSchedule")}));
        let spec = mixed.spec.as_mut().unwrap();
        let mut soft: TopologySpreadConstraint =
            spec.topology_spread_constraints.as_ref().unwrap()[0].clone();
        soft.when_unsatisfiable = "ScheduleAnyway".into();
        spec.topology_spread_constraints
            .as_mut()
            .unwrap()
            .push(soft);
        assert_eq!(
            soft_preference(&mixed),
            Some(SoftPreference::TopologySpread)
        );
        let labels: Vec<&str> = [
            SoftPreference::NodeAffinity,
            SoftPreference::PodAffinity,
            SoftPreference::PodAntiAffinity,
            SoftPreference::TopologySpread,
            SoftPreference::DefaultSpread,
        ]
        .map(SoftPreference::label)
        .to_vec();
        assert_eq!(
            labels,
            [
                "node_affinity",
                "pod_affinity",
                "pod_anti_affinity",
                "topology_spread",
                "default_spread"
            ]
        );
    }

    /// kube-scheduler spreads a pod by its system default constraints when the pod has no
    /// constraints of its own and a `ReplicaSet`, `StatefulSet` or `ReplicationController` selects
    /// it; a Job's pod, a bare pod and a pod with its own `DoNotSchedule` spread get none.
    #[test]
    fn a_controllers_pod_without_own_spread_has_the_default_spread() {
        let pod = |owner: Option<&str>, spec: serde_json::Value| -> Pod {
            let owners: Vec<serde_json::Value> = owner
                .map(|kind| {
                    // "group/version kind", "~kind" for a reference that is not the controller.
                    let (controller, kind) = match kind.strip_prefix('~') {
                        Some(k) => (false, k),
                        None => (true, kind),
                    };
                    let (api_version, kind) = kind.rsplit_once(' ').unwrap_or(("apps/v1", kind));
                    serde_json::json!({"apiVersion": api_version, "kind": kind,
                        "name": "chat-7d9f", "uid": "u1", "controller": controller})
                })
                .into_iter()
                .collect();
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "ownerReferences": owners},
                "spec": spec,
            }))
            .unwrap()
        };
        let own_spread = |when: &str| {
            serde_json::json!({"topologySpreadConstraints": [{"maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": when,
                "labelSelector": {"matchLabels": {"app": "chat"}}}]})
        };
        let none = serde_json::json!({});
        let cases = [
            ("bare", None, none.clone(), None),
            (
                "ReplicaSet",
                Some("ReplicaSet"),
                none.clone(),
                Some(SoftPreference::DefaultSpread),
            ),
            (
                "StatefulSet",
                Some("StatefulSet"),
                none.clone(),
                Some(SoftPreference::DefaultSpread),
            ),
            (
                "ReplicationController",
                Some("v1 ReplicationController"),
                none.clone(),
                Some(SoftPreference::DefaultSpread),
            ),
            (
                "a ReplicaSet that is not the controller",
                Some("~ReplicaSet"),
                none.clone(),
                None,
            ),
            (
                "another group's StatefulSet",
                Some("apps.kruise.io/v1beta1 StatefulSet"),
                none.clone(),
                None,
            ),
            ("Job", Some("Job"), none.clone(), None),
            (
                "ReplicaSet, own DoNotSchedule spread",
                Some("ReplicaSet"),
                own_spread("DoNotSchedule"),
                None,
            ),
            (
                "ReplicaSet, own ScheduleAnyway spread",
                Some("ReplicaSet"),
                own_spread("ScheduleAnyway"),
                Some(SoftPreference::TopologySpread),
            ),
            (
                "ReplicaSet, empty constraint list",
                Some("ReplicaSet"),
                serde_json::json!({"topologySpreadConstraints": []}),
                Some(SoftPreference::DefaultSpread),
            ),
        ];
        for (what, owner, spec, want) in cases {
            assert_eq!(soft_preference(&pod(owner, spec)), want, "{what}");
        }
    }

    #[test]
    fn only_a_pod_peakfit_places_has_its_gpu_products_read() {
        use k8s_openapi::api::core::v1::{
            Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
        };
        let with_products = |mut pod: Pod| {
            let values: Vec<String> = (0..1_000).map(|i| format!("gpu-{}", i % 10)).collect();
            pod.spec.as_mut().unwrap().affinity = Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: crate::cluster::resources::GPU_PRODUCT_LABEL.into(),
                                operator: "In".into(),
                                values: Some(values),
                            }]),
                            ..Default::default()
                        }],
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
            pod
        };
        let foreign = with_products(mk_pod("f", Some("n1"), &[]));
        let entry = PodEntry::from_pod(&foreign, pod_request_of(&foreign));
        assert!(entry.host.gpu_products.is_empty(), "{:?}", entry.host);
        let ours = with_products(mk_pod("o", None, &[("peakfit.io/vram", "10Gi")]));
        let entry = PodEntry::from_pod(&ours, pod_request_of(&ours));
        let expected: Vec<String> = (0..10).map(|i| format!("gpu-{i}")).collect();
        assert_eq!(entry.host.gpu_products, expected);
    }
}
