//! TLS for the webhook: rustls with the ring provider only (no OpenSSL, no aws-lc), and a
//! certificate that is re-read when its files change, because cert-manager renews it in place
//! and the kubelet updates the mounted Secret without restarting the pod.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::RwLock;
use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, ServerConfig};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading the certificate chain {path}: {source}")]
    Cert {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path} holds no certificate")]
    NoCert { path: PathBuf },
    #[error("reading the private key {path}: {source}")]
    Key {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("the key {key} does not fit the certificate {cert}: {source}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[error("building the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Serves the certificate last read from disk, and re-reads it when a file's mtime changes.
#[derive(Debug)]
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<(Option<SystemTime>, Arc<CertifiedKey>)>,
}

impl ReloadingCert {
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, TlsError> {
        let provider = Arc::new(ring::default_provider());
        let key = read_pair(cert_path, key_path, &provider)?;
        Ok(Self {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            provider,
            current: RwLock::new((stamp(cert_path, key_path), Arc::new(key))),
        })
    }

    /// Re-reads the pair if it changed; a broken new pair keeps the old one serving (and is logged),
    /// since a half-written Secret update must not take the webhook down.
    pub fn refresh(&self) {
        let now = stamp(&self.cert_path, &self.key_path);
        if now == self.current.read().0 {
            return;
        }
        match read_pair(&self.cert_path, &self.key_path, &self.provider) {
            Ok(key) => {
                tracing::info!(cert = %self.cert_path.display(), "serving certificate reloaded");
                *self.current.write() = (now, Arc::new(key));
            }
            Err(e) => tracing::warn!(error = %e, "keeping the previous serving certificate"),
        }
    }

    pub fn server_config(self: &Arc<Self>) -> Result<ServerConfig, TlsError> {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().1.clone())
    }
}

/// The later of the two files' modification times: either file changing triggers a reload.
fn stamp(cert: &Path, key: &Path) -> Option<SystemTime> {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    m(cert).max(m(key))
}

fn read_pair(
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_file_iter(cert_path)
        .and_then(std::iter::Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|source| TlsError::Cert {
            path: cert_path.to_owned(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCert {
            path: cert_path.to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|source| TlsError::Key {
        path: key_path.to_owned(),
        source,
    })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|source| TlsError::Pair {
        cert: cert_path.to_owned(),
        key: key_path.to_owned(),
        source,
    })
}
