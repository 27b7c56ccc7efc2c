//! The Helm chart, rendered by the real `helm template` and read back as k8s-openapi types: what
//! each object must hold, the settings the chart passes checked against clap's own definition of
//! the command line, `deploy/peakfit.yaml` and the chart's CRD copy as golden files, the rendered
//! core objects through `kubernetes-validate` and the rendered alert rules through `promtool`, and
//! the webhook serving TLS with the certificate the chart generates.
//!
//! Needs `helm`, `kubernetes-validate` and `promtool` on `PATH` or in `.tools/bin`
//! (`scripts/check-chart --install` puts them there; `scripts/test` runs it); without them these
//! tests fail, naming the command. `PEAKFIT_UPDATE_GOLDEN=1` rewrites the golden files instead of
//! comparing them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::CommandFactory as _;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, ResourceQuota, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

mod tls_support;

/// The oldest Kubernetes the chart supports (k8s-openapi feature `v1_33`).
const KUBE_VERSION: &str = "1.33.0";
const CHART: &str = "charts/peakfit";
const ALL_VALUES: &str = "charts/peakfit/ci/all-features-values.yaml";
const CRD_COPY: &str = "charts/peakfit/files/crd/nodegpureports.peakfit.io.yaml";
const PROFILE_CRD_COPY: &str = "charts/peakfit/files/crd/gpuworkloadprofiles.peakfit.io.yaml";
const DEPLOY: &str = "deploy/peakfit.yaml";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A tool from `PATH` or `.tools/bin`; panics naming the installer when it is in neither.
fn tool(name: &str) -> PathBuf {
    let local = root().join(".tools/bin").join(name);
    if local.is_file() {
        return local;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} not found on PATH or in .tools/bin: run scripts/check-chart --install")
        })
}

/// Runs a tool in the repository root; its stdout, or a panic with its stderr.
fn run(name: &str, args: &[&str]) -> String {
    let out = Command::new(tool(name))
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(
        out.status.success(),
        "{name} {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn template_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "template",
        "peakfit",
        CHART,
        "--namespace",
        "peakfit",
        "--kube-version",
        KUBE_VERSION,
    ];
    args.extend_from_slice(extra);
    args
}

/// `helm template` with these extra arguments, as text.
fn render_text(extra: &[&str]) -> String {
    run("helm", &template_args(extra))
}

/// `helm template` with these extra arguments, one JSON value per object.
fn render(extra: &[&str]) -> Vec<Value> {
    documents(&render_text(extra))
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml)
        .expect("helm renders YAML")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn component(d: &Value) -> Option<&str> {
    d["metadata"]["labels"]["app.kubernetes.io/component"].as_str()
}

/// The one object of `kind` (and component label), as its k8s-openapi type.
fn one<T: DeserializeOwned>(docs: &[Value], kind: &str, comp: Option<&str>) -> T {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && (comp.is_none() || component(d) == comp))
        .collect();
    assert_eq!(found.len(), 1, "one {kind} {comp:?}");
    serde_json::from_value(found[0].clone()).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

fn named<T: DeserializeOwned>(docs: &[Value], kind: &str, suffix: &str) -> T {
    let d = docs
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"].as_str().unwrap().ends_with(suffix))
        .unwrap_or_else(|| panic!("no {kind} named *{suffix}"));
    serde_json::from_value(d.clone()).unwrap()
}

fn pod_spec(template: Option<&k8s_openapi::api::core::v1::PodTemplateSpec>) -> &PodSpec {
    template.and_then(|t| t.spec.as_ref()).expect("a pod spec")
}

fn container<'a>(pod: &'a PodSpec, name: &str) -> &'a Container {
    pod.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// Literal env values of a container (`valueFrom` ones map to `None`).
fn env(c: &Container) -> BTreeMap<String, Option<String>> {
    c.env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect()
}

fn env_value(c: &Container, name: &str) -> String {
    env(c)
        .get(name)
        .cloned()
        .flatten()
        .unwrap_or_else(|| panic!("{}: no literal env {name}", c.name))
}

/// The `KubeSchedulerConfiguration` the chart's `ConfigMap` carries (not a k8s-openapi type).
fn scheduler_config(docs: &[Value]) -> Value {
    let cm: ConfigMap = one(docs, "ConfigMap", Some("scheduler"));
    let text = &cm.data.expect("data")["scheduler-config.yaml"];
    serde_saphyr::from_str(text).unwrap()
}

