//! Writing a bind decision: annotate the pod with its GPUs, then create its Binding.

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use parking_lot::Mutex;

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
    #[error("annotating pod {namespace}/{name} failed: {source}")]
    Annotate {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("creating the binding of pod {namespace}/{name} to node {node} failed: {source}")]
    Bind {
        namespace: String,
        name: String,
        node: String,
        source: kube::Error,
    },
}

/// Where bind's writes go: the API server, or memory (file mode, tests).
pub trait BindingWriter: Send + Sync {
    /// Patches `annotations` onto the pod (skipped when empty), then creates the Binding.
    fn bind<'a>(
        &'a self,
        target: &'a BindTarget,
        annotations: &'a BTreeMap<String, String>,
    ) -> BoxFuture<'a, Result<(), BindError>>;
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
}

/// The Binding the API server expects: target Node, and the pod's UID as a precondition.
pub fn binding_for(target: &BindTarget) -> Binding {
    Binding {
        metadata: ObjectMeta {
            name: Some(target.name.clone()),
            namespace: Some(target.namespace.clone()),
            uid: target.uid.clone(),
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
            if !annotations.is_empty() {
                // The UID in the patch makes the API server refuse it for a recreated pod.
                let mut meta = serde_json::json!({ "annotations": annotations });
                if let Some(uid) = &target.uid {
                    meta["uid"] = serde_json::Value::String(uid.clone());
                }
                pods.patch(
                    &target.name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({ "metadata": meta })),
                )
                .await
                .map_err(|source| BindError::Annotate {
                    namespace: target.namespace.clone(),
                    name: target.name.clone(),
                    source,
                })?;
            }
            pods.create_subresource::<_, kube::core::Status>(
                "binding",
                &target.name,
                &PostParams::default(),
                &binding_for(target),
            )
            .await
            .map_err(|source| BindError::Bind {
                namespace: target.namespace.clone(),
                name: target.name.clone(),
                node: target.node.clone(),
                source,
            })?;
            Ok(())
        })
    }
}

/// File mode: records every binding in memory and logs it.
#[derive(Debug, Default)]
pub struct MemoryBinder {
    pub bindings: Mutex<Vec<(BindTarget, BTreeMap<String, String>)>>,
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
}
