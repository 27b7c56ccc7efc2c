//! Reading the GPUs: a `GpuSource` trait (so the loop and the report can be tested without a
//! driver) and its NVML implementation through nvml-wrapper.
//!
//! A driver that cannot answer one question (`NotSupported`, a symbol missing from an old
//! `libnvidia-ml.so`) costs that field only: it is listed in the device's `degraded` and the rest of
//! the report stands. A driver that cannot be loaded or initialised at all yields an empty reading
//! with `nvml.up = false` and the reason, and the source tries again later with a backoff, so a
//! node without a working driver never crash-loops the `DaemonSet`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::time::{Duration, Instant};

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};

use crate::inventory::{GpuDevice, GpuProcess, NvmlStatus};

/// One look at the node's GPUs, before processes are mapped to pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reading {
    pub nvml: NvmlStatus,
    pub gpus: Vec<GpuDevice>,
    /// Each physical GPU's device minor number (`/dev/nvidia<minor>`) by UUID, where NVML gives
    /// it: NVIDIA's DRA driver names GPUs after it (`gpu-<minor>`), and it need not be the index.
    pub minor_numbers: BTreeMap<String, u32>,
}

impl Reading {
    /// A reading of a node whose driver could not be reached, saying why.
    pub fn down(reason: impl Into<String>) -> Self {
        Self {
            nvml: NvmlStatus {
                up: false,
                driver_version: None,
                reason: Some(reason.into()),
            },
            gpus: Vec::new(),
            minor_numbers: BTreeMap::new(),
        }
    }
}

/// Where GPU readings come from: NVML in production, anything in tests and benches.
pub trait GpuSource: Send {
    /// Reads every GPU now. Never fails: failures are part of the reading.
    fn read(&mut self) -> Reading;
}

/// NVML through nvml-wrapper, loaded at runtime from `lib_path`.
pub struct NvmlSource {
    lib_path: OsString,
    nvml: Option<Nvml>,
    /// The last reason NVML could not be initialised, reported until the next attempt.
    last_failure: Option<String>,
    failures: u32,
    retry_at: Option<Instant>,
    max_backoff: Duration,
}

impl NvmlSource {
    /// Does not touch the library yet: the first `read` loads it.
    pub fn new(lib_path: impl Into<OsString>) -> Self {
        Self {
            lib_path: lib_path.into(),
            nvml: None,
            last_failure: None,
            failures: 0,
            retry_at: None,
            max_backoff: Duration::from_secs(60),
        }
    }

    /// The wait before the next init attempt after `failures` consecutive failures: 1 s doubling
    /// up to `max_backoff`, so a driver that comes up late (driver container still installing) is
    /// picked up within a minute, without hammering a broken one.
    fn backoff(&self) -> Duration {
        let secs = 1u64 << self.failures.saturating_sub(1).min(16);
        Duration::from_secs(secs).min(self.max_backoff)
    }

    fn init(&mut self) -> Result<&Nvml, String> {
        if self.nvml.is_none() {
            if let (Some(at), Some(reason)) = (self.retry_at, &self.last_failure)
                && Instant::now() < at
            {
                return Err(reason.clone());
            }
            match Nvml::builder().lib_path(&self.lib_path).init() {
                Ok(nvml) => {
                    if self.failures > 0 {
                        tracing::info!("NVML is up after {} failed attempts", self.failures);
                    }
                    self.failures = 0;
                    self.retry_at = None;
                    self.last_failure = None;
                    self.nvml = Some(nvml);
                }
                Err(e) => {
                    let reason = init_failure(&e);
                    self.failures += 1;
                    self.retry_at = Some(Instant::now() + self.backoff());
                    if self.last_failure.as_deref() != Some(reason.as_str()) {
                        tracing::warn!(
                            lib = %self.lib_path.to_string_lossy(),
                            "NVML unavailable, reporting zero GPUs: {reason}"
                        );
                    }
                    self.last_failure = Some(reason.clone());
                    return Err(reason);
                }
            }
        }
        self.nvml
            .as_ref()
            .ok_or_else(|| "NVML not initialised".to_string())
    }
}

