//! The node's standing processes: `:xla`, the server the cluster calls, and `net_kernel`, which
//! answers `:net_adm.ping/1`.
//!
//! `:xla` speaks gen_server: `GenServer.call({:xla, node}, request)`. Its loop is below: each
//! call is parsed into a `Request` and applied to the server's `State`. Requests are handled
//! in the order they arrive, but anything that calls XLA (compiling, running, transfers,
//! freeing) is handed to executor threads and replied to from there, so the server itself never
//! blocks (see `crate::schedule` for where work executes and why, `watchdog.rs` for the check
//! that it holds).
//!
//! Files: `state` (what the server holds), `request` (the requests as a type, and which file
//! answers each), one file per request family (`compile`, `describe`, `run`, `buffers`, `holders`,
//! `load_kernel`, `info`, `echo`), `metrics` (the same figures for `--metrics-addr`), `parse` and `error`
//! (reading requests, error replies), `resources` (executables and buffers and their holders),
//! `device_budget` (`--max-device-bytes`), `watchdog`, `kernels` (the operator's kernel
//! settings), `plugin` (finding the PJRT plugin), `net_kernel`.

mod buffers;
mod compile;
mod describe;
mod device_budget;
mod echo;
mod error;
mod holders;
mod info;
pub mod kernels;
mod load_kernel;
mod metrics;
mod net_kernel;
mod parse;
mod plugin;
mod request;
mod resources;
mod run;
mod state;
mod transfer;
mod watchdog;

pub use plugin::locate_plugin;

use crate::dispatch::Dispatcher;
use crate::node::gen;
use crate::node::{Node, Process, Signal};
use crate::schedule::tenants::{TenantRules, Tenants};
use crate::schedule::{CallbackActivity, Scheduler};
use crate::xla::{Api, Client, CreateOption, Executor, IdlePolling};
use request::Request;
use state::{Settings, State};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub struct ServerConfig {
    pub plugin: PathBuf,
    /// The plugin's create options (`--preallocate`, `--pjrt-option`, ...).
    pub client_options: Vec<CreateOption>,
    pub callback_timeout: Duration,
    /// How long a thread waiting for a callback's reply polls before it sleeps.
    pub callback_spin: Duration,
    /// How long a run may wait for a place to execute (`None`: no limit) unless it says otherwise.
    pub queue_timeout: Option<Duration>,
    /// Kernels to load now, and what run-time loads may do.
    pub kernels: kernels::KernelPolicy,
    /// Device bytes that buffers kept and work in flight may take together; `None`: no bound.
    pub max_device_bytes: Option<u64>,
    /// Executables the compile cache keeps beyond those still held.
    pub max_executables: usize,
    /// What each client node gets (`--tenant`, `--tenant-config`).
    pub tenants: TenantRules,
}

/// Keeps the standing processes alive; dropping it stops them.
pub struct ServerHandle {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    state: Arc<State>,
}

impl ServerHandle {
    /// Renders the server's figures in the Prometheus text format, for the metrics endpoint.
    pub fn metrics(&self) -> crate::metrics::endpoint::Render {
        metrics::render(self.state.clone())
    }
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
    let client = Api::load(&config.plugin)
        .and_then(|api| Client::with_options(&api, &config.client_options))
        .map_err(|e| anyhow::anyhow!("cannot load PJRT plugin {}: {e}", config.plugin.display()))?;
    let options: Vec<String> = config
        .client_options
        .iter()
        .map(|o| o.to_string())
        .collect();
    tracing::info!(plugin = %config.plugin.display(), platform = client.platform_name(), devices = client.devices().len(), options = %options.join(" "), "XLA ready");
    let dispatcher = Dispatcher::install(
        node.clone(),
        &client,
        config.callback_timeout,
        config.callback_spin,
    );
    if let Some(reason) = dispatcher.unavailable_reason() {
        tracing::warn!(
            platform = client.platform_name(),
            "host callbacks off (:info's host_callbacks: false): {reason}; programs that call \
             back do not compile here, split them at their callbacks (XlaNode.Compiler does)"
        );
    }
    kernels::load_at_start(&client, &config.kernels)?;
    let net_kernel = node.spawn_registered("net_kernel");
    let xla = node.spawn_registered("xla");
    let calling_back = Arc::new(CallbackActivity::default());
    let idle_polling = IdlePolling {
        window: node.busy_window(),
        // Not while XLA's threads compute a run's program either: they keep the CPUs awake,
        // and a polling thread only takes time from them.
        allowed: {
            let (calling_back, node) = (calling_back.clone(), node.clone());
            Arc::new(move || calling_back.quiet() && !node.busy_wait_held())
        },
    };
    let executor = Executor::with_idle_polling(client, config.max_executables, idle_polling);
    let scheduler = Scheduler::new(
        executor.clone(),
        node.clone(),
        calling_back,
        Tenants::new(config.tenants),
    );
    let heartbeat = watchdog::start(
        node.runtime(),
        watchdog::Watched {
            scheduler: scheduler.clone(),
            dispatcher: dispatcher.clone(),
            executor: executor.clone(),
        },
    )?;
    let settings = Settings {
        plugin: config.plugin,
        queue_timeout: config.queue_timeout,
        kernels: config.kernels,
        max_device_bytes: config.max_device_bytes,
    };
    let state = State::new(
        node.clone(),
        xla.pid().clone(),
        executor,
        dispatcher,
        scheduler,
        settings,
    );
    let state = Arc::new(state);
    Ok(ServerHandle {
        tasks: vec![
            tokio::spawn(net_kernel::serve(net_kernel)),
            tokio::spawn(serve(xla, state.clone())),
            heartbeat,
        ],
        state,
    })
}

/// `:xla`'s loop.
async fn serve(mut process: Process, state: Arc<State>) {
    while let Some(signal) = process.recv().await {
        match signal {
            Signal::Message(message) => match gen::parse_call(message) {
                Ok((from, request)) => match Request::parse(request) {
                    Ok(request) => request.apply(&state, from),
                    Err(e) => state.reply_error(&from, &e),
                },
                Err(other) => match gen::parse_cast(other) {
                    Ok(request) => match Request::parse(request) {
                        Ok(request) => request.apply_cast(&state),
                        Err(e) => tracing::debug!("xla: ignoring cast: {e}"),
                    },
                    Err(other) => tracing::debug!("xla: ignoring message {other}"),
                },
            },
            // The server traps exits: a linked client that dies must not take it down.
            Signal::Exit { from, reason, .. } => {
                tracing::debug!("xla: exit signal from {from}: {reason}")
            }
            // A holder of executables or buffers died or disconnected.
            Signal::Down {
                reference,
                object,
                reason,
            } => {
                let freed = state.owner_down(&reference);
                if freed > 0 {
                    tracing::debug!(
                        "xla: {object} went down ({reason}); freeing {freed} resources"
                    );
                }
            }
        }
    }
}
