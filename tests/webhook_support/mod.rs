//! What the webhook's tests and the `hardening` bench share: the probe's pod with thousands of
//! containers, and a TLS client that trusts one certificate.
#![allow(dead_code)] // each test crate uses a different part

use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

/// The probe's `AdmissionReview`: a pod CREATE with `containers` containers, each a name and an
/// image, opted in by `peakfit.io/vram`.
pub fn big_pod_review(containers: usize) -> Value {
    let containers: Vec<Value> = (0..containers)
        .map(|i| json!({"name": format!("c{i}"), "image": "i"}))
        .collect();
    json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "u", "operation": "CREATE", "namespace": "ml", "name": "big",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "userInfo": {},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "big", "namespace": "ml",
                             "annotations": {"peakfit.io/vram": "10Gi"}},
                "spec": {"containers": containers}},
        }
    })
}

/// A rustls client configuration that trusts only the PEM certificate `cert`.
pub fn client_config_trusting(cert: &Path) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(cert).unwrap())
        .unwrap();
    ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}
