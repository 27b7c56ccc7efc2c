//! Which pod the kubelet gave each GPU to: the `PodResources` answer mapped onto the devices NVML
//! lists.
//!
//! What is mapped:
//! * device plugin (`nvidia.com/gpu`, `nvidia.com/mig-*`, or what `--gpu-resources` names): a
//!   device id that is a device's UUID (`GPU-…`, `MIG-…`: the NVIDIA device plugin's default
//!   `DEVICE_ID_STRATEGY=uuid`), with or without a time-slicing replica suffix (`GPU-…::3`); or a
//!   plain number, a physical GPU's NVML index (`DEVICE_ID_STRATEGY=index`);
//! * DRA (`gpu.nvidia.com`, or what `--gpu-dra-drivers` names): a device named `gpu-<n>`, the
//!   physical GPU whose device minor number is `n` (NVIDIA's DRA driver names GPUs after their
//!   `/dev/nvidia<minor>`; where NVML gives no minor numbers, the NVML index), a device named
//!   after a UUID, or a CDI device whose name after `=` is a UUID.
//!
//! What is not: a MIG instance by index (`<gpu>:<mig>`, the index strategy) and a DRA MIG device
//! (`gpu-<n>-mig-<profile>-<start>-<size>`): neither name says which instance NVML lists, and
//! guessing would mark the wrong one. They are returned as [`Unmapped`], which the agent logs and
//! counts (`peakfit_agent_pod_resources_unmapped_devices`); nothing is dropped silently.

use std::collections::BTreeMap;

pub use crate::gpu_resources::{FilterError, GpuResources};
use crate::inventory::{DeviceHolder, GpuDevice, HolderKind};

use super::proto;

/// A GPU allocation the kubelet reported that names no device NVML lists.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Unmapped {
    /// `ns/pod/container`, or `allocatable` for a device the kubelet can hand out.
    pub holder: String,
    /// The resource or DRA driver.
    pub resource: String,
    /// The device id (device plugin) or device name (DRA).
    pub device: String,
}

impl std::fmt::Display for Unmapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {:?}", self.holder, self.resource, self.device)
    }
}

/// Sets each device's `held_by` from `pods` (clearing what was there) and returns the GPU
/// allocations that name no device. `minors` maps a physical GPU's UUID to its device minor
/// number, where NVML gave one.
pub fn assign(
    pods: &[proto::PodResources],
    gpus: &mut [GpuDevice],
    minors: &BTreeMap<String, u32>,
    filter: &GpuResources,
) -> Vec<Unmapped> {
    for g in gpus.iter_mut() {
        g.held_by.clear();
    }
    let mut unmapped = Vec::new();
    for pod in pods {
        for container in &pod.containers {
            let who = || format!("{}/{}/{}", pod.namespace, pod.name, container.name);
            for devices in &container.devices {
                if !filter.is_gpu_resource(&devices.resource_name) {
                    continue;
                }
                let holder = DeviceHolder {
                    namespace: pod.namespace.clone(),
                    pod_name: pod.name.clone(),
                    container: container.name.clone(),
                    kind: HolderKind::DevicePlugin,
                    resource: devices.resource_name.clone(),
                    claim: None,
                };
                for id in &devices.device_ids {
                    match device_plugin_id(id, gpus) {
                        Some(i) => hold(&mut gpus[i], &holder),
                        None => unmapped.push(Unmapped {
                            holder: who(),
                            resource: devices.resource_name.clone(),
                            device: id.clone(),
                        }),
                    }
                }
            }
            for claim in &container.dynamic_resources {
                for r in &claim.claim_resources {
                    if !filter.is_gpu_driver(&r.driver_name) {
                        continue;
                    }
                    let holder = DeviceHolder {
                        namespace: pod.namespace.clone(),
                        pod_name: pod.name.clone(),
                        container: container.name.clone(),
                        kind: HolderKind::Dra,
                        resource: r.driver_name.clone(),
                        claim: Some(format!("{}/{}", claim.claim_namespace, claim.claim_name)),
                    };
                    match dra_device(r, gpus, minors) {
                        Some(i) => hold(&mut gpus[i], &holder),
                        None => unmapped.push(Unmapped {
                            holder: who(),
                            resource: r.driver_name.clone(),
                            device: r.device_name.clone(),
                        }),
                    }
                }
            }
        }
    }
    for g in gpus.iter_mut() {
        g.held_by.sort_by(|a, b| {
            (
                &a.namespace,
                &a.pod_name,
                &a.container,
                &a.resource,
                &a.claim,
            )
                .cmp(&(
                    &b.namespace,
                    &b.pod_name,
                    &b.container,
                    &b.resource,
                    &b.claim,
                ))
        });
    }
    unmapped.sort();
    unmapped
}

