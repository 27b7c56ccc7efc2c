//! Writing a bind decision: one Binding that carries the pod's GPU annotations. The API server
//! copies a Binding's annotations onto the pod in the same update that sets `spec.nodeName`, so
//! the pod is bound and annotated at once or not at all: no stale `assigned-gpus` on an unbound
//! pod, and one write (one watch event to every watcher) per pod where patching the pod first
//! made two, which cost the scheduler's throughput on a busy API server (`scheduler_throughput`).

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use parking_lot::Mutex;

/// The field manager of every write the extender makes (pod annotations, Bindings, Node nudges).
pub const FIELD_MANAGER: &str = "peakfit-extender";

/// The pod to bind and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindTarget {
    pub namespace: String,
    pub name: String,
    /// The API server refuses the binding if the pod was recreated under the same name.
    pub uid: Option<String>,
    pub node: String,
}

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("creating the binding of pod {namespace}/{name} to node {node} failed: {source}")]
    Bind {
        namespace: String,
        name: String,
        node: String,
        source: kube::Error,
    },
    #[error("writing the hold (peakfit.io/hold) on pod {namespace}/{name} failed: {source}")]
    Hold {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("reading pod {namespace}/{name} from the API server failed: {source}")]
    Read {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error(
        "removing the expired hold (peakfit.io/hold) from pod {namespace}/{name} failed: {source}"
    )]
    ClearHold {
        namespace: String,
        name: String,
        source: kube::Error,
    },
}

impl BindError {
    /// Whether the API server refused the write because a precondition failed (the pod's
    /// `resourceVersion` or UID): the pod changed, so the writer reads it again and decides anew.
    pub fn is_conflict(&self) -> bool {
        let source = match self {
            Self::Bind { source, .. }
            | Self::Hold { source, .. }
            | Self::Read { source, .. }
            | Self::ClearHold { source, .. } => source,
        };
        matches!(source, kube::Error::Api(s) if s.code == 409)
    }
}

/// Where bind's writes go: the API server, or memory (file mode, tests).
pub trait BindingWriter: Send + Sync {
    /// Binds the pod with `annotations` written onto it (none when empty).
    fn bind<'a>(
        &'a self,
        target: &'a BindTarget,
        annotations: &'a BTreeMap<String, String>,
    ) -> BoxFuture<'a, Result<(), BindError>>;

    /// Writes `peakfit.io/hold` on a pending pod (`target.node` is the held node), on condition
    /// that the pod is still at `resource_version` (when given): two replicas deciding at once
    /// cannot both hold memory for it, the second gets a conflict. Then records `event` on it.
    fn hold<'a>(
        &'a self,
        target: &'a BindTarget,
        value: &'a str,
        resource_version: Option<&'a str>,
        event: &'a str,
    ) -> BoxFuture<'a, Result<(), BindError>>;

    /// Removes an expired `peakfit.io/hold` from a pending pod, on condition that the pod is
    /// still at `resource_version` (read just before, with the expired hold on it): a new hold
    /// written meanwhile is never removed, and of several replicas sweeping the same hold one
    /// removes it.
    fn clear_hold<'a>(
        &'a self,
        target: &'a BindTarget,
        resource_version: &'a str,
    ) -> BoxFuture<'a, Result<(), BindError>>;

    /// The pod as the API server has it now, for a bind that arrives before the watch delivered
    /// the pod, and for a hold's write or removal refused with a conflict. `Ok(None)`: no such
    /// pod (or nothing to ask, as in file mode).
    fn get_pod<'a>(
        &'a self,
        _namespace: &'a str,
        _name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Pod>, BindError>> {
        Box::pin(async { Ok(None) })
    }
}

/// Writes through the API server.
#[derive(Clone)]
pub struct KubeBinder {
    client: kube::Client,
}

impl KubeBinder {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    /// A JSON merge patch of the pod `target` names, as the extender's field manager.
    async fn merge_patch(
        &self,
        target: &BindTarget,
        patch: &serde_json::Value,
    ) -> Result<(), kube::Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &target.namespace);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        pods.patch(&target.name, &params, &Patch::Merge(patch))
            .await
            .map(drop)
    }
}

/// The Binding the API server expects: target Node, the pod's UID as a precondition, and the
/// annotations the API server copies onto the pod as it binds it.
pub fn binding_for(target: &BindTarget, annotations: &BTreeMap<String, String>) -> Binding {
    Binding {
        metadata: ObjectMeta {
            name: Some(target.name.clone()),
            namespace: Some(target.namespace.clone()),
            uid: target.uid.clone(),
            annotations: (!annotations.is_empty()).then(|| annotations.clone()),
            ..Default::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(target.node.clone()),
            ..Default::default()
        },
    }
}

