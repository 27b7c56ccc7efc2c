//! The admission decision for one pod: pass it through, refuse it, or hand it to peakfit with a
//! JSON patch. Pure: no I/O, so every branch is tested with `AdmissionReview` JSON alone.

use json_patch::jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, ResourceRequirements};
use kube::api::ObjectMeta;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model;
use crate::model::annotations::{ASSIGNED_GPUS, GPU_MEMORY_FRACTION, RESERVED_BYTES};

/// What the webhook decodes of the object under review: its metadata and its spec as raw
/// JSON, read into a [`SpecView`] only for a pod. A `DynamicObject` held the whole object as a
/// `serde_json::Value` tree, several times the bytes it came in (a 4 MiB review peaked at 232 MiB,
/// issue 24); a spec's fields the decision does not read (affinity lists, volumes, probes) are
/// now only bytes, and of the review only the request's own fields are decoded.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct PodView {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Box<serde_json::value::RawValue>>,
}

impl kube::Resource for PodView {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind((): &()) -> std::borrow::Cow<'_, str> {
        "Pod".into()
    }
    fn group((): &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn version((): &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural((): &()) -> std::borrow::Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl PodView {
    /// The spec's fields the decision reads; `Ok(None)` without a spec.
    fn spec(&self) -> serde_json::Result<Option<SpecView>> {
        self.spec
            .as_deref()
            .map(|raw| serde_json::from_str(raw.get()))
            .transpose()
    }
}

/// An `AdmissionReview` as the webhook reads it.
pub type Review = AdmissionReview<PodView>;

/// The scheduler name the API server fills in when a pod names none: peakfit may take such pods.
const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// Why the API server sent this pod: the two webhooks of the chart's `MutatingWebhookConfiguration`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptIn {
    /// `POST /mutate`: the pod opts in by carrying a `peakfit.io/` input annotation; others pass.
    Annotation,
    /// `POST /mutate/namespace`: the pod's namespace carries the opt-in label, so every pod is taken.
    Namespace,
}

/// What the webhook was told at start-up.
#[derive(Clone, Debug)]
pub struct Mutator {
    pub scheduler_name: String,
    /// Set on pods that name no runtime class (the NVIDIA runtime honours `NVIDIA_VISIBLE_DEVICES`).
    pub runtime_class_name: Option<String>,
    /// The extended resource the agents advertise node GPU memory as (MiB): the pod's least
    /// possible GPU memory is requested in it, so kube-scheduler's fit and preemption see it.
    pub gpu_memory_resource: Option<String>,
    /// Which modelled pods must state `peakfit.io/vram` instead (`--require-vram`).
    pub require_vram: RequireVram,
    /// Turn an opted-in pod's `nvidia.com/gpu: N` into a peakfit pod of N whole GPUs
    /// (`--convert-device-plugin-requests`, see [`device_plugin_conversion`]).
    pub convert_device_plugin_requests: bool,
}

/// The device plugin's extended resource that `--convert-device-plugin-requests` converts.
pub const DEVICE_PLUGIN_GPU: &str = "nvidia.com/gpu";

/// Which pods the webhook refuses unless they give `peakfit.io/vram`: those whose workload kind
/// the peak-memory model does not cover, or covers with a confidence class at or below the one
/// named (the bands `peakfit estimate` prints, measured on public data). A pod that gives
/// `vram` is never refused by it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RequireVram {
    /// The model sizes every pod that describes one.
    #[default]
    Off,
    /// Kinds without real-GPU measurements.
    Uncovered,
    /// Those and kinds in class `poor`.
    Poor,
    /// Those and kinds in class `fair`: only `good` kinds may rely on the model.
    Fair,
}

impl RequireVram {
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Uncovered => "uncovered",
            Self::Poor => "poor",
            Self::Fair => "fair",
        }
    }

    /// Why `spec` must give `vram` under this policy, or `None` when it need not.
    pub fn refusal(self, spec: &model::Spec) -> Option<String> {
        use model::confidence::{band_for, class, workload_kind};
        if self == Self::Off || spec.vram.is_some() {
            return None;
        }
        let kind = workload_kind(spec);
        let why = match band_for(spec) {
            None => {
                format!("the peak-memory model has no real-GPU measurements of {kind} workloads")
            }
            Some(b) => {
                let c = class(b);
                let refused = match self {
                    Self::Off | Self::Uncovered => false,
                    Self::Poor => c == "poor",
                    Self::Fair => c != "good",
                };
                if !refused {
                    return None;
                }
                format!(
                    "the peak-memory model's error on real-GPU measurements of {kind} workloads is \
                     median {:.1}%, p90 {:.1}%, signed median {:+.1}% over {} rows (confidence {c})",
                    b.median, b.p90, b.signed_median, b.rows
                )
            }
        };
        Some(format!(
            "annotation peakfit.io/vram is required for {kind} workloads in this cluster (webhook \
             --require-vram {}): {why}; give the per-GPU peak your job was measured at, e.g. \
             peakfit.io/vram: 24Gi",
            self.name()
        ))
    }
}

/// What the decision reads of a pod's spec. The rest of each container is left in the request's
/// tree: a whole `k8s_openapi` `Container` is ~2 KiB (probes, security context, ...), and a pod
/// with 5,000 containers decoded as `PodSpec` took ~20 MiB (~30 MiB while its `Vec` grew).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecView {
    node_name: Option<String>,
    scheduler_name: Option<String>,
    runtime_class_name: Option<String>,
    containers: Option<Vec<ContainerView>>,
    init_containers: Option<Vec<ContainerView>>,
}

#[derive(Debug, Default, Deserialize)]
struct ContainerView {
    #[serde(default)]
    name: String,
    env: Option<Vec<EnvVar>>,
    resources: Option<ResourceRequirements>,
}

/// The outcome before it is wrapped in an `AdmissionResponse`.
#[derive(Debug, PartialEq)]
enum Decision {
    PassThrough,
    Refuse(String),
    Mutate {
        ops: PatchWriter,
        warnings: Vec<String>,
    },
}

/// A JSON Patch (RFC 6902) written straight to the bytes the API server receives. A pod with
/// 5,000 containers gets 5,000 operations: held as `json_patch::PatchOperation`s, each value a
/// `serde_json::Value` tree, they took ~20 MiB before the patch was even serialised and the
/// webhook peaked near its 128 Mi limit. Written as bytes, an operation costs its ~230 bytes.
#[derive(Debug, Default, PartialEq)]
struct PatchWriter {
    bytes: Vec<u8>,
    ops: usize,
    /// The first value that would not serialise; the patch is then refused, not sent half-made.
    error: Option<String>,
}