impl GpuSource for NvmlSource {
    fn read(&mut self) -> Reading {
        let nvml = match self.init() {
            Ok(nvml) => nvml,
            Err(reason) => return Reading::down(reason),
        };
        match read_all(nvml) {
            Ok(reading) => reading,
            Err(e) => {
                // The library stopped answering as a whole (driver unloaded, GPU lost): start over
                // with a fresh init on a later poll.
                let reason = format!("reading GPUs failed: {}", short(&e));
                tracing::warn!("{reason}; NVML will be re-initialised");
                self.nvml = None;
                self.failures = 1;
                self.retry_at = Some(Instant::now() + self.backoff());
                self.last_failure = Some(reason.clone());
                Reading::down(reason)
            }
        }
    }
}

/// A reason an operator can act on, naming the NVML error.
fn init_failure(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(inner) => format!("NVML library could not be loaded: {inner}"),
        NvmlError::DriverNotLoaded => "DriverNotLoaded: the NVIDIA driver is not loaded".into(),
        NvmlError::NoPermission => "NoPermission: not allowed to talk to the NVIDIA driver".into(),
        NvmlError::LibRmVersionMismatch => {
            "LibRmVersionMismatch: NVML library and kernel driver versions differ".into()
        }
        NvmlError::FailedToLoadSymbol(s) => format!("NVML library lacks nvmlInit: {s}"),
        other => format!("NVML init failed: {}", short(other)),
    }
}

/// The error's variant name where it is one of NVML's codes, which is what an operator searches
/// for; the message otherwise.
fn short(e: &NvmlError) -> String {
    match e {
        NvmlError::NotSupported => "NotSupported".into(),
        NvmlError::FailedToLoadSymbol(_) => "missing symbol".into(),
        NvmlError::NoPermission => "NoPermission".into(),
        NvmlError::GpuLost => "GpuLost".into(),
        NvmlError::Uninitialized => "Uninitialized".into(),
        NvmlError::DriverNotLoaded => "DriverNotLoaded".into(),
        NvmlError::NotFound => "NotFound".into(),
        NvmlError::InvalidArg => "InvalidArg".into(),
        NvmlError::Unknown => "Unknown".into(),
        other => other.to_string(),
    }
}

/// Keeps a field's value, or records why it is missing.
fn field<T>(r: Result<T, NvmlError>, name: &str, degraded: &mut Vec<String>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            degraded.push(format!("{name}: {}", short(&e)));
            None
        }
    }
}

/// Errors that mean the library as a whole is gone, not that one device or field is missing.
fn is_fatal(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::Uninitialized | NvmlError::DriverNotLoaded | NvmlError::LibRmVersionMismatch
    )
}

fn read_all(nvml: &Nvml) -> Result<Reading, NvmlError> {
    let count = nvml.device_count()?;
    let mut gpus = Vec::with_capacity(count as usize);
    let mut minor_numbers = BTreeMap::new();
    for index in 0..count {
        let device = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) if is_fatal(&e) => return Err(e),
            Err(e) => {
                // Without a handle there is no UUID to report under; the extender sees one GPU
                // fewer, which is the safe direction.
                tracing::warn!(index, "skipping GPU: {}", short(&e));
                continue;
            }
        };
        let at = gpus.len();
        read_gpu(&device, index, &mut gpus);
        // Only DRA's device names need it; a driver without it maps `gpu-<n>` by index.
        if let (Ok(minor), Some(gpu)) = (device.minor_number(), gpus.get(at))
            && !gpu.uuid.is_empty()
        {
            minor_numbers.insert(gpu.uuid.clone(), minor);
        }
    }
    Ok(Reading {
        nvml: NvmlStatus {
            up: true,
            driver_version: nvml.sys_driver_version().ok(),
            reason: None,
        },
        gpus,
        minor_numbers,
    })
}

