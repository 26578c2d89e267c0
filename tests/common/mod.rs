//! What the XLA tests share: the node's plugin, and running a program the way the node does.

use std::path::PathBuf;
use std::sync::Arc;
use xla_node::server::locate_plugin;
use xla_node::xla::{Argument, Buffer, Executable, HostTensor, Run, XlaError};

/// The PJRT plugin the node would load: `XLA_NODE_PJRT_PLUGIN`, else the default install.
pub fn plugin() -> PathBuf {
    let named = std::env::var_os("XLA_NODE_PJRT_PLUGIN").map(PathBuf::from);
    locate_plugin(named.as_deref()).expect("PJRT plugin")
}

/// Runs `exe` with host arguments and reads the results back, as the node does for a run.
pub fn run_host(exe: &Arc<Executable>, inputs: &[HostTensor]) -> Result<Vec<HostTensor>, XlaError> {
    let args = inputs.iter().cloned().map(Argument::Host).collect();
    Run::new(exe.clone(), vec![], args)?
        .execute()?
        .iter()
        .map(Buffer::to_host_tensor)
        .collect()
}
