//! The chart's own RBAC on a control plane with `AUTHZ=Node,RBAC`: the chart's `ServiceAccounts`,
//! `ClusterRoles`, Roles, bindings and `ValidatingAdmissionPolicies` (`helm template`, applied as they
//! are), each component with a `TokenRequest` token of its service account (the agent's bound to its
//! Node object, so it carries `authentication.kubernetes.io/node-name`). The agent publishes its
//! report and advertises GPU memory, the extender and kube-scheduler place a pod; an agent cannot
//! write another node's report.
//!
//! Needs `../shared/tools/k8s` and the fake NVML library; fails, never skips, without them.

mod e2e_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use e2e_support::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

const NS: &str = "ml";
const AGENT_SA: &str = "peakfit-agent";
const SCHEDULER_SA: &str = "peakfit-scheduler";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_component_works_with_exactly_the_charts_permissions() {
    // SAFETY: set before any thread of this test binary reads the environment.
    unsafe { std::env::set_var("AUTHZ", "Node,RBAC") };
    let c = Cluster::up().await;
    c.namespace(NS).await;
    apply_chart_access(&c);

    // Two nodes whose agents start as admin (the harness); replaced below by agents with their
    // own node-bound tokens.
    c.add_gpu_node("l4-a", vec![Gpu::l4("l4-a", 0)]).await;
    c.add_gpu_node("l4-b", vec![Gpu::l4("l4-b", 0)]).await;
    c.wait_reports().await;
    c.stop_agent("l4-a");
    let reports: Api<peakfit::cluster::NodeGpuReport> = Api::all(c.client.clone());
    reports
        .delete("l4-a", &kube::api::DeleteParams::default())
        .await
        .unwrap();

    let agent_kc = kubeconfig_for(&c, AGENT_SA, Some("l4-a")).await;
    let nvml_config = c.path("l4-a.nvml.yaml");
    let _agent = c.spawn(
        "agent-l4-a-rbac",
        &strings(&[
            "agent",
            "--node-name",
            "l4-a",
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--poll-interval",
            "500ms",
            "--heartbeat",
            "2s",
            "--nvml-lib",
            &fake_nvml_lib().display().to_string(),
            "--proc-root",
            &c.path("proc").display().to_string(),
            "--kubeconfig",
            &agent_kc.display().to_string(),
        ]),
        &[("FAKE_NVML_CONFIG", &nvml_config)],
    );
    // Its report and its Node's GPU memory, written with the chart's permissions only.
    eventually(
        Duration::from_secs(30),
        "the agent's report under its own identity",
        || {
            let reports = reports.clone();
            async move { reports.get("l4-a").await.ok()?.status.map(|_| ()) }
        },
    )
    .await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    eventually(Duration::from_secs(30), "GPU memory on the Node", || {
        let nodes = nodes.clone();
        async move {
            let a = nodes.get("l4-a").await.ok()?.status?.allocatable?;
            a.contains_key("peakfit.io/gpu-memory-mib").then_some(())
        }
    })
    .await;

    // RBAC is on, and grants the agent nothing beyond the chart's ClusterRole.
    let agent_client = client_for(&agent_kc).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::all(agent_client.clone());
    let err = pods
        .list(&kube::api::ListParams::default())
        .await
        .expect_err("the agent may not list pods");
    assert!(err.to_string().contains("cannot list resource"), "{err}");

    // The same token cannot write another node's report, nor touch another Node.
    let theirs: Api<peakfit::cluster::NodeGpuReport> = Api::all(agent_client.clone());
    let forged = json!({"apiVersion": "peakfit.io/v1alpha1", "kind": "NodeGpuReport",
                        "metadata": {"name": "l4-b"}, "spec": {"nodeName": "l4-b"}});
    // The API server loads a new policy within a few seconds of its creation.
    let err = eventually(
        Duration::from_secs(20),
        "an agent's write of another node's report refused",
        || {
            let (theirs, forged) = (theirs.clone(), forged.clone());
            async move {
                theirs
                    .patch(
                        "l4-b",
                        &PatchParams::apply("peakfit-agent").force(),
                        &Patch::Apply(&forged),
                    )
                    .await
                    .err()
            }
        },
    )
    .await;
    assert!(
        err.to_string()
            .contains("may not write nodegpureports l4-b"),
        "{err}"
    );
    let their_node: Api<Node> = Api::all(agent_client);
    let err = their_node
        .patch_status(
            "l4-b",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": {"peakfit.io/gpu-memory-mib": "1"}}})),
        )
        .await
        .expect_err("an agent must not patch another Node");
    assert!(
        err.to_string().contains("Forbidden") || err.to_string().contains("forbidden"),
        "{err}"
    );

    // Extender and kube-scheduler as the chart's scheduler service account.
    let sched_kc = kubeconfig_for(&c, SCHEDULER_SA, None).await;
    let port = free_port();
    let _extender = c.spawn(
        "extender-rbac",
        &strings(&[
            "extender",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--kubeconfig",
            &sched_kc.display().to_string(),
            // A pod that fits nowhere gets a hold after 2 s (below): the extender's one write
            // of a pod, which the chart's RBAC and bind-output policy must allow.
            "--reserve-after",
            "2s",
        ]),
        &[],
    );
    eventually(Duration::from_secs(30), "extender ready", || async {
        (http_get(port, "/readyz").map(|r| r.0) == Some(200)).then_some(())
    })
    .await;
    let mut config = c.scheduler_config(port);
    config["clientConnection"]["kubeconfig"] = sched_kc.display().to_string().into();
    let path = c.path("scheduler-rbac.json");
    std::fs::write(&path, serde_json::to_string(&config).unwrap()).unwrap();
    let out = Command::new(control_plane_script())
        .arg("scheduler")
        .arg(c.dir.path())
        .arg(&path)
        .arg("peakfit-scheduler")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    c.create_pod(NS, "small", &[("peakfit.io/vram", "4Gi")])
        .await;
    let p = c.wait_bound(NS, "small", Duration::from_secs(60)).await;
    let (gpus, reserved, _) = assignment(&p);
    assert_eq!(gpus.len(), 1);
    assert!(reserved >= 4 * GIB);
    c.assert_no_overcommit().await;

    // Bind's output travels with its Binding; anyone else's Binding (here the admin's) that
    // carries it is refused by the chart's policy, and the pod stays unbound.
    let pods = c.pods(NS);
    let unscheduled: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "forged"},
        "spec": {"schedulerName": "nobody",
                 "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6.3"}]},
    }))
    .unwrap();
    pods.create(&kube::api::PostParams::default(), &unscheduled)
        .await
        .unwrap();
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "forged", "annotations": {ASSIGNED_GPUS: gpus[0], RESERVED_BYTES: "1"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node_of(&p)},
    });
    let err = pods
        .create_subresource::<_, kube::core::Status>(
            "binding",
            "forged",
            &kube::api::PostParams::default(),
            &binding,
        )
        .await
        .expect_err("a Binding carrying bind's output from anyone but peakfit's bind");
    assert!(err.to_string().contains("only peakfit's bind"), "{err}");
    assert_eq!(node_of(&pods.get("forged").await.unwrap()), "");

    // A hold is written on the starving pod under the same service account: with `fill` on the
    // other L4, a 20 GiB pod fits on neither GPU; once it has waited 2 s, the next retry (made
    // by a new pod's arrival) writes `peakfit.io/hold` on it.
    c.create_pod(NS, "fill", &[("peakfit.io/vram", "19Gi")])
        .await;
    c.wait_bound(NS, "fill", Duration::from_secs(60)).await;
    c.create_pod(NS, "big", &[("peakfit.io/vram", "20Gi")])
        .await;
    c.wait_event(NS, "big", "FailedScheduling", Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // An arriving pod makes kube-scheduler retry `big`. The hold's write is conditioned on the
    // resourceVersion the filter saw, and the scheduler's own status update after the failed
    // attempt often lands first (409); the extender then reads the pod again and writes on its
    // new version, so this one retry writes the hold.
    c.create_pod(NS, "poke", &[("peakfit.io/vram", "1Gi")])
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut held = false;
    while !held && std::time::Instant::now() < deadline {
        held = c
            .event_messages(NS, "big")
            .await
            .iter()
            .any(|m| m.contains("holding GPU"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(held, "{:?}", c.event_messages(NS, "big").await);
    let (_, metrics) = http_get(port, "/metrics").expect("the extender's metrics");
    println!(
        "e2e rbac: the hold was written after one retry; conflicts retried on the pod's new \
         version: {}",
        metric_value(
            &metrics,
            "peakfit_holds_write_conflicts_total",
            r#"outcome="retried""#
        )
        .abs()
    );
    let big = pods.get("big").await.unwrap();
    assert!(
        big.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(peakfit::cluster::hold::HOLD)),
        "{:?}",
        big.metadata.annotations
    );
    c.assert_no_overcommit().await;
}

/// The chart's `ServiceAccounts`, RBAC and admission policies, applied by kubectl as rendered.
fn apply_chart_access(c: &Cluster) {
    let mut docs: Vec<Value> = Vec::new();
    for file in [
        "templates/agent/serviceaccount.yaml",
        "templates/agent/rbac.yaml",
        "templates/scheduler/serviceaccount.yaml",
        "templates/scheduler/rbac.yaml",
        "templates/admission-policies.yaml",
    ] {
        docs.extend(render_chart(file, &[]));
    }
    let path = c.path("chart-access.json");
    std::fs::write(
        &path,
        serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": docs})).unwrap(),
    )
    .unwrap();
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .args(["apply", "-f"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl apply of the chart's RBAC: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A kubeconfig with a `TokenRequest` token of `peakfit/<sa>`, bound to Node `node` when given.
async fn kubeconfig_for(c: &Cluster, sa: &str, node: Option<&str>) -> PathBuf {
    let mut spec = json!({"expirationSeconds": 3600});
    if let Some(n) = node {
        let nodes: Api<Node> = Api::all(c.client.clone());
        let uid = nodes.get(n).await.unwrap().metadata.uid.unwrap();
        spec["boundObjectRef"] = json!({"kind": "Node", "apiVersion": "v1", "name": n, "uid": uid});
    }
    let body =
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec});
    let req = http::Request::post(format!(
        "/api/v1/namespaces/{RELEASE_NAMESPACE}/serviceaccounts/{sa}/token"
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&body).unwrap())
    .unwrap();
    let answer: Value = c.client.request(req).await.expect("TokenRequest");
    let token = answer["status"]["token"].as_str().unwrap().to_owned();
    let mut kc: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&c.kubeconfig).unwrap()).unwrap();
    kc["users"] = json!([{"name": sa, "user": {"token": token}}]);
    for ctx in kc["contexts"].as_array_mut().unwrap() {
        ctx["context"]["user"] = sa.into();
    }
    let path = c.path(&format!("{sa}-{}.kubeconfig", node.unwrap_or("cluster")));
    std::fs::write(&path, serde_json::to_string(&kc).unwrap()).unwrap();
    path
}

async fn client_for(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(std::string::ToString::to_string).collect()
}
