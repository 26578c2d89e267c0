//! TLS distribution (`-proto_dist inet_tls`): the node's TLS settings, read from OTP's own
//! `-ssl_dist_optfile`, and the TLS handshakes of accepted and dialled connections.
//!
//! One option file serves the BEAM nodes of a cluster and this node: `[{server, Opts}, {client,
//! Opts}]`, where `server` applies to connections peers open to us and `client` to those we open.
//! The options read are OTP's `certfile`, `keyfile` (default: the key in `certfile`),
//! `cacertfile`, `verify` (`verify_peer` | `verify_none`), `fail_if_no_peer_cert` (server),
//! `server_name_indication` (client: a host name, or `disable`) and `versions`. As OTP's
//! `inet_tls_dist` does, a connection we dial names the peer's host (the part of its node name
//! after `@`) as the TLS server name, which the peer's certificate must carry in its
//! subjectAltName when `verify` is `verify_peer`; `disable` turns that off and checks the chain
//! only. Options that change nothing here are accepted with a warning; any other option is an
//! error, so that a file never means less security here than on the BEAM.
//!
//! Defaults where OTP releases differ: a server verifies clients only with `verify_peer`; a
//! client verifies servers unless the file says `{verify, verify_none}` (OTP 26 on), so the
//! client's `cacertfile` is needed then. EPMD stays plain TCP, as in OTP.

use super::consult::{self, Literal};
use super::stream::{DistStream, TLS_READ_BUFFER};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig,
    SignatureScheme, SupportedProtocolVersion,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::BufReader;
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The node's TLS side, built once at start-up from the option file.
pub struct TlsDist {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
    server_name: ClientServerName,
}

impl std::fmt::Debug for TlsDist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsDist")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// What a dialled connection names as the server: `server_name_indication`.
#[derive(Debug, Clone, PartialEq)]
enum ClientServerName {
    /// The host part of the peer's node name (OTP's default).
    PeerHost,
    /// A fixed host name from the file.
    Fixed(String),
    /// `disable`: no SNI and no host name check.
    Disabled,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Verify {
    Peer,
    None,
}

/// Options of one side (`server` or `client`) as given in the file.
#[derive(Debug, Default)]
struct SideOptions {
    certfile: Option<PathBuf>,
    keyfile: Option<PathBuf>,
    cacertfile: Option<PathBuf>,
    verify: Option<Verify>,
    fail_if_no_peer_cert: bool,
    server_name: Option<ClientServerName>,
    versions: Option<Vec<&'static SupportedProtocolVersion>>,
    /// Options accepted and ignored, reported once at start-up.
    ignored: Vec<String>,
}

/// Options that change nothing for this node: accepted (with a warning) so that one file serves
/// the BEAM nodes too. Everything else unknown is refused.
const IGNORED_OPTIONS: &[&str] = &[
    "depth",
    "hibernate_after",
    "reuse_sessions",
    "reuse_session",
    "secure_renegotiate",
    "honor_cipher_order",
    "client_renegotiation",
    "ciphers",
    "dhfile",
    "log_level",
    "log_alert",
    "padding_check",
    "beast_mitigation",
    "session_tickets",
];

#[derive(Debug, thiserror::Error)]
#[error("--ssl-dist-optfile {path}: {message}")]
pub struct TlsConfigError {
    path: String,
    message: String,
}

impl TlsDist {
    /// Reads the option file and loads every certificate and key it names: any missing or
    /// unreadable file, a key that does not match its certificate, or an option this node does not
    /// support is an error (the node does not start). Ignored options are logged.
    pub fn from_optfile(path: &Path) -> Result<TlsDist, TlsConfigError> {
        let fail = |message: String| TlsConfigError {
            path: path.display().to_string(),
            message,
        };
        let file = consult::read(path).map_err(fail)?;
        let (server, client) = sides(&file).map_err(fail)?;
        for (side, options) in [("server", &server), ("client", &client)] {
            for option in &options.ignored {
                tracing::warn!(
                    "--ssl-dist-optfile: {side} option {option} does not apply to xla_node and is ignored"
                );
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server_config =
            server_config(&server, &provider).map_err(|e| fail(format!("server: {e}")))?;
        let client_config =
            client_config(&client, &provider).map_err(|e| fail(format!("client: {e}")))?;
        Ok(TlsDist {
            acceptor: TlsAcceptor::from(Arc::new(server_config)),
            connector: TlsConnector::from(Arc::new(client_config)),
            server_name: client.server_name.unwrap_or(ClientServerName::PeerHost),
        })
    }

    /// The TLS handshake of a connection a peer opened.
    pub async fn accept(&self, tcp: TcpStream) -> Result<DistStream, String> {
        let buffered = BufReader::with_capacity(TLS_READ_BUFFER, tcp);
        match self.acceptor.accept(buffered).await {
            Ok(tls) => Ok(DistStream::Tls(Box::new(tls.into()))),
            Err(e) => Err(describe(&e, "")),
        }
    }

    /// The TLS handshake of a connection we opened to the node on `peer_host`.
    pub async fn connect(&self, tcp: TcpStream, peer_host: &str) -> Result<DistStream, String> {
        let host = match &self.server_name {
            ClientServerName::Fixed(name) => name.as_str(),
            ClientServerName::PeerHost | ClientServerName::Disabled => peer_host,
        };
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| format!("{host:?} is not a valid TLS server name"))?;
        let buffered = BufReader::with_capacity(TLS_READ_BUFFER, tcp);
        match self.connector.connect(name, buffered).await {
            Ok(tls) => Ok(DistStream::Tls(Box::new(tls.into()))),
            Err(e) => Err(describe(&e, host)),
        }
    }
}

/// A failed TLS handshake, said so that the log line points at the cause.
fn describe(error: &std::io::Error, server_name: &str) -> String {
    let tls = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match tls {
        Some(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)) => {
            format!("TLS handshake failed: the peer does not speak TLS (plain-TCP distribution?): {error}")
        }
        Some(rustls::Error::InvalidCertificate(CertificateError::NotValidForName))
        | Some(rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
            ..
        })) => format!(
            "TLS handshake failed: the peer's certificate is not valid for {server_name:?} \
             (server_name_indication): {error}"
        ),
        Some(rustls::Error::InvalidCertificate(_)) => {
            format!("TLS handshake failed: the peer's certificate is not trusted: {error}")
        }
        Some(rustls::Error::NoCertificatesPresented) => {
            format!("TLS handshake failed: the peer presented no certificate (fail_if_no_peer_cert): {error}")
        }
        _ => format!("TLS handshake failed: {error}"),
    }
}

