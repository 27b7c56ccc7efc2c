//! The webhook's memory is linear and small in a pod's container count (issue 11): a pod with
//! 5,000 containers (a 164 KB request) took `peakfit webhook` to 132 MiB, then 102 MiB, against
//! the chart's 128 Mi limit, and with `failurePolicy: Fail` an OOM-killed webhook blocks every
//! opted-in pod. The cost was a `serde_json::Value` tree per JSON-patch operation and a second
//! copy of the pod's tree to decode it.
//!
//! This test counts the heap the whole request takes (body read, decode, decision, patch, reply)
//! with a counting allocator, so it measures bytes, not time. It is alone in its binary: the
//! allocator counts every thread.

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

/// Peak heap above what was held before, while the webhook answers `body`; and the reply.
fn peak_while_answering(body: Vec<u8>) -> (usize, Vec<u8>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let app = router(Mutator {
        scheduler_name: "peakfit-scheduler".into(),
        runtime_class_name: Some("nvidia".into()),
        gpu_memory_resource: Some("peakfit.io/gpu-memory-mib".into()),
        require_vram: peakfit::webhook::RequireVram::Off,
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
