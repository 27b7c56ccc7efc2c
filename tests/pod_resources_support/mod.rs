//! A fake kubelet for the agent's tests and benches: the kubelet's `PodResources` v1 service
//! (generated from the same `proto/podresources/v1/api.proto` by scripts/gen-proto), served by
//! tonic on a unix socket from a thread of its own, answering what the test sets.
#![allow(dead_code)] // each test crate uses a different part

#[allow(clippy::all, clippy::pedantic)]
pub mod proto;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};

#[derive(Default)]
struct State {
    pods: Vec<proto::PodResources>,
    allocatable: Vec<proto::ContainerDevices>,
    /// How long each answer waits: a hung kubelet.
    delay: Duration,
    /// `GetAllocatableResources` answers `Unimplemented`, as a kubelet before 1.23 does.
    no_allocatable: bool,
}

#[derive(Clone, Default)]
struct Service {
    state: Arc<Mutex<State>>,
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl PodResourcesLister for Service {
    async fn list(
        &self,
        _: tonic::Request<proto::ListPodResourcesRequest>,
    ) -> Result<tonic::Response<proto::ListPodResourcesResponse>, tonic::Status> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let (delay, pods) = {
            let s = self.state.lock().unwrap();
            (s.delay, s.pods.clone())
        };
        tokio::time::sleep(delay).await;
        Ok(tonic::Response::new(proto::ListPodResourcesResponse {
            pod_resources: pods,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: tonic::Request<proto::AllocatableResourcesRequest>,
    ) -> Result<tonic::Response<proto::AllocatableResourcesResponse>, tonic::Status> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let (delay, devices, unimplemented) = {
            let s = self.state.lock().unwrap();
            (s.delay, s.allocatable.clone(), s.no_allocatable)
        };
        tokio::time::sleep(delay).await;
        if unimplemented {
            return Err(tonic::Status::unimplemented(
                "GetAllocatableResources is not served",
            ));
        }
        Ok(tonic::Response::new(proto::AllocatableResourcesResponse {
            devices,
            ..proto::AllocatableResourcesResponse::default()
        }))
    }

    async fn get(
        &self,
        r: tonic::Request<proto::GetPodResourcesRequest>,
    ) -> Result<tonic::Response<proto::GetPodResourcesResponse>, tonic::Status> {
        let r = r.into_inner();
        let pod = self
            .state
            .lock()
            .unwrap()
            .pods
            .iter()
            .find(|p| p.name == r.pod_name && p.namespace == r.pod_namespace)
            .cloned();
        match pod {
            Some(p) => Ok(tonic::Response::new(proto::GetPodResourcesResponse {
                pod_resources: Some(p),
            })),
            None => Err(tonic::Status::not_found("no such pod")),
        }
    }
}

/// The fake kubelet's socket, served until dropped.
pub struct FakeKubelet {
    pub socket: PathBuf,
    service: Service,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeKubelet {
    /// Serves on `socket` (created; its directory must exist).
    pub fn start(socket: &Path) -> Self {
        let service = Service::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let served = service.clone();
        let path = socket.to_path_buf();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::UnixListener::bind(&path).unwrap();
                ready_tx.send(()).unwrap();
                let serve = tonic::transport::Server::builder()
                    .add_service(PodResourcesListerServer::new(served))
                    .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener));
                tokio::select! {
                    r = serve => r.unwrap(),
                    _ = stopped => {}
                }
            });
            // Dropping the runtime ends every connection and answer in flight, as a kubelet
            // that exits does.
            drop(rt);
        });
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the fake kubelet binds its socket");
        Self {
            socket: socket.to_path_buf(),
            service,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// What `List` and `GetAllocatableResources` answer from now on.
    pub fn set(&self, pods: Vec<proto::PodResources>, allocatable: Vec<proto::ContainerDevices>) {
        let mut s = self.service.state.lock().unwrap();
        s.pods = pods;
        s.allocatable = allocatable;
    }

    pub fn set_delay(&self, delay: Duration) {
        self.service.state.lock().unwrap().delay = delay;
    }

    pub fn set_no_allocatable(&self, no: bool) {
        self.service.state.lock().unwrap().no_allocatable = no;
    }

    /// Calls answered or started so far.
    pub fn calls(&self) -> usize {
        self.service.calls.load(Ordering::Relaxed)
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// A pod whose container `main` got `ids` of `resource` from a device plugin.
pub fn device_plugin_pod(
    ns: &str,
    name: &str,
    resource: &str,
    ids: &[&str],
) -> proto::PodResources {
    pod(
        ns,
        name,
        proto::ContainerResources {
            devices: vec![allocatable(resource, ids)],
            ..proto::ContainerResources::default()
        },
    )
}

/// A pod of one container, `main`, with `resources`.
fn pod(ns: &str, name: &str, resources: proto::ContainerResources) -> proto::PodResources {
    proto::PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers: vec![proto::ContainerResources {
            name: "main".into(),
            ..resources
        }],
    }
}

/// A pod whose container `main` uses DRA claim `<ns>/<claim>`, allocated `device` of `driver`.
pub fn dra_pod(
    ns: &str,
    name: &str,
    claim: &str,
    driver: &str,
    device: &str,
) -> proto::PodResources {
    pod(
        ns,
        name,
        proto::ContainerResources {
            dynamic_resources: vec![proto::DynamicResource {
                claim_name: claim.into(),
                claim_namespace: ns.into(),
                claim_resources: vec![proto::ClaimResource {
                    cdi_devices: vec![proto::CdiDevice {
                        name: format!("k8s.{driver}/claim={claim}-{device}"),
                    }],
                    driver_name: driver.into(),
                    pool_name: "node".into(),
                    device_name: device.into(),
                }],
            }],
            ..proto::ContainerResources::default()
        },
    )
}

/// `GetAllocatableResources`' devices of one resource (and a container's, from a device plugin).
pub fn allocatable(resource: &str, ids: &[&str]) -> proto::ContainerDevices {
    proto::ContainerDevices {
        resource_name: resource.into(),
        device_ids: ids.iter().map(|s| (*s).to_string()).collect(),
        topology: None,
    }
}

/// Each device's holders, described (`ml/trainer-0 through nvidia.com/gpu`), in device order.
pub fn holders(s: &peakfit::inventory::NodeGpuReportStatus) -> Vec<Vec<String>> {
    s.gpus
        .iter()
        .map(|g| {
            g.held_by
                .iter()
                .map(peakfit::inventory::DeviceHolder::describe)
                .collect()
        })
        .collect()
}