/// The `server` and `client` option lists of the file's term.
fn sides(file: &Literal) -> Result<(SideOptions, SideOptions), String> {
    let entries = file
        .as_list()
        .ok_or("expected a list [{server, Options}, {client, Options}]")?;
    let mut server = SideOptions::default();
    let mut client = SideOptions::default();
    for entry in &entries {
        match entry {
            Literal::Tuple(pair) if pair.len() == 2 => match pair[0].as_atom() {
                Some("server") => server = side_options(&pair[1], "server")?,
                Some("client") => client = side_options(&pair[1], "client")?,
                _ => {
                    return Err(format!(
                        "{entry}: expected {{server, Options}} or {{client, Options}}"
                    ))
                }
            },
            _ => {
                return Err(format!(
                    "{entry}: expected {{server, Options}} or {{client, Options}}"
                ))
            }
        }
    }
    Ok((server, client))
}

fn side_options(list: &Literal, side: &str) -> Result<SideOptions, String> {
    let options = list
        .as_list()
        .ok_or_else(|| format!("{side} options must be a list, found {list}"))?;
    let mut out = SideOptions::default();
    for option in &options {
        let Literal::Tuple(pair) = option else {
            return Err(format!("{side} option {option}: expected {{Name, Value}}"));
        };
        let [name, value] = pair.as_slice() else {
            return Err(format!("{side} option {option}: expected {{Name, Value}}"));
        };
        let name = name
            .as_atom()
            .ok_or_else(|| format!("{side} option {option}: the name must be an atom"))?;
        let bad = |wanted: &str| format!("{side} option {option}: expected {wanted}");
        let path = || {
            value
                .as_text()
                .map(PathBuf::from)
                .ok_or_else(|| bad("a file name string"))
        };
        match name {
            "certfile" => out.certfile = Some(path()?),
            "keyfile" => out.keyfile = Some(path()?),
            "cacertfile" => out.cacertfile = Some(path()?),
            "verify" => {
                out.verify = Some(match value.as_atom() {
                    Some("verify_peer") => Verify::Peer,
                    Some("verify_none") => Verify::None,
                    _ => return Err(bad("verify_peer or verify_none")),
                })
            }
            "fail_if_no_peer_cert" if side == "server" => {
                out.fail_if_no_peer_cert = match value.as_atom() {
                    Some("true") => true,
                    Some("false") => false,
                    _ => return Err(bad("true or false")),
                }
            }
            "server_name_indication" if side == "client" => {
                out.server_name = Some(match value.as_atom() {
                    Some("disable") => ClientServerName::Disabled,
                    _ => ClientServerName::Fixed(
                        value
                            .as_text()
                            .ok_or_else(|| bad("a host name string or disable"))?,
                    ),
                })
            }
            "versions" => {
                let versions = value
                    .as_list()
                    .ok_or_else(|| bad("a list of versions"))?
                    .iter()
                    .map(|v| match v.as_atom() {
                        Some("tlsv1.3") => Ok(&rustls::version::TLS13),
                        Some("tlsv1.2") => Ok(&rustls::version::TLS12),
                        _ => Err(format!(
                            "{side} option {option}: xla_node supports 'tlsv1.2' and 'tlsv1.3' only"
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if versions.is_empty() {
                    return Err(bad("at least one version"));
                }
                out.versions = Some(versions);
            }
            name if IGNORED_OPTIONS.contains(&name) => out.ignored.push(option.to_string()),
            "password" => {
                return Err(format!(
                    "{side} option password: encrypted private keys are not supported by \
                     xla_node; give it the key unencrypted (e.g. `openssl pkey -in KEY -out \
                     PLAIN_KEY`), readable by the node's user only"
                ))
            }
            _ => {
                return Err(format!(
                    "{side} option {option} is not supported by xla_node"
                ))
            }
        }
    }
    Ok(out)
}

fn load_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let read = |e: &dyn std::fmt::Display| format!("{what} {}: {e}", path.display());
    // Open first, for the operating system's own words on a missing or unreadable file.
    std::fs::File::open(path).map_err(|e| read(&e))?;
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| read(&e))?;
    if certs.is_empty() {
        return Err(read(
            &"no PEM certificate (-----BEGIN CERTIFICATE-----) in the file",
        ));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let read = |e: &dyn std::fmt::Display| format!("keyfile {}: {e}", path.display());
    std::fs::File::open(path).map_err(|e| read(&e))?;
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => read(
            &"no unencrypted PEM private key (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY) \
              in the file",
        ),
        e => read(&e),
    })
}

fn load_roots(options: &SideOptions, why: &str) -> Result<Arc<RootCertStore>, String> {
    let path = options
        .cacertfile
        .as_deref()
        .ok_or_else(|| format!("{why} needs cacertfile (the CA certificates to trust)"))?;
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path, "cacertfile")? {
        roots
            .add(cert)
            .map_err(|e| format!("cacertfile {}: {e}", path.display()))?;
    }
    Ok(Arc::new(roots))
}

