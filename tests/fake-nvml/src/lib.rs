//! A fake `libnvidia-ml.so` for GPU-less CI.
//!
//! It exports the NVML C functions `peakfit agent` calls through nvml-wrapper and answers them from
//! the YAML file named in `FAKE_NVML_CONFIG` (see README.md). The file is re-read whenever it
//! changes, so a test can change memory between two polls of a running agent. This is the only
//! crate of the workspace allowed to use `unsafe`: a C ABI needs raw pointers.
#![allow(non_snake_case)]
// Every exported function is called by C code (nvml-wrapper's libloading bindings) with the
// pointer contract of `nvml.h`; the docs of NVML are the safety contract, not ours.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, c_ulonglong, c_void};
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};

use serde::Deserialize;

type Ret = c_uint;
type Handle = *mut c_void;

const SUCCESS: Ret = 0;
const UNINITIALIZED: Ret = 1;
const INVALID_ARGUMENT: Ret = 2;
const NOT_SUPPORTED: Ret = 3;
const NO_PERMISSION: Ret = 4;
const NOT_FOUND: Ret = 6;
const INSUFFICIENT_SIZE: Ret = 7;
const DRIVER_NOT_LOADED: Ret = 9;
const GPU_IS_LOST: Ret = 15;
const LIB_RM_VERSION_MISMATCH: Ret = 18;
const UNKNOWN: Ret = 999;
/// `NVML_VALUE_NOT_AVAILABLE` as nvml-wrapper reads it from `usedGpuMemory`.
const VALUE_NOT_AVAILABLE: c_ulonglong = c_ulonglong::MAX;
const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    #[serde(default = "default_driver")]
    driver_version: String,
    #[serde(default)]
    errors: std::collections::BTreeMap<String, Code>,
    #[serde(default)]
    devices: Vec<Device>,
}

