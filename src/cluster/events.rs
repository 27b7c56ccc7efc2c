//! Events on pods, as kube-scheduler writes its own: a `core/v1` Event naming the pod, best
//! effort (an Event that cannot be written is logged at debug and dropped; it never fails what
//! it describes).

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ObjectMeta, PostParams};

/// The pod an event is about.
pub struct PodRef<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: Option<&'a str>,
}

/// A `Normal` event `reason` on `pod` saying `message` (cut to the usual bound), from
/// `component`.
pub async fn record(
    client: &kube::Client,
    pod: &PodRef<'_>,
    reason: &str,
    message: &str,
    component: &str,
) {
    let events: Api<Event> = Api::namespaced(client.clone(), pod.namespace);
    let event = pod_event(
        pod,
        reason,
        "Normal",
        &crate::clip::clip(message),
        component,
    );
    if let Err(e) = events.create(&PostParams::default(), &event).await {
        tracing::debug!(error = %e, reason, "could not record the event");
    }
}

/// A core/v1 Event of `type_` (`Normal`, `Warning`) about `pod`, named `<pod>.<random>` by the
/// API server, as kube-scheduler writes them. `message` goes in as given: callers cut it to
/// their bound. The held-GPU conflicts give it a name of their own to write it once.
pub fn pod_event(
    pod: &PodRef<'_>,
    reason: &str,
    type_: &str,
    message: &str,
    component: &str,
) -> Event {
    let now = Time(jiff::Timestamp::now());
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", pod.name)),
            namespace: Some(pod.namespace.to_owned()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name.to_owned()),
            namespace: Some(pod.namespace.to_owned()),
            uid: pod.uid.map(str::to_owned),
            ..Default::default()
        },
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        type_: Some(type_.to_owned()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        source: Some(EventSource {
            component: Some(component.to_owned()),
            ..Default::default()
        }),
        ..Default::default()
    }
}
