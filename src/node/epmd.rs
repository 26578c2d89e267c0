//! EPMD: registering this node (ALIVE2) and finding peers (PORT_PLEASE2), through `erl_dist`'s
//! client. The registration socket must stay open for the node's lifetime: EPMD forgets the node
//! the moment it closes, which is also how the node unregisters on shutdown.

use erl_dist::epmd::{EpmdClient, NodeEntry};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_util::compat::{Compat, TokioAsyncReadCompatExt};

/// The port EPMD listens on: `ERL_EPMD_PORT` or 4369, as `erl` does.
pub fn epmd_port() -> u16 {
    std::env::var("ERL_EPMD_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(4369)
}

#[derive(Debug, thiserror::Error)]
pub enum EpmdError {
    #[error("cannot reach epmd on {host}:{port}: {source}")]
    Connect {
        host: String,
        port: u16,
        source: std::io::Error,
    },
    #[error("epmd: {0:?}")]
    Protocol(erl_dist::epmd::EpmdError),
    #[error("node {0} is not registered in epmd")]
    NotRegistered(String),
    #[error("could not start epmd: {0}")]
    Start(String),
}

/// The open registration: dropping it unregisters the node.
pub struct Registration {
    _socket: Compat<TcpStream>,
    pub creation: u32,
}

async fn connect(host: &str) -> Result<TcpStream, EpmdError> {
    let port = epmd_port();
    let stream = TcpStream::connect((host, port))
        .await
        .map_err(|source| EpmdError::Connect {
            host: host.to_string(),
            port,
            source,
        })?;
    stream.set_nodelay(true).ok();
    Ok(stream)
}

/// Makes sure an EPMD runs on this host, starting `epmd -daemon` as `erl` does if none answers.
pub async fn ensure_running() -> Result<(), EpmdError> {
    if connect("127.0.0.1").await.is_ok() {
        return Ok(());
    }
    tracing::info!(
        "no epmd answering on port {}, starting `epmd -daemon`",
        epmd_port()
    );
    let status = tokio::process::Command::new("epmd")
        .arg("-daemon")
        .status()
        .await
        .map_err(|e| EpmdError::Start(format!("`epmd -daemon`: {e} (is Erlang installed?)")))?;
    if !status.success() {
        return Err(EpmdError::Start(format!(
            "`epmd -daemon` exited with {status}"
        )));
    }
    for _ in 0..50 {
        if connect("127.0.0.1").await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(EpmdError::Start(
        "epmd did not start listening within 5 s".into(),
    ))
}

/// Registers `alive_name` (the part before `@`) as a hidden node listening on `port`.
pub async fn register(alive_name: &str, port: u16) -> Result<Registration, EpmdError> {
    let stream = connect("127.0.0.1").await?;
    let (socket, creation) = EpmdClient::new(stream.compat())
        .register(NodeEntry::new_hidden(alive_name, port))
        .await
        .map_err(EpmdError::Protocol)?;
    Ok(Registration {
        _socket: socket,
        creation: creation.get(),
    })
}

/// Finds the distribution address of `node` (`name@host`).
pub async fn lookup(node: &str) -> Result<SocketAddr, EpmdError> {
    let (alive, host) = node
        .split_once('@')
        .ok_or_else(|| EpmdError::NotRegistered(node.to_string()))?;
    let stream = connect(host).await?;
    let peer_ip = stream.peer_addr().map_err(|source| EpmdError::Connect {
        host: host.to_string(),
        port: epmd_port(),
        source,
    })?;
    let entry = EpmdClient::new(stream.compat())
        .get_node(alive)
        .await
        .map_err(EpmdError::Protocol)?
        .ok_or_else(|| EpmdError::NotRegistered(node.to_string()))?;
    Ok(SocketAddr::new(peer_ip.ip(), entry.port))
}