impl PatchWriter {
    fn add(&mut self, path: &[&str], value: &impl Serialize) {
        self.op("add", path, Some(value));
    }

    fn replace(&mut self, path: &[&str], value: &impl Serialize) {
        self.op("replace", path, Some(value));
    }

    fn remove(&mut self, path: &[&str]) {
        self.op::<()>("remove", path, None);
    }

    fn op<T: Serialize>(&mut self, op: &str, path: &[&str], value: Option<&T>) {
        let start = self.bytes.len();
        self.bytes.push(if self.ops == 0 { b'[' } else { b',' });
        self.bytes.extend_from_slice(b"{\"op\":\"");
        self.bytes.extend_from_slice(op.as_bytes());
        self.bytes.extend_from_slice(b"\",\"path\":");
        // PointerBuf escapes `~` and `/` in a token (annotation keys have slashes).
        let pointer = PointerBuf::from_tokens(path.iter().copied());
        let written =
            serde_json::to_writer(&mut self.bytes, pointer.as_str()).and_then(|()| match value {
                Some(v) => {
                    self.bytes.extend_from_slice(b",\"value\":");
                    serde_json::to_writer(&mut self.bytes, v)
                }
                None => Ok(()),
            });
        match written {
            Ok(()) => {
                self.bytes.push(b'}');
                self.ops += 1;
            }
            Err(e) => {
                self.bytes.truncate(start);
                self.error.get_or_insert_with(|| format!("{pointer}: {e}"));
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.ops == 0 && self.error.is_none()
    }

    fn len(&self) -> usize {
        self.ops
    }

    /// The patch's JSON, or why a value would not serialise.
    fn finish(mut self) -> Result<Vec<u8>, String> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.ops == 0 {
            self.bytes.push(b'[');
        }
        self.bytes.push(b']');
        Ok(self.bytes)
    }
}

impl Mutator {
    /// Answers one `AdmissionReview`. Never fails: a review it cannot read is answered as invalid.
    pub fn review(&self, review: Review, opt_in: OptIn) -> Value {
        let request: AdmissionRequest<PodView> = match review.try_into() {
            Ok(request) => request,
            Err(e) => return encode(AdmissionResponse::invalid(e), None),
        };
        let response = AdmissionResponse::from(&request);
        let response = match self.decide(&request, opt_in) {
            Decision::PassThrough => response,
            Decision::Refuse(message) => {
                tracing::info!(
                    namespace = ?request.namespace, name = %request.name,
                    message = %crate::clip::clip_to(&message, crate::clip::MAX_MESSAGE_BYTES),
                    "refused"
                );
                let mut response = response.deny(&message);
                response.result.reason = "Invalid".into();
                response.result.code = 400;
                response
            }
            Decision::Mutate { ops, warnings } => {
                tracing::debug!(namespace = ?request.namespace, name = %request.name, ops = ops.len(), "opted in");
                match ops.finish() {
                    Ok(patch) => {
                        let mut response = response;
                        if !warnings.is_empty() {
                            response.warnings = Some(warnings);
                        }
                        return encode(response, Some(patch));
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "could not encode the patch");
                        response.deny(format!("peakfit webhook could not encode its patch: {e}"))
                    }
                }
            }
        };
        encode(response, None)
    }

