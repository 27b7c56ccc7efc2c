//! Which device-plugin resources and DRA drivers are GPUs (`--gpu-resources`,
//! `--gpu-dra-drivers`): one parser and matcher for the agent, which maps the kubelet's
//! allocations onto NVML's devices with it, and the extender, which asks whether a Node's
//! allocatable advertises a GPU the device plugin could hand out behind peakfit's back, or a DRA
//! driver publishes GPUs for the node in a `ResourceSlice`. Both read the same chart values, so
//! they must agree on what a name means.

/// The device-plugin resources and DRA drivers whose devices are GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuResources {
    exact: Vec<String>,
    prefixes: Vec<String>,
    dra_drivers: Vec<String>,
}

/// A `--gpu-resources` or `--gpu-dra-drivers` entry that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FilterError {
    #[error(
        "{flag}: entry {value:?} is not allowed: entries are names (`nvidia.com/gpu`) or \
         prefixes ending in one `*` (`nvidia.com/mig-*`), comma-separated, none empty"
    )]
    Resource { flag: &'static str, value: String },
}

impl GpuResources {
    /// `resources` are exact names or prefixes ending in `*`; `dra_drivers` exact driver names.
    pub fn new(resources: &[String], dra_drivers: &[String]) -> Result<Self, FilterError> {
        let mut exact = Vec::new();
        let mut prefixes = Vec::new();
        for r in resources.iter().map(|r| r.trim()) {
            let bad = || FilterError::Resource {
                flag: "--gpu-resources",
                value: r.to_string(),
            };
            match r.strip_suffix('*') {
                Some(prefix) if !prefix.is_empty() && !prefix.contains('*') => {
                    prefixes.push(prefix.to_string());
                }
                None if !r.is_empty() && !r.contains('*') => exact.push(r.to_string()),
                _ => return Err(bad()),
            }
        }
        let mut drivers = Vec::new();
        // `none` alone names no driver: DRA is not used for GPUs, and the extender starts no
        // `ResourceSlice` watch. (The chart writes it for an empty list; an empty entry stays
        // an error, as a value cut short is more likely than a wish for nothing.)
        let none = matches!(dra_drivers, [d] if d.trim() == "none");
        for d in dra_drivers.iter().filter(|_| !none).map(|d| d.trim()) {
            if d.is_empty() || d.contains('*') {
                return Err(FilterError::Resource {
                    flag: "--gpu-dra-drivers",
                    value: d.to_string(),
                });
            }
            drivers.push(d.to_string());
        }
        Ok(Self {
            exact,
            prefixes,
            dra_drivers: drivers,
        })
    }

    /// Whether device-plugin resource `name` is a GPU (an exact name or a listed prefix).
    pub fn is_gpu_resource(&self, name: &str) -> bool {
        self.exact.iter().any(|e| e == name) || self.prefixes.iter().any(|p| name.starts_with(p))
    }

    /// The DRA drivers that hand out GPUs; empty when DRA is not used for GPUs.
    pub fn dra_drivers(&self) -> &[String] {
        &self.dra_drivers
    }

    /// Whether DRA driver `driver` hands out GPUs.
    pub fn is_gpu_driver(&self, driver: &str) -> bool {
        self.dra_drivers.iter().any(|d| d == driver)
    }
}

/// `--gpu-resources`' default, the agent's and the extender's: the NVIDIA device plugin's whole
/// GPUs and MIG instances.
pub const DEFAULT_GPU_RESOURCES: &str = "nvidia.com/gpu,nvidia.com/mig-*";

/// `--gpu-dra-drivers`' default: NVIDIA's DRA driver.
pub const DEFAULT_GPU_DRA_DRIVERS: &str = "gpu.nvidia.com";

impl Default for GpuResources {
    /// The flags' defaults, [`DEFAULT_GPU_RESOURCES`] and [`DEFAULT_GPU_DRA_DRIVERS`].
    fn default() -> Self {
        let split = |s: &str| s.split(',').map(str::to_owned).collect::<Vec<_>>();
        Self::new(
            &split(DEFAULT_GPU_RESOURCES),
            &split(DEFAULT_GPU_DRA_DRIVERS),
        )
        .unwrap_or_else(|e| unreachable!("the defaults parse: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_names_the_nvidia_device_plugin_resources() {
        let r = GpuResources::default();
        assert!(r.is_gpu_resource("nvidia.com/gpu"));
        assert!(r.is_gpu_resource("nvidia.com/mig-1g.10gb"));
        assert!(!r.is_gpu_resource("nvidia.com/gpu.shared"));
        assert!(!r.is_gpu_resource("cpu"));
        assert!(r.is_gpu_driver("gpu.nvidia.com"));
    }

    /// `none` turns DRA off; an empty entry, alone or beside a driver, is refused naming the
    /// flag.
    #[test]
    fn none_names_no_dra_driver() {
        for off in ["none", " none "] {
            let r = GpuResources::new(&[], &[off.to_owned()]).unwrap();
            assert!(r.dra_drivers().is_empty(), "{off:?}");
            assert!(!r.is_gpu_driver("gpu.nvidia.com"));
        }
        for bad in [
            vec![String::new()],
            vec!["gpu.nvidia.com".into(), String::new()],
        ] {
            let err = GpuResources::new(&[], &bad).unwrap_err();
            assert!(err.to_string().starts_with("--gpu-dra-drivers"), "{err}");
        }
    }
}
