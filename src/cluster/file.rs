//! File mode: a Kubernetes `List` or multi-document YAML (or JSON) of Nodes, Pods and
//! `NodeGpuReports` loaded into the index, so the extender runs without a cluster, and the
//! `GpuWorkloadProfiles` of the same file loaded into the profile store, so a file answers as
//! the cluster it was taken from would (pods sized from what their workload used).

use std::path::Path;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use serde_json::Value;

use super::NodeGpuReport;
use super::index::Index;
use super::profile::GpuWorkloadProfile;
use super::profile::store::ProfileStore;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not YAML or JSON: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: object {index} (kind {kind}, name {name:?}) is not a valid {kind}: {source}")]
    Object {
        path: String,
        index: usize,
        kind: String,
        name: String,
        source: serde_json::Error,
    },
}

/// Loads every Node, Pod, `NodeGpuReport` and model-config ConfigMap (labelled
/// `peakfit.io/model-config: "true"`, as in a cluster) of the file into `index`; other kinds
/// (priority classes, namespaces …) are skipped. Returns how many objects were indexed.
pub fn load_into(index: &Index, path: &Path) -> Result<usize, FileError> {
    let (text, p) = read(path)?;
    load_str(index, &text, &p)
}

/// The file's text and its name for errors.
fn read(path: &Path) -> Result<(String, String), FileError> {
    let p = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => Ok((text, p)),
        Err(source) => Err(FileError::Read { path: p, source }),
    }
}

/// [`load_into`] on a file's text, `p` naming it in errors and logs (also what the fuzz test
/// drives, without a file per case).
pub fn load_str(index: &Index, text: &str, p: &str) -> Result<usize, FileError> {
    let p = p.to_owned();
    let docs = parse_documents(text).map_err(|message| FileError::Parse {
        path: p.clone(),
        message,
    })?;
    let mut objects = Vec::new();
    for d in docs {
        flatten(d, &mut objects);
    }
    // Nodes, reports and model configs first, so that pods land on known nodes and find
    // their ConfigMaps.
    objects.sort_by_key(|o| match o.get("kind").and_then(Value::as_str) {
        Some("Node") => 0,
        Some("NodeGpuReport") => 1,
        Some("ConfigMap") => 2,
        _ => 3,
    });
    let mut n = 0;
    let mut pods = std::collections::HashSet::new();
    for (i, obj) in objects.into_iter().enumerate() {
        let kind = obj
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let err = |source| FileError::Object {
            path: p.clone(),
            index: i,
            kind: kind.clone(),
            name: name.clone(),
            source,
        };
        match kind.as_str() {
            "Node" => index.apply_node(&serde_json::from_value::<Node>(obj).map_err(err)?),
            "Pod" => {
                let pod = serde_json::from_value::<Pod>(obj).map_err(err)?;
                // Two pods under one key would be charged once, the second replacing the first.
                if !pods.insert(super::index::pod_key(&pod)) {
                    tracing::warn!(
                        path = %p, index = i, name = %crate::clip::clip(&name),
                        key = %crate::clip::clip(&super::index::pod_key(&pod)),
                        "two pods in the file have one UID (or namespace/name); the later one replaces the earlier"
                    );
                    index.warn_metric("duplicate_pod_uid");
                }
                index.apply_pod(&pod);
            }
            "NodeGpuReport" => {
                index.apply_report(&serde_json::from_value::<NodeGpuReport>(obj).map_err(err)?);
            }
            "ConfigMap" => {
                index.apply_model_config(&serde_json::from_value::<ConfigMap>(obj).map_err(err)?);
            }
            // A `kubectl get -o yaml` of a DRA cluster carries its slices: the same marks as the
            // watch's (any order: a slot made later reads them). Only the version the watch
            // reads; an older one is skipped like any object peakfit does not index.
            "ResourceSlice"
                if obj.get("apiVersion").and_then(Value::as_str) == Some("resource.k8s.io/v1") =>
            {
                index.apply_resource_slice(
                    &serde_json::from_value::<k8s_openapi::api::resource::v1::ResourceSlice>(obj)
                        .map_err(err)?,
                );
            }
            other => {
                tracing::debug!(kind = other, %name, "skipping an object peakfit does not index");
                continue;
            }
        }
        n += 1;
    }
    if n == 0 {
        tracing::warn!(
            path = %p,
            "the file holds no Node, Pod or NodeGpuReport: every node will be refused for lack of a GPU report"
        );
    }
    Ok(n)
}