/// Compares `path` with `want`, or rewrites it under `PEAKFIT_UPDATE_GOLDEN=1`.
fn golden(path: &str, want: &str) {
    let file = root().join(path);
    if std::env::var_os("PEAKFIT_UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        std::fs::write(&file, want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&file).unwrap_or_default();
    if have != want {
        let line = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .map_or(have.lines().count().min(want.lines().count()), |i| i);
        panic!(
            "{path} is out of date (first difference at line {}: have {:?}, want {:?}); \
             rerun with PEAKFIT_UPDATE_GOLDEN=1",
            line + 1,
            have.lines().nth(line),
            want.lines().nth(line)
        );
    }
}

#[test]
fn the_charts_crd_copy_is_what_peakfit_crd_prints() {
    golden(CRD_COPY, &peakfit::cluster::crd_yaml().unwrap());
    golden(
        PROFILE_CRD_COPY,
        &peakfit::cluster::profile_crd_yaml().unwrap(),
    );
}

#[test]
fn deploy_manifest_is_the_chart_rendered_with_default_values() {
    let header = format!(
        "# Generated by `PEAKFIT_UPDATE_GOLDEN=1 cargo nextest run -E 'binary(chart)'` from charts/peakfit with default values\n\
         # (helm template peakfit charts/peakfit --namespace peakfit --kube-version {KUBE_VERSION}). Do not edit.\n\
         # Needs cert-manager (the webhook's certificate); see deploy/README.md.\n\
         ---\n\
         apiVersion: v1\n\
         kind: Namespace\n\
         metadata:\n  name: peakfit\n  labels:\n\
         \x20   # The agent needs hostPID and a hostPath (read-only /proc), which baseline forbids.\n\
         \x20   pod-security.kubernetes.io/enforce: privileged\n"
    );
    golden(DEPLOY, &(header + &render_text(&[])));
}

#[test]
fn helm_lint_strict_passes_with_default_values_and_every_feature() {
    run(
        "helm",
        &["lint", "--strict", CHART, "--kube-version", KUBE_VERSION],
    );
    run(
        "helm",
        &[
            "lint",
            "--strict",
            CHART,
            "--kube-version",
            KUBE_VERSION,
            "-f",
            ALL_VALUES,
        ],
    );
}

#[test]
fn bad_values_are_refused_at_render() {
    for bad in [
        &["--set", "agent.port=not-a-port"][..],
        &["--set", "webhook.requireVram=sometimes"],
        &["--set", "agent.podResources.gpuResources={nvidia.com/*gpu}"],
        &["--set", "agent.podResources.hostPath=relative/path"],
        &[
            "--set",
            "alerts.enabled=true",
            "--set",
            "alerts.rules.NoSuchAlert.for=1m",
        ],
    ] {
        let out = Command::new(tool("helm"))
            .args(template_args(bad))
            .current_dir(root())
            .output()
            .unwrap();
        assert!(!out.status.success(), "helm accepted {bad:?}");
    }
}

/// Leaves of values.yaml, dotted; maps the chart passes through whole count as one value.
fn leaves(v: &Value, prefix: &str, out: &mut Vec<String>) {
    const OPAQUE: [&str; 6] = [
        "affinity",
        "scheduler.profile",
        "securityContext",
        "resources",
        "updateStrategy",
        "objectSelector",
    ];
    let Value::Object(map) = v else { return };
    for (k, v) in map {
        let path = format!("{prefix}{k}");
        match v {
            Value::Object(m) if !m.is_empty() && !OPAQUE.iter().any(|o| path.ends_with(o)) => {
                leaves(v, &format!("{path}."), out);
            }
            _ => out.push(path),
        }
    }
}

#[test]
fn the_chart_readme_documents_every_value_and_every_alert() {
    let read = |p: &str| std::fs::read_to_string(root().join(CHART).join(p)).unwrap();
    let readme = read("README.md");
    let mut values = Vec::new();
    leaves(
        &serde_saphyr::from_str(&read("values.yaml")).unwrap(),
        "",
        &mut values,
    );
    let alerts: Value = serde_saphyr::from_str(&read("files/alerts.yaml")).unwrap();
    let alerts: Vec<&str> = alerts["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert!(values.len() > 20 && !alerts.is_empty());
    let missing: Vec<String> = values
        .iter()
        .filter(|v| !readme.contains(&format!("| `{v}` |")))
        .cloned()
        .chain(
            alerts
                .iter()
                .filter(|a| !readme.contains(&format!("| `{a}`")))
                .map(std::string::ToString::to_string),
        )
        .collect();
    assert!(
        missing.is_empty(),
        "{CHART}/README.md lacks a table row for: {missing:?}"
    );
}

#[test]
fn the_default_render_holds_what_each_object_needs() {
    let docs = render(&[]);

    let ds: DaemonSet = one(&docs, "DaemonSet", Some("agent"));
    let pod = pod_spec(ds.spec.as_ref().map(|s| &s.template));
    let agent = &pod.containers[0];
    assert_eq!(pod.host_pid, Some(true), "agent has hostPID");
    assert_eq!(pod.runtime_class_name.as_deref(), Some("nvidia"));
    assert!(
        pod.tolerations
            .iter()
            .flatten()
            .any(|t| t.key.as_deref() == Some("nvidia.com/gpu")),
        "agent tolerates the GPU taint"
    );
    assert!(
        pod.affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .is_some(),
        "agent only on GPU nodes"
    );
    let sc = agent.security_context.as_ref().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_ne!(sc.privileged, Some(true));
    assert_eq!(
        sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_owned()])
    );
    let args = agent.args.as_deref().unwrap();
    assert_eq!(&args[..3], ["agent", "--proc-root", "/host/proc"]);
    let mount = agent
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/host/proc")
        .expect("/host/proc mounted");
    let vol = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap();
    assert_eq!(mount.read_only, Some(true));
    assert_eq!(vol.host_path.as_ref().unwrap().path, "/proc");
    assert_eq!(env_value(agent, "NVIDIA_VISIBLE_DEVICES"), "all");
    assert_eq!(env_value(agent, "NVIDIA_DRIVER_CAPABILITIES"), "utility");
    // The /metrics listener's limits, as the extender's (issue 11).
    assert_eq!(env_value(agent, "PEAKFIT_IDLE_TIMEOUT"), "60s");
    assert_eq!(env_value(agent, "PEAKFIT_SHUTDOWN_TIMEOUT"), "10s");
    assert_eq!(env_value(agent, "PEAKFIT_MAX_CONNECTIONS"), "64");
    let res = agent.resources.as_ref().unwrap();
    assert!(
        res.limits.is_some() && res.requests.is_some(),
        "agent requests and limits"
    );

    let deploy: Deployment = one(&docs, "Deployment", Some("scheduler"));
    let spod = pod_spec(deploy.spec.as_ref().map(|s| &s.template));
    assert_eq!(
        container(spod, "kube-scheduler").image.as_deref(),
        Some("registry.k8s.io/kube-scheduler:v1.33.0"),
        "scheduler tag from --kube-version"
    );
    let config = scheduler_config(&docs);
    let ext = &config["extenders"][0];
    assert_eq!(config["profiles"][0]["schedulerName"], "peakfit-scheduler");
    assert_eq!(ext["urlPrefix"], "http://127.0.0.1:8888");
    assert_eq!(
        env_value(container(spod, "extender"), "PEAKFIT_LISTEN"),
        "127.0.0.1:8888",
        "the extender listens where kube-scheduler calls it"
    );
    let le = &config["leaderElection"];
    assert_eq!(le["leaderElect"], true);
    assert_eq!(le["resourceName"], "peakfit-scheduler");
    assert_eq!(le["resourceNamespace"], "peakfit");
    let lease: Role = named(&docs, "Role", "-lease");
    assert!(
        lease.rules.iter().flatten().any(|r| {
            r.resource_names
                .iter()
                .flatten()
                .any(|n| n == "peakfit-scheduler")
                && r.verbs.iter().any(|v| v == "update")
        }),
        "Lease RBAC"
    );
    let bound: BTreeSet<String> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding")
        .map(|d| {
            serde_json::from_value::<ClusterRoleBinding>(d.clone())
                .unwrap()
                .role_ref
                .name
        })
        .collect();
    assert!(
        bound.contains("system:kube-scheduler") && bound.contains("system:volume-scheduler"),
        "scheduler bound to the built-in roles: {bound:?}"
    );
    let role: ClusterRole = named(&docs, "ClusterRole", "-extender");
    let mut verbs: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for rule in role.rules.iter().flatten() {
        for g in rule.api_groups.iter().flatten() {
            for r in rule.resources.iter().flatten() {
                verbs
                    .entry((g.clone(), r.clone()))
                    .or_default()
                    .extend(rule.verbs.iter().cloned());
            }
        }
    }
    let of = |g: &str, r: &str| {
        verbs
            .get(&(g.into(), r.into()))
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        of("", "pods/binding"),
        BTreeSet::from(["create".to_owned()])
    );
    // Bind's annotations travel with the Binding; the one write of a pod is a starving pod's
    // hold (`peakfit.io/hold`), so with holds off the extender cannot write pods at all.
    let read = ["get".to_owned(), "list".to_owned(), "watch".to_owned()];
    let mut read_and_hold = BTreeSet::from(read.clone());
    read_and_hold.insert("patch".to_owned());
    assert_eq!(of("", "pods"), read_and_hold);
    let no_holds: ClusterRole = named(
        &render(&["--set", "extender.holds.after=off"]),
        "ClusterRole",
        "-extender",
    );
    let pod_verbs: BTreeSet<String> = no_holds
        .rules
        .iter()
        .flatten()
        .filter(|r| r.resources.iter().flatten().any(|x| x == "pods"))
        .flat_map(|r| r.verbs.iter().cloned())
        .collect();
    assert_eq!(pod_verbs, BTreeSet::from(read));
    // Self-preemption: evictions (never plain deletes), the nomination, the victims' events.
    assert_eq!(
        of("", "pods/eviction"),
        BTreeSet::from(["create".to_owned()])
    );
    assert_eq!(of("", "pods/status"), BTreeSet::from(["patch".to_owned()]));
    assert!(!of("", "pods").contains("delete"));
    assert!(of("", "events").contains("create"));
    assert!(of("peakfit.io", "nodegpureports").contains("watch"));
    // Model-config ConfigMaps: listed and watched by label, never read one by one or written.
    assert_eq!(
        of("", "configmaps"),
        BTreeSet::from(["list".to_owned(), "watch".to_owned()])
    );
    assert!(
        !verbs.values().any(|v| v.contains("*")),
        "no wildcard verbs"
    );
    let hook: MutatingWebhookConfiguration = one(&docs, "MutatingWebhookConfiguration", None);
    let hooks = hook.webhooks.unwrap();
    assert!(
        hooks
            .iter()
            .all(|w| w.failure_policy.as_deref() == Some("Fail"))
    );
    assert!(
        hooks
            .iter()
            .all(|w| w.namespace_selector.is_some() && w.object_selector.is_some()),
        "webhooks scoped by namespace and object selectors"
    );
    let kinds: BTreeSet<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    for k in [
        "PodDisruptionBudget",
        "NetworkPolicy",
        "Service",
        "CustomResourceDefinition",
    ] {
        assert!(kinds.contains(k), "no {k}");
    }
    let quota: ResourceQuota = one(&docs, "ResourceQuota", None);
    let expr = &quota
        .spec
        .unwrap()
        .scope_selector
        .unwrap()
        .match_expressions
        .unwrap()[0];
    assert_eq!(expr.scope_name, "PriorityClass");
    let admitted = expr.values.clone().unwrap_or_default();
    for class in [&pod.priority_class_name, &spod.priority_class_name] {
        let class = class.as_ref().expect("a priority class");
        assert!(
            admitted.contains(class),
            "the ResourceQuota admits {class} (GKE)"
        );
    }
    let dash = docs
        .iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .map(|d| serde_json::from_value::<ConfigMap>(d.clone()).unwrap())
        .find(|c| {
            c.data
                .as_ref()
                .is_some_and(|d| d.contains_key("peakfit.json"))
        })
        .expect("the dashboard ConfigMap");
    assert_eq!(
        dash.metadata.labels.as_ref().unwrap()["grafana_dashboard"],
        "1",
        "dashboard sidecar label"
    );
    serde_json::from_str::<Value>(&dash.data.unwrap()["peakfit.json"]).expect("dashboard JSON");
}

