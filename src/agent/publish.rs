//! Writing this node's `NodeGpuReport` by server-side apply.
//!
//! The agent owns the object's `spec.nodeName` and its whole `status` under the field manager
//! `peakfit-agent`, forcing ownership so a stale manager (an older agent, a `kubectl edit`) can
//! never pin old numbers. The object is applied once (it may not exist yet: a status patch on a
//! missing object is a 404), then only the status subresource is written.

use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::NodeGpuReport;
use crate::inventory::NodeGpuReportStatus;

/// The field manager of every write the agent makes.
pub const FIELD_MANAGER: &str = "peakfit-agent";

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("applying NodeGpuReport {name}")]
    Object {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("applying the status of NodeGpuReport {name}")]
    Status {
        name: String,
        #[source]
        source: kube::Error,
    },
}

pub struct Publisher {
    api: Api<NodeGpuReport>,
    node: String,
    object_applied: bool,
}

impl Publisher {
    pub fn new(client: Client, node: impl Into<String>) -> Self {
        Self {
            api: Api::all(client),
            node: node.into(),
            object_applied: false,
        }
    }

    fn params() -> PatchParams {
        PatchParams::apply(FIELD_MANAGER).force()
    }

    /// Writes `status`, creating the object first when this agent has not yet done so.
    pub async fn publish(&mut self, status: &NodeGpuReportStatus) -> Result<(), PublishError> {
        if !self.object_applied {
            let object = json!({
                "apiVersion": "peakfit.io/v1alpha1",
                "kind": "NodeGpuReport",
                "metadata": { "name": self.node },
                "spec": { "nodeName": self.node },
            });
            self.api
                .patch(&self.node, &Self::params(), &Patch::Apply(&object))
                .await
                .map_err(|source| PublishError::Object {
                    name: self.node.clone(),
                    source,
                })?;
            self.object_applied = true;
        }
        let patch = json!({
            "apiVersion": "peakfit.io/v1alpha1",
            "kind": "NodeGpuReport",
            "status": status,
        });
        match self
            .api
            .patch_status(&self.node, &Self::params(), &Patch::Apply(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(source) => {
                // Someone deleted the object: apply it again on the next attempt.
                if matches!(&source, kube::Error::Api(s) if s.code == 404) {
                    self.object_applied = false;
                }
                Err(PublishError::Status {
                    name: self.node.clone(),
                    source,
                })
            }
        }
    }
}