/// Loads every `GpuWorkloadProfile` of the file (as `kubectl get gpuworkloadprofiles -A -o
/// yaml` prints them, beside the other objects or in a file of their own) into `store`, as the
/// profile watch would. Returns how many. A profile peakfit did not write is an error naming
/// it: sizing pods from half a profile would be worse than refusing the file.
pub fn load_profiles_into(store: &ProfileStore, path: &Path) -> Result<usize, FileError> {
    let (text, p) = read(path)?;
    let found = profiles(&text, &p)?;
    for profile in &found {
        store.apply(profile);
    }
    Ok(found.len())
}

/// The `GpuWorkloadProfile` objects of a file's text, `p` naming it in errors; other kinds are
/// skipped.
pub fn profiles(text: &str, p: &str) -> Result<Vec<GpuWorkloadProfile>, FileError> {
    let mut out = Vec::new();
    let found = objects(text).map_err(|message| FileError::Parse {
        path: p.to_owned(),
        message,
    })?;
    for (index, obj) in found.into_iter().enumerate() {
        if obj.get("kind").and_then(Value::as_str) != Some("GpuWorkloadProfile") {
            continue;
        }
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .map(|n| crate::clip::clip(n).into_owned())
            .unwrap_or_default();
        out.push(
            serde_json::from_value(obj).map_err(|source| FileError::Object {
                path: p.to_owned(),
                index,
                kind: "GpuWorkloadProfile".into(),
                name,
                source,
            })?,
        );
    }
    Ok(out)
}

/// Every object of a file's text (JSON, or YAML documents), `List`s unwrapped.
pub fn objects(text: &str) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for doc in parse_documents(text)? {
        flatten(doc, &mut out);
    }
    Ok(out)
}

fn parse_documents(text: &str) -> Result<Vec<Value>, String> {
    if text.trim_start().starts_with(['{', '[']) {
        return serde_json::from_str::<Value>(text)
            .map(|v| vec![v])
            .map_err(|e| e.to_string());
    }
    serde_saphyr::from_multiple_with_options::<Value>(text, trusted_file_options()).map_err(|e| {
        let e = e.to_string();
        if e.to_ascii_lowercase().contains("alias") {
            format!(
                "YAML aliases (*name) are not accepted in a --from-file file (kubectl and helm \
                 never write them, and a few can expand a small file to gigabytes): {}",
                crate::clip::clip_to(&e, crate::clip::MAX_MESSAGE_BYTES)
            )
        } else {
            e
        }
    })
}

/// serde-saphyr's default budget is for untrusted YAML and stops at 1,024 documents, 250,000
/// nodes and a million events: a `List` of ~1,185 nodes × 8 GPUs. The file is the operator's
/// own (as trusted as the kubeconfig), so the size budgets go; the nesting depth guard stays,
/// and aliases (`*name`) are refused: kubectl and helm never write them, and with the size
/// budgets gone one scalar repeated by alias grew a 1 MiB file to 5.5 GB (issue 24).
fn trusted_file_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_aliases = 0;
    budget.max_documents = usize::MAX;
    budget.max_nodes = usize::MAX;
    budget.max_events = usize::MAX;
    budget.max_total_scalar_bytes = usize::MAX;
    budget.max_reader_input_bytes = None;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// Unwraps `List`s (and `*List`s) into their items; drops empty documents.
fn flatten(v: Value, out: &mut Vec<Value>) {
    match v {
        Value::Array(items) => items.into_iter().for_each(|i| flatten(i, out)),
        Value::Object(mut m) => {
            let is_list = m
                .get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| k.ends_with("List"));
            match (is_list, m.remove("items")) {
                (true, Some(items)) => flatten(items, out),
                (_, items) => {
                    if let Some(items) = items {
                        m.insert("items".into(), items);
                    }
                    out.push(Value::Object(m));
                }
            }
        }
        // `null` (an empty document) and scalars are not objects.
        _ => {}
    }
}