/// Appends the physical GPU and, in MIG mode, each of its MIG instances.
fn read_gpu(device: &Device, index: u32, out: &mut Vec<GpuDevice>) {
    let mut gpu = read_common(device, index);
    gpu.pci_bus_id = field(device.pci_info(), "pciBusId", &mut gpu.degraded).map(|p| p.bus_id);
    let mig_enabled = match device.mig_mode() {
        Ok(mode) => mode.current == 1,
        // Most GPUs cannot do MIG at all; that is an answer, not a degradation.
        Err(NvmlError::NotSupported) => false,
        Err(e) => {
            gpu.degraded.push(format!("migMode: {}", short(&e)));
            false
        }
    };
    if !mig_enabled {
        gpu.processes = read_processes(device, &mut gpu.degraded);
        out.push(gpu);
        return;
    }
    // A MIG parent is not schedulable and its processes are listed on the instance they run
    // in, so that no memory is counted twice.
    gpu.mig_enabled = true;
    let parent_uuid = gpu.uuid.clone();
    let slots = field(device.mig_device_count(), "migDevices", &mut gpu.degraded).unwrap_or(0);
    let mut instances = Vec::new();
    for slot in 0..slots {
        match device.mig_device_by_index(slot) {
            Ok(mig) => {
                let mut instance = read_common(&mig, index);
                instance.mig_parent_uuid = Some(parent_uuid.clone());
                instance.processes = read_instance_processes(&mig, &mut instance);
                instances.push(instance);
            }
            // Unused slots of the maximum answer NotFound (or InvalidArg on some drivers).
            Err(NvmlError::NotFound | NvmlError::InvalidArg) => {}
            Err(e) => gpu.degraded.push(format!("mig[{slot}]: {}", short(&e))),
        }
    }
    out.push(gpu);
    out.extend(instances);
}

fn read_common(device: &Device, index: u32) -> GpuDevice {
    let mut degraded = Vec::new();
    let uuid = field(device.uuid(), "uuid", &mut degraded).unwrap_or_default();
    let name = field(device.name(), "name", &mut degraded).unwrap_or_default();
    let memory = field(device.memory_info(), "memory", &mut degraded);
    GpuDevice {
        index,
        uuid,
        name,
        memory_total_bytes: memory.as_ref().map_or(0, |m| m.total),
        memory_used_bytes: memory.as_ref().map_or(0, |m| m.used),
        memory_free_bytes: memory.as_ref().map_or(0, |m| m.free),
        memory_reserved_bytes: memory.as_ref().map_or(0, |m| m.reserved),
        degraded,
        ..GpuDevice::default()
    }
}

fn raw_processes(device: &Device, degraded: &mut Vec<String>) -> Vec<ProcessInfo> {
    field(device.running_compute_processes(), "processes", degraded).unwrap_or_default()
}

fn read_processes(device: &Device, degraded: &mut Vec<String>) -> Vec<GpuProcess> {
    raw_processes(device, degraded)
        .iter()
        .map(to_gpu_process)
        .collect()
}

/// nvml-wrapper does not wrap `nvmlDeviceGetGpuInstanceId`, so the instance id comes from the
/// processes NVML lists on the instance (each carries it); an idle instance has none.
fn read_instance_processes(mig: &Device, instance: &mut GpuDevice) -> Vec<GpuProcess> {
    let raw = raw_processes(mig, &mut instance.degraded);
    instance.mig_gpu_instance_id = raw.iter().find_map(|p| p.gpu_instance_id);
    raw.iter().map(to_gpu_process).collect()
}

fn to_gpu_process(p: &ProcessInfo) -> GpuProcess {
    GpuProcess {
        pid: p.pid,
        used_bytes: match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => Some(b),
            UsedGpuMemory::Unavailable => None,
        },
        pod_uid: None,
        container_id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_down_reading_with_the_reason() {
        let mut source = NvmlSource::new("/nonexistent/libnvidia-ml.so.1");
        let reading = source.read();
        assert!(!reading.nvml.up);
        assert!(reading.gpus.is_empty());
        let reason = reading.nvml.reason.unwrap();
        assert!(
            reason.contains("could not be loaded") && reason.contains("/nonexistent"),
            "{reason}"
        );
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let mut s = NvmlSource::new("x");
        let waits: Vec<u64> = (1..=9)
            .map(|f| {
                s.failures = f;
                s.backoff().as_secs()
            })
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    #[test]
    fn a_failed_field_is_listed_and_the_rest_kept() {
        let mut degraded = Vec::new();
        let ok: Option<u32> = field(Ok(3), "a", &mut degraded);
        let missing: Option<u32> = field(Err(NvmlError::NotSupported), "processes", &mut degraded);
        let symbol: Option<u32> = field(
            Err(NvmlError::FailedToLoadSymbol("undefined symbol: x".into())),
            "pciBusId",
            &mut degraded,
        );
        assert_eq!((ok, missing, symbol), (Some(3), None, None));
        assert_eq!(
            degraded,
            ["processes: NotSupported", "pciBusId: missing symbol"]
        );
    }
}
