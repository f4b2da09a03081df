//! The serving certificate, read from files and read again when they
//! change: cert-manager and Secret volumes replace the files in place (a
//! Secret volume swaps a symlink), and the next TLS handshake must use the
//! new pair without a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::lock;
use multicluster_runtime::Error;

/// What identifies a file's contents without reading them: a replaced
/// file (or a swapped symlink) has another inode or modification time.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    let metadata = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&metadata);
    #[cfg(not(unix))]
    let inode = 0;
    Some(Stamp {
        modified: metadata.modified().ok(),
        len: metadata.len(),
        inode,
    })
}

/// A certificate chain and key in PEM files, looked at again at each
/// handshake (two `stat`s) and read again when either changed. A pair that
/// does not load (half written, a key that does not match) leaves the
/// previous one in use, with a warning naming the files.
pub(crate) struct CertificateFiles {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: Mutex<Loaded>,
}

struct Loaded {
    stamps: (Option<Stamp>, Option<Stamp>),
    key: Arc<CertifiedKey>,
}

impl std::fmt::Debug for CertificateFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateFiles")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl CertificateFiles {
    /// Reads the pair; an error names the file that could not be used.
    pub(crate) fn load(
        cert: PathBuf,
        key: PathBuf,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, Error> {
        let stamps = (stamp(&cert), stamp(&key));
        let certified = read_pair(&cert, &key, &provider)?;
        Ok(Self {
            cert,
            key,
            provider,
            current: Mutex::new(Loaded {
                stamps,
                key: Arc::new(certified),
            }),
        })
    }

    /// The pair to serve with now, read again if the files changed.
    pub(crate) fn current(&self) -> Arc<CertifiedKey> {
        let stamps = (stamp(&self.cert), stamp(&self.key));
        let mut current = lock(&self.current);
        if current.stamps != stamps {
            // Looked at once per change, whether it loads or not.
            current.stamps = stamps;
            match read_pair(&self.cert, &self.key, &self.provider) {
                Ok(certified) => {
                    tracing::info!(cert = %self.cert.display(), "webhook serving certificate reloaded");
                    current.key = Arc::new(certified);
                }
                Err(err) => {
                    tracing::warn!(error = %err, "webhook serving certificate changed but cannot be used; serving the previous one");
                }
            }
        }
        current.key.clone()
    }
}

impl ResolvesServerCert for CertificateFiles {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn read_pair(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, Error> {
    let invalid =
        |path: &Path, reason: String, source: Option<Box<dyn std::error::Error + Send + Sync>>| {
            Error::Webhook {
                what: format!("serving certificate file {}", path.display()),
                reason,
                source,
            }
        };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|err| {
            invalid(
                cert,
                format!("cannot read certificates: {err}"),
                Some(Box::new(err)),
            )
        })?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| {
            invalid(
                cert,
                format!("not PEM certificates: {err}"),
                Some(Box::new(err)),
            )
        })?;
    if chain.is_empty() {
        return Err(invalid(cert, "holds no certificate".to_string(), None));
    }
    // The key's text is never quoted, nor its parser's error passed on:
    // only what kind of problem it has.
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|_| invalid(key, "holds no readable PEM private key".to_string(), None))?;
    CertifiedKey::from_der(chain, private, provider).map_err(|err| {
        invalid(
            key,
            format!("does not go with {}: {err}", cert.display()),
            Some(Box::new(err)),
        )
    })
}
