//! A loopback HTTPS server for tests: a throw-away CA, a certificate for localhost (and 127.0.0.1) signed by it (its
//! PEM written where `extra_ca_certs` can trust it), and an axum router served over TLS.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct TlsServer {
    pub addr: SocketAddr,
    pub ca_pem_path: PathBuf,
    _runtime: tokio::runtime::Runtime,
}

impl TlsServer {
    /// Serves the router `app(port)` makes on a free loopback port; the CA goes into `dir`.
    pub fn start(dir: &Path, app: impl FnOnce(u16) -> axum::Router) -> Self {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};

        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "code-interpreter-mcp test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate().unwrap();
        let server_cert =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .unwrap()
                .signed_by(&server_key, &issuer)
                .unwrap();
        let ca_pem_path = dir.join("test-ca.pem");
        std::fs::write(&ca_pem_path, ca.pem()).unwrap();

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let app = app(addr.port());
        let tls = {
            let _guard = runtime.enter();
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let certs = vec![server_cert.der().clone()];
            let key = rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into());
            let config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .unwrap();
            axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(config))
        };
        runtime.spawn(async move {
            axum_server::from_tcp_rustls(listener, tls)
                .serve(app.into_make_service())
                .await
                .unwrap();
        });
        Self {
            addr,
            ca_pem_path,
            _runtime: runtime,
        }
    }

    /// `https://localhost:PORT`
    pub fn base(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }
}