#[test]
fn values_move_what_they_name() {
    let docs = render(&[
        "--kube-version",
        "1.35.2-eks-1a2b3c",
        "--set",
        "webhook.failurePolicy=Ignore",
        "--set",
        "extender.port=9999",
        "--set",
        "webhook.requireVram=fair",
    ]);
    let hook_deploy: Deployment = one(&docs, "Deployment", Some("webhook"));
    let hpod = pod_spec(hook_deploy.spec.as_ref().map(|s| &s.template));
    assert_eq!(
        env_value(container(hpod, "webhook"), "PEAKFIT_REQUIRE_VRAM"),
        "fair"
    );
    let deploy: Deployment = one(&docs, "Deployment", Some("scheduler"));
    let spod = pod_spec(deploy.spec.as_ref().map(|s| &s.template));
    let image = container(spod, "kube-scheduler").image.clone().unwrap();
    assert!(
        image.ends_with(":v1.35.2"),
        "vendor suffix dropped: {image}"
    );
    assert_eq!(
        scheduler_config(&docs)["extenders"][0]["urlPrefix"],
        "http://127.0.0.1:9999"
    );
    assert_eq!(
        env_value(container(spod, "extender"), "PEAKFIT_LISTEN"),
        "127.0.0.1:9999",
        "extender.port moves both ends"
    );
    let hook: MutatingWebhookConfiguration = one(&docs, "MutatingWebhookConfiguration", None);
    assert!(
        hook.webhooks
            .unwrap()
            .iter()
            .all(|w| w.failure_policy.as_deref() == Some("Ignore"))
    );

    let docs = render(&[
        "--set",
        "scheduler.image.tag=v1.34.1",
        "--set",
        "agent.enabled=false",
        "--set",
        "webhook.enabled=false",
    ]);
    let deploy: Deployment = one(&docs, "Deployment", Some("scheduler"));
    let spod = pod_spec(deploy.spec.as_ref().map(|s| &s.template));
    assert!(
        spod.containers[0]
            .image
            .as_deref()
            .unwrap()
            .ends_with(":v1.34.1")
    );
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "DaemonSet" || d["kind"] == "MutatingWebhookConfiguration"),
        "components can be turned off"
    );
}

