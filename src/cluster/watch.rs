//! Cluster mode: watches on Nodes, Pods, `NodeGpuReports` and DRA `ResourceSlices` feed the
//! index one event at a time.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use super::index::{Index, pod_key};
use super::model_config;
use super::profile::store::ProfileStore;
use super::{GpuWorkloadProfile, NodeGpuReport};

/// Ready once every watch has listed its objects (kubert's `Initialized` gate): until then the
/// index could call a busy node free.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    waiting: Arc<AtomicUsize>,
}

impl Readiness {
    /// A gate that opens after `n` calls to [`Readiness::synced`].
    pub fn waiting_for(n: usize) -> Self {
        Self {
            waiting: Arc::new(AtomicUsize::new(n)),
        }
    }

    pub fn synced(&self) {
        let _ = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    pub fn is_ready(&self) -> bool {
        self.waiting.load(Ordering::Acquire) == 0
    }
}

/// How many watches must list before the extender is ready: Nodes, Pods, `NodeGpuReports`, the
/// model-config ConfigMaps (a pod naming one would be refused until they are listed), the
/// `GpuWorkloadProfiles` (a pod of a known workload would be sized from its prediction alone)
/// and the DRA `ResourceSlices` (a node whose agent cannot read the kubelet's `PodResources` API
/// would take pods on GPUs a DRA driver may have handed out).
pub const WATCHES: usize = 6;

/// [`WATCHES`], less the ConfigMap, profile and `ResourceSlice` watches when they are off.
pub fn watches(model_configs: bool, profiles: bool, resource_slices: bool) -> usize {
    WATCHES - usize::from(!model_configs) - usize::from(!profiles) - usize::from(!resource_slices)
}

/// Starts the `ResourceSlice` watch (`resource.k8s.io/v1`), which marks the nodes a DRA GPU
/// driver (`--gpu-dra-drivers`) publishes devices on; counts towards `readiness` like the
/// others. Every slice is listed: a `spec.driver` field selector names one driver where
/// `--gpu-dra-drivers` may list several, and a cluster has about one slice per node and driver,
/// so the others cost little (the index keeps nothing of them).
pub fn spawn_resource_slices(client: Client, index: Arc<Index>, readiness: Readiness) {
    use tracing::Instrument as _;
    tokio::spawn(
        watch_resource_slices(client, index, readiness, SERVED_RETRY_MAX, SERVED_RECHECK)
            .instrument(tracing::info_span!("watch", kind = "ResourceSlice")),
    );
}

/// The longest wait between two discovery attempts for `ResourceSlices`.
const SERVED_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// How long after the API server said it does not serve `ResourceSlices` it is asked again: a
/// control plane upgraded to Kubernetes 1.34 while the extender runs starts serving them, and
/// the watch should follow without a restart. Not a flag: one discovery call every 5 minutes
/// costs the API server nothing an operator would trade, and a DRA driver publishes slices only
/// once it is installed after the upgrade, which takes longer than that; until then the watch
/// has nothing to list.
pub const SERVED_RECHECK: std::time::Duration = std::time::Duration::from_secs(300);

/// The `ResourceSlice` watch's task: asks discovery (`resource_slices_served`), and while the
/// API server does not serve `resource.k8s.io/v1` asks again every `recheck`, starting the watch
/// once it does. Readiness opens at the first "not served" and stays open: the extender served
/// before the upgrade, and a watch started afterwards counts its first list towards a gate of
/// its own, not the probes' (a gate that opened never closes again).
async fn watch_resource_slices(
    client: Client,
    index: Arc<Index>,
    readiness: Readiness,
    retry_max: std::time::Duration,
    recheck: std::time::Duration,
) {
    let readiness = if resource_slices_served(&client, retry_max).await {
        readiness
    } else {
        tracing::warn!(
            every = ?recheck,
            "the API server does not serve resource.k8s.io/v1 ResourceSlices (Kubernetes \
             before 1.34): nodes are refused while PodResources is down only where a device \
             plugin advertises a GPU; asking again periodically"
        );
        // Nothing to list: the watch counts as synced.
        readiness.synced();
        loop {
            tokio::time::sleep(recheck).await;
            if resource_slices_served(&client, retry_max).await {
                break;
            }
            tracing::debug!("resource.k8s.io/v1 ResourceSlices still not served");
        }
        tracing::info!(
            "the API server serves resource.k8s.io/v1 ResourceSlices now (upgraded to \
             Kubernetes 1.34 or later): watching them"
        );
        Readiness::waiting_for(1)
    };
    run_watch::<ResourceSlice>(
        Api::all(client),
        watcher::Config::default().any_semantic(),
        index,
        readiness,
    )
    .await;
}

/// Whether the API server serves `ResourceSlices`, asked until it answers (1 s, doubling, at
/// most `retry_max` apart): a watch on a version it does not serve would never list, and a
/// readiness that counts it would never open; but a discovery call that merely failed (the
/// API server restarting, a timeout) says nothing either way, so it is asked again rather
/// than guessed, as the other watches retry their lists.
async fn resource_slices_served(client: &Client, retry_max: std::time::Duration) -> bool {
    let mut wait = std::time::Duration::from_secs(1);
    loop {
        if let Some(served) = serves_resource_slices(client).await {
            return served;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(retry_max);
    }
}

/// Whether the API server serves `resource.k8s.io/v1` (Kubernetes 1.34 and later): before, no
/// GA DRA driver publishes slices there. `None` when the question itself failed.
pub async fn serves_resource_slices(client: &Client) -> Option<bool> {
    match client.list_api_group_resources("resource.k8s.io/v1").await {
        Ok(list) => Some(list.resources.iter().any(|r| r.name == "resourceslices")),
        Err(kube::Error::Api(s)) if s.is_not_found() => Some(false),
        Err(e) => {
            tracing::warn!(error = %e, "could not ask whether resource.k8s.io/v1 is served; asking again");
            None
        }
    }
}

/// Starts the `GpuWorkloadProfile` watch (with `--learn` other than `off`), feeding `store`;
/// counts towards `readiness` like the others.
pub fn spawn_profiles(client: Client, store: Arc<ProfileStore>, readiness: Readiness) {
    use tracing::Instrument as _;
    tokio::spawn(
        run_watch::<GpuWorkloadProfile>(
            Api::all(client),
            watcher::Config::default().any_semantic(),
            store,
            readiness,
        )
        .instrument(tracing::info_span!("watch", kind = "GpuWorkloadProfile")),
    );
}

/// How one kind of object enters and leaves what it feeds (the index, or the profile store).
trait Indexed: Resource + Clone + std::fmt::Debug + Send + 'static {
    type Target: Send + Sync + 'static;
    fn key(&self) -> String;
    fn apply(index: &Self::Target, obj: &Self);
    fn delete(index: &Self::Target, key: &str);
}

impl Indexed for Node {
    type Target = Index;
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
    type Target = Index;
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
    type Target = Index;
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

/// `ResourceSlices` (cluster-scoped), keyed by name.
impl Indexed for ResourceSlice {
    type Target = Index;
    fn key(&self) -> String {
        self.name_any()
    }
    fn apply(index: &Index, obj: &Self) {
        index.apply_resource_slice(obj);
    }
    fn delete(index: &Index, key: &str) {
        index.delete_resource_slice(key);
    }
}

/// Labelled model-config ConfigMaps, keyed `namespace/name`.
impl Indexed for ConfigMap {
    type Target = Index;
    fn key(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.name_any()
        )
    }
    fn apply(index: &Index, obj: &Self) {
        index.apply_model_config(obj);
    }
    fn delete(index: &Index, key: &str) {
        if let Some((namespace, name)) = key.split_once('/') {
            index.delete_model_config(namespace, name);
        }
    }
}

/// `GpuWorkloadProfiles`, keyed `namespace/name`, into the profile store.
impl Indexed for GpuWorkloadProfile {
    type Target = ProfileStore;
    fn key(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.name_any()
        )
    }
    fn apply(store: &ProfileStore, obj: &Self) {
        store.apply(obj);
    }
    fn delete(store: &ProfileStore, key: &str) {
        store.delete_object(key);
    }
}