fn default_driver() -> String {
    "550.54.15".into()
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Device {
    #[serde(default)]
    name: String,
    uuid: String,
    #[serde(default)]
    pci_bus_id: Option<String>,
    #[serde(default)]
    memory: Memory,
    #[serde(default)]
    processes: Vec<Process>,
    #[serde(default)]
    errors: std::collections::BTreeMap<String, Code>,
    /// MIG instances; a device with any is in MIG mode.
    #[serde(default)]
    mig: Vec<Device>,
    /// What `nvmlDeviceGetMaxMigDeviceCount` answers; defaults to the number of instances.
    #[serde(default)]
    max_mig_devices: Option<u32>,
    /// For a MIG instance: its GPU instance id.
    #[serde(default)]
    gpu_instance_id: Option<u32>,
    /// What `nvmlDeviceGetMinorNumber` answers (`/dev/nvidia<minor>`); defaults to the index.
    #[serde(default)]
    minor: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Memory {
    #[serde(default)]
    total: u64,
    #[serde(default)]
    reserved: u64,
    #[serde(default)]
    used: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Process {
    pid: u32,
    #[serde(default)]
    used_bytes: Option<u64>,
}

/// An NVML return code, by name or number.
#[derive(Debug, Clone, Copy)]
struct Code(Ret);

impl<'de> Deserialize<'de> for Code {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(u32),
            Name(String),
        }
        let code = match Raw::deserialize(d)? {
            Raw::Num(n) => n,
            Raw::Name(name) => match name.as_str() {
                "Success" => SUCCESS,
                "Uninitialized" => UNINITIALIZED,
                "InvalidArgument" => INVALID_ARGUMENT,
                "NotSupported" => NOT_SUPPORTED,
                "NoPermission" => NO_PERMISSION,
                "NotFound" => NOT_FOUND,
                "InsufficientSize" => INSUFFICIENT_SIZE,
                "DriverNotLoaded" => DRIVER_NOT_LOADED,
                "GpuIsLost" => GPU_IS_LOST,
                "LibRmVersionMismatch" => LIB_RM_VERSION_MISMATCH,
                "Unknown" => UNKNOWN,
                other => {
                    return Err(serde::de::Error::custom(format!(
                        "unknown NVML return code {other:?}"
                    )));
                }
            },
        };
        Ok(Code(code))
    }
}

/// The parsed file and what identified its version on disk.
struct Cached {
    key: (i64, i64, u64, u64),
    config: Arc<Config>,
}

static CACHE: Mutex<Option<Cached>> = Mutex::new(None);

/// The current configuration, re-parsed only when the file changed (mtime, size or inode), so a
/// poll of many devices does not parse YAML once per call.
fn config() -> Result<Arc<Config>, Ret> {
    let Some(path) = std::env::var_os("FAKE_NVML_CONFIG") else {
        return Ok(Arc::new(Config::default()));
    };
    let meta = std::fs::metadata(&path).map_err(|e| {
        eprintln!("fake-nvml: cannot read {}: {e}", path.to_string_lossy());
        UNKNOWN
    })?;
    let key = (meta.mtime(), meta.mtime_nsec(), meta.size(), meta.ino());
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(c) = cache.as_ref().filter(|c| c.key == key) {
        return Ok(c.config.clone());
    }
    let text = std::fs::read_to_string(&path).map_err(|_| UNKNOWN)?;
    let config: Config = serde_saphyr::from_str(&text).map_err(|e| {
        eprintln!("fake-nvml: bad config {}: {e}", path.to_string_lossy());
        UNKNOWN
    })?;
    let config = Arc::new(config);
    *cache = Some(Cached {
        key,
        config: config.clone(),
    });
    Ok(config)
}

/// A handle is `(gpu index + 1) | (mig index + 1) << 16`; 0 in the high half is the physical GPU.
fn handle(gpu: usize, mig: Option<usize>) -> Handle {
    let mig = mig.map_or(0, |m| m + 1);
    ((gpu + 1) | (mig << 16)) as Handle
}

fn decode(h: Handle) -> Option<(usize, Option<usize>)> {
    let v = h as usize;
    let gpu = (v & 0xFFFF).checked_sub(1)?;
    let mig = (v >> 16).checked_sub(1);
    Some((gpu, mig))
}

fn device(cfg: &Config, h: Handle) -> Option<&Device> {
    let (gpu, mig) = decode(h)?;
    let d = cfg.devices.get(gpu)?;
    match mig {
        None => Some(d),
        Some(m) => d.mig.get(m),
    }
}

/// Runs `f` on the device behind `h`, after the library-wide and per-device error injections for
/// `call`.
fn with_device(call: &str, h: Handle, f: impl FnOnce(&Config, &Device) -> Ret) -> Ret {
    let cfg = match config() {
        Ok(c) => c,
        Err(rc) => return rc,
    };
    if let Some(Code(rc)) = cfg.errors.get(call) {
        return *rc;
    }
    let Some(d) = device(&cfg, h) else {
        return INVALID_ARGUMENT;
    };
    if let Some(Code(rc)) = d.errors.get(call) {
        return *rc;
    }
    f(&cfg, d)
}

fn with_config(call: &str, f: impl FnOnce(&Config) -> Ret) -> Ret {
    match config() {
        Ok(cfg) => match cfg.errors.get(call) {
            Some(Code(rc)) => *rc,
            None => f(&cfg),
        },
        Err(rc) => rc,
    }
}

unsafe fn write_cstr(s: &str, buf: *mut c_char, len: c_uint) -> Ret {
    if buf.is_null() {
        return INVALID_ARGUMENT;
    }
    if s.len() + 1 > len as usize {
        return INSUFFICIENT_SIZE;
    }
    // SAFETY: `buf` is non-null and the caller's buffer holds `len` bytes (NVML's contract), checked above to fit the string and its NUL.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
        *buf.add(s.len()) = 0;
    }
    SUCCESS
}