/// Issue 23: the agent reads the kubelet's `PodResources` socket through a read-only hostPath
/// mount, as root without capabilities (the socket is root's, mode 0755); turned off, neither the
/// mount nor the socket is there.
#[test]
fn the_agent_mounts_the_kubelets_pod_resources_socket_read_only() {
    let docs = render(&[]);
    let ds: DaemonSet = one(&docs, "DaemonSet", Some("agent"));
    let pod = pod_spec(ds.spec.as_ref().map(|s| &s.template));
    let agent = container(pod, "agent");
    assert_eq!(
        env_value(agent, "PEAKFIT_POD_RESOURCES_SOCKET"),
        "/var/lib/kubelet/pod-resources/kubelet.sock"
    );
    assert_eq!(
        env_value(agent, "PEAKFIT_GPU_RESOURCES"),
        "nvidia.com/gpu,nvidia.com/mig-*"
    );
    assert_eq!(
        env_value(agent, "PEAKFIT_GPU_DRA_DRIVERS"),
        "gpu.nvidia.com"
    );
    assert_eq!(env_value(agent, "PEAKFIT_POD_RESOURCES_TIMEOUT"), "1s");
    let mount = agent
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "pod-resources")
        .expect("the pod-resources mount");
    assert_eq!(mount.mount_path, "/var/lib/kubelet/pod-resources");
    assert_eq!(mount.read_only, Some(true));
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "pod-resources")
        .and_then(|v| v.host_path.clone())
        .expect("the pod-resources hostPath");
    assert_eq!(volume.path, "/var/lib/kubelet/pod-resources");
    let sc = agent.security_context.clone().unwrap();
    assert_eq!(sc.run_as_user, Some(0));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        sc.capabilities.and_then(|c| c.drop),
        Some(vec!["ALL".to_string()])
    );

    let docs = render(&[
        "--set",
        "agent.podResources.enabled=false",
        "--set",
        "agent.podResources.hostPath=/srv/kubelet/pod-resources",
    ]);
    let ds: DaemonSet = one(&docs, "DaemonSet", Some("agent"));
    let pod = pod_spec(ds.spec.as_ref().map(|s| &s.template));
    let agent = container(pod, "agent");
    assert_eq!(env_value(agent, "PEAKFIT_POD_RESOURCES_SOCKET"), "");
    assert!(
        !agent
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "pod-resources")
    );
    assert!(
        !pod.volumes
            .iter()
            .flatten()
            .any(|v| v.name == "pod-resources")
    );

    let docs = render(&[
        "--set",
        "agent.podResources.hostPath=/srv/kubelet/pod-resources/",
    ]);
    let ds: DaemonSet = one(&docs, "DaemonSet", Some("agent"));
    let pod = pod_spec(ds.spec.as_ref().map(|s| &s.template));
    assert_eq!(
        env_value(container(pod, "agent"), "PEAKFIT_POD_RESOURCES_SOCKET"),
        "/srv/kubelet/pod-resources/kubelet.sock"
    );
}

