//! The client TLS context of the Scylla backend (OpenSSL, through the driver's `openssl-010`
//! feature): the CA the nodes must chain to, an optional client certificate, verification on
//! unless turned off.

use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslVerifyMode};

use super::{ScyllaTls, BACKEND};
use crate::model::StoreError;

/// A TLS file that cannot be used: transient (`Unavailable`), like every configuration error of
/// the connection (readiness false, retried, never a record's verdict), with the file named.
fn unusable(what: &str, path: &std::path::Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable {
        backend: BACKEND,
        detail: format!("TLS: cannot use {what} {}: {e}", path.display()),
    }
}

/// Builds the driver's TLS context. A file that cannot be read or parsed is reported by name.
pub(super) fn context(tls: &ScyllaTls) -> Result<scylla::client::session::TlsContext, StoreError> {
    let mut builder =
        SslConnector::builder(SslMethod::tls()).map_err(|e| StoreError::Unavailable {
            backend: BACKEND,
            detail: format!("TLS: cannot create an OpenSSL context: {e}"),
        })?;
    if let Some(ca) = &tls.ca_file {
        builder
            .set_ca_file(ca)
            .map_err(|e| unusable("store.scylla.tls.ca_file", ca, e))?;
    }
    if let Some((cert, key)) = &tls.client_cert {
        builder
            .set_certificate_chain_file(cert)
            .map_err(|e| unusable("store.scylla.tls.cert_file", cert, e))?;
        builder
            .set_private_key_file(key, SslFiletype::PEM)
            .map_err(|e| unusable("store.scylla.tls.key_file", key, e))?;
        builder.check_private_key().map_err(|e| {
            unusable(
                "store.scylla.tls.key_file (does not match cert_file)",
                key,
                e,
            )
        })?;
    }
    builder.set_verify(if tls.verify {
        SslVerifyMode::PEER
    } else {
        tracing::warn!("store.scylla.tls.verify = false: node certificates are not checked");
        SslVerifyMode::NONE
    });
    Ok(builder.into())
}