/// The device-plugin GPU ids the kubelet can allocate (`GetAllocatableResources`) that name no
/// device NVML lists: the plugin and NVML disagree (an id strategy this agent cannot read, or a
/// GPU NVML no longer sees), so its allocations of them cannot be placed either.
pub fn unknown_allocatable(
    allocatable: &[proto::ContainerDevices],
    gpus: &[GpuDevice],
    filter: &GpuResources,
) -> Vec<Unmapped> {
    let mut out: Vec<Unmapped> = allocatable
        .iter()
        .filter(|d| filter.is_gpu_resource(&d.resource_name))
        .flat_map(|d| {
            d.device_ids
                .iter()
                .filter(|id| device_plugin_id(id, gpus).is_none())
                .map(|id| Unmapped {
                    holder: "allocatable".into(),
                    resource: d.resource_name.clone(),
                    device: id.clone(),
                })
        })
        .collect();
    out.sort();
    out
}

fn hold(gpu: &mut GpuDevice, holder: &DeviceHolder) {
    if !gpu.held_by.contains(holder) {
        gpu.held_by.push(holder.clone());
    }
}

/// The device a device plugin's id names: a UUID (a time-slicing replica `<uuid>::<n>` is the
/// device itself), or a physical GPU's index.
fn device_plugin_id(id: &str, gpus: &[GpuDevice]) -> Option<usize> {
    let id = id.split_once("::").map_or(id, |(base, _)| base);
    by_uuid(id, gpus).or_else(|| {
        let index: u32 = digits(id)?;
        gpus.iter()
            .position(|g| g.mig_parent_uuid.is_none() && g.index == index)
    })
}

/// The device a DRA allocation names: `gpu-<minor>`, a UUID, or a CDI device named after one.
fn dra_device(
    r: &proto::ClaimResource,
    gpus: &[GpuDevice],
    minors: &BTreeMap<String, u32>,
) -> Option<usize> {
    let by_name = r
        .device_name
        .strip_prefix("gpu-")
        .and_then(digits)
        .and_then(|n| {
            gpus.iter().position(|g| {
                g.mig_parent_uuid.is_none()
                    && match minors.get(&g.uuid) {
                        Some(&minor) => minor == n,
                        None => minors.is_empty() && g.index == n,
                    }
            })
        });
    by_name
        .or_else(|| by_uuid(&r.device_name, gpus))
        .or_else(|| {
            r.cdi_devices
                .iter()
                .filter_map(|c| c.name.split_once('=').map(|(_, device)| device))
                .find_map(|device| by_uuid(device, gpus))
        })
}

fn by_uuid(id: &str, gpus: &[GpuDevice]) -> Option<usize> {
    if id.is_empty() {
        return None;
    }
    gpus.iter().position(|g| g.uuid.eq_ignore_ascii_case(id))
}

