//! Which pod a GPU process belongs to: host PID → `<proc-root>/<pid>/cgroup` → pod UID and
//! container id.
//!
//! The kubelet names a pod's cgroup after its UID, and the runtime names the container's cgroup
//! after the container id, under either cgroup driver:
//! * systemd: `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, '-'→'_'>.slice/
//!   cri-containerd-<id>.scope` (CRI-O: `crio-<id>.scope`, dockershim: `docker-<id>.scope`);
//! * cgroupfs: `/kubepods/burstable/pod<uid>/<id>`.
//!
//! Under cgroup v1 the file has one line per hierarchy, under v2 a single `0::` line; inside a
//! cgroup namespace the path may start with `/../..`. Parsing therefore looks at path segments,
//! not at fixed prefixes, and takes the first line that names a pod.

use std::path::Path;

/// The pod (and container) a process runs in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    pub pod_uid: String,
    pub container_id: Option<String>,
}

/// The most of a cgroup file read: 64 KiB. A real one is one line under cgroup v2 and about a
/// dozen under v1 (well under 4 KiB); the file of a process in a deep, long-named hierarchy
/// is the process owner's to make, and was read whole (issue 24).
pub const MAX_CGROUP_FILE_BYTES: u64 = 64 << 10;

/// Reads the process's cgroup file (its first [`MAX_CGROUP_FILE_BYTES`]); `None` for a process
/// of no pod, or one that has exited.
pub fn lookup(proc_root: &Path, pid: u32) -> Option<PodRef> {
    use std::io::Read as _;
    let path = proc_root.join(pid.to_string()).join("cgroup");
    let mut bytes = Vec::new();
    let read = std::fs::File::open(&path)
        .and_then(|f| f.take(MAX_CGROUP_FILE_BYTES).read_to_end(&mut bytes));
    match read {
        Ok(_) => parse_cgroup(&String::from_utf8_lossy(&bytes)),
        Err(e) => {
            tracing::debug!(path = %path.display(), "no cgroup for GPU process: {e}");
            None
        }
    }
}

/// Parses the contents of `/proc/<pid>/cgroup`.
pub fn parse_cgroup(text: &str) -> Option<PodRef> {
    text.lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .find_map(parse_path)
}

fn parse_path(path: &str) -> Option<PodRef> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut under_kubepods = false;
    for (i, segment) in segments.iter().enumerate() {
        if segment.contains("kubepods") {
            under_kubepods = true;
        }
        if !under_kubepods {
            continue;
        }
        let Some(uid) = pod_uid(segment) else {
            continue;
        };
        let container_id = segments.get(i + 1).and_then(|s| container_id(s));
        return Some(PodRef {
            pod_uid: uid,
            container_id,
        });
    }
    None
}

/// `kubepods-burstable-pod<uid_>.slice` (systemd) or `pod<uid>` (cgroupfs).
fn pod_uid(segment: &str) -> Option<String> {
    let raw = if let Some(stem) = segment.strip_suffix(".slice") {
        let at = stem.rfind("-pod")?;
        stem[at + 4..].replace('_', "-")
    } else {
        segment.strip_prefix("pod")?.to_string()
    };
    is_uid(&raw).then_some(raw)
}

/// A UID is a 36-character UUID, or for static pods the 32 hex digits of the manifest's hash.
fn is_uid(s: &str) -> bool {
    (32..=36).contains(&s.len())
        && s.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        && s.chars().filter(char::is_ascii_hexdigit).count() == 32
}