    fn decide(&self, request: &AdmissionRequest<PodView>, opt_in: OptIn) -> Decision {
        if request.kind.kind != "Pod" {
            return Decision::PassThrough;
        }
        if request.operation == Operation::Update {
            return assignment_kept(request);
        }
        if request.operation != Operation::Create {
            return Decision::PassThrough;
        }
        let Some(object) = &request.object else {
            return Decision::PassThrough;
        };
        // The API server has already decoded the pod, so this only fails on a hand-made request;
        // such a pod is not ours to judge. The spec is read from the request's tree in place: a
        // copy of the tree to decode a whole `Pod` from cost as much as the tree itself.
        let pod_spec = match object.spec() {
            Ok(spec) => spec.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %e, "request object is not a readable Pod; passing it through");
                return Decision::PassThrough;
            }
        };
        let mut annotations = object.metadata.annotations.clone().unwrap_or_default();
        // Refusals quote the annotation cut to 256 bytes (`clip`): the API server shows the
        // message to the pod's author and logs it.
        let mut spec = match model::Spec::parse(&annotations) {
            Ok(spec) => spec,
            Err(e) => return Decision::Refuse(crate::clip::annotation_error(e).to_string()),
        };
        let mut ops = PatchWriter::default();
        let mut warnings = Vec::new();
        if self.convert_device_plugin_requests
            && (opt_in == OptIn::Namespace || !spec.is_empty())
            && let Some(conversion) = device_plugin_conversion(&pod_spec, &annotations)
        {
            conversion.write(
                object.metadata.annotations.is_none(),
                &mut annotations,
                &mut ops,
                &mut warnings,
            );
            spec = match model::Spec::parse(&annotations) {
                Ok(spec) => spec,
                Err(e) => return Decision::Refuse(crate::clip::annotation_error(e).to_string()),
            };
        }
        // The allocator setting the pod runs with, from its env: the model's slack follows it.
        // Only for a pod the model sizes (not `vram`, a GPU share or a fraction engine), which
        // describes itself, so its annotations map exists (in the review or from the conversion
        // above).
        let model_sized = (spec.describes_model() || spec.model_config.is_some())
            && spec.vram.is_none()
            && spec.gpu_share.is_none()
            && !matches!(spec.engine, Some(model::annotations::Engine::Fraction(_)));
        if model_sized
            && spec.expandable_segments.is_none()
            && let Some(env) = expandable_segments_in_env(&pod_spec)
        {
            ops.add(
                &["metadata", "annotations", EXPANDABLE_SEGMENTS],
                &env.on.to_string(),
            );
            warnings.push(if env.only_new_says_on {
                format!(
                    "{EXPANDABLE_SEGMENTS}: false: container {:?} turns expandable_segments on \
                     in PYTORCH_ALLOC_CONF only, which PyTorch before 2.9 does not read; set it in \
                     PYTORCH_CUDA_ALLOC_CONF too (every version reads that), or annotate \
                     {EXPANDABLE_SEGMENTS}: \"true\" if the image's PyTorch is 2.9 or later",
                    env.container
                )
            } else {
                format!(
                    "{EXPANDABLE_SEGMENTS}: {:?} from container {:?}'s PyTorch allocator env: the \
                     estimate follows the allocator the pod runs with",
                    env.on, env.container
                )
            });
            annotations.insert(EXPANDABLE_SEGMENTS.to_owned(), env.on.to_string());
            spec.expandable_segments = Some(env.on);
        }
        // A model in a ConfigMap is sized by the extender, which reads it: the webhook decides
        // from the review alone, so it checks the annotations and leaves the size open.
        let deferred = spec.model_config.is_some() && spec.vram.is_none();
        let pod_request = if deferred {
            None
        } else {
            match model::pod_request(&annotations) {
                Ok(r) => r,
                Err(e) => return Decision::Refuse(crate::clip::annotation_error(e).to_string()),
            }
        };
        let opted = pod_request.is_some() || deferred;
        if opted && let Some(why) = self.require_vram.refusal(&spec) {
            return Decision::Refuse(why);
        }
        // Bind's output on a pod being created is forged or copied (a restored backup, a
        // template that kept them): the extender's index would believe it and count memory
        // on GPUs nobody reserved. Removed whether or not the pod opts in.
        let carried: Vec<&str> = OUTPUTS
            .into_iter()
            .filter(|k| annotations.contains_key(*k))
            .collect();
        if !carried.is_empty() {
            for key in &carried {
                ops.remove(&["metadata", "annotations", key]);
            }
            warnings.push(format!(
                "removed {}: only peakfit's bind writes them, when it places the pod",
                carried.join(", ")
            ));
        }
        if !opted && opt_in == OptIn::Annotation {
            return if ops.is_empty() {
                Decision::PassThrough
            } else {
                Decision::Mutate { ops, warnings }
            };
        }
        let fraction = matches!(spec.engine, Some(model::annotations::Engine::Fraction(_)));

        match pod_spec.scheduler_name.as_deref() {
            Some(name) if name == self.scheduler_name => {}
            None => ops.add(&["spec", "schedulerName"], &self.scheduler_name),
            Some(name) if name.is_empty() || name == DEFAULT_SCHEDULER => {
                ops.replace(&["spec", "schedulerName"], &self.scheduler_name);
            }
            Some(other) => warnings.push(format!(
                "pod names scheduler {other:?}; peakfit leaves it, so its GPU memory is not reserved"
            )),
        }
        if let (Some(class), None) = (&self.runtime_class_name, &pod_spec.runtime_class_name) {
            ops.add(&["spec", "runtimeClassName"], class);
        }
        if let (Some(resource), Some(req)) = (&self.gpu_memory_resource, &pod_request) {
            let mib = least_gpu_memory_mib(req);
            if mib > 0 {
                let containers = pod_spec.containers.as_deref().unwrap_or_default();
                resource_ops(resource, mib, containers, &mut ops, &mut warnings);
            }
        }
        if let (Some(resource), true, Some(name)) =
            (&self.gpu_memory_resource, deferred, &spec.model_config)
        {
            warnings.push(format!(
                "peakfit.io/model-config: the extender sizes this pod from ConfigMap {name} when \
                 it schedules it; {resource} is not requested, so kube-scheduler's own fit and \
                 preemption do not see its GPU memory (give peakfit.io/vram for that)"
            ));
        }
        // A pod opted in only by its namespace and without a request is placed by the scheduler
        // but gets no GPU assignment: pinning it to an empty device list would hide its GPUs.
        if opted {
            let wanted = downward_env(fraction);
            for (field, containers) in [
                ("containers", &pod_spec.containers),
                ("initContainers", &pod_spec.init_containers),
            ] {
                let containers = containers.as_deref().unwrap_or_default();
                for (index, container) in containers.iter().enumerate() {
                    if let Err(why) =
                        env_ops(field, index, container, &wanted, &mut ops, &mut warnings)
                    {
                        return Decision::Refuse(why);
                    }
                }
            }
        }
        if ops.is_empty() {
            return Decision::PassThrough;
        }
        Decision::Mutate { ops, warnings }
    }
}

/// How an opted-in pod's device-plugin GPUs become peakfit's (issue 23): the kubelet hands
/// `nvidia.com/gpu` devices out by itself, knowing nothing of peakfit's placements, so a pod
/// peakfit schedules that also asks the device plugin for GPUs could be given a GPU peakfit
/// pods share (and the device plugin's count would not match the GPUs peakfit assigned). Such
/// a pod is made a peakfit pod of N whole GPUs instead, and peakfit is the one allocator.
#[derive(Debug, PartialEq, Eq)]
struct Conversion {
    /// The GPUs: the containers' sum, or the largest init container's if more (init containers
    /// run one at a time, before the others, as the kubelet counts them).
    gpus: u64,
    /// (field, container index, `requests`/`limits`) entries that name the resource.
    remove: Vec<(&'static str, usize, &'static str)>,
    /// The pod already says how much memory it needs (`vram`, a model...): only the count is set.
    sized: bool,
}

/// The conversion of a pod that asks for `nvidia.com/gpu`, if it does. A pod giving its own
/// `peakfit.io/gpus` keeps it; a pod with a peakfit request keeps its sizing, and one without
/// takes whole GPUs (`gpu-share: 1`, which fits only a GPU nobody else uses).
fn device_plugin_conversion(
    spec: &SpecView,
    annotations: &std::collections::BTreeMap<String, String>,
) -> Option<Conversion> {
    let count = |c: &ContainerView, field: &str| -> Option<u64> {
        let r = c.resources.as_ref()?;
        let map = if field == "limits" {
            r.limits.as_ref()
        } else {
            r.requests.as_ref()
        }?;
        map.get(DEVICE_PLUGIN_GPU)
            .map(|q| q.0.trim().parse::<u64>().unwrap_or(0))
    };
    let mut remove = Vec::new();
    let (mut sum, mut init_max) = (0u64, 0u64);
    for (field, list) in [
        ("containers", &spec.containers),
        ("initContainers", &spec.init_containers),
    ] {
        for (i, c) in list.as_deref().unwrap_or_default().iter().enumerate() {
            // Limits decide an extended resource (requests, when given, must equal them).
            let n = count(c, "limits").or_else(|| count(c, "requests"));
            for part in ["requests", "limits"] {
                if count(c, part).is_some() {
                    remove.push((field, i, part));
                }
            }
            let n = n.unwrap_or(0);
            if field == "containers" {
                sum = sum.saturating_add(n);
            } else {
                init_max = init_max.max(n);
            }
        }
    }
    if remove.is_empty() {
        return None;
    }
    let sized = model::Spec::parse(annotations).is_ok_and(|s| {
        s.vram.is_some()
            || s.gpu_share.is_some()
            || model::pod_request(annotations).is_ok_and(|r| r.is_some())
    });
    Some(Conversion {
        gpus: sum.max(init_max),
        remove,
        sized,
    })
}

