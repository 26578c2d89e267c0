//! The node's standing processes: `:xla`, the server the cluster calls, and `net_kernel`, which
//! answers `:net_adm.ping/1`.
//!
//! `:xla` speaks gen_server: `GenServer.call({:xla, node}, request)`. Requests are handled in
//! the order they arrive, but anything that calls XLA (compiling, running, transfers, freeing) is
//! handed to executor threads and replied to from there, so the server itself never blocks (see
//! `schedule.rs` for where work executes and why, `watchdog.rs` for the check that it holds).

mod compute;
pub mod kernels;
pub mod request;
mod resources;
pub mod schedule;
mod watchdog;

use crate::dispatch::Dispatcher;
use crate::node::gen::{self, From};
use crate::node::term::{as_atom, as_tuple, atom, error_kind, int, ok};
use crate::node::{Node, Process, Signal};
use crate::xla::{Client, Executor};
use compute::Compute;
use eetf::{Map, Term};
use request::Request;
use schedule::Scheduler;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub struct ServerConfig {
    pub plugin: PathBuf,
    pub callback_timeout: Duration,
    /// How long a thread waiting for a callback's reply polls before it sleeps.
    pub callback_spin: Duration,
    /// How long a run may wait for a place to execute (`None`: no limit) unless it says otherwise.
    pub queue_timeout: Option<Duration>,
    /// Kernels to load now, and what run-time loads may do.
    pub kernels: kernels::KernelPolicy,
}

/// Where `scripts/setup.sh` installs the CPU plugin.
pub fn default_plugin_dir() -> PathBuf {
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("/usr/local/share"));
    base.join("xla_node/pjrt")
}

pub fn default_plugin_path() -> PathBuf {
    default_plugin_dir().join("xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")
}

/// The plugin to load: the one named, else the default CPU plugin, else an error that says how
/// to install it.
pub fn locate_plugin(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        anyhow::ensure!(
            path.is_file(),
            "PJRT plugin {} does not exist",
            path.display()
        );
        return Ok(path.to_path_buf());
    }
    let default = default_plugin_path();
    anyhow::ensure!(
        default.is_file(),
        "no PJRT plugin found at {}. Install the CPU plugin with:\n    python3 -m pip install --target {} xla-cpu-pjrt\n\
         (or run scripts/setup.sh), or pass --pjrt-plugin PATH / set XLA_NODE_PJRT_PLUGIN",
        default.display(),
        default_plugin_dir().display()
    );
    Ok(default)
}