/// The container's cgroup: `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`,
/// `cri-dockerd-<id>.scope`, or a bare `<id>` under cgroupfs. A `crio-conmon-…` scope is CRI-O's
/// monitor, not the container.
fn container_id(segment: &str) -> Option<String> {
    let stem = segment.strip_suffix(".scope").unwrap_or(segment);
    if stem.contains("conmon") {
        return None;
    }
    let id = ["cri-containerd-", "crio-", "cri-dockerd-", "docker-"]
        .iter()
        .find_map(|p| stem.strip_prefix(p))
        .unwrap_or(stem);
    (id.len() >= 12 && id.chars().all(|c| c.is_ascii_hexdigit())).then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "8f5d1a52-3f43-4a8e-9f1e-0d3c1b2a4e01";
    const CID: &str = "4f2c9e0b7a1d3c5e8f6a2b4d9c0e1f3a5b7c9d2e4f6a8b0c1d3e5f7a9b2c4d6e";

    #[test]
    fn cgroup_files_of_every_driver_and_runtime() {
        /// (what, file contents, expected (pod UID, container id)).
        type Case<'a> = (&'a str, &'a str, Option<(&'a str, Option<&'a str>)>);
        let cases: &[Case] = &[
            (
                "v2, systemd, containerd, burstable",
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8f5d1a52_3f43_4a8e_9f1e_0d3c1b2a4e01.slice/cri-containerd-4f2c9e0b7a1d3c5e8f6a2b4d9c0e1f3a5b7c9d2e4f6a8b0c1d3e5f7a9b2c4d6e.scope\n",
                Some((UID, Some(CID))),
            ),
            (
                "v2, systemd, CRI-O, guaranteed",
                "0::/kubepods.slice/kubepods-pod8f5d1a52_3f43_4a8e_9f1e_0d3c1b2a4e01.slice/crio-4f2c9e0b7a1d3c5e8f6a2b4d9c0e1f3a5b7c9d2e4f6a8b0c1d3e5f7a9b2c4d6e.scope\n",
                Some((UID, Some(CID))),
            ),
            (
                "v2, systemd, besteffort, CRI-O conmon",
                "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod8f5d1a52_3f43_4a8e_9f1e_0d3c1b2a4e01.slice/crio-conmon-4f2c9e0b7a1d3c5e8f6a2b4d9c0e1f3a5b7c9d2e4f6a8b0c1d3e5f7a9b2c4d6e.scope\n",
                Some((UID, None)),
            ),
            (
                "v2, cgroupfs, containerd",
                "0::/kubepods/burstable/pod8f5d1a52-3f43-4a8e-9f1e-0d3c1b2a4e01/4f2c9e0b7a1d3c5e8f6a2b4d9c0e1f3a5b7c9d2e4f6a8b0c1d3e5f7a9b2c4d6e\n",
                Some((UID, Some(CID))),
            ),
            (
                "v2, cgroupfs, guaranteed (no QoS level)",
                "0::/kubepods/pod8f5d1a52-3f43-4a8e-9f1e-0d3c1b2a4e01/4f2c9e0b7a1d3c5e8f6a2b4d9c0e1f3a5b7c9d2e4f6a8b0c1d3e5f7a9b2c4d6e\n",
                Some((UID, Some(CID))),
            ),
            (
                "v2, read from inside a cgroup namespace",
                "0::/../../kubepods-burstable-pod8f5d1a52_3f43_4a8e_9f1e_0d3c1b2a4e01.slice/cri-containerd-4f2c9e0b7a1d3c5e8f6a2b4d9c0e1f3a5b7c9d2e4f6a8b0c1d3e5f7a9b2c4d6e.scope\n",
                Some((UID, Some(CID))),
            ),
            (
                "v2, kind node (kubelet.slice parent)",
                "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod8f5d1a52_3f43_4a8e_9f1e_0d3c1b2a4e01.slice/cri-containerd-4f2c9e0b7a1d3c5e8f6a2b4d9c0e1f3a5b7c9d2e4f6a8b0c1d3e5f7a9b2c4d6e.scope\n",
                Some((UID, Some(CID))),
            ),
            (
                "v1, systemd, docker",
                "12:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8f5d1a52_3f43_4a8e_9f1e_0d3c1b2a4e01.slice/docker-4f2c9e0b7a1d3c5e8f6a2b4d9c0e1f3a5b7c9d2e4f6a8b0c1d3e5f7a9b2c4d6e.scope\n\
                 11:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8f5d1a52_3f43_4a8e_9f1e_0d3c1b2a4e01.slice/docker-4f2c9e0b7a1d3c5e8f6a2b4d9c0e1f3a5b7c9d2e4f6a8b0c1d3e5f7a9b2c4d6e.scope\n\
                 0::/\n",
                Some((UID, Some(CID))),
            ),
            (
                "v1, cgroupfs, containerd, first lines outside kubepods",
                "13:rdma:/\n\
                 12:pids:/kubepods/besteffort/pod8f5d1a52-3f43-4a8e-9f1e-0d3c1b2a4e01/4f2c9e0b7a1d3c5e8f6a2b4d9c0e1f3a5b7c9d2e4f6a8b0c1d3e5f7a9b2c4d6e\n\
                 1:name=systemd:/kubepods/besteffort/pod8f5d1a52-3f43-4a8e-9f1e-0d3c1b2a4e01/4f2c9e0b7a1d3c5e8f6a2b4d9c0e1f3a5b7c9d2e4f6a8b0c1d3e5f7a9b2c4d6e\n",
                Some((UID, Some(CID))),
            ),
            (
                "static pod (UID is a 32-digit hash)",
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f6a1b2c3d4e5f60718293a4b5c6d7e8.slice/cri-containerd-4f2c9e0b7a1d3c5e8f6a2b4d9c0e1f3a5b7c9d2e4f6a8b0c1d3e5f7a9b2c4d6e.scope\n",
                Some(("0f6a1b2c3d4e5f60718293a4b5c6d7e8", Some(CID))),
            ),
            (
                "pod cgroup itself (pause-less process), no container segment",
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8f5d1a52_3f43_4a8e_9f1e_0d3c1b2a4e01.slice\n",
                Some((UID, None)),
            ),
            (
                "host process in a system service",
                "0::/system.slice/nvidia-persistenced.service\n",
                None,
            ),
            (
                "host process in a user session",
                "0::/user.slice/user-1000.slice/session-3.scope\n",
                None,
            ),
            (
                "a path that only looks like a pod outside kubepods",
                "0::/system.slice/pod8f5d1a52-3f43-4a8e-9f1e-0d3c1b2a4e01/x\n",
                None,
            ),
            (
                "the kubepods slice itself",
                "0::/kubepods.slice/kubepods-burstable.slice\n",
                None,
            ),
            ("empty file", "", None),
            ("garbage", "not a cgroup file", None),
        ];
        for (what, text, want) in cases {
            let got = parse_cgroup(text);
            let want = want.map(|(uid, cid)| PodRef {
                pod_uid: uid.to_string(),
                container_id: cid.map(str::to_string),
            });
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn lookup_reads_the_proc_root_and_tolerates_exited_processes() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("4242")).unwrap();
        std::fs::write(
            root.path().join("4242/cgroup"),
            format!("0::/kubepods/burstable/pod{UID}/{CID}\n"),
        )
        .unwrap();
        assert_eq!(
            lookup(root.path(), 4242).map(|p| p.pod_uid),
            Some(UID.to_string())
        );
        assert_eq!(lookup(root.path(), 9999), None);
        // Past the cap nothing is read: a kubepods line after 1 MiB of other lines is not seen.
        std::fs::create_dir_all(root.path().join("4343")).unwrap();
        let mut big = "1:name=x:/elsewhere\n".repeat((1 << 20) / 20);
        big.push_str(&format!("0::/kubepods/burstable/pod{UID}/{CID}\n"));
        std::fs::write(root.path().join("4343/cgroup"), big).unwrap();
        assert_eq!(lookup(root.path(), 4343), None);
    }
}