/// A number written only with ASCII digits (`+1`, ` 1`, `1:0` are not).
fn digits(s: &str) -> Option<u32> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, uuid: &str) -> GpuDevice {
        GpuDevice {
            index,
            uuid: uuid.into(),
            ..GpuDevice::default()
        }
    }

    fn mig(index: u32, uuid: &str, parent: &str) -> GpuDevice {
        GpuDevice {
            mig_parent_uuid: Some(parent.into()),
            ..gpu(index, uuid)
        }
    }

    fn gpus() -> Vec<GpuDevice> {
        let mut parent = gpu(2, "GPU-c");
        parent.mig_enabled = true;
        vec![
            gpu(0, "GPU-a"),
            gpu(1, "GPU-b"),
            parent,
            mig(2, "MIG-c1", "GPU-c"),
            mig(2, "MIG-c2", "GPU-c"),
        ]
    }

    fn filter() -> GpuResources {
        GpuResources::new(
            &["nvidia.com/gpu".into(), "nvidia.com/mig-*".into()],
            &["gpu.nvidia.com".into()],
        )
        .unwrap()
    }

    fn plugin(resource: &str, ids: &[&str]) -> proto::ContainerDevices {
        proto::ContainerDevices {
            resource_name: resource.into(),
            device_ids: ids.iter().map(|s| (*s).to_string()).collect(),
            topology: None,
        }
    }

    fn claim(ns: &str, name: &str, driver: &str, device: &str) -> proto::DynamicResource {
        proto::DynamicResource {
            claim_name: name.into(),
            claim_namespace: ns.into(),
            claim_resources: vec![proto::ClaimResource {
                cdi_devices: vec![],
                driver_name: driver.into(),
                pool_name: "node-1".into(),
                device_name: device.into(),
            }],
        }
    }

    fn pod(
        ns: &str,
        name: &str,
        devices: Vec<proto::ContainerDevices>,
        dra: Vec<proto::DynamicResource>,
    ) -> proto::PodResources {
        proto::PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: vec![proto::ContainerResources {
                name: "main".into(),
                devices,
                dynamic_resources: dra,
                ..proto::ContainerResources::default()
            }],
        }
    }

    fn holders(g: &GpuDevice) -> Vec<String> {
        g.held_by.iter().map(DeviceHolder::describe).collect()
    }

    #[test]
    fn uuids_replicas_and_mig_uuids_map_to_their_devices() {
        let mut gpus = gpus();
        let pods = [
            pod(
                "ml",
                "trainer",
                vec![
                    plugin("nvidia.com/gpu", &["GPU-a", "gpu-b::2"]),
                    plugin("cpu-things", &["GPU-c"]), // not a GPU resource: ignored
                ],
                vec![],
            ),
            pod(
                "ml",
                "small",
                vec![plugin("nvidia.com/mig-1g.10gb", &["MIG-c2"])],
                vec![],
            ),
        ];
        let unmapped = assign(&pods, &mut gpus, &BTreeMap::new(), &filter());
        assert_eq!(unmapped, []);
        assert_eq!(holders(&gpus[0]), ["ml/trainer through nvidia.com/gpu"]);
        assert_eq!(holders(&gpus[1]), ["ml/trainer through nvidia.com/gpu"]);
        assert!(gpus[2].held_by.is_empty() && gpus[3].held_by.is_empty());
        assert_eq!(
            holders(&gpus[4]),
            ["ml/small through nvidia.com/mig-1g.10gb"]
        );
        assert_eq!(gpus[0].held_by[0].container, "main");
    }

    #[test]
    fn the_index_strategy_maps_whole_gpus_and_reports_mig_indices() {
        let mut gpus = gpus();
        let pods = [pod(
            "ml",
            "idx",
            vec![plugin("nvidia.com/gpu", &["1", "2:0", "7"])],
            vec![],
        )];
        let unmapped = assign(&pods, &mut gpus, &BTreeMap::new(), &filter());
        assert_eq!(holders(&gpus[1]), ["ml/idx through nvidia.com/gpu"]);
        let devices: Vec<&str> = unmapped.iter().map(|u| u.device.as_str()).collect();
        assert_eq!(devices, ["2:0", "7"]);
        assert_eq!(
            unmapped[0].to_string(),
            r#"ml/idx/main nvidia.com/gpu "2:0""#
        );
    }

    #[test]
    fn dra_devices_map_by_minor_number_uuid_or_cdi_name() {
        let mut gpus = gpus();
        let mut by_cdi = claim("ml", "c3", "gpu.nvidia.com", "weird-name");
        by_cdi.claim_resources[0].cdi_devices = vec![proto::CdiDevice {
            name: "nvidia.com/gpu=GPU-b".into(),
        }];
        let pods = [pod(
            "ml",
            "dra",
            vec![],
            vec![
                claim("ml", "c1", "gpu.nvidia.com", "gpu-1"),
                by_cdi,
                claim("ml", "c4", "gpu.nvidia.com", "gpu-2-mig-9-4-4"),
                claim("ml", "c5", "other.example.com", "gpu-0"), // not a GPU driver
            ],
        )];
        // Minor numbers differ from indices: gpu-1 is the GPU at index 0.
        let minors = BTreeMap::from([
            ("GPU-a".to_string(), 1),
            ("GPU-b".to_string(), 0),
            ("GPU-c".to_string(), 2),
        ]);
        let unmapped = assign(&pods, &mut gpus, &minors, &filter());
        assert_eq!(
            holders(&gpus[0]),
            ["ml/dra through claim ml/c1 (gpu.nvidia.com)"]
        );
        assert_eq!(
            holders(&gpus[1]),
            ["ml/dra through claim ml/c3 (gpu.nvidia.com)"]
        );
        assert_eq!(unmapped.len(), 1, "{unmapped:?}");
        assert_eq!(unmapped[0].device, "gpu-2-mig-9-4-4");

        // Without minor numbers, gpu-<n> is the NVML index.
        let unmapped = assign(&pods[..1], &mut gpus, &BTreeMap::new(), &filter());
        assert_eq!(unmapped.len(), 1);
        assert_eq!(
            holders(&gpus[1]),
            [
                "ml/dra through claim ml/c1 (gpu.nvidia.com)",
                "ml/dra through claim ml/c3 (gpu.nvidia.com)"
            ]
        );
        assert!(gpus[0].held_by.is_empty(), "a second assign starts afresh");
    }

    #[test]
    fn a_device_listed_twice_for_one_container_is_one_holder() {
        let mut gpus = gpus();
        let pods = [pod(
            "ml",
            "twice",
            vec![
                plugin("nvidia.com/gpu", &["GPU-a"]),
                plugin("nvidia.com/gpu", &["GPU-a::1"]),
            ],
            vec![],
        )];
        assign(&pods, &mut gpus, &BTreeMap::new(), &filter());
        assert_eq!(gpus[0].held_by.len(), 1);
    }

    #[test]
    fn allocatable_ids_that_name_no_gpu_are_reported() {
        let allocatable = [
            plugin("nvidia.com/gpu", &["GPU-a", "GPU-zz"]),
            plugin("example.com/nic", &["eth9"]),
        ];
        let unknown = unknown_allocatable(&allocatable, &gpus(), &filter());
        assert_eq!(
            unknown,
            [Unmapped {
                holder: "allocatable".into(),
                resource: "nvidia.com/gpu".into(),
                device: "GPU-zz".into(),
            }]
        );
    }

    #[test]
    fn filters_take_names_and_trailing_star_prefixes_only() {
        let f = filter();
        assert!(f.is_gpu_resource("nvidia.com/gpu"));
        assert!(f.is_gpu_resource("nvidia.com/mig-3g.40gb"));
        assert!(!f.is_gpu_resource("nvidia.com/gpu.shared"));
        assert!(f.is_gpu_driver("gpu.nvidia.com"));
        assert!(!f.is_gpu_driver("compute-domain.nvidia.com"));
        for bad in ["", "*", "nvidia.com/*gpu", "a**"] {
            let err = GpuResources::new(&[bad.into()], &[]).unwrap_err();
            assert!(
                err.to_string().starts_with("--gpu-resources: entry"),
                "{err}"
            );
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        let err = GpuResources::new(&[], &[" ".into()]).unwrap_err();
        assert!(err.to_string().starts_with("--gpu-dra-drivers"), "{err}");
    }
}
