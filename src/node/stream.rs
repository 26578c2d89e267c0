//! A distribution connection's byte stream: plain TCP (`inet_tcp`) or TLS over TCP (`inet_tls`).
//!
//! The handshake reads and writes either through this enum. An established connection takes the
//! stream apart ([`super::connection`]): plain TCP keeps its owned halves, so that senders can
//! write to the socket directly; TLS splits into halves that share the one TLS session.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, BufReader, ReadBuf};
use tokio::net::TcpStream;

/// TLS over a buffered socket: the TLS library reads at most a few KiB per call, and the buffer
/// turns those reads into one system call per 64 KiB (writes pass straight through).
pub type TlsStream = tokio_rustls::TlsStream<BufReader<TcpStream>>;

/// Socket reads the TLS session is served from.
pub const TLS_READ_BUFFER: usize = 64 * 1024;

pub enum DistStream {
    Tcp(TcpStream),
    Tls(Box<TlsStream>),
}

impl AsyncRead for DistStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            DistStream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            DistStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for DistStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            DistStream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            DistStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            DistStream::Tcp(s) => Pin::new(s).poll_flush(cx),
            DistStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            DistStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            DistStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
