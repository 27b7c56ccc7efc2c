//! The kubelet's `PodResources` v1 API over its unix socket: `List` and
//! `GetAllocatableResources`, both under one deadline.
//!
//! The poll is synchronous (NVML blocks), so the client owns a current-thread runtime and blocks
//! on it; the channel's connection lives on that runtime and is reused from poll to poll (one
//! `connect` and HTTP/2 handshake per kubelet restart, not per poll). A kubelet that does not
//! answer costs the poll at most `timeout`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use super::proto;
use super::proto::pod_resources_lister_client::PodResourcesListerClient;

/// The kubelet allows 16 MiB answers (`podresources.DefaultMaxMsgSize`) where tonic's default is
/// 4 MiB: a node with many pods and devices must not fail to decode.
const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// Why the kubelet's socket could not be read; its `Display` is the report's
/// `podResources.reason`.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error(
        "socket missing: {} does not exist (mount the kubelet's pod-resources directory, or set \
         --pod-resources-socket \"\" to stop reading it)",
        path.display()
    )]
    Missing { path: PathBuf },
    #[error(
        "permission denied on {} (connecting to the kubelet's socket needs root, or write \
         permission on it)",
        path.display()
    )]
    PermissionDenied { path: PathBuf },
    #[error("connection refused on {}: nothing listens (is the kubelet running?)", path.display())]
    Refused { path: PathBuf },
    #[error("timeout: the kubelet did not answer on {} within {timeout:?}", path.display())]
    Timeout { path: PathBuf, timeout: Duration },
    #[error("{call} on {} failed: {code:?}: {message}", path.display())]
    Call {
        call: &'static str,
        path: PathBuf,
        code: tonic::Code,
        message: String,
    },
    #[error("starting the PodResources client's runtime")]
    Runtime(#[source] std::io::Error),
}

/// One answer of the kubelet.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Allocations {
    /// `List`: every pod's devices, device plugin and DRA.
    pub pods: Vec<proto::PodResources>,
    /// `GetAllocatableResources`' device-plugin devices; `None` where the kubelet does not serve
    /// it (before 1.23, or its feature gate off) or it was not asked this time.
    pub allocatable: Option<Vec<proto::ContainerDevices>>,
}

pub struct Client {
    /// `Some` until dropped: `Drop` shuts it down without blocking, so a client dropped on an
    /// async worker (the agent's loop ending) does not panic.
    runtime: Option<tokio::runtime::Runtime>,
    api: PodResourcesListerClient<Channel>,
    socket: PathBuf,
    timeout: Duration,
    allocatable_served: bool,
    /// When `GetAllocatableResources` last answered: the devices a kubelet can allocate change
    /// only when a device plugin registers, so it is asked once per [`ALLOCATABLE_EVERY`], not at
    /// every poll (one call per poll instead of two).
    allocatable_at: Option<std::time::Instant>,
}

/// How often `GetAllocatableResources` is asked.
pub const ALLOCATABLE_EVERY: Duration = Duration::from_secs(60);

impl Client {
    /// Connects lazily: nothing touches the socket before the first [`Client::read`].
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Result<Self, PodResourcesError> {
        let socket = socket.into();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(PodResourcesError::Runtime)?;
        let channel = {
            // The channel spawns its worker on the runtime it is made in.
            let _entered = runtime.enter();
            let path = socket.clone();
            // The URI is only the `:authority` of each request; the connector decides where to go.
            Endpoint::from_static("http://localhost")
                .connect_timeout(timeout)
                .connect_with_connector_lazy(tower::service_fn(move |_: http::Uri| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                }))
        };
        let api =
            PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
        Ok(Self {
            runtime: Some(runtime),
            api,
            socket,
            timeout,
            allocatable_served: true,
            allocatable_at: None,
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Asks `List` (and, when due, `GetAllocatableResources`: two streams on one connection at
    /// once) within the timeout. Must not be called from an async task (it blocks on its own runtime).
    pub fn read(&mut self) -> Result<Allocations, PodResourcesError> {
        let (mut list_api, mut alloc_api) = (self.api.clone(), self.api.clone());
        let ask_allocatable = self.allocatable_served
            && self
                .allocatable_at
                .is_none_or(|at| at.elapsed() >= ALLOCATABLE_EVERY);
        let runtime = self.runtime.as_ref().ok_or_else(|| {
            PodResourcesError::Runtime(std::io::Error::other("client already shut down"))
        })?;
        let timeout = self.timeout;
        // The timer is made inside `block_on`: it needs the runtime's time driver.
        let answer = runtime.block_on(async move {
            tokio::time::timeout(timeout, async move {
                let list = list_api.list(proto::ListPodResourcesRequest {});
                let allocatable = async {
                    if ask_allocatable {
                        Some(
                            alloc_api
                                .get_allocatable_resources(proto::AllocatableResourcesRequest {})
                                .await,
                        )
                    } else {
                        None
                    }
                };
                tokio::join!(list, allocatable)
            })
            .await
        });
        let Ok((list, allocatable)) = answer else {
            return Err(PodResourcesError::Timeout {
                path: self.socket.clone(),
                timeout: self.timeout,
            });
        };
        let pods = list
            .map_err(|s| self.error("List", &s))?
            .into_inner()
            .pod_resources;
        let allocatable = match allocatable {
            None => None,
            Some(Ok(r)) => {
                self.allocatable_at = Some(std::time::Instant::now());
                Some(r.into_inner().devices)
            }
            Some(Err(s)) if s.code() == tonic::Code::Unimplemented => {
                tracing::info!(
                    socket = %self.socket.display(),
                    "the kubelet does not serve GetAllocatableResources; reading List only"
                );
                self.allocatable_served = false;
                None
            }
            Some(Err(s)) => return Err(self.error("GetAllocatableResources", &s)),
        };
        Ok(Allocations { pods, allocatable })
    }

    /// The socket's own failure (missing, not allowed, nobody listening) where the status carries
    /// one, the call's status otherwise.
    fn error(&self, call: &'static str, status: &tonic::Status) -> PodResourcesError {
        let path = self.socket.clone();
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(status);
        while let Some(e) = source {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                match io.kind() {
                    std::io::ErrorKind::NotFound => return PodResourcesError::Missing { path },
                    std::io::ErrorKind::PermissionDenied => {
                        return PodResourcesError::PermissionDenied { path };
                    }
                    std::io::ErrorKind::ConnectionRefused => {
                        return PodResourcesError::Refused { path };
                    }
                    _ => {}
                }
            }
            source = e.source();
        }
        let message = if status.message().is_empty() {
            std::error::Error::source(status).map_or_else(String::new, ToString::to_string)
        } else {
            status.message().to_string()
        };
        PodResourcesError::Call {
            call,
            path,
            code: status.code(),
            message,
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