impl BindingWriter for KubeBinder {
    fn bind<'a>(
        &'a self,
        target: &'a BindTarget,
        annotations: &'a BTreeMap<String, String>,
    ) -> BoxFuture<'a, Result<(), BindError>> {
        Box::pin(async move {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &target.namespace);
            let created = pods
                .create_subresource::<_, kube::core::Status>(
                    "binding",
                    &target.name,
                    &PostParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    &binding_for(target, annotations),
                )
                .await;
            let Err(source) = created else { return Ok(()) };
            // A retried request that went through after all: bound where asked, with our GPUs.
            match pods.get_opt(&target.name).await {
                Ok(Some(pod)) if is_bound_to(&pod, target, annotations) => Ok(()),
                Ok(_) => Err(bind_error(target, source)),
                Err(e) => {
                    tracing::warn!(
                        pod = %format!("{}/{}", target.namespace, target.name), error = %e,
                        "the binding failed and the pod could not be read back"
                    );
                    Err(bind_error(target, source))
                }
            }
        })
    }

    fn hold<'a>(
        &'a self,
        target: &'a BindTarget,
        value: &'a str,
        resource_version: Option<&'a str>,
        event: &'a str,
    ) -> BoxFuture<'a, Result<(), BindError>> {
        Box::pin(async move {
            self.merge_patch(target, &hold_patch(target, value, resource_version))
                .await
                .map_err(|source| BindError::Hold {
                    namespace: target.namespace.clone(),
                    name: target.name.clone(),
                    source,
                })?;
            let pod = crate::cluster::events::PodRef {
                namespace: &target.namespace,
                name: &target.name,
                uid: target.uid.as_deref(),
            };
            crate::cluster::events::record(
                &self.client,
                &pod,
                "PeakfitHold",
                event,
                "peakfit-extender",
            )
            .await;
            Ok(())
        })
    }

    fn clear_hold<'a>(
        &'a self,
        target: &'a BindTarget,
        resource_version: &'a str,
    ) -> BoxFuture<'a, Result<(), BindError>> {
        Box::pin(async move {
            self.merge_patch(target, &clear_hold_patch(target, resource_version))
                .await
                .map_err(|source| BindError::ClearHold {
                    namespace: target.namespace.clone(),
                    name: target.name.clone(),
                    source,
                })
        })
    }

    fn get_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Pod>, BindError>> {
        Box::pin(async move {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
            pods.get_opt(name).await.map_err(|source| BindError::Read {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                source,
            })
        })
    }
}

/// The JSON merge patch that writes a hold: the annotation, the pod's UID (refused for a pod
/// recreated under the name) and, when known, its `resourceVersion` (refused with a conflict if
/// anyone wrote the pod since, another replica's hold included).
pub fn hold_patch(
    target: &BindTarget,
    value: &str,
    resource_version: Option<&str>,
) -> serde_json::Value {
    let mut meta = serde_json::json!({
        "annotations": { crate::cluster::hold::HOLD: value },
    });
    if let Some(uid) = &target.uid {
        meta["uid"] = serde_json::Value::String(uid.clone());
    }
    if let Some(rv) = resource_version.filter(|rv| !rv.is_empty()) {
        meta["resourceVersion"] = serde_json::Value::String(rv.to_owned());
    }
    serde_json::json!({ "metadata": meta })
}

/// The JSON merge patch that removes a hold (`null` deletes the key), conditioned as
/// [`hold_patch`] is.
pub fn clear_hold_patch(target: &BindTarget, resource_version: &str) -> serde_json::Value {
    let mut meta = serde_json::json!({
        "annotations": { crate::cluster::hold::HOLD: null },
        "resourceVersion": resource_version,
    });
    if let Some(uid) = &target.uid {
        meta["uid"] = serde_json::Value::String(uid.clone());
    }
    serde_json::json!({ "metadata": meta })
}

fn bind_error(target: &BindTarget, source: kube::Error) -> BindError {
    BindError::Bind {
        namespace: target.namespace.clone(),
        name: target.name.clone(),
        node: target.node.clone(),
        source,
    }
}

fn is_bound_to(pod: &Pod, target: &BindTarget, annotations: &BTreeMap<String, String>) -> bool {
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    let uid_ok = target.uid.is_none() || pod.metadata.uid == target.uid;
    let ours = pod.metadata.annotations.as_ref();
    let annotated = annotations
        .iter()
        .all(|(k, v)| ours.and_then(|a| a.get(k)) == Some(v));
    uid_ok && annotated && node == Some(target.node.as_str())
}

/// File mode: records every binding and hold in memory and logs it.
#[derive(Debug, Default)]
pub struct MemoryBinder {
    pub bindings: Mutex<Vec<(BindTarget, BTreeMap<String, String>)>>,
    /// Holds written: the pod (its `node` the held node), the annotation and the event.
    pub holds: Mutex<Vec<(BindTarget, String, String)>>,
    /// Expired holds removed: the pod and the `resourceVersion` the removal was conditioned on.
    pub cleared: Mutex<Vec<(BindTarget, String)>>,
}

impl BindingWriter for MemoryBinder {
    fn bind<'a>(
        &'a self,
        target: &'a BindTarget,
        annotations: &'a BTreeMap<String, String>,
    ) -> BoxFuture<'a, Result<(), BindError>> {
        tracing::info!(
            pod = %format!("{}/{}", target.namespace, target.name),
            node = %target.node,
            annotations = ?annotations,
            "bound (in memory)"
        );
        self.bindings
            .lock()
            .push((target.clone(), annotations.clone()));
        Box::pin(async { Ok(()) })
    }

    fn hold<'a>(
        &'a self,
        target: &'a BindTarget,
        value: &'a str,
        _resource_version: Option<&'a str>,
        event: &'a str,
    ) -> BoxFuture<'a, Result<(), BindError>> {
        tracing::info!(
            pod = %format!("{}/{}", target.namespace, target.name),
            node = %target.node, %event, "hold (in memory)"
        );
        self.holds
            .lock()
            .push((target.clone(), value.to_owned(), event.to_owned()));
        Box::pin(async { Ok(()) })
    }

    fn clear_hold<'a>(
        &'a self,
        target: &'a BindTarget,
        resource_version: &'a str,
    ) -> BoxFuture<'a, Result<(), BindError>> {
        tracing::info!(
            pod = %format!("{}/{}", target.namespace, target.name),
            "expired hold removed (in memory)"
        );
        self.cleared
            .lock()
            .push((target.clone(), resource_version.to_owned()));
        Box::pin(async { Ok(()) })
    }
}