impl Conversion {
    /// The patch: the resource out of every container, and the annotations in (`fresh`: the pod
    /// has no annotations map yet). `annotations` becomes what the pod will carry.
    fn write(
        &self,
        fresh: bool,
        annotations: &mut std::collections::BTreeMap<String, String>,
        ops: &mut PatchWriter,
        warnings: &mut Vec<String>,
    ) {
        for &(field, index, part) in &self.remove {
            ops.remove(&[
                "spec",
                field,
                &index.to_string(),
                "resources",
                part,
                DEVICE_PLUGIN_GPU,
            ]);
        }
        let gpus_key = format!("{}gpus", model::annotations::PREFIX);
        let share_key = format!("{}gpu-share", model::annotations::PREFIX);
        let mut added: Vec<(String, String)> = Vec::new();
        if self.gpus == 0 {
            warnings.push(format!(
                "removed {DEVICE_PLUGIN_GPU}: 0 GPUs asked; peakfit places this pod on no GPU"
            ));
            return;
        }
        if !annotations.contains_key(&gpus_key) {
            added.push((gpus_key.clone(), self.gpus.to_string()));
        }
        if !self.sized {
            added.push((share_key, "1".to_owned()));
        }
        if fresh && !added.is_empty() {
            let map: std::collections::BTreeMap<&str, &str> = added
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            ops.add(&["metadata", "annotations"], &map);
        } else {
            for (k, v) in &added {
                ops.add(&["metadata", "annotations", k], v);
            }
        }
        let said: Vec<String> = added.iter().map(|(k, v)| format!("{k}: {v:?}")).collect();
        warnings.push(format!(
            "converted {DEVICE_PLUGIN_GPU}: {} into {}: peakfit assigns this pod's GPUs, so that \
             the device plugin never gives it (or another pod) a GPU peakfit pods share \
             (webhook --convert-device-plugin-requests)",
            self.gpus,
            if said.is_empty() {
                "the pod's own peakfit.io/ annotations".to_owned()
            } else {
                said.join(", ")
            }
        ));
        annotations.extend(added);
    }
}

/// The annotation that says the pod's PyTorch maps expandable segments.
const EXPANDABLE_SEGMENTS: &str = "peakfit.io/expandable-segments";

/// `expandable_segments` as the first container that sets PyTorch's allocator env says it, with
/// the container and variable that said it, and whether the pod's PyTorch version decides it.
///
/// PyTorch 2.9 and later read `PYTORCH_ALLOC_CONF` when it is set and the older
/// `PYTORCH_CUDA_ALLOC_CONF` only when it is not (`c10/core/AllocatorConfig.cpp`); earlier
/// releases read only `PYTORCH_CUDA_ALLOC_CONF`. The webhook cannot see the version, so the
/// setting is taken as on only where every version would turn it on: `PYTORCH_CUDA_ALLOC_CONF`
/// says `True` and `PYTORCH_ALLOC_CONF`, if set, says so too. A variable from a ConfigMap or
/// Secret (`valueFrom`) is not in the review, so a container with one says nothing, and of two
/// entries of one name the last wins, as the kubelet sets them. `backend:cudaMallocAsync` is
/// CUDA's own allocator, which has no expandable segments and is not the model's.
fn expandable_segments_in_env(spec: &SpecView) -> Option<ExpandableFromEnv> {
    spec.containers.as_deref()?.iter().find_map(|c| {
        let env = c.env.as_deref()?;
        // `None`: unset; `Some(None)`: set, but not to a literal value.
        let var = |name: &str| {
            env.iter()
                .rev()
                .find(|e| e.name == name)
                .map(|e| e.value.as_deref())
        };
        let (new, old) = (var("PYTORCH_ALLOC_CONF"), var("PYTORCH_CUDA_ALLOC_CONF"));
        // PyTorch 2.9 on reads the old name only when the new one is unset.
        let new_set = new.is_some();
        if new.is_none() && old.is_none() {
            return None;
        }
        // What each says of the setting (`None`: unset, or not mentioned); a value the review
        // does not hold, or CUDA's own allocator, says nothing for the pod.
        let read = |v: Option<Option<&str>>| match v {
            None => Some(None),
            Some(Some(conf)) if !uses_cuda_malloc_async(conf) => Some(expandable_segments_of(conf)),
            Some(_) => None,
        };
        let (new, old) = (read(new)?, read(old)?);
        if new.is_none() && old.is_none() {
            return None;
        }
        let on = old == Some(true) && (!new_set || new == Some(true));
        Some(ExpandableFromEnv {
            on,
            container: c.name.clone(),
            only_new_says_on: !on && new == Some(true),
        })
    })
}

/// What [`expandable_segments_in_env`] read.
struct ExpandableFromEnv {
    on: bool,
    container: String,
    /// `PYTORCH_ALLOC_CONF` turns it on, but without `PYTORCH_CUDA_ALLOC_CONF` saying so too a
    /// PyTorch before 2.9 runs without it: counted off, and the pod is told.
    only_new_says_on: bool,
}

/// Whether an allocator config picks CUDA's `cudaMallocAsync` backend.
fn uses_cuda_malloc_async(conf: &str) -> bool {
    alloc_conf_items(conf).any(|(k, v)| k == "backend" && v == "cudaMallocAsync")
}

/// `expandable_segments` in an allocator config, if it is set to `True` or `False`, the only
/// values PyTorch takes (the last one given wins, as in PyTorch's parser).
fn expandable_segments_of(conf: &str) -> Option<bool> {
    alloc_conf_items(conf)
        .filter(|(k, _)| *k == "expandable_segments")
        .filter_map(|(_, v)| match v {
            "True" => Some(true),
            "False" => Some(false),
            _ => None,
        })
        .last()
}

/// The `key:value` items of an allocator config string, trimmed: separated by commas, except
/// inside `roundup_power2_divisions`' bracketed list, which has commas of its own.
fn alloc_conf_items(conf: &str) -> impl Iterator<Item = (&str, &str)> {
    let mut depth = 0i32;
    conf.split(move |c: char| {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            _ => {}
        }
        c == ',' && depth == 0
    })
    .filter_map(|item| item.split_once(':'))
    .map(|(k, v)| (k.trim(), v.trim()))
}

/// The annotations bind writes, in the order they are reported.
const OUTPUTS: [&str; 3] = [ASSIGNED_GPUS, RESERVED_BYTES, GPU_MEMORY_FRACTION];

