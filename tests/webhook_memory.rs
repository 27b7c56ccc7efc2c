//! The webhook's memory is linear and small in a pod's container count (issue 11): a pod with
//! 5,000 containers (a 164 KB request) took `peakfit webhook` to 132 MiB, then 102 MiB, against
//! the chart's 128 Mi limit, and with `failurePolicy: Fail` an OOM-killed webhook blocks every
//! opted-in pod. The cost was a `serde_json::Value` tree per JSON-patch operation and a second
//! copy of the pod's tree to decode it.
//!
//! These tests count the heap the whole request takes (body read, decode, decision, patch, reply)
//! with a counting allocator, so they measure bytes, not time. They are alone in their binary,
//! and take turns (`ONE_AT_A_TIME`): the allocator counts every thread.

mod webhook_support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use http::Request;
use http_body_util::BodyExt as _;
use peakfit::webhook::{Mutator, router};
use tower::ServiceExt as _;

struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = NOW.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Peak heap above what was held before, while the webhook answers `body`; and the reply.
fn peak_while_answering(body: Vec<u8>) -> (usize, Vec<u8>) {
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let app = router(Mutator {
        scheduler_name: "peakfit-scheduler".into(),
        runtime_class_name: Some("nvidia".into()),
        gpu_memory_resource: Some("peakfit.io/gpu-memory-mib".into()),
        require_vram: peakfit::webhook::RequireVram::Off,
        convert_device_plugin_requests: false,
    });
    let request = Request::post("/mutate")
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let base = NOW.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let reply = rt.block_on(async {
        let response = app.oneshot(request).await.unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        response.into_body().collect().await.unwrap().to_bytes()
    });
    let peak = PEAK.load(Ordering::Relaxed) - base;
    (peak, reply.to_vec())
}

#[test]
fn a_pod_with_5000_containers_costs_a_few_kib_of_heap_per_container() {
    const N: usize = 5_000;
    let body = serde_json::to_vec(&webhook_support::big_pod_review(N)).unwrap();
    let request_bytes = body.len();
    let (peak, reply) = peak_while_answering(body);
    // The reply carries a patch for every container (its env), so the work was really done.
    let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    let patch = reply["response"]["patch"].as_str().expect("a patch");
    assert!(patch.len() > N * 100, "a patch of {} bytes", patch.len());
    let per_container = peak / N;
    eprintln!(
        "{N} containers, {request_bytes} B request: peak heap {peak} B ({per_container} B per \
         container, {:.1}x the request)",
        peak as f64 / request_bytes as f64
    );
    // The request itself is ~29 B per container; the pod's tree as decoded, the fields the
    // decision reads, the patch, its base64 and the reply are each linear in it.
    assert!(
        per_container <= 3 * 1024,
        "{per_container} B of heap per container ({peak} B peak for {N} containers)"
    );
}

/// Issue 24: a 4 MiB review peaked at 232 MiB (the pod decoded as a `serde_json::Value` tree)
/// and 16 at once would pass any limit. The probe's shape, scaled to the largest review read: a
/// pod whose spec holds 4 MiB of a field the decision does not read. 16 such reviews at once
/// must stay well under the chart's 128 Mi: the decision reads only its fields, and the
/// in-flight budget (16 MiB by default) lets four be read at a time.
#[test]
fn sixteen_concurrent_4_mib_reviews_stay_far_under_the_chart_limit() {
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut review = webhook_support::big_pod_review(2);
    let filler = ",0".repeat((4 << 20) / 2 - 4096);
    let mut body = serde_json::to_vec(&review).unwrap();
    review["request"]["object"]["spec"]["overhead"] = serde_json::json!({});
    // Spliced in as text: a `Value` of 2 M numbers would itself be ~64 MiB of this test's heap.
    let text = serde_json::to_string(&review).unwrap();
    let text = text.replacen(r#""overhead":{}"#, &format!(r#""x-probe":[0{filler}]"#), 1);
    body.clear();
    body.extend_from_slice(text.as_bytes());
    assert!(
        body.len() > (4 << 20) - 8192 && body.len() <= 4 << 20,
        "{}",
        body.len()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let app = router(Mutator {
        scheduler_name: "peakfit-scheduler".into(),
        runtime_class_name: None,
        gpu_memory_resource: None,
        require_vram: peakfit::webhook::RequireVram::Off,
        convert_device_plugin_requests: false,
    });
    let body = axum::body::Bytes::from(body);
    let base = NOW.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let statuses = rt.block_on(async {
        let calls = (0..16).map(|_| {
            let (app, body) = (app.clone(), body.clone());
            tokio::spawn(async move {
                let request = Request::post("/mutate")
                    .header("content-type", "application/json")
                    .header("content-length", body.len())
                    .body(Body::from(body))
                    .unwrap();
                let response = app.oneshot(request).await.unwrap();
                let status = response.status();
                let reply = response.into_body().collect().await.unwrap().to_bytes();
                (status, reply.len())
            })
        });
        futures::future::join_all(calls).await
    });
    let peak = PEAK.load(Ordering::Relaxed) - base;
    for s in statuses {
        let (status, len) = s.unwrap();
        assert!(status.is_success() && len > 0, "{status}");
    }
    eprintln!(
        "16 concurrent reviews of {} B: peak heap {peak} B",
        body.len()
    );
    // The 16 bodies are shared here (one Bytes), so the peak is what the webhook adds.
    assert!(peak < 48 << 20, "{} MiB of heap at peak", peak >> 20);
}