/// The node's certificate chain and key: `certfile`, and `keyfile` or the key in `certfile`.
fn identity(
    options: &SideOptions,
) -> Result<Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>, String> {
    let Some(certfile) = &options.certfile else {
        return Ok(None);
    };
    let certs = load_certs(certfile, "certfile")?;
    let key = load_key(options.keyfile.as_deref().unwrap_or(certfile))?;
    Ok(Some((certs, key)))
}

/// Says which files disagree when the key does not belong to the certificate.
fn key_error(options: &SideOptions, error: rustls::Error) -> String {
    match error {
        rustls::Error::InconsistentKeys(_) => format!(
            "the private key in {} does not match the certificate in {}",
            options
                .keyfile
                .as_deref()
                .or(options.certfile.as_deref())
                .unwrap_or(Path::new("?"))
                .display(),
            options
                .certfile
                .as_deref()
                .unwrap_or(Path::new("?"))
                .display()
        ),
        e => format!("certificate or key not usable: {e}"),
    }
}

fn versions(options: &SideOptions) -> &[&'static SupportedProtocolVersion] {
    options
        .versions
        .as_deref()
        .unwrap_or(rustls::DEFAULT_VERSIONS)
}

fn server_config(
    options: &SideOptions,
    provider: &Arc<CryptoProvider>,
) -> Result<ServerConfig, String> {
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions(options))
        .map_err(|e| e.to_string())?;
    let builder = match options.verify.unwrap_or(Verify::None) {
        Verify::None => builder.with_no_client_auth(),
        Verify::Peer => {
            let roots = load_roots(options, "verify_peer")?;
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone());
            let verifier = if options.fail_if_no_peer_cert {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| e.to_string())?)
        }
    };
    let (certs, key) = identity(options)?
        .ok_or("certfile is missing (the node's certificate, needed to accept connections)")?;
    builder
        .with_single_cert(certs, key)
        .map_err(|e| key_error(options, e))
}