/// An UPDATE of a bound pod must leave bind's output as it was: the containers were pinned to
/// those GPUs when they started, and the extender's index counts the pod's memory where the
/// annotations say. Before the pod is bound, bind itself writes them (and may rewrite them when
/// a Binding failed), so an unbound pod is left alone; the chart's `ValidatingAdmissionPolicy`
/// limits that window to the scheduler's service account.
fn assignment_kept(request: &AdmissionRequest<PodView>) -> Decision {
    let (Some(old), Some(new)) = (&request.old_object, &request.object) else {
        return Decision::PassThrough;
    };
    let bound = old
        .spec()
        .ok()
        .flatten()
        .and_then(|s| s.node_name)
        .is_some_and(|n| !n.is_empty());
    if !bound {
        return Decision::PassThrough;
    }
    let value = |o: &PodView, k: &str| {
        o.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .cloned()
    };
    let changed: Vec<String> = OUTPUTS
        .into_iter()
        .filter_map(|k| {
            let (was, now) = (value(old, k), value(new, k));
            (was != now).then(|| {
                let show = |v: Option<String>| {
                    v.map_or("unset".to_owned(), |v| {
                        format!("{:?}", crate::clip::clip(&v))
                    })
                };
                format!("{k} from {} to {}", show(was), show(now))
            })
        })
        .collect();
    if changed.is_empty() {
        return Decision::PassThrough;
    }
    Decision::Refuse(format!(
        "{}: only peakfit's bind writes them, before the pod is bound; the pod runs on the GPUs \
         they name (delete and recreate the pod to place it again)",
        changed.join(", ")
    ))
}

/// The least GPU memory, in whole MiB, the pod can reserve on any node: its per-GPU demand on
/// the smallest GPU it runs on (a fraction engine's share grows with the GPU), times its GPUs,
/// rounded down. A lower bound keeps kube-scheduler's node-level check from ever refusing a node
/// the extender would accept; the extender then decides per GPU.
pub fn least_gpu_memory_mib(req: &model::PodRequest) -> u64 {
    let shape = req.shape();
    let per_gpu = shape.demand.bytes_on(shape.demand.min_gpu_total_bytes);
    per_gpu.saturating_mul(u64::from(shape.gpus)) >> 20
}

/// Requests (and limits: an extended resource must have both, equal) `mib` of `resource` on the
/// first container. A value the pod set itself is replaced: it is peakfit's resource, and a
/// different count would make the scheduler's node-level view disagree with the extender's.
fn resource_ops(
    resource: &str,
    mib: u64,
    containers: &[ContainerView],
    ops: &mut PatchWriter,
    warnings: &mut Vec<String>,
) {
    let Some(first) = containers.first() else {
        return;
    };
    let value = Value::from(mib.to_string());
    let wanted = k8s_openapi::apimachinery::pkg::api::resource::Quantity(mib.to_string());
    let resources = first.resources.clone().unwrap_or_default();
    for field in ["requests", "limits"] {
        let map = match field {
            "requests" => &resources.requests,
            _ => &resources.limits,
        };
        match map.as_ref().map(|m| m.get(resource)) {
            None if first.resources.is_none() && field == "requests" => {
                ops.add(
                    &["spec", "containers", "0", "resources"],
                    &serde_json::json!({"requests": {resource: value}, "limits": {resource: value}}),
                );
                return;
            }
            None => ops.add(
                &["spec", "containers", "0", "resources", field],
                &serde_json::json!({resource: value}),
            ),
            Some(None) => ops.add(
                &["spec", "containers", "0", "resources", field, resource],
                &value,
            ),
            Some(Some(q)) if *q == wanted => {}
            Some(Some(q)) => {
                warnings.push(format!(
                    "container {:?} {field} {resource}={}; peakfit sets it to {mib} (MiB, the \
                     pod's least GPU memory)",
                    first.name, q.0
                ));
                ops.replace(
                    &["spec", "containers", "0", "resources", field, resource],
                    &value,
                );
            }
        }
    }
}

/// The env that pins a container to what bind assigned; resolved by the kubelet at container start,
/// after bind has written the annotations.
fn downward_env(fraction: bool) -> Vec<EnvVar> {
    let mut env = vec![
        from_annotation(VISIBLE_DEVICES, ASSIGNED_GPUS),
        from_annotation("PEAKFIT_VRAM_BYTES", RESERVED_BYTES),
    ];
    if fraction {
        env.push(from_annotation(
            "PEAKFIT_GPU_MEMORY_FRACTION",
            GPU_MEMORY_FRACTION,
        ));
    }
    env
}

