//! Cluster mode: watches on Nodes, Pods and NodeGpuReports feed the index one event at a time.

use std::collections::HashSet;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use super::NodeGpuReport;
use super::index::{Index, pod_key};
use crate::extender::Readiness;

/// How many watches must list before the extender is ready.
pub const WATCHES: usize = 3;

/// How one kind of object enters and leaves the index.
trait Indexed: Resource + Clone + std::fmt::Debug + Send + 'static {
    fn key(&self) -> String;
    fn apply(index: &Index, obj: &Self);
    fn delete(index: &Index, key: &str);
}

impl Indexed for Node {
    fn key(&self) -> String {
        self.name_any()
    }
    fn apply(index: &Index, obj: &Self) {
        index.apply_node(obj);
    }
    fn delete(index: &Index, key: &str) {
        index.delete_node(key);
    }
}

impl Indexed for NodeGpuReport {
    fn key(&self) -> String {
        self.name_any()
    }
    fn apply(index: &Index, obj: &Self) {
        index.apply_report(obj);
    }
    fn delete(index: &Index, key: &str) {
        index.delete_report(key);
    }
}

impl Indexed for Pod {
    fn key(&self) -> String {
        pod_key(self)
    }
    fn apply(index: &Index, obj: &Self) {
        index.apply_pod(obj);
    }
    fn delete(index: &Index, key: &str) {
        index.delete_pod_key(key);
    }
}

/// Applies one watcher event. A relist (`Init` … `InitDone`) deletes what it no longer lists;
/// returns true on `InitDone`.
fn handle<K: Indexed>(
    index: &Index,
    known: &mut HashSet<String>,
    relist: &mut Option<HashSet<String>>,
    event: watcher::Event<K>,
) -> bool {
    match event {
        watcher::Event::Apply(obj) => {
            known.insert(obj.key());
            K::apply(index, &obj);
        }
        watcher::Event::Delete(obj) => {
            let key = obj.key();
            known.remove(&key);
            K::delete(index, &key);
        }
        watcher::Event::Init => *relist = Some(HashSet::new()),
        watcher::Event::InitApply(obj) => {
            let key = obj.key();
            K::apply(index, &obj);
            if let Some(seen) = relist {
                seen.insert(key.clone());
            }
            known.insert(key);
        }
        watcher::Event::InitDone => {
            if let Some(seen) = relist.take() {
                for gone in known.difference(&seen) {
                    K::delete(index, gone);
                }
                *known = seen;
            }
            return true;
        }
    }
    false
}

async fn run_watch<K>(api: Api<K>, index: Arc<Index>, readiness: Readiness)
where
    K: Indexed + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let mut known = HashSet::new();
    let mut relist = None;
    let mut synced = false;
    let stream = watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(|o: &mut K| o.meta_mut().managed_fields = None);
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(e) => {
                if handle(&index, &mut known, &mut relist, e) && !synced {
                    synced = true;
                    readiness.synced();
                    tracing::info!(kind = %K::kind(&Default::default()), objects = known.len(), "watch synced");
                }
            }
            Err(e) => {
                tracing::warn!(kind = %K::kind(&Default::default()), error = %e, "watch error; retrying")
            }
        }
    }
}

/// Starts the three watches; `readiness` opens once each has listed.
pub fn spawn(client: Client, index: Arc<Index>, readiness: Readiness) {
    tokio::spawn(run_watch::<Node>(
        Api::all(client.clone()),
        index.clone(),
        readiness.clone(),
    ));
    tokio::spawn(run_watch::<NodeGpuReport>(
        Api::all(client.clone()),
        index.clone(),
        readiness.clone(),
    ));
    tokio::spawn(run_watch::<Pod>(Api::all(client), index, readiness));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::index::tests::{mk_pod, mk_report};

    #[test]
    fn a_relist_deletes_what_disappeared_while_disconnected() {
        let index = Index::new();
        index.apply_report(&mk_report("n1", &[("GPU-a", 80 << 30, 0, &[])]));
        let (mut known, mut relist) = (HashSet::new(), None);
        let a = mk_pod("a", Some("n1"), &[]);
        let b = mk_pod("b", Some("n1"), &[]);
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(a.clone()),
            watcher::Event::InitApply(b.clone()),
            watcher::Event::InitDone,
        ] {
            handle(&index, &mut known, &mut relist, e);
        }
        assert_eq!(index.pod_count(), 2);
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(a),
            watcher::Event::InitDone,
        ] {
            handle(&index, &mut known, &mut relist, e);
        }
        assert_eq!(index.pod_count(), 1);
        assert!(index.find_pod("b", "", "").is_none());
    }
}
