//! Certificates and keys for one control plane: a CA, the API server's serving
//! certificate, client certificates for users, and the service-account signing
//! key. Everything is generated fresh per control plane, so tests never share
//! trust roots.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::Error;

/// A certificate and its private key, both PEM encoded.
#[derive(Clone)]
pub(crate) struct PemPair {
    pub(crate) cert: String,
    pub(crate) key: String,
}

/// The certificate authority that signs the serving certificate and client
/// certificates, and that the API server trusts for client authentication.
pub(crate) struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

impl CertificateAuthority {
    pub(crate) fn generate() -> Result<Self, Error> {
        let key = KeyPair::generate().map_err(pki_error)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name("multicluster-envtest-ca", None);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).map_err(pki_error)?;
        Ok(Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate in PEM.
    pub(crate) fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A serving certificate valid for loopback addresses and the in-cluster
    /// service names, so clients may use either `127.0.0.1` or `localhost`.
    pub(crate) fn serving_pair(&self) -> Result<PemPair, Error> {
        let mut params = CertificateParams::new(vec![
            "127.0.0.1".to_string(),
            "::1".to_string(),
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
            "10.0.0.1".to_string(),
        ])
        .map_err(pki_error)?;
        params.distinguished_name = name("kube-apiserver", None);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate: Kubernetes reads the user name from the common
    /// name and the group from the organisation. rcgen keeps one value per
    /// attribute type, so a certificate carries at most one group.
    pub(crate) fn client_pair(&self, user: &str, group: Option<&str>) -> Result<PemPair, Error> {
        self.client_pair_valid_for(user, group, None)
    }

    /// Like [`CertificateAuthority::client_pair`], valid from a minute ago
    /// until `valid_for` from now when given (rcgen's default otherwise).
    pub(crate) fn client_pair_valid_for(
        &self,
        user: &str,
        group: Option<&str>,
        valid_for: Option<std::time::Duration>,
    ) -> Result<PemPair, Error> {
        let mut params = CertificateParams::default();
        if let Some(valid_for) = valid_for {
            let now = time::OffsetDateTime::now_utc();
            params.not_before = now - time::Duration::minutes(1);
            params.not_after = now + valid_for;
        }
        params.distinguished_name = name(user, group);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Result<PemPair, Error> {
        let key = KeyPair::generate().map_err(pki_error)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(pki_error)?;
        Ok(PemPair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

/// The key pair the API server signs service-account tokens with: the private
/// half for `--service-account-signing-key-file`, the public half for
/// `--service-account-key-file`.
pub(crate) struct ServiceAccountKeys {
    pub(crate) private_pem: String,
    pub(crate) public_pem: String,
}

impl ServiceAccountKeys {
    pub(crate) fn generate() -> Result<Self, Error> {
        let key = KeyPair::generate().map_err(pki_error)?;
        Ok(Self {
            private_pem: key.serialize_pem(),
            public_pem: key.public_key_pem(),
        })
    }
}

fn name(common_name: &str, organisation: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(org) = organisation {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}

fn pki_error(source: rcgen::Error) -> Error {
    Error::Certificates(source.to_string())
}

/// A fresh certificate authority and a serving certificate it signed for
/// loopback (`127.0.0.1`, `::1`, `localhost`), written as PEM files: what a
/// server the API server calls (an admission webhook) needs in a test.
#[derive(Clone, Debug)]
pub struct ServingFiles {
    /// The CA certificate (the `caBundle` of a webhook configuration).
    pub ca: std::path::PathBuf,
    /// The serving certificate.
    pub cert: std::path::PathBuf,
    /// Its private key.
    pub key: std::path::PathBuf,
}

impl ServingFiles {
    /// Generates a new CA and serving pair into `dir`, replacing the files
    /// if present (each file written whole, then renamed into place, as a
    /// Secret volume's update appears to a reader).
    pub fn generate(dir: &std::path::Path) -> Result<Self, Error> {
        let authority = CertificateAuthority::generate()?;
        let pair = authority.serving_pair()?;
        let files = Self {
            ca: dir.join("ca.crt"),
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        for (path, text) in [
            (&files.key, &pair.key),
            (&files.cert, &pair.cert),
            (&files.ca, &authority.cert_pem().to_string()),
        ] {
            let staged = path.with_extension("new");
            std::fs::write(&staged, text)
                .and_then(|()| std::fs::rename(&staged, path))
                .map_err(|source| Error::Io {
                    what: format!("writing {}", path.display()),
                    source,
                })?;
        }
        Ok(files)
    }
}