/// Keeps the standing processes alive; dropping it stops them.
pub struct ServerHandle {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Loads the plugin, installs the callback targets, loads the start-up kernels and starts `:xla` and `net_kernel`.
pub fn start(node: &Node, config: ServerConfig) -> anyhow::Result<ServerHandle> {
    let client = Client::from_plugin(&config.plugin)
        .map_err(|e| anyhow::anyhow!("cannot load PJRT plugin {}: {e}", config.plugin.display()))?;
    tracing::info!(plugin = %config.plugin.display(), platform = client.platform_name(), devices = client.devices().len(), "XLA ready");
    let dispatcher = Dispatcher::install(
        node.clone(),
        &client,
        config.callback_timeout,
        config.callback_spin,
    )
    .map_err(|e| anyhow::anyhow!("cannot install the callback targets: {e}"))?;
    kernels::load_at_start(&client, &config.kernels)?;
    let net_kernel = node.spawn_registered("net_kernel");
    let xla = node.spawn_registered("xla");
    let executor = Executor::new(client);
    let scheduler = Scheduler::new(executor.clone(), node.runtime().clone());
    let heartbeat = watchdog::start(
        node.runtime(),
        watchdog::Watched {
            scheduler: scheduler.clone(),
            dispatcher: dispatcher.clone(),
            executor: executor.clone(),
        },
    )?;
    let compute = Compute {
        node: node.clone(),
        server: xla.pid().clone(),
        executor,
        resources: Arc::default(),
        plugin: config.plugin,
        dispatcher,
        scheduler,
        queue_timeout: config.queue_timeout,
        runs: Arc::default(),
        kernels: Arc::new(config.kernels),
    };
    Ok(ServerHandle {
        tasks: vec![
            tokio::spawn(net_kernel_loop(net_kernel)),
            tokio::spawn(xla_loop(xla, compute)),
            heartbeat,
        ],
    })
}

/// `net_kernel`: enough of it for `:net_adm.ping/1` (`{:is_auth, node}` -> `:yes`).
async fn net_kernel_loop(mut process: Process) {
    while let Some(signal) = process.recv().await {
        if let Signal::Message(message) = signal {
            if let Ok((from, request)) = gen::parse_call(message) {
                let reply = match as_tuple(&request, 2) {
                    Some([tag, _]) if as_atom(tag) == Some("is_auth") => atom("yes"),
                    _ => error_kind("bad_request", "net_kernel on xla_node only answers is_auth"),
                };
                gen::reply(&process, &from, reply);
            }
        }
    }
}

async fn xla_loop(mut process: Process, compute: Compute) {
    while let Some(signal) = process.recv().await {
        match signal {
            Signal::Message(message) => match gen::parse_call(message) {
                Ok((from, request)) => handle_call(&process, &compute, from, request),
                Err(other) => tracing::debug!("xla: ignoring message {other}"),
            },
            // The server traps exits: a linked client that dies must not take it down.
            Signal::Exit { from, reason, .. } => {
                tracing::debug!("xla: exit signal from {from}: {reason}")
            }
            // An owner of executables or buffers died or disconnected.
            Signal::Down {
                reference,
                object,
                reason,
            } => {
                let freed = compute.resources.owner_down(&reference);
                if !freed.is_empty() {
                    tracing::debug!(
                        "xla: {object} went down ({reason}); freeing {} resources",
                        freed.len()
                    );
                }
                compute.release(freed);
            }
        }
    }
}

/// Handles one request: the quick ones here, the ones that call XLA in `compute.rs`, which
/// reply from an executor thread.
fn handle_call(process: &Process, compute: &Compute, from: From, request: Term) {
    let reply = match Request::parse(request) {
        Ok(Request::Ping) => atom("pong"),
        Ok(Request::Echo(term)) => term,
        Ok(Request::Info) => ok(info(process.node(), compute)),
        Ok(Request::SpawnEcho) => {
            let worker = process.node().spawn_process();
            let pid = Term::from(worker.pid().clone());
            tokio::spawn(echo_loop(worker));
            ok(pid)
        }
        Ok(Request::Compile { program }) => return compute.compile(from, program),
        Ok(Request::Run(run)) => return compute.run(from, run),
        Ok(Request::ToDevice(tensor)) => return compute.to_device(from, tensor),
        Ok(Request::Read(buffer)) => return compute.read(from, buffer),
        Ok(Request::Free(reference)) => return compute.free(from, reference),
        Ok(Request::LoadKernel(request)) => return compute.load_kernel(from, request),
        Err(e) => e.to_reply(),
    };
    gen::reply(process, &from, reply);
}

fn info(node: &Node, compute: &Compute) -> Term {
    let peers = node.connected_nodes().iter().map(|n| atom(n)).collect();
    let mut entries = vec![
        ("node", atom(node.name())),
        (
            "version",
            crate::node::term::binary(env!("CARGO_PKG_VERSION").as_bytes().to_vec()),
        ),
        ("uptime_ms", int(node.uptime().as_millis() as i64)),
        ("peers", crate::node::term::list(peers)),
        ("processes", int(node.process_count() as i64)),
    ];
    entries.extend(compute.info());
    map(entries)
}

/// A map with atom keys.
pub fn map(entries: Vec<(&str, Term)>) -> Term {
    let map: HashMap<Term, Term> = entries.into_iter().map(|(k, v)| (atom(k), v)).collect();
    Term::from(Map::from(map))
}

/// A process that answers `:ping` and `{:echo, term}` like `:xla` and otherwise behaves like a
/// plain gen_server that does not trap exits: `GenServer.stop/2` and `Process.exit/2` end it with
/// the given reason, which its monitors and links then see. Used to exercise monitors and links.
async fn echo_loop(mut process: Process) {
    while let Some(signal) = process.recv().await {
        match signal {
            Signal::Message(message) => match gen::parse_call(message) {
                Ok((from, request)) => {
                    let reply = match as_tuple(&request, 2) {
                        Some([tag, term]) if as_atom(tag) == Some("echo") => term.clone(),
                        _ if as_atom(&request) == Some("ping") => atom("pong"),
                        _ => error_kind("bad_request", format!("unknown request {request}")),
                    };
                    gen::reply(&process, &from, reply);
                }
                // `:sys.terminate/3` (behind GenServer.stop) sends {:system, from, {:terminate, reason}}
                // and expects `:ok` before the process exits with that reason.
                Err(other) => {
                    if let Ok((from, request)) = gen::parse_system(other) {
                        if let Some([t, reason]) = as_tuple(&request, 2) {
                            if as_atom(t) == Some("terminate") {
                                gen::reply(&process, &from, atom("ok"));
                                return process.exit(reason.clone());
                            }
                        }
                    }
                }
            },
            Signal::Exit { reason, .. } => match as_atom(&reason) {
                Some("normal") => {}
                Some("kill") => return process.exit(atom("killed")),
                _ => return process.exit(reason),
            },
            Signal::Down { .. } => {}
        }
    }
}