fn from_annotation(name: &str, annotation: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: format!("metadata.annotations['{annotation}']"),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// Adds the missing variables; a variable the pod already sets is kept (re-invocation adds nothing).
/// Adds the env `wanted` that the container lacks. A container that sets
/// `NVIDIA_VISIBLE_DEVICES` itself would see GPUs peakfit did not assign it (every GPU, with
/// `all`) while the ledger counts its memory on others: refused, naming the container and its
/// value (issue 24; it was admitted with a warning). Another of the variables set differently is
/// only the container's own business: a warning.
fn env_ops(
    field: &str,
    index: usize,
    container: &ContainerView,
    wanted: &[EnvVar],
    ops: &mut PatchWriter,
    warnings: &mut Vec<String>,
) -> Result<(), String> {
    let existing = container.env.as_deref().unwrap_or_default();
    let mut missing: Vec<&EnvVar> = Vec::new();
    for w in wanted {
        match existing.iter().find(|e| e.name == w.name) {
            None => missing.push(w),
            Some(e) if e == w => {}
            Some(e) if w.name == VISIBLE_DEVICES => {
                let value = e.value.as_deref().map_or_else(
                    || "from a reference".to_owned(),
                    |v| format!("{:?}", crate::clip::clip(v)),
                );
                return Err(format!(
                    "{field}[{index}] ({:?}) sets {VISIBLE_DEVICES} itself ({value}): in a pod \
                     peakfit places, peakfit sets it to the GPUs bind assigns, and a value of \
                     the pod's own would show the container GPUs whose memory is reserved for \
                     other pods; remove it from the container's env",
                    crate::clip::clip(&container.name)
                ));
            }
            Some(_) => warnings.push(format!(
                "container {:?} sets {} itself; peakfit's assignment is not applied to it",
                crate::clip::clip(&container.name),
                w.name
            )),
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let index = index.to_string();
    if existing.is_empty() {
        ops.add(&["spec", field, &index, "env"], &missing);
    } else {
        for env in missing {
            ops.add(&["spec", field, &index, "env", "-"], env);
        }
    }
    Ok(())
}

/// The variable the NVIDIA container runtime selects a container's GPUs by.
const VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// The review around `response`, with `patch` as the API documents it: base64 (Go's `[]byte`)
/// and `patchType: JSONPatch`. `AdmissionResponse` would serialise a patch as a JSON array of
/// numbers (~40 bytes of memory per patch byte as a `Value`), so the patch never goes through it.
fn encode(response: AdmissionResponse, patch: Option<Vec<u8>>) -> Value {
    use base64::Engine as _;
    let mut review = serde_json::to_value(response.into_review()).unwrap_or(Value::Null);
    if let (Some(patch), Some(Value::Object(r))) = (patch, review.get_mut("response")) {
        let patch = base64::engine::general_purpose::STANDARD.encode(patch);
        r.insert("patch".into(), patch.into());
        r.insert("patchType".into(), "JSONPatch".into());
    }
    review
}

#[cfg(test)]
mod tests {
    use super::*;
    use json_patch::{AddOperation, PatchOperation, RemoveOperation, ReplaceOperation};
    use serde_json::json;

    impl PatchWriter {
        /// The operations as the API server reads them.
        fn decoded(self) -> Vec<PatchOperation> {
            let bytes = self.finish().expect("the patch serialises");
            serde_json::from_slice::<json_patch::Patch>(&bytes)
                .expect("the patch is a JSON Patch")
                .0
        }
    }

    fn add(path: &[&str], value: Value) -> PatchOperation {
        PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(path.iter().copied()),
            value,
        })
    }

    fn remove(path: &[&str]) -> PatchOperation {
        PatchOperation::Remove(RemoveOperation {
            path: PointerBuf::from_tokens(path.iter().copied()),
        })
    }

    fn replace(path: &[&str], value: Value) -> PatchOperation {
        PatchOperation::Replace(ReplaceOperation {
            path: PointerBuf::from_tokens(path.iter().copied()),
            value,
        })
    }

    #[test]
    fn the_written_patch_is_the_json_patch_of_its_operations() {
        let mut w = PatchWriter::default();
        assert_eq!(PatchWriter::default().finish().unwrap(), b"[]");
        w.add(&["spec", "schedulerName"], &"s");
        w.remove(&["metadata", "annotations", "a/b~c"]);
        w.replace(&["spec", "x"], &json!({"k": [1, "\"q\""]}));
        assert_eq!(w.len(), 3);
        assert_eq!(
            w.decoded(),
            [
                add(&["spec", "schedulerName"], "s".into()),
                remove(&["metadata", "annotations", "a/b~c"]),
                replace(&["spec", "x"], json!({"k": [1, "\"q\""]})),
            ]
        );
    }

    /// A value that will not serialise (a map with non-string keys) refuses the whole patch
    /// rather than sending a half-written one.
    #[test]
    fn a_value_that_will_not_serialise_refuses_the_patch() {
        let mut w = PatchWriter::default();
        w.add(&["a"], &1);
        w.add(&["b"], &std::collections::BTreeMap::from([((1, 2), 3)]));
        assert!(!w.is_empty());
        let e = w.finish().unwrap_err();
        assert!(e.contains("/b"), "{e}");
    }

    fn mutator() -> Mutator {
        Mutator {
            scheduler_name: "peakfit-scheduler".into(),
            runtime_class_name: None,
            gpu_memory_resource: None,
            require_vram: RequireVram::Off,
            convert_device_plugin_requests: false,
        }
    }

    fn review_of(pod: &Value, operation: &str) -> Review {
        serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "ml",
                "operation": operation,
                "userInfo": {"username": "alice"},
                "object": pod,
            }
        }))
        .expect("review parses")
    }

    fn pod(annotations: &Value, containers: &Value) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
            "spec": {"schedulerName": "default-scheduler", "containers": containers},
        })
    }

    fn decide(pod: &Value, opt_in: OptIn) -> Decision {
        let review = review_of(pod, "CREATE");
        mutator().decide(&review.try_into().unwrap(), opt_in)
    }

    /// A pod whose container runs PyTorch with `expandable_segments:True` carries it as
    /// `peakfit.io/expandable-segments`, so the extender sizes it for that allocator;
    /// `PYTORCH_ALLOC_CONF` wins over the older name, as in PyTorch; the pod's own annotation
    /// and a pod that describes nothing are left alone.
    #[test]
    fn the_allocator_env_becomes_the_expandable_segments_annotation() {
        let conf = |vars: Value| json!([{"name": "sidecar", "image": "i"}, {"name": "train", "image": "i", "env": vars}]);
        let added = |d: Decision| match d {
            Decision::Mutate { ops, .. } => ops.decoded().into_iter().find_map(|op| match op {
                PatchOperation::Add(a)
                    if a.path == "/metadata/annotations/peakfit.io~1expandable-segments" =>
                {
                    Some(a.value)
                }
                _ => None,
            }),
            other => panic!("expected a patch, got {other:?}"),
        };
        let model = json!({"peakfit.io/model": "qwen3-0.6b"});
        let d = decide(
            &pod(
                &model,
                &conf(json!([{"name": "PYTORCH_CUDA_ALLOC_CONF",
                    "value": "max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2],expandable_segments:True"}])),
            ),
            OptIn::Annotation,
        );
        let Decision::Mutate { warnings, .. } = &d else {
            panic!("expected a patch, got {d:?}")
        };
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("\"train\"") && w.contains("allocator env")),
            "{warnings:?}"
        );
        assert_eq!(added(d), Some(json!("true")));
        let d = decide(
            &pod(
                &model,
                &conf(json!([
                    {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"},
                    {"name": "PYTORCH_ALLOC_CONF", "value": "expandable_segments:False"}])),
            ),
            OptIn::Annotation,
        );
        assert_eq!(added(d), Some(json!("false")));
        // Only the new name: PyTorch before 2.9 would not read it; counted off, and said.
        let d = decide(
            &pod(
                &model,
                &conf(json!([{"name": "PYTORCH_ALLOC_CONF", "value": "expandable_segments:True"}])),
            ),
            OptIn::Annotation,
        );
        let Decision::Mutate { warnings, .. } = &d else {
            panic!("expected a patch, got {d:?}")
        };
        assert!(
            warnings.iter().any(|w| w.contains("before 2.9")),
            "{warnings:?}"
        );
        assert_eq!(added(d), Some(json!("false")));
        // The new name set, without the setting: PyTorch 2.9 on does not read the old one.
        let d = decide(
            &pod(
                &model,
                &conf(json!([
                    {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"},
                    {"name": "PYTORCH_ALLOC_CONF", "value": "max_split_size_mb:64"}])),
            ),
            OptIn::Annotation,
        );
        assert_eq!(added(d), Some(json!("false")));
        // The last of two entries of one name is the one the kubelet sets.
        let d = decide(
            &pod(
                &model,
                &conf(json!([
                    {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:False"},
                    {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"}])),
            ),
            OptIn::Annotation,
        );
        assert_eq!(added(d), Some(json!("true")));
        // Not set, from a ConfigMap (the new name's hides the old one's literal, as in
        // PyTorch), CUDA's own allocator, stated by the pod, or a pod the model does not size:
        // nothing added.
        for (annotations, vars) in [
            (
                model.clone(),
                json!([
                {"name": "PYTORCH_ALLOC_CONF", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
                {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"}]),
            ),
            (
                model.clone(),
                json!([{"name": "PYTORCH_CUDA_ALLOC_CONF",
                "value": "backend:cudaMallocAsync,expandable_segments:True"}]),
            ),
            (
                json!({"peakfit.io/vram": "20Gi"}),
                json!([{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"}]),
            ),
            (
                model.clone(),
                json!([{"name": "PYTORCH_ALLOC_CONF", "value": "max_split_size_mb:64"}]),
            ),
            (
                model.clone(),
                json!([{"name": "PYTORCH_ALLOC_CONF",
                "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]),
            ),
            (
                json!({"peakfit.io/model": "qwen3-0.6b", "peakfit.io/expandable-segments": "false"}),
                json!([{"name": "PYTORCH_ALLOC_CONF", "value": "expandable_segments:True"}]),
            ),
        ] {
            assert_eq!(
                added(decide(
                    &pod(&annotations, &conf(vars.clone())),
                    OptIn::Annotation
                )),
                None,
                "{vars}"
            );
        }
        let plain = decide(
            &pod(
                &json!({}),
                &conf(json!([{"name": "PYTORCH_ALLOC_CONF", "value": "expandable_segments:True"}])),
            ),
            OptIn::Annotation,
        );
        assert_eq!(plain, Decision::PassThrough);
    }

    #[test]
    fn existing_env_is_not_duplicated_and_a_differing_one_is_reported() {
        let d = decide(
            &pod(
                &json!({"peakfit.io/vram": "20Gi"}),
                &json!([{"name": "c", "image": "i", "env": [
                    {"name": "PEAKFIT_VRAM_BYTES", "value": "1"},
                    {"name": "OTHER", "value": "x"}]}]),
            ),
            OptIn::Annotation,
        );
        let Decision::Mutate { ops, warnings } = d else {
            panic!("expected a patch, got {d:?}")
        };
        let paths: Vec<String> = ops
            .decoded()
            .iter()
            .map(|op| match op {
                PatchOperation::Add(a) => a.path.to_string(),
                PatchOperation::Replace(r) => r.path.to_string(),
                other => panic!("unexpected op {other:?}"),
            })
            .collect();
        assert_eq!(paths, ["/spec/schedulerName", "/spec/containers/0/env/-"]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("PEAKFIT_VRAM_BYTES"));
    }

    /// Issue 24: a container that set `NVIDIA_VISIBLE_DEVICES=all` was admitted with a warning
    /// and saw every GPU. It is refused, naming the container, the variable and its value.
    #[test]
    fn a_container_setting_its_own_visible_devices_is_refused() {
        let d = decide(
            &pod(
                &json!({"peakfit.io/vram": "20Gi"}),
                &json!([{"name": "c", "image": "i"}, {"name": "greedy", "image": "i", "env": [
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]),
            ),
            OptIn::Annotation,
        );
        let Decision::Refuse(why) = d else {
            panic!("expected a refusal, got {d:?}")
        };
        assert!(
            why.contains(r#"containers[1] ("greedy") sets NVIDIA_VISIBLE_DEVICES itself ("all")"#),
            "{why}"
        );
    }

    #[test]
    fn an_already_mutated_pod_needs_no_patch() {
        let env = serde_json::to_value(downward_env(false)).unwrap();
        let mut p = pod(
            &json!({"peakfit.io/vram": "20Gi"}),
            &json!([{"name": "c", "image": "i", "env": env}]),
        );
        p["spec"]["schedulerName"] = "peakfit-scheduler".into();
        assert_eq!(decide(&p, OptIn::Annotation), Decision::PassThrough);
    }

    #[test]
    fn another_scheduler_is_respected_with_a_warning() {
        let mut p = pod(
            &json!({"peakfit.io/vram": "20Gi"}),
            &json!([{"name": "c", "image": "i"}]),
        );
        p["spec"]["schedulerName"] = "volcano".into();
        let Decision::Mutate { ops, warnings } = decide(&p, OptIn::Annotation) else {
            panic!("expected a patch")
        };
        assert_eq!(ops.len(), 1, "only the env: {ops:?}");
        assert!(warnings[0].contains("volcano"));
    }

    #[test]
    fn namespace_opt_in_without_a_request_sets_only_the_scheduler() {
        let d = decide(
            &pod(&json!({}), &json!([{"name": "c", "image": "i"}])),
            OptIn::Namespace,
        );
        let Decision::Mutate { ops, .. } = d else {
            panic!("expected a patch, got {d:?}")
        };
        assert_eq!(
            ops.decoded(),
            [replace(
                &["spec", "schedulerName"],
                "peakfit-scheduler".into()
            )]
        );
    }

    #[test]
    fn bind_output_on_a_new_pod_is_removed_even_without_opt_in() {
        let forged = json!({
            "peakfit.io/assigned-gpus": "GPU-0",
            "peakfit.io/reserved-bytes": "1",
            "example.com/keep": "yes",
        });
        let d = decide(
            &pod(&forged.clone(), &json!([{"name": "c", "image": "i"}])),
            OptIn::Annotation,
        );
        let Decision::Mutate { ops, warnings } = d else {
            panic!("expected a patch, got {d:?}")
        };
        let ops = ops.decoded();
        assert_eq!(
            ops,
            [
                remove(&["metadata", "annotations", "peakfit.io/assigned-gpus"]),
                remove(&["metadata", "annotations", "peakfit.io/reserved-bytes"]),
            ]
        );
        assert!(
            warnings[0].contains("peakfit.io/assigned-gpus"),
            "{warnings:?}"
        );
        // The pointer escapes the key's slash as JSON Pointer requires.
        let PatchOperation::Remove(r) = &ops[0] else {
            unreachable!()
        };
        assert_eq!(
            r.path.to_string(),
            "/metadata/annotations/peakfit.io~1assigned-gpus"
        );
        // Applied to the pod, only peakfit's output goes.
        let mut object = pod(&forged, &json!([]));
        json_patch::patch(&mut object, &ops).unwrap();
        assert_eq!(
            object["metadata"]["annotations"],
            json!({"example.com/keep": "yes"})
        );
    }

    #[test]
    fn a_fraction_engine_with_explicit_vram_is_told_its_fraction() {
        let d = decide(
            &pod(
                &json!({"peakfit.io/vram": "30Gi", "peakfit.io/engine": "vllm"}),
                &json!([{"name": "c", "image": "i"}]),
            ),
            OptIn::Annotation,
        );
        let Decision::Mutate { ops, .. } = d else {
            panic!("expected a patch, got {d:?}")
        };
        let text = String::from_utf8(ops.finish().unwrap()).unwrap();
        assert!(text.contains("PEAKFIT_GPU_MEMORY_FRACTION"), "{text}");
    }

    #[test]
    fn fraction_budget_engines_also_get_the_fraction() {
        let names: Vec<String> = downward_env(true).into_iter().map(|e| e.name).collect();
        assert_eq!(
            names,
            [
                "NVIDIA_VISIBLE_DEVICES",
                "PEAKFIT_VRAM_BYTES",
                "PEAKFIT_GPU_MEMORY_FRACTION"
            ]
        );
        let fraction = &downward_env(true)[2];
        let path = fraction
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        assert_eq!(
            path,
            Some("metadata.annotations['peakfit.io/gpu-memory-fraction']")
        );
    }

    #[test]
    fn updates_and_other_kinds_pass_through() {
        // A bogus value that a pod CREATE would be refused for: passing through shows it was not read.
        let p = pod(&json!({"peakfit.io/vram": "bogus"}), &json!([]));
        assert!(matches!(decide(&p, OptIn::Annotation), Decision::Refuse(_)));
        let review = review_of(&p, "UPDATE");
        assert_eq!(
            mutator().decide(&review.try_into().unwrap(), OptIn::Annotation),
            Decision::PassThrough
        );
        let mut other = serde_json::to_value(review_of(&p, "CREATE")).unwrap();
        other["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
        let review: Review = serde_json::from_value(other).unwrap();
        assert_eq!(
            mutator().decide(&review.try_into().unwrap(), OptIn::Namespace),
            Decision::PassThrough
        );
    }

    fn converting() -> Mutator {
        Mutator {
            convert_device_plugin_requests: true,
            ..mutator()
        }
    }

    fn ops_of(d: Decision) -> (Vec<PatchOperation>, Vec<String>) {
        let Decision::Mutate { ops, warnings } = d else {
            panic!("not mutated: {d:?}")
        };
        (ops.decoded(), warnings)
    }

    /// Issue 23: `nvidia.com/gpu: 2` in an opted-in namespace becomes a peakfit pod of two whole
    /// GPUs: the resource leaves every container, the annotations say so, and the pod is
    /// pinned like any peakfit pod.
    #[test]
    fn a_device_plugin_request_in_an_opted_in_namespace_becomes_whole_gpus() {
        let p = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "trainer", "namespace": "ml"},
            "spec": {"containers": [
                {"name": "a", "image": "i", "resources": {
                    "limits": {"nvidia.com/gpu": "1", "cpu": "2"},
                    "requests": {"nvidia.com/gpu": "1"}}},
                {"name": "b", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            ]},
        });
        let review = review_of(&p, "CREATE");
        let (ops, warnings) =
            ops_of(converting().decide(&review.try_into().unwrap(), OptIn::Namespace));
        for path in [
            [
                "spec",
                "containers",
                "0",
                "resources",
                "requests",
                "nvidia.com/gpu",
            ],
            [
                "spec",
                "containers",
                "0",
                "resources",
                "limits",
                "nvidia.com/gpu",
            ],
            [
                "spec",
                "containers",
                "1",
                "resources",
                "limits",
                "nvidia.com/gpu",
            ],
        ] {
            assert!(
                ops.contains(&remove(&path)),
                "{path:?} not removed: {ops:?}"
            );
        }
        assert!(
            ops.contains(&add(
                &["metadata", "annotations"],
                json!({"peakfit.io/gpus": "2", "peakfit.io/gpu-share": "1"})
            )),
            "{ops:?}"
        );
        assert!(ops.iter().any(|o| matches!(o, PatchOperation::Add(a)
            if a.path.as_str() == "/spec/containers/0/env")));
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("converted nvidia.com/gpu: 2")),
            "{warnings:?}"
        );

        // Switched off, the same pod is left to the device plugin (only scheduled by peakfit).
        let review = review_of(&p, "CREATE");
        let d = mutator().decide(&review.try_into().unwrap(), OptIn::Namespace);
        let (ops, _) = ops_of(d);
        assert!(
            !ops.iter().any(|o| matches!(o, PatchOperation::Remove(_))),
            "{ops:?}"
        );
    }

    /// A pod that sizes itself keeps its sizing and its own GPU count; one of a namespace not
    /// opted in (no peakfit annotation on `/mutate`) is not touched.
    #[test]
    fn a_sized_pod_keeps_its_sizing_and_others_pass() {
        let sized = pod(
            &json!({"peakfit.io/vram": "20Gi"}),
            &json!([{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]),
        );
        let review = review_of(&sized, "CREATE");
        let (ops, _) = ops_of(converting().decide(&review.try_into().unwrap(), OptIn::Annotation));
        assert!(ops.contains(&add(
            &["metadata", "annotations", "peakfit.io/gpus"],
            "3".into()
        )));
        assert!(
            !ops.iter().any(|o| o.path().as_str().contains("gpu-share")),
            "{ops:?}"
        );

        let plain = pod(
            &json!({}),
            &json!([{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
        );
        let review = review_of(&plain, "CREATE");
        assert_eq!(
            converting().decide(&review.try_into().unwrap(), OptIn::Annotation),
            Decision::PassThrough
        );
    }

    #[test]
    fn runtime_class_is_added_only_when_the_pod_names_none() {
        let m = Mutator {
            runtime_class_name: Some("nvidia".into()),
            ..mutator()
        };
        let p = pod(
            &json!({"peakfit.io/vram": "8Gi"}),
            &json!([{"name": "c", "image": "i"}]),
        );
        let review = review_of(&p, "CREATE");
        let Decision::Mutate { ops, .. } = m.decide(&review.try_into().unwrap(), OptIn::Annotation)
        else {
            panic!("expected a patch")
        };
        assert!(
            ops.decoded()
                .contains(&add(&["spec", "runtimeClassName"], "nvidia".into()))
        );
        let mut p = p;
        p["spec"]["runtimeClassName"] = "kata".into();
        let review = review_of(&p, "CREATE");
        let Decision::Mutate { ops, .. } = m.decide(&review.try_into().unwrap(), OptIn::Annotation)
        else {
            panic!("expected a patch")
        };
        assert!(
            !ops.decoded().iter().any(
                |op| matches!(op, PatchOperation::Add(a) if a.path == "/spec/runtimeClassName")
            )
        );
    }

    #[test]
    fn an_unreadable_review_is_answered_invalid() {
        let review: Review = serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"
        }))
        .unwrap();
        let out = mutator().review(review, OptIn::Annotation);
        assert_eq!(out["response"]["allowed"], false);
    }
}