unsafe fn write<T>(out: *mut T, value: T) -> Ret {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: `out` is non-null (checked above) and points to a writable `T` (NVML's contract for output arguments).
    unsafe { out.write(value) };
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> Ret {
    with_config("nvmlInit_v2", |_| SUCCESS)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    with_config("nvmlInitWithFlags", |_| SUCCESS)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> Ret {
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(_rc: Ret) -> *const c_char {
    c"fake nvml error".as_ptr()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) -> Ret {
    // SAFETY: `buf`/`len` are the caller's buffer as NVML's contract describes it; `write_cstr` checks null and size.
    with_config("nvmlSystemGetDriverVersion", |cfg| unsafe {
        write_cstr(&cfg.driver_version, buf, len)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    // SAFETY: the output pointers are the caller's, writable as NVML's contract says; `write` returns INVALID_ARGUMENT for null.
    with_config("nvmlDeviceGetCount_v2", |cfg| unsafe {
        write(
            count,
            c_uint::try_from(cfg.devices.len()).unwrap_or(c_uint::MAX),
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, out: *mut Handle) -> Ret {
    with_config("nvmlDeviceGetHandleByIndex_v2", |cfg| {
        if index as usize >= cfg.devices.len() {
            return INVALID_ARGUMENT;
        }
        // SAFETY: the output pointers are the caller's, writable as NVML's contract says; `write` returns INVALID_ARGUMENT for null.
        unsafe { write(out, handle(index as usize, None)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(h: Handle, out: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetIndex", h, |_, _| match decode(h) {
        // SAFETY: the output pointers are the caller's, writable as NVML's contract says; `write` returns INVALID_ARGUMENT for null.
        Some((gpu, _)) => unsafe { write(out, c_uint::try_from(gpu).unwrap_or(c_uint::MAX)) },
        None => INVALID_ARGUMENT,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(h: Handle, out: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetMinorNumber", h, |_, d| match decode(h) {
        // The real driver has minor numbers for physical GPUs only.
        Some((gpu, None)) => {
            let minor = d
                .minor
                .unwrap_or_else(|| c_uint::try_from(gpu).unwrap_or(c_uint::MAX));
            // SAFETY: the output pointers are the caller's, writable as NVML's contract says; `write` returns INVALID_ARGUMENT for null.
            unsafe { write(out, minor) }
        }
        _ => INVALID_ARGUMENT,
    })
}

#[repr(C)]
pub struct MemoryV1 {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

fn free_of(m: &Memory) -> u64 {
    m.total.saturating_sub(m.reserved).saturating_sub(m.used)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(h: Handle, out: *mut MemoryV1) -> Ret {
    with_device("nvmlDeviceGetMemoryInfo", h, |_, d| {
        // v1 counts driver-reserved memory as used, as the real driver does.
        let m = &d.memory;
        let value = MemoryV1 {
            total: m.total,
            free: free_of(m),
            used: m.used + m.reserved,
        };
        // SAFETY: the output pointers are the caller's, writable as NVML's contract says; `write` returns INVALID_ARGUMENT for null.
        unsafe { write(out, value) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(h: Handle, out: *mut MemoryV2) -> Ret {
    with_device("nvmlDeviceGetMemoryInfo_v2", h, |_, d| {
        if out.is_null() {
            return INVALID_ARGUMENT;
        }
        let m = &d.memory;
        // SAFETY: `out` is non-null (checked above) and points to the caller's initialised struct (NVML's contract: it sets `version`).
        unsafe {
            // The caller sets `version`; the driver keeps it.
            let version = (*out).version;
            out.write(MemoryV2 {
                version,
                total: m.total,
                reserved: m.reserved,
                free: free_of(m),
                used: m.used,
            });
        }
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(h: Handle, buf: *mut c_char, len: c_uint) -> Ret {
    // SAFETY: `buf`/`len` are the caller's buffer as NVML's contract describes it; `write_cstr` checks null and size.
    with_device("nvmlDeviceGetName", h, |_, d| unsafe {
        write_cstr(&d.name, buf, len)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(h: Handle, buf: *mut c_char, len: c_uint) -> Ret {
    // SAFETY: `buf`/`len` are the caller's buffer as NVML's contract describes it; `write_cstr` checks null and size.
    with_device("nvmlDeviceGetUUID", h, |_, d| unsafe {
        write_cstr(&d.uuid, buf, len)
    })
}

/// `nvmlPciInfo_t` (v3 layout).
#[repr(C)]
pub struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(h: Handle, out: *mut PciInfo) -> Ret {
    with_device("nvmlDeviceGetPciInfo_v3", h, |_, d| {
        let Some(bus_id) = d.pci_bus_id.as_deref() else {
            return NOT_SUPPORTED;
        };
        if out.is_null() {
            return INVALID_ARGUMENT;
        }
        let mut info = PciInfo {
            bus_id_legacy: [0; 16],
            domain: 0,
            bus: 0,
            device: 0,
            pci_device_id: 0x2330_10de,
            pci_sub_system_id: 0,
            bus_id: [0; 32],
        };
        for (dst, src) in info.bus_id.iter_mut().zip(bus_id.bytes().take(31)) {
            *dst = c_char::from_ne_bytes([src]);
        }
        for (dst, src) in info.bus_id_legacy.iter_mut().zip(bus_id.bytes().take(15)) {
            *dst = c_char::from_ne_bytes([src]);
        }
        // SAFETY: the output pointers are the caller's, writable as NVML's contract says; `write` returns INVALID_ARGUMENT for null.
        unsafe { write(out, info) }
    })
}

/// `nvmlProcessInfo_t` (v3 layout, as `_v3` functions fill it).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// The two-call protocol: a call with too small a buffer (or none) answers
/// `NVML_ERROR_INSUFFICIENT_SIZE` and the count needed; an empty list is `SUCCESS` with 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    h: Handle,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    with_device("nvmlDeviceGetComputeRunningProcesses_v3", h, |_, d| {
        if count.is_null() {
            return INVALID_ARGUMENT;
        }
        // SAFETY: `count` is non-null (checked above) and points to the caller's `unsigned int` (NVML's contract).
        let capacity = unsafe { *count } as usize;
        let n = d.processes.len();
        // SAFETY: `count` is non-null (checked above) and points to the caller's `unsigned int` (NVML's contract).
        unsafe { *count = c_uint::try_from(n).unwrap_or(c_uint::MAX) };
        if n == 0 {
            return SUCCESS;
        }
        if infos.is_null() || capacity < n {
            return INSUFFICIENT_SIZE;
        }
        let instance = d.gpu_instance_id.unwrap_or(NO_INSTANCE);
        let compute = if d.gpu_instance_id.is_some() {
            0
        } else {
            NO_INSTANCE
        };
        for (i, p) in d.processes.iter().enumerate() {
            let info = ProcessInfo {
                pid: p.pid,
                used_gpu_memory: p.used_bytes.unwrap_or(VALUE_NOT_AVAILABLE),
                gpu_instance_id: instance,
                compute_instance_id: compute,
            };
            // SAFETY: `infos` is non-null and holds `capacity >= n > i` entries (checked above; NVML's contract).
            unsafe { infos.add(i).write(info) };
        }
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    h: Handle,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    with_device("nvmlDeviceGetMigMode", h, |_, d| {
        if decode(h).is_some_and(|(_, mig)| mig.is_some()) {
            return NOT_SUPPORTED;
        }
        let mode = c_uint::from(!d.mig.is_empty() || d.max_mig_devices.is_some());
        // SAFETY: the output pointers are the caller's, writable as NVML's contract says; `write` returns INVALID_ARGUMENT for null.
        unsafe {
            match write(current, mode) {
                SUCCESS => write(pending, mode),
                rc => rc,
            }
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(h: Handle, count: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetMaxMigDeviceCount", h, |_, d| {
        let n = d
            .max_mig_devices
            .unwrap_or(u32::try_from(d.mig.len()).unwrap_or(u32::MAX));
        // SAFETY: the output pointers are the caller's, writable as NVML's contract says; `write` returns INVALID_ARGUMENT for null.
        unsafe { write(count, n) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    h: Handle,
    index: c_uint,
    out: *mut Handle,
) -> Ret {
    with_device("nvmlDeviceGetMigDeviceHandleByIndex", h, |_, d| {
        let Some((gpu, None)) = decode(h) else {
            return INVALID_ARGUMENT;
        };
        if index as usize >= d.mig.len() {
            return NOT_FOUND;
        }
        // SAFETY: the output pointers are the caller's, writable as NVML's contract says; `write` returns INVALID_ARGUMENT for null.
        unsafe { write(out, handle(gpu, Some(index as usize))) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(h: Handle, is_mig: *mut c_uint) -> Ret {
    with_device("nvmlDeviceIsMigDeviceHandle", h, |_, _| {
        let mig = decode(h).is_some_and(|(_, mig)| mig.is_some());
        // SAFETY: the output pointers are the caller's, writable as NVML's contract says; `write` returns INVALID_ARGUMENT for null.
        unsafe { write(is_mig, c_uint::from(mig)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(h: Handle, id: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetGpuInstanceId", h, |_, d| {
        match d.gpu_instance_id {
            // SAFETY: the output pointers are the caller's, writable as NVML's contract says; `write` returns INVALID_ARGUMENT for null.
            Some(gi) => unsafe { write(id, gi) },
            None => NOT_SUPPORTED,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    h: Handle,
    out: *mut Handle,
) -> Ret {
    with_device(
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        h,
        |_, _| match decode(h) {
            // SAFETY: the output pointers are the caller's, writable as NVML's contract says; `write` returns INVALID_ARGUMENT for null.
            Some((gpu, Some(_))) => unsafe { write(out, handle(gpu, None)) },
            _ => INVALID_ARGUMENT,
        },
    )
}
