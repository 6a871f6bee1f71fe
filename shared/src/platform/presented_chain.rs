//! What a Postgres server's certificate chains to, for the message of a refused handshake
//! (docs/design.md §5.3, TLS): "invalid peer certificate: UnknownIssuer" names no issuer, so
//! the one who must find the missing root (a new RDS Region, a database of another CA) is
//! told the name at the top of the chain the server presented. The chain is read over a
//! handshake this module then abandons: nothing is trusted and nothing is sent over it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use der::Decode;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long the whole read may take: it only adds to a message.
const BUDGET: Duration = Duration::from_secs(5);

/// Postgres's SSLRequest: length 8, then the code 80877103 (Postgres's "Message Formats",
/// SSLRequest); the server answers one byte, `S` when it goes on in TLS.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// The issuer of the last certificate the server at `host:port` presents (its distinguished
/// name as RFC 4514 writes it, `CN=…,O=…`): the root a verifier would need. `None` when the
/// server cannot be reached, offers no TLS or presents nothing readable within [`BUDGET`].
pub async fn presented_issuer(host: &str, port: u16) -> Option<String> {
    let chain = tokio::time::timeout(BUDGET, presented_chain(host, port))
        .await
        .ok()??;
    let top = chain.last()?;
    let certificate = x509_cert::Certificate::from_der(top.as_ref()).ok()?;
    Some(certificate.tbs_certificate.issuer.to_string())
}

/// The chain the server presents, end entity first.
async fn presented_chain(host: &str, port: u16) -> Option<Vec<CertificateDer<'static>>> {
    let mut tcp = TcpStream::connect((host, port)).await.ok()?;
    tcp.write_all(&SSL_REQUEST).await.ok()?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await.ok()?;
    if answer[0] != b'S' {
        return None;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let reader = Arc::new(ChainReader::new(&provider));
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(reader.clone())
        .with_no_client_auth();
    let name = ServerName::try_from(host.to_owned()).ok()?;
    // The reader refuses the chain once it has it: the handshake fails by design.
    let _ = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await;
    let chain = std::mem::take(&mut *reader.chain.lock().ok()?);
    (!chain.is_empty()).then_some(chain)
}

/// A verifier that keeps the chain it is shown and refuses it.
#[derive(Debug)]
struct ChainReader {
    chain: Mutex<Vec<CertificateDer<'static>>>,
    schemes: Vec<SignatureScheme>,
}

impl ChainReader {
    fn new(provider: &CryptoProvider) -> Self {
        Self {
            chain: Mutex::new(Vec::new()),
            schemes: provider
                .signature_verification_algorithms
                .supported_schemes(),
        }
    }
}

fn read_only() -> rustls::Error {
    rustls::Error::General("the chain is read, not trusted".into())
}

impl ServerCertVerifier for ChainReader {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Ok(mut chain) = self.chain.lock() {
            chain.push(end_entity.clone().into_owned());
            chain.extend(intermediates.iter().map(|c| c.clone().into_owned()));
        }
        Err(read_only())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(read_only())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(read_only())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes.clone()
    }
}
