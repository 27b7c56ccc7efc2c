//! What the kubelet allocated (issue 23): the agent reads the kubelet's `PodResources` API each
//! poll and records, on each GPU, which pods the kubelet gave it to through a device plugin or a
//! DRA claim. peakfit shares memory only on devices nobody else was given, and the node's
//! advertised GPU memory leaves held devices out.
//!
//! A kubelet that cannot be read costs the report its holders' freshness, never the NVML
//! reading: `podResources.up` is false with the reason, and the holders of the last successful
//! read are kept, since a device that was held a moment ago is safer to treat as still held than
//! as free.
//!
//! Processes whose cgroup names no pod are not attributed through `PodResources`: it names
//! pods, not their UIDs (which the report's processes carry), and a host process or another
//! runtime's container on a device-plugin GPU looks the same as the pod's own; a held device
//! is not shared anyway, so its processes' owner changes no placement.

mod client;
pub mod holders;
/// The kubelet's `k8s.io/kubelet/pkg/apis/podresources/v1` messages and client, generated from
/// `proto/podresources/v1/api.proto` by scripts/gen-proto.
#[allow(clippy::all, clippy::pedantic)]
pub mod proto;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::inventory::{DeviceHolder, GpuDevice, PodResourcesStatus};

pub use self::client::{Allocations, Client, PodResourcesError};
pub use self::holders::{FilterError, GpuResources, Unmapped};

/// What the last read found, for the agent's metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub up: bool,
    /// Schedulable devices with at least one holder.
    pub held_devices: usize,
    /// GPU allocations (and allocatable ids) that name no device NVML lists.
    pub unmapped: usize,
    /// GPU device-plugin devices the kubelet can allocate; `None` where it does not say.
    pub allocatable: Option<usize>,
}

/// Reads the kubelet's socket and maps its allocations onto the GPUs of a reading.
pub struct PodResourcesReader {
    client: Client,
    filter: GpuResources,
    /// Holders per device UUID at the last successful read, kept while the kubelet cannot be read.
    last_holders: BTreeMap<String, Vec<DeviceHolder>>,
    last_reason: Option<String>,
    last_unmapped: Vec<Unmapped>,
    /// The last `GetAllocatableResources` answer (asked once a minute), checked against every
    /// reading.
    allocatable: Option<Vec<proto::ContainerDevices>>,
    stats: Stats,
}

impl PodResourcesReader {
    pub fn new(
        socket: impl Into<PathBuf>,
        timeout: Duration,
        filter: GpuResources,
    ) -> Result<Self, PodResourcesError> {
        Ok(Self {
            client: Client::new(socket, timeout)?,
            filter,
            last_holders: BTreeMap::new(),
            last_reason: None,
            last_unmapped: Vec::new(),
            allocatable: None,
            stats: Stats::default(),
        })
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Sets `held_by` on `gpus` (NVML's reading; `minors` maps a physical GPU's UUID to its device
    /// minor number) and says whether the kubelet answered. Blocks up to the client's timeout.
    pub fn read(
        &mut self,
        gpus: &mut [GpuDevice],
        minors: &BTreeMap<String, u32>,
    ) -> PodResourcesStatus {
        match self.client.read() {
            Ok(answer) => {
                if answer.allocatable.is_some() {
                    self.allocatable = answer.allocatable;
                }
                let mut unmapped = holders::assign(&answer.pods, gpus, minors, &self.filter);
                if let Some(allocatable) = &self.allocatable {
                    unmapped.extend(holders::unknown_allocatable(
                        allocatable,
                        gpus,
                        &self.filter,
                    ));
                }
                if let Some(reason) = self.last_reason.take() {
                    tracing::info!(
                        socket = %self.client.socket().display(),
                        "the kubelet's PodResources API answers again (was: {reason})"
                    );
                }
                if unmapped != self.last_unmapped && !unmapped.is_empty() {
                    let list: Vec<String> = unmapped.iter().map(ToString::to_string).collect();
                    tracing::warn!(
                        count = unmapped.len(),
                        "GPU allocations that name no device NVML lists (not marked as held): {}",
                        list.join(", ")
                    );
                }
                self.last_holders = gpus
                    .iter()
                    .filter(|g| !g.held_by.is_empty())
                    .map(|g| (g.uuid.clone(), g.held_by.clone()))
                    .collect();
                self.stats = Stats {
                    up: true,
                    held_devices: held_devices(gpus),
                    unmapped: unmapped.len(),
                    allocatable: self.allocatable.as_ref().map(|a| {
                        a.iter()
                            .filter(|d| self.filter.is_gpu_resource(&d.resource_name))
                            .map(|d| d.device_ids.len())
                            .sum()
                    }),
                };
                self.last_unmapped = unmapped;
                PodResourcesStatus {
                    up: true,
                    reason: None,
                }
            }
            Err(e) => {
                let reason = e.to_string();
                if self.last_reason.as_deref() != Some(reason.as_str()) {
                    tracing::warn!(
                        "cannot read the kubelet's PodResources API; devices keep the holders of \
                         the last read: {reason}"
                    );
                }
                for g in gpus.iter_mut() {
                    g.held_by = self.last_holders.get(&g.uuid).cloned().unwrap_or_default();
                }
                self.stats = Stats {
                    up: false,
                    held_devices: held_devices(gpus),
                    unmapped: self.last_unmapped.len(),
                    allocatable: self.stats.allocatable,
                };
                self.last_reason = Some(reason.clone());
                PodResourcesStatus {
                    up: false,
                    reason: Some(reason),
                }
            }
        }
    }
}

fn held_devices(gpus: &[GpuDevice]) -> usize {
    gpus.iter()
        .filter(|g| g.is_schedulable() && !g.held_by.is_empty())
        .count()
}