fn client_config(
    options: &SideOptions,
    provider: &Arc<CryptoProvider>,
) -> Result<ClientConfig, String> {
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions(options))
        .map_err(|e| e.to_string())?;
    let chain = match options.verify.unwrap_or(Verify::Peer) {
        Verify::None => None,
        Verify::Peer => {
            let roots = load_roots(
                options,
                "verify_peer (the client's default; {verify, verify_none} turns it off)",
            )?;
            let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| e.to_string())?;
            Some(verifier)
        }
    };
    let verifier = Arc::new(ServerCertPolicy {
        provider: provider.clone(),
        chain,
        check_name: options.server_name != Some(ClientServerName::Disabled),
    });
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match identity(options)? {
        Some((certs, key)) => builder
            .with_client_auth_cert(certs, key)
            .map_err(|e| key_error(options, e))?,
        None => builder.with_no_client_auth(),
    };
    config.enable_sni = options.server_name != Some(ClientServerName::Disabled);
    Ok(config)
}

/// How a client checks the server's certificate, as the option file says: `verify_none` (no
/// check: any certificate), `verify_peer` (the chain, and the host name unless
/// `{server_name_indication, disable}`). The handshake's signatures are checked in every case, so
/// the session is with the holder of the certificate's key.
#[derive(Debug)]
struct ServerCertPolicy {
    provider: Arc<CryptoProvider>,
    /// The chain's verifier; `None` for `verify_none`.
    chain: Option<Arc<WebPkiServerVerifier>>,
    check_name: bool,
}

