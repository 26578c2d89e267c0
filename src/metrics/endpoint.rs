//! The `--metrics-addr` endpoint: `GET /metrics` in the Prometheus (OpenMetrics) text format,
//! served by hyper on a thread of its own.
//!
//! Off unless asked for, and kept away from the distribution: the endpoint has its own
//! single-threaded runtime on its own thread, so a slow or hostile scraper never takes a thread
//! that serves peers, and a scrape only reads counters (atomics, and a few locks held for as
//! long as a count takes). At most 16 scrapers are served at once; a request whose headers do
//! not arrive within 10 s is dropped.
//!
//! Answers: `GET` and `HEAD /metrics` 200, another method there 405 (with `Allow`), any other
//! path 404.

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, Semaphore};

/// The path the metrics are served at.
pub const PATH: &str = "/metrics";

/// What `prometheus-client` writes: OpenMetrics text, which Prometheus asks for first.
pub const CONTENT_TYPE_OPENMETRICS: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Scrapers served at once; more connections are closed at once.
const MAX_CONNECTIONS: usize = 16;

/// How long a connection may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Renders the exposition, at each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("cannot listen for metrics on {address}: {source}")]
    Listen {
        address: String,
        source: std::io::Error,
    },
    #[error("cannot start the metrics thread: {0}")]
    Thread(std::io::Error),
}

/// The endpoint's socket, bound and not yet served.
pub struct Bound {
    listener: std::net::TcpListener,
    address: SocketAddr,
}

/// Listens on `address` (`HOST:PORT`; the first of its addresses that binds). Binding comes
/// first, before the node registers anywhere, so that a wrong address stops start-up at once.
pub fn bind(address: &str) -> Result<Bound, EndpointError> {
    let listen_error = |source| EndpointError::Listen {
        address: address.to_string(),
        source,
    };
    let listener = std::net::TcpListener::bind(address).map_err(listen_error)?;
    listener.set_nonblocking(true).map_err(listen_error)?;
    let address = listener.local_addr().map_err(listen_error)?;
    Ok(Bound { listener, address })
}

impl Bound {
    /// Serves `render`'s text at [`PATH`], on a thread of its own, until the endpoint drops.
    pub fn serve(self, render: Render) -> Result<Endpoint, EndpointError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(EndpointError::Thread)?;
        let (stop, stopped) = oneshot::channel();
        let listener = self.listener;
        std::thread::Builder::new()
            .name("xla-node-metrics".into())
            .spawn(move || runtime.block_on(serve(listener, render, stopped)))
            .map_err(EndpointError::Thread)?;
        let address = self.address;
        tracing::info!(%address, "serving metrics at http://{address}{PATH}");
        Ok(Endpoint {
            address,
            stop: Some(stop),
        })
    }
}

/// The running endpoint; dropping it stops it.
pub struct Endpoint {
    address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl Endpoint {
    /// Where it listens (the port the system chose, for `HOST:0`).
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn serve(
    listener: std::net::TcpListener,
    render: Render,
    mut stopped: oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return tracing::error!("metrics endpoint: {e}"),
    };
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, most likely: try again shortly.
                    tracing::warn!("metrics endpoint: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue; // dropping the stream closes it
        };
        let render = render.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let response = respond(&request, &render);
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            drop(slot);
        });
    }
}

fn respond(request: &Request<Incoming>, render: &Render) -> Response<Full<Bytes>> {
    if request.uri().path() != PATH {
        return text(
            StatusCode::NOT_FOUND,
            format!("not found: the metrics are at {PATH}\n"),
        );
    }
    match *request.method() {
        // hyper leaves the body out of a HEAD response, and keeps its length.
        Method::GET | Method::HEAD => {
            let mut response = Response::new(Full::new(Bytes::from(render())));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(CONTENT_TYPE_OPENMETRICS),
            );
            response
        }
        _ => {
            let mut response = text(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{PATH} answers GET and HEAD\n"),
            );
            response
                .headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            response
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