/// Every flag and `PEAKFIT_*` variable the chart gives a peakfit container, under every values
/// file, is one that command's clap definition has (globals included).
#[test]
fn every_flag_and_variable_the_chart_passes_is_one_peakfit_reads() {
    let mut cli = peakfit::cli::Cli::command();
    cli.build();
    let mut checked = 0;
    let mut unknown = BTreeSet::new();
    for extra in [
        &[][..],
        &["-f", ALL_VALUES],
        &["--set", "extender.port=9999"],
    ] {
        for d in render(extra) {
            if d["kind"] != "Deployment" && d["kind"] != "DaemonSet" {
                continue;
            }
            let pod: PodSpec =
                serde_json::from_value(d["spec"]["template"]["spec"].clone()).unwrap();
            for c in &pod.containers {
                let args = c.args.clone().unwrap_or_default();
                let Some(sub) = args.first().and_then(|a| cli.find_subcommand(a)) else {
                    continue;
                };
                let longs: BTreeSet<String> = sub
                    .get_arguments()
                    .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
                    .collect();
                let envs: BTreeSet<String> = sub
                    .get_arguments()
                    .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
                    .collect();
                for a in args.iter().skip(1).filter(|a| a.starts_with("--")) {
                    checked += 1;
                    let flag = a.split('=').next().unwrap();
                    if !longs.contains(flag) {
                        unknown.insert(format!("{}: flag {flag}", c.name));
                    }
                }
                for e in c.env.iter().flatten() {
                    if e.name.starts_with("PEAKFIT_") {
                        checked += 1;
                        if !envs.contains(&e.name) {
                            unknown.insert(format!("{}: env {}", c.name, e.name));
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 10, "only {checked} settings seen");
    assert!(
        unknown.is_empty(),
        "the chart gives peakfit settings it does not read: {unknown:?}"
    );
}

/// `--filter-keep-best` has one default, `DEFAULT_FILTER_KEEP_BEST`: clap's and the chart's
/// `extender.filterKeepBest` are both it, so changing the number in one place and not the
/// other fails here.
#[test]
fn the_chart_and_the_binary_keep_the_same_best_nodes_by_default() {
    use peakfit::extender::DEFAULT_FILTER_KEEP_BEST;
    let mut cli = peakfit::cli::Cli::command();
    cli.build();
    let arg = cli
        .find_subcommand("extender")
        .expect("an extender subcommand")
        .get_arguments()
        .find(|a| a.get_long() == Some("filter-keep-best"))
        .expect("--filter-keep-best");
    assert_eq!(
        arg.get_default_values(),
        [DEFAULT_FILTER_KEEP_BEST.to_string()]
    );
    let deploy: Deployment = one(&render(&[]), "Deployment", Some("scheduler"));
    let spod = pod_spec(deploy.spec.as_ref().map(|s| &s.template));
    assert_eq!(
        env_value(container(spod, "extender"), "PEAKFIT_FILTER_KEEP_BEST"),
        DEFAULT_FILTER_KEEP_BEST.to_string(),
        "charts/peakfit/values.yaml extender.filterKeepBest"
    );
}

#[test]
fn the_scheduler_config_snippet_has_what_the_chart_configures() {
    let chart = scheduler_config(&render(&[]))["extenders"][0].clone();
    let snippet: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(root().join("deploy/scheduler-config-snippet.yaml")).unwrap(),
    )
    .unwrap();
    let snippet = &snippet["extenders"][0];
    for key in [
        "filterVerb",
        "prioritizeVerb",
        "preemptVerb",
        "bindVerb",
        "nodeCacheCapable",
        "urlPrefix",
        "weight",
        "httpTimeout",
        "ignorable",
    ] {
        assert_eq!(
            snippet[key], chart[key],
            "scheduler-config-snippet.yaml: {key}"
        );
    }
    assert_eq!(chart["nodeCacheCapable"], true);
    for verb in ["filterVerb", "prioritizeVerb", "preemptVerb", "bindVerb"] {
        assert!(
            chart[verb].as_str().is_some_and(|v| !v.is_empty()),
            "{verb}"
        );
    }
}

/// The simulator models kube-scheduler as the chart deploys it (`sim::via_extender`): the
/// extender's weight and the score plugins the peakfit profile turns off. The snippet for
/// operators with their own scheduler turns off the same ones.
#[test]
fn the_simulator_models_the_profile_the_chart_renders() {
    use peakfit::sim::via_extender::{DISABLED_SCORE_PLUGINS, EXTENDER_WEIGHT};
    let disabled = |profile: &Value| -> Vec<String> {
        profile["plugins"]["score"]["disabled"]
            .as_array()
            .expect("plugins.score.disabled")
            .iter()
            .map(|p| p["name"].as_str().expect("a plugin name").to_owned())
            .collect()
    };
    let config = scheduler_config(&render(&[]));
    let profile = &config["profiles"][0];
    assert_eq!(disabled(profile), DISABLED_SCORE_PLUGINS);
    assert!(
        profile["plugins"]["score"]["enabled"].is_null(),
        "the sim models no extra score plugin"
    );
    assert_eq!(config["extenders"][0]["weight"], EXTENDER_WEIGHT);
    // A value set beside the default keeps it (Helm merges maps).
    let config = scheduler_config(&render(&[
        "--set",
        "scheduler.profile.percentageOfNodesToScore=100",
    ]));
    assert_eq!(disabled(&config["profiles"][0]), DISABLED_SCORE_PLUGINS);
    let snippet: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(root().join("deploy/scheduler-config-snippet.yaml")).unwrap(),
    )
    .unwrap();
    let peakfit = snippet["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["schedulerName"] == "peakfit-scheduler")
        .expect("the snippet's peakfit profile");
    assert_eq!(disabled(peakfit), DISABLED_SCORE_PLUGINS);
}

/// The fields of the non-core kinds the chart renders; anything else in them is a mistake the
/// operator's CRDs would refuse.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ServiceMonitorSpec {
    #[allow(dead_code)]
    selector: Value,
    #[serde(default)]
    #[allow(dead_code)]
    namespace_selector: Option<Value>,
    endpoints: Vec<ServiceMonitorEndpoint>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
struct ServiceMonitorEndpoint {
    port: String,
    path: Option<String>,
    interval: Option<String>,
    scrape_timeout: Option<String>,
    honor_labels: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
struct CertificateSpec {
    secret_name: String,
    common_name: Option<String>,
    dns_names: Vec<String>,
    duration: Option<String>,
    renew_before: Option<String>,
    usages: Option<Vec<String>>,
    private_key: Option<Value>,
    issuer_ref: IssuerRef,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct IssuerRef {
    name: String,
    kind: Option<String>,
    group: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
struct IssuerSpec {
    self_signed: Option<Value>,
    ca: Option<Value>,
}

const CORE_GROUPS: [&str; 7] = [
    "v1",
    "apps/v1",
    "policy/v1",
    "networking.k8s.io/v1",
    "rbac.authorization.k8s.io/v1",
    "apiextensions.k8s.io/v1",
    "admissionregistration.k8s.io/v1",
];

/// The core kinds go through `kubernetes-validate --strict`; `PrometheusRules` through
/// `promtool check rules`; `ServiceMonitors` and cert-manager objects are read into the fields the
/// chart uses; any other kind fails.
#[test]
fn rendered_objects_validate_against_kubernetes_and_their_operators() {
    let dir = tempfile::tempdir().unwrap();
    for (name, extra) in [("default", &[][..]), ("all", &["-f", ALL_VALUES])] {
        let mut core = Vec::new();
        let mut rules = 0;
        for d in render(extra) {
            let api = d["apiVersion"].as_str().unwrap_or_default().to_owned();
            let kind = d["kind"].as_str().unwrap_or_default().to_owned();
            let what = format!("{name}: {kind}/{}", d["metadata"]["name"]);
            let spec = d["spec"].clone();
            match (api.as_str(), kind.as_str()) {
                (g, _) if CORE_GROUPS.contains(&g) => core.push(d),
                ("monitoring.coreos.com/v1", "ServiceMonitor") => {
                    let s: ServiceMonitorSpec =
                        serde_json::from_value(spec).unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert!(!s.endpoints.is_empty(), "{what}: no endpoints");
                }
                ("monitoring.coreos.com/v1", "PrometheusRule") => {
                    let path = dir.path().join(format!("{name}-rules-{rules}.yaml"));
                    std::fs::write(&path, serde_saphyr::to_string(&spec).unwrap()).unwrap();
                    run("promtool", &["check", "rules", path.to_str().unwrap()]);
                    rules += 1;
                }
                ("cert-manager.io/v1", "Certificate") => {
                    let s: CertificateSpec =
                        serde_json::from_value(spec).unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert!(!s.dns_names.is_empty(), "{what}: no dnsNames");
                }
                ("cert-manager.io/v1", "Issuer") => {
                    let s: IssuerSpec =
                        serde_json::from_value(spec).unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert!(
                        s.self_signed.is_some() != s.ca.is_some(),
                        "{what}: one of selfSigned, ca"
                    );
                }
                _ => panic!("{what}: kind {api} {kind} is neither core nor known to this test"),
            }
        }
        if name == "all" {
            assert!(
                rules > 0,
                "no PrometheusRule rendered with every feature on"
            );
        }
        let path = dir.path().join(format!("{name}-core.yaml"));
        let text: Vec<String> = core
            .iter()
            .map(|d| serde_saphyr::to_string(d).unwrap())
            .collect();
        std::fs::write(&path, text.join("---\n")).unwrap();
        run(
            "kubernetes-validate",
            &[
                "--strict",
                "--quiet",
                "-k",
                KUBE_VERSION,
                path.to_str().unwrap(),
            ],
        );
    }
}

/// With every feature on the chart generates the webhook's certificate: the Secret's pair loads in
/// the webhook, and a client trusting only the `MutatingWebhookConfiguration`'s caBundle reaches it
/// under the Service's DNS name and gets an example pod patched.
#[tokio::test]
async fn the_webhook_serves_tls_with_the_certificate_the_chart_generates() {
    use base64::Engine as _;

    let docs = render(&["-f", ALL_VALUES]);
    let secret: Secret = docs
        .iter()
        .filter(|d| d["kind"] == "Secret" && d["type"] == "kubernetes.io/tls")
        .map(|d| serde_json::from_value(d.clone()).unwrap())
        .next()
        .expect("a generated TLS Secret");
    let data = secret.data.unwrap();
    let hook: MutatingWebhookConfiguration = one(&docs, "MutatingWebhookConfiguration", None);
    let hooks = hook.webhooks.unwrap();
    for w in &hooks {
        assert_eq!(
            w.client_config.ca_bundle.as_ref(),
            Some(&data["ca.crt"]),
            "caBundle is the Secret's ca.crt"
        );
    }
    let svc = hooks[0].client_config.service.clone().unwrap();
    let server_name = format!("{}.{}.svc", svc.name, svc.namespace);
    let dir = tempfile::tempdir().unwrap();
    for key in ["ca.crt", "tls.crt", "tls.key"] {
        std::fs::write(dir.path().join(key), &data[key].0).unwrap();
    }
    let webhook =
        tls_support::Webhook::start(&dir.path().join("tls.crt"), &dir.path().join("tls.key")).await;
    let mut tls = tls_support::connect(webhook.addr, &dir.path().join("ca.crt"), &server_name)
        .await
        .unwrap_or_else(|e| panic!("TLS as {server_name}: {e}"));

    let pod: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(root().join("deploy/examples/explicit-vram.yaml")).unwrap(),
    )
    .unwrap();
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "chart-test", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"]["namespace"], "operation": "CREATE",
            "userInfo": {"username": "chart-test"}, "object": pod}});
    let body = serde_json::to_vec(&review).unwrap();
    let mut request = format!(
        "POST /mutate HTTP/1.1\r\nhost: {server_name}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    let reply = tls_support::exchange(&mut tls, &request).await.unwrap();
    webhook.stop().await;

    let body = reply.split_once("\r\n\r\n").expect("an HTTP reply").1;
    // Chunked or not, the JSON object is the body's outermost braces.
    let json = &body[body.find('{').unwrap()..=body.rfind('}').unwrap()];
    let reply: Value = serde_json::from_str(json).unwrap();
    let response = &reply["response"];
    assert_eq!(response["uid"], "chart-test");
    assert_eq!(response["allowed"], true);
    let patch: Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(response["patch"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let paths: Vec<&str> = patch
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|op| op["path"].as_str())
        .collect();
    assert!(
        paths.contains(&"/spec/schedulerName") && paths.contains(&"/spec/containers/0/env"),
        "{paths:?}"
    );
}

/// `extender.modelConfigWatch: false` turns the extender's ConfigMap watch off and drops its
/// access to ConfigMaps; the default keeps both.
#[test]
fn the_model_config_watch_can_be_turned_off_with_its_rbac() {
    for (set, watched) in [
        (None, true),
        (Some("extender.modelConfigWatch=false"), false),
    ] {
        let args: Vec<&str> = set.map(|s| vec!["--set", s]).unwrap_or_default();
        let docs = render(&args);
        let deploy: Deployment = one(&docs, "Deployment", Some("scheduler"));
        let spod = pod_spec(deploy.spec.as_ref().map(|s| &s.template));
        assert_eq!(
            env_value(container(spod, "extender"), "PEAKFIT_MODEL_CONFIG_WATCH"),
            watched.to_string()
        );
        let role: ClusterRole = named(&docs, "ClusterRole", "-extender");
        let configmaps = role
            .rules
            .iter()
            .flatten()
            .any(|r| r.resources.iter().flatten().any(|x| x == "configmaps"));
        assert_eq!(configmaps, watched, "{set:?}");
    }
}

/// The extender gets the agent's DRA drivers (so both agree on which are GPUs) and lists and
/// watches `ResourceSlices`, never more; `extender.resourceSliceWatch: false`, an empty driver
/// list (written `none`, which both read as no driver) or `agent.podResources.enabled: false`
/// (no report says `PodResources` is down, so no slice could refuse a node) drops the watch and
/// its access.
#[test]
fn the_resource_slice_watch_follows_the_dra_drivers_with_its_rbac() {
    for (set, drivers, watch_env, watched) in [
        (vec![], "gpu.nvidia.com", "true", true),
        (
            vec!["--set", "extender.resourceSliceWatch=false"],
            "gpu.nvidia.com",
            "false",
            false,
        ),
        (
            vec!["--set-json", "agent.podResources.draDrivers=[]"],
            "none",
            "true",
            false,
        ),
        (
            vec!["--set", "agent.podResources.enabled=false"],
            "gpu.nvidia.com",
            "false",
            false,
        ),
    ] {
        let docs = render(&set);
        let deploy: Deployment = one(&docs, "Deployment", Some("scheduler"));
        let extender = container(
            pod_spec(deploy.spec.as_ref().map(|s| &s.template)),
            "extender",
        );
        assert_eq!(
            env_value(extender, "PEAKFIT_GPU_DRA_DRIVERS"),
            drivers,
            "{set:?}"
        );
        // An agent that does not read `PodResources` is not told the drivers.
        if !set.contains(&"agent.podResources.enabled=false") {
            let ds: DaemonSet = one(&docs, "DaemonSet", Some("agent"));
            let agent = container(pod_spec(ds.spec.as_ref().map(|s| &s.template)), "agent");
            assert_eq!(
                env_value(agent, "PEAKFIT_GPU_DRA_DRIVERS"),
                drivers,
                "{set:?}"
            );
        }
        assert_eq!(
            env_value(extender, "PEAKFIT_RESOURCE_SLICE_WATCH"),
            watch_env,
            "{set:?}"
        );
        let role: ClusterRole = named(&docs, "ClusterRole", "-extender");
        let verbs: Vec<Vec<String>> = role
            .rules
            .iter()
            .flatten()
            .filter(|r| r.resources.iter().flatten().any(|x| x == "resourceslices"))
            .map(|r| {
                assert_eq!(r.api_groups, Some(vec!["resource.k8s.io".to_owned()]));
                r.verbs.clone()
            })
            .collect();
        let want: Vec<Vec<String>> = if watched {
            vec![vec!["list".into(), "watch".into()]]
        } else {
            vec![]
        };
        assert_eq!(verbs, want, "{set:?}");
    }
}