impl ServerCertVerifier for ServerCertPolicy {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // The name is checked after the chain: a name error means the chain was good.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(text: &str, name: &str) -> Result<SideOptions, String> {
        side_options(&consult::parse(text).unwrap(), name)
    }

    #[test]
    fn reads_both_sides() {
        let file = consult::parse(
            r#"[{server, [{certfile, "s.pem"}, {keyfile, "s.key"}, {cacertfile, "ca.pem"},
                          {verify, verify_peer}, {fail_if_no_peer_cert, true}, {depth, 3}]},
                {client, [{cacertfile, "ca.pem"}, {server_name_indication, "db.example"},
                          {versions, ['tlsv1.3']}]}]."#,
        )
        .unwrap();
        let (server, client) = sides(&file).unwrap();
        assert_eq!(server.certfile.as_deref(), Some(Path::new("s.pem")));
        assert_eq!(server.keyfile.as_deref(), Some(Path::new("s.key")));
        assert_eq!(server.verify, Some(Verify::Peer));
        assert!(server.fail_if_no_peer_cert);
        assert_eq!(server.ignored, ["{depth,3}"]);
        assert_eq!(client.cacertfile.as_deref(), Some(Path::new("ca.pem")));
        assert_eq!(
            client.server_name,
            Some(ClientServerName::Fixed("db.example".into()))
        );
        assert_eq!(client.versions.as_ref().unwrap().len(), 1);
        assert_eq!(client.verify, None);
    }

    #[test]
    fn refuses_what_it_cannot_honour() {
        let message = |text: &str, name: &str| side(text, name).unwrap_err();
        assert!(message("[{verify_fun, {m, f, []}}].", "client").contains("not supported"));
        assert!(message("[{crl_check, true}].", "server").contains("not supported"));
        assert!(message(r#"[{password, "x"}]."#, "server").contains("encrypted"));
        assert!(message("[{verify, maybe}].", "server").contains("verify_peer or verify_none"));
        assert!(message("[{versions, ['tlsv1.1']}].", "client").contains("'tlsv1.2'"));
        assert!(message("[{certfile, 42}].", "server").contains("file name"));
        // Side-specific options on the other side.
        assert!(message("[{fail_if_no_peer_cert, true}].", "client").contains("not supported"));
        assert!(message("[{server_name_indication, disable}].", "server").contains("not supported"));
        assert!(sides(&consult::parse("[{peer, []}].").unwrap())
            .unwrap_err()
            .contains("{server, Options}"));
    }

    #[test]
    fn sni_disable() {
        let client = side("[{server_name_indication, disable}].", "client").unwrap();
        assert_eq!(client.server_name, Some(ClientServerName::Disabled));
    }

    /// Certificates and option files in a directory of their own.
    struct Pki {
        dir: PathBuf,
    }

    struct Ca {
        cert: rcgen::Certificate,
        key: rcgen::KeyPair,
        path: PathBuf,
    }

    /// A certificate and key on disk.
    struct Identity {
        cert: PathBuf,
        key: PathBuf,
    }

    impl Pki {
        fn new(tag: &str) -> Pki {
            let dir =
                std::env::temp_dir().join(format!("xla_node_tls_{tag}_{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Pki { dir }
        }

        fn ca(&self, name: &str) -> Ca {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            let cert = params.self_signed(&key).unwrap();
            let path = self.dir.join(format!("{name}.pem"));
            std::fs::write(&path, cert.pem()).unwrap();
            Ca { cert, key, path }
        }

        fn node(&self, name: &str, ca: &Ca, host: &str) -> Identity {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(vec![host.to_string()]).unwrap();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            let cert = params.signed_by(&key, &ca.cert, &ca.key).unwrap();
            let identity = Identity {
                cert: self.dir.join(format!("{name}.pem")),
                key: self.dir.join(format!("{name}.key")),
            };
            std::fs::write(&identity.cert, cert.pem()).unwrap();
            std::fs::write(&identity.key, key.serialize_pem()).unwrap();
            identity
        }

        /// An option file: `identity` and `trusted` on both sides, peers verified both ways,
        /// then `client_extra` options on the client side.
        fn optfile(
            &self,
            name: &str,
            identity: &Identity,
            trusted: &Ca,
            client_extra: &str,
        ) -> PathBuf {
            let side = format!(
                "{{certfile, {:?}}}, {{keyfile, {:?}}}, {{cacertfile, {:?}}}, {{verify, verify_peer}}",
                identity.cert, identity.key, trusted.path
            );
            let path = self.dir.join(name);
            std::fs::write(
                &path,
                format!(
                    "[{{server, [{side}, {{fail_if_no_peer_cert, true}}]}},\n \
                     {{client, [{side}{client_extra}]}}]."
                ),
            )
            .unwrap();
            path
        }
    }

    impl Drop for Pki {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// A CA, a node certificate of it for `node.example`, and the TLS side of that node.
    fn cluster(tag: &str) -> (Pki, Ca, Identity, TlsDist) {
        let pki = Pki::new(tag);
        let ca = pki.ca("ca");
        let node = pki.node("node", &ca, "node.example");
        let dist = TlsDist::from_optfile(&pki.optfile("dist.conf", &node, &ca, "")).unwrap();
        (pki, ca, node, dist)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn assert_connects(server: &TlsDist, client: &TlsDist, peer_host: &str) {
        assert_eq!(exchange(server, client, peer_host), (Ok(()), Ok(())));
    }

    /// Connects `client` to `server` over loopback as a dial of a node on `peer_host`, and
    /// exchanges a few bytes each way. Returns each side's handshake error, if any.
    fn exchange(
        server: &TlsDist,
        client: &TlsDist,
        peer_host: &str,
    ) -> (Result<(), String>, Result<(), String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        runtime().block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let accepting = async {
                let (tcp, _) = listener.accept().await.unwrap();
                let mut stream = server.accept(tcp).await?;
                let mut got = [0u8; 5];
                stream
                    .read_exact(&mut got)
                    .await
                    .map_err(|e| e.to_string())?;
                stream
                    .write_all(b"world")
                    .await
                    .map_err(|e| e.to_string())?;
                stream.flush().await.map_err(|e| e.to_string())?;
                assert_eq!(&got, b"hello");
                Ok(())
            };
            let dialling = async {
                let tcp = TcpStream::connect(addr).await.unwrap();
                let mut stream = client.connect(tcp, peer_host).await?;
                stream
                    .write_all(b"hello")
                    .await
                    .map_err(|e| e.to_string())?;
                stream.flush().await.map_err(|e| e.to_string())?;
                let mut got = [0u8; 5];
                stream
                    .read_exact(&mut got)
                    .await
                    .map_err(|e| e.to_string())?;
                assert_eq!(&got, b"world");
                Ok(())
            };
            tokio::join!(accepting, dialling)
        })
    }

    #[test]
    fn peers_verified_both_ways_and_by_host_name() {
        let (pki, ca, node, dist) = cluster("verify");
        assert_connects(&dist, &dist, "node.example");

        // The certificate does not name the host dialled: refused, unless the file says which
        // name to expect or turns the check off.
        let (_, dialled) = exchange(&dist, &dist, "elsewhere.example");
        assert!(dialled
            .unwrap_err()
            .contains("not valid for \"elsewhere.example\""));
        for extra in [
            r#", {server_name_indication, "node.example"}"#,
            ", {server_name_indication, disable}",
        ] {
            let client =
                TlsDist::from_optfile(&pki.optfile("sni.conf", &node, &ca, extra)).unwrap();
            assert_connects(&dist, &client, "elsewhere.example");
        }
    }

    #[test]
    fn certificates_from_another_ca_are_refused() {
        let (pki, ca, node, dist) = cluster("other_ca");
        let other_ca = pki.ca("other_ca");
        let rogue = pki.node("rogue", &other_ca, "node.example");
        // Trusts our CA, presents a certificate from another one.
        let rogue = TlsDist::from_optfile(&pki.optfile("rogue.conf", &rogue, &ca, "")).unwrap();

        let (accepted, _) = exchange(&dist, &rogue, "node.example");
        assert!(accepted.unwrap_err().contains("not trusted"));
        let (_, dialled) = exchange(&rogue, &dist, "node.example");
        assert!(dialled.unwrap_err().contains("not trusted"));

        // `verify_none` on the client accepts the server's certificate whatever its issuer.
        let trusting =
            TlsDist::from_optfile(&pki.optfile("none.conf", &node, &ca, ", {verify, verify_none}"))
                .unwrap();
        let rogue_server = pki.node("rs", &other_ca, "node.example");
        let server =
            TlsDist::from_optfile(&pki.optfile("rs.conf", &rogue_server, &ca, "")).unwrap();
        assert_connects(&server, &trusting, "node.example");
    }

    #[test]
    fn a_plain_tcp_peer_is_told_apart() {
        use tokio::io::AsyncWriteExt;
        let (_pki, _, _, dist) = cluster("plain");
        let refused = runtime().block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let mut tcp = TcpStream::connect(listener.local_addr().unwrap())
                .await
                .unwrap();
            // A plain-TCP distribution handshake's send_name.
            tcp.write_all(b"\x00\x10N\x00\x00\x00\x00\x00\x00\x00\x00a@b")
                .await
                .unwrap();
            let (accepted, _) = listener.accept().await.unwrap();
            dist.accept(accepted).await.err().unwrap()
        });
        assert!(refused.contains("does not speak TLS"), "{refused}");
    }

    #[test]
    fn unusable_files_stop_start_up() {
        let (pki, ca, node, _) = cluster("files");
        let other = pki.node("other", &ca, "node.example");
        let error = |path: &Path| TlsDist::from_optfile(path).unwrap_err().to_string();

        let mismatched = Identity {
            cert: node.cert.clone(),
            key: other.key.clone(),
        };
        let message = error(&pki.optfile("mismatch.conf", &mismatched, &ca, ""));
        assert!(message.contains("does not match"), "{message}");
        assert!(message.contains(&other.key.display().to_string()));

        let missing = Identity {
            cert: pki.dir.join("missing.pem"),
            key: node.key.clone(),
        };
        let message = error(&pki.optfile("missing.conf", &missing, &ca, ""));
        assert!(
            message.contains("certfile") && message.contains("missing.pem"),
            "{message}"
        );

        // A certificate where the key should be.
        let keyless = Identity {
            cert: node.cert.clone(),
            key: node.cert.clone(),
        };
        let message = error(&pki.optfile("keyless.conf", &keyless, &ca, ""));
        assert!(
            message.contains("no unencrypted PEM private key"),
            "{message}"
        );

        let message = error(&pki.dir.join("absent.conf"));
        assert!(
            message.contains("absent.conf") && message.contains("No such file"),
            "{message}"
        );

        std::fs::write(
            pki.dir.join("syntax.conf"),
            "[{server, [{certfile, \"x\"}]}]",
        )
        .unwrap();
        let message = error(&pki.dir.join("syntax.conf"));
        assert!(
            message.contains("line 1") && message.contains("'.'"),
            "{message}"
        );
    }
}