/// Applies one watcher event. A relist (`Init` … `InitDone`) deletes what it no longer lists;
/// returns true on `InitDone`.
fn handle<K: Indexed>(
    index: &K::Target,
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

async fn run_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    index: Arc<K::Target>,
    readiness: Readiness,
) where
    K: Indexed + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let mut known = HashSet::new();
    let mut relist = None;
    let mut synced = false;
    let stream = watcher(api, config)
        .default_backoff()
        .modify(|o: &mut K| o.meta_mut().managed_fields = None);
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(e) => {
                if handle(&*index, &mut known, &mut relist, e) && !synced {
                    synced = true;
                    readiness.synced();
                    tracing::info!(kind = %K::kind(&Default::default()), objects = known.len(), "watch synced");
                }
            }
            Err(e) => {
                tracing::warn!(kind = %K::kind(&Default::default()), error = %e, "watch error; retrying");
            }
        }
    }
}

/// Starts the Node, Pod, `NodeGpuReport` and model-config watches, each in its own `watch` span
/// naming its kind (the profile and `ResourceSlice` watches have their own `spawn_*`); `readiness` opens
/// once each has listed ([`watches`]`(model_configs)` of them). ConfigMaps are watched by label
/// ([`model_config::label_selector`]): only those meant for peakfit are listed, sent and kept;
/// with `model_configs` false they are not watched at all (the extender then needs no RBAC on
/// ConfigMaps) and a pod naming one is refused saying so.
pub fn spawn(client: Client, index: Arc<Index>, readiness: Readiness, model_configs: bool) {
    use tracing::Instrument as _;
    let all = || watcher::Config::default().any_semantic();
    tokio::spawn(
        run_watch::<Node>(
            Api::all(client.clone()),
            all(),
            index.clone(),
            readiness.clone(),
        )
        .instrument(tracing::info_span!("watch", kind = "Node")),
    );
    tokio::spawn(
        run_watch::<NodeGpuReport>(
            Api::all(client.clone()),
            all(),
            index.clone(),
            readiness.clone(),
        )
        .instrument(tracing::info_span!("watch", kind = "NodeGpuReport")),
    );
    if model_configs {
        tokio::spawn(
            run_watch::<ConfigMap>(
                Api::all(client.clone()),
                all().labels(&model_config::label_selector()),
                index.clone(),
                readiness.clone(),
            )
            .instrument(tracing::info_span!("watch", kind = "ConfigMap")),
        );
    } else {
        index.model_configs().turn_off();
        tracing::info!("model-config ConfigMap watch off (--model-config-watch false)");
    }
    tokio::spawn(
        run_watch::<Pod>(Api::all(client), all(), index, readiness)
            .instrument(tracing::info_span!("watch", kind = "Pod")),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::test_support::{mk_pod, mk_report};

    /// What the API server answers for `resource.k8s.io/v1` decides whether the extender
    /// watches `ResourceSlices`: served, not served (404: before 1.34), or unknown (any other
    /// failure: asked again, `a_failed_discovery_is_asked_again_until_it_answers`).
    #[tokio::test]
    async fn the_slice_watch_follows_what_the_api_server_serves() {
        use http::{Request, Response};
        use kube::client::Body;
        for (status, body, want) in [
            (
                200,
                r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"resource.k8s.io/v1",
                    "resources":[{"name":"resourceslices","singularName":"resourceslice",
                    "namespaced":false,"kind":"ResourceSlice","verbs":["list","watch"]}]}"#,
                Some(true),
            ),
            (
                404,
                r#"{"kind":"Status","apiVersion":"v1","status":"Failure",
                    "message":"the server could not find the requested resource",
                    "reason":"NotFound","code":404}"#,
                Some(false),
            ),
            (
                403,
                r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"forbidden",
                    "reason":"Forbidden","code":403}"#,
                None,
            ),
        ] {
            let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
            let client = Client::new(svc, "default");
            tokio::spawn(async move {
                let (req, send) = handle.next_request().await.expect("one request");
                assert_eq!(req.uri().path(), "/apis/resource.k8s.io/v1");
                send.send_response(
                    Response::builder()
                        .status(status)
                        .body(Body::from(body.as_bytes().to_vec()))
                        .unwrap(),
                );
            });
            assert_eq!(serves_resource_slices(&client).await, want, "{status}");
        }
    }

    /// A failed discovery call is asked again (on tokio's paused clock), and its answer
    /// decides: here a 403, then a 404 (not served).
    #[tokio::test(start_paused = true)]
    async fn a_failed_discovery_is_asked_again_until_it_answers() {
        use http::{Request, Response};
        use kube::client::Body;
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(svc, "default");
        let server = tokio::spawn(async move {
            for (status, reason) in [
                (403, "Forbidden"),
                (500, "InternalError"),
                (404, "NotFound"),
            ] {
                let (req, send) = handle.next_request().await.expect("a request");
                assert_eq!(req.uri().path(), "/apis/resource.k8s.io/v1");
                let body = format!(
                    r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"x","reason":"{reason}","code":{status}}}"#
                );
                send.send_response(
                    Response::builder()
                        .status(status)
                        .body(Body::from(body.into_bytes()))
                        .unwrap(),
                );
            }
        });
        assert!(!resource_slices_served(&client, std::time::Duration::from_secs(30)).await);
        server.await.unwrap();
    }

    /// A cluster upgraded to 1.34 while the extender runs (issue 23): "not served" opens
    /// readiness at once, discovery is asked again every `SERVED_RECHECK` (on tokio's paused
    /// clock) with readiness open throughout, and once `resource.k8s.io/v1` is served the watch
    /// lists the slices, which mark their node.
    #[tokio::test(start_paused = true)]
    async fn slices_served_after_an_upgrade_are_watched_without_a_restart() {
        use crate::inventory::PodResourcesStatus;
        use crate::placement::NodeCondition;
        use http::{Request, Response};
        use kube::client::Body;
        use std::time::Duration;
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(svc, "default");
        let index = Arc::new(Index::new());
        index.apply_node(&crate::cluster::test_support::mk_node("n1"));
        let mut report = mk_report("n1", &[("GPU-a", 80 << 30, 0, &[])]);
        report.status.as_mut().unwrap().pod_resources = Some(PodResourcesStatus {
            up: false,
            reason: Some("connection refused".into()),
        });
        index.apply_report(&report);
        let ledger = |index: &Index| crate::cluster::test_support::ledger(index, "n1").condition;
        assert_eq!(ledger(&index), NodeCondition::Ready, "no slice seen yet");
        let readiness = Readiness::waiting_for(1);
        let start = tokio::time::Instant::now();
        tokio::spawn(watch_resource_slices(
            client,
            index.clone(),
            readiness.clone(),
            SERVED_RETRY_MAX,
            SERVED_RECHECK,
        ));
        let respond = |send: tower_test::mock::SendResponse<Response<Body>>, status, body: &str| {
            send.send_response(
                Response::builder()
                    .status(status)
                    .body(Body::from(body.as_bytes().to_vec()))
                    .unwrap(),
            );
        };
        let not_found = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"x",
            "reason":"NotFound","code":404}"#;
        for ask in 0..3u32 {
            let (req, send) = handle.next_request().await.expect("discovery");
            assert_eq!(req.uri().path(), "/apis/resource.k8s.io/v1");
            let waited = start.elapsed();
            assert!(
                waited >= SERVED_RECHECK * ask
                    && waited < SERVED_RECHECK * ask + Duration::from_secs(1),
                "asked again after {ask} waits, at {waited:?}"
            );
            assert_eq!(
                readiness.is_ready(),
                ask > 0,
                "open after the first answer, and stays"
            );
            respond(send, 404, not_found);
        }
        let (req, send) = handle.next_request().await.expect("discovery");
        assert_eq!(req.uri().path(), "/apis/resource.k8s.io/v1");
        assert!(start.elapsed() >= SERVED_RECHECK * 3);
        respond(
            send,
            200,
            r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"resource.k8s.io/v1",
                "resources":[{"name":"resourceslices","singularName":"resourceslice",
                "namespaced":false,"kind":"ResourceSlice","verbs":["list","watch"]}]}"#,
        );
        let (req, send) = handle.next_request().await.expect("the slices' list");
        assert_eq!(req.uri().path(), "/apis/resource.k8s.io/v1/resourceslices");
        respond(
            send,
            200,
            r#"{"kind":"ResourceSliceList","apiVersion":"resource.k8s.io/v1",
                "metadata":{"resourceVersion":"7"},
                "items":[{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice",
                  "metadata":{"name":"n1-gpu","resourceVersion":"7"},
                  "spec":{"driver":"gpu.nvidia.com","nodeName":"n1",
                    "pool":{"name":"p","generation":1,"resourceSliceCount":1},
                    "devices":[{"name":"gpu-0"}]}}]}"#,
        );
        // The watch asks for changes once it has applied the list.
        let (req, _send) = handle.next_request().await.expect("the slices' watch");
        assert_eq!(req.uri().path(), "/apis/resource.k8s.io/v1/resourceslices");
        assert!(readiness.is_ready());
        assert!(
            matches!(ledger(&index), NodeCondition::PodResourcesDown { by, .. }
                if by.dra_driver.as_deref() == Some("gpu.nvidia.com")),
            "{:?}",
            ledger(&index)
        );
    }

    #[test]
    fn readiness_opens_after_every_watch() {
        let r = Readiness::waiting_for(2);
        assert!(!r.is_ready());
        r.synced();
        assert!(!r.is_ready());
        r.synced();
        r.synced();
        assert!(r.is_ready());
    }

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
