//! `xla_node`: start a hidden Erlang node that serves XLA to the cluster.
//!
//! Flags follow `erl` where one exists (`--sname`, `--name`, `--cookie`, the `inet_dist_*`
//! listen options, `net_ticktime`, `proto_dist` and `ssl_dist_optfile`), so that starting it feels
//! like starting any other node.

// As in the library (see src/lib.rs): `unsafe` belongs in `xla_node::xla` only.
#![deny(unsafe_code)]

use anyhow::Context;
use clap::Parser;
use std::io::IsTerminal;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use xla_node::byte_count::parse_bytes;
use xla_node::metrics;
use xla_node::node::frame::DEFAULT_MAX_MESSAGE_SIZE;
use xla_node::node::tls::TlsDist;
use xla_node::node::{cookie, Node, NodeConfig};
use xla_node::schedule::tenants::{TenantRule, TenantRules};
use xla_node::server::kernels::{KernelArg, KernelPolicy, VersionShim};
use xla_node::server::{self, ServerConfig};
use xla_node::shutdown::{self, StopRequests};
use xla_node::xla::{CreateOption, OptionValue};

/// Large messages allocate and free multi-MiB buffers all the time. glibc hands each one back to
/// the kernel and the next one page-faults in again; mimalloc reuses them. Built with its
/// `override` feature, it also serves `malloc`/`free` for the whole process, so the PJRT plugin's
/// device buffers (host memory on CPU) are reused too, and the node's resident memory under large
/// runs stays flat. What that saves: docs/performance.md, "Figures behind the code's choices".
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "A hidden Erlang node that compiles and runs XLA programs for the cluster"
)]
struct Cli {
    /// Short node name, as `erl -sname`: `xla` becomes `xla@<short hostname>`.
    #[arg(long, conflicts_with = "name", required_unless_present = "name")]
    sname: Option<String>,
    /// Long node name, as `erl -name`: `xla@host.domain` (or `xla`, completed with the hostname).
    #[arg(long)]
    name: Option<String>,
    /// Magic cookie; default: the contents of $HOME/.erlang.cookie (created if missing), as `erl`.
    #[arg(long, env = "XLA_NODE_COOKIE", hide_env_values = true)]
    cookie: Option<String>,
    /// Reads the magic cookie from the first line of standard input, so that it is in no
    /// command line and no environment (how `XlaNode.Local` and `XlaNode.Launcher.SSH` pass it);
    /// it takes the place of `--cookie` and `XLA_NODE_COOKIE`.
    #[arg(long)]
    cookie_from_stdin: bool,
    /// Stops the node, as SIGTERM does, when its standard input closes: a parent that holds
    /// the other end of the pipe (an Erlang port, `ssh`) closes it by exiting, however it exits.
    #[arg(long)]
    exit_on_stdin_close: bool,
    /// Address to listen on for distribution connections (kernel `inet_dist_use_interface`).
    #[arg(long, default_value = "0.0.0.0")]
    inet_dist_use_interface: IpAddr,
    /// Lowest listen port (kernel `inet_dist_listen_min`); 0 picks any free port.
    #[arg(long, default_value_t = 0)]
    inet_dist_listen_min: u16,
    /// Highest listen port (kernel `inet_dist_listen_max`); defaults to the minimum.
    #[arg(long)]
    inet_dist_listen_max: Option<u16>,
    /// Seconds of silence after which a peer is considered down (kernel `net_ticktime`).
    #[arg(long, default_value_t = 60)]
    net_ticktime: u64,
    /// Distribution carrier, as `erl -proto_dist`: plain TCP, or TLS for every connection in
    /// both directions (EPMD stays plain TCP, as in OTP).
    #[arg(long, value_enum, default_value_t = ProtoDist::InetTcp)]
    proto_dist: ProtoDist,
    /// OTP's TLS distribution option file, as `erl -ssl_dist_optfile`: `[{server, Opts},
    /// {client, Opts}].` with certfile, keyfile, cacertfile, verify, fail_if_no_peer_cert,
    /// server_name_indication, versions. Needs `--proto-dist inet_tls`.
    #[arg(long, value_name = "FILE")]
    ssl_dist_optfile: Option<PathBuf>,
    /// Largest message a peer may send, in bytes (suffixes K, M, G: KiB, MiB, GiB), fragments
    /// added up; a peer that sends a larger one is disconnected, everyone else is served on.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, default_value_t = DEFAULT_MAX_MESSAGE_SIZE)]
    max_message_bytes: usize,
    /// Device memory, in bytes (suffixes K, M, G), that buffers kept on the device and the
    /// transfers and runs in flight may take together; a `to_device` or run that would exceed it
    /// is answered `{:error, {:resource_exhausted, message}}` before anything is allocated.
    /// Default: no bound.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    max_device_bytes: Option<usize>,
    /// Compiled programs the compile cache keeps: beyond it, the least recently used ones that
    /// no client holds any more are destroyed (one still held is never evicted).
    #[arg(long, value_name = "N", default_value_t = xla_node::xla::DEFAULT_MAX_CACHED)]
    max_executables: usize,
    /// PJRT plugin to load (default: the CPU plugin installed by scripts/setup.sh).
    #[arg(long, env = "XLA_NODE_PJRT_PLUGIN")]
    pjrt_plugin: Option<PathBuf>,
    /// Whether the plugin takes most of the device's memory at start (the CUDA plugin's
    /// `preallocate` create option; XLA's default is true, 75% of each GPU). `false` allocates
    /// as buffers need it, so other processes can share the GPU.
    #[arg(long, value_name = "BOOL")]
    preallocate: Option<bool>,
    /// Fraction of each device's memory the plugin may use, in (0, 1] (the CUDA plugin's
    /// `memory_fraction` create option).
    #[arg(long, value_name = "F", value_parser = parse_fraction)]
    memory_fraction: Option<f32>,
    /// The devices the plugin uses, by their ids, as `CUDA_VISIBLE_DEVICES` does for JAX
    /// (the CUDA plugin's `visible_devices` create option).
    #[arg(long, value_name = "IDS", value_parser = parse_device_ids)]
    visible_devices: Option<Vec<i64>>,
    /// Any other create option of the plugin, as KEY=VALUE or KEY:TYPE=VALUE (TYPE: bool, int,
    /// ints, float, string; without it the value's form decides). Repeatable. An option the
    /// plugin does not know, or of the wrong type, stops start-up naming it.
    #[arg(long = "pjrt-option", value_name = "KEY=VALUE", value_parser = CreateOption::parse)]
    pjrt_options: Vec<CreateOption>,
    /// Default bound, in seconds, on the wait for each host callback's reply.
    #[arg(long, default_value_t = 60)]
    callback_timeout: u64,
    /// Default bound, in seconds, on the time a run waits for a place to execute when the node
    /// already runs as many as XLA can hold (a run's `queue_timeout` option overrides it);
    /// 0: no bound.
    #[arg(long, default_value_t = 60)]
    queue_timeout: u64,
    /// Microseconds a run waiting for a callback's reply polls for it (yielding the CPU) before
    /// its thread sleeps, when the target usually answers within that time; at most half the
    /// CPUs spin at once, the busy-wait thread included. 0: sleep at once.
    #[arg(long, env = "XLA_NODE_CALLBACK_SPIN_US", default_value_t = 200)]
    callback_spin_us: u64,
    /// Microseconds one thread keeps a CPU busy (yielding it to any thread with work) after each
    /// message the node sends, so that the next request finds a CPU awake, as the
    /// BEAM's scheduler busy wait (`erl +sbwt`); also how long an executor thread polls for its
    /// next job after one (unless runs that call back are about), so that a run handed to it
    /// needs no wake-up. 0: never.
    #[arg(long, env = "XLA_NODE_BUSY_WAIT_US", default_value_t = 200)]
    busy_wait_us: u64,
    /// Loads an XLA FFI kernel before the node accepts connections: the handler exported as
    /// SYMBOL by the shared library PATH serves `stablehlo.custom_call @TARGET`. Repeatable; any
    /// failure stops start-up.
    #[arg(long = "kernel", value_name = "TARGET=PATH:SYMBOL")]
    kernels: Vec<KernelArg>,
    /// Lets clients load kernels at run time (`XlaNode.load_kernel/5`) from libraries under DIR
    /// (repeatable). Without it, run-time loading is refused.
    #[arg(long = "kernel-dir", value_name = "DIR")]
    kernel_dirs: Vec<PathBuf>,
    /// Loads kernels built against a newer XLA FFI than the plugin's by answering their version
    /// query in their place: safe only for kernels without FFI state. Bare: every kernel;
    /// `=TARGET` (repeatable): that kernel only.
    #[arg(long = "kernel-version-shim", value_name = "TARGET", num_args = 0..=1, default_missing_value = "")]
    kernel_version_shim: Vec<String>,
    /// Serves `GET /metrics` (Prometheus text format) at HOST:PORT, on a thread of its own.
    /// Off by default.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<String>,
    /// What the client nodes a pattern names get, each for itself: `weight` (its share of the
    /// places when runs wait, 1 to 1000, default 1), `max_device_bytes` (its device memory quota;
    /// suffixes K, M, G; default none), `max_queued` (runs it may have waiting before more are
    /// refused as overloaded; default none). The pattern is a node name with `*` and `?`
    /// (without `@`: on any host), or `default` for the nodes no other pattern names and the
    /// keys a rule leaves unset. Repeatable; the first matching pattern applies.
    #[arg(long = "tenant", value_name = "NODE_PATTERN:KEY=VALUE,...", value_parser = TenantRule::parse_flag)]
    tenants: Vec<TenantRule>,
    /// The same rules in a file of Erlang terms, as `erl -config` reads:
    /// `[{"web*@*", [{weight, 3}, {max_device_bytes, "8G"}]}, {default, [{max_queued, 100}]}].`
    /// `--tenant` flags apply after it, and override the keys they set for a pattern it has.
    #[arg(long, value_name = "FILE")]
    tenant_config: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
#[value(rename_all = "snake_case")]
enum ProtoDist {
    /// Plain TCP (`inet_tcp`).
    InetTcp,
    /// TLS over TCP (`inet_tls`), configured by `--ssl-dist-optfile`.
    InetTls,
}

/// A fraction of device memory: a number in (0, 1].
fn parse_fraction(text: &str) -> Result<f32, String> {
    text.trim()
        .parse::<f32>()
        .ok()
        .filter(|f| *f > 0.0 && *f <= 1.0)
        .ok_or_else(|| format!("{text:?} is not a fraction in (0, 1]"))
}

/// Device ids separated by commas: `0,2`.
fn parse_device_ids(text: &str) -> Result<Vec<i64>, String> {
    xla_node::xla::parse_ints(text)
        .filter(|ids| !ids.is_empty() && ids.iter().all(|&id| id >= 0))
        .ok_or_else(|| format!("{text:?} is not a list of device ids (e.g. 0,2)"))
}

/// The plugin's create options, the named flags first; a name given twice stops start-up.
fn client_options(cli: &Cli) -> anyhow::Result<Vec<CreateOption>> {
    let mut options = Vec::new();
    if let Some(b) = cli.preallocate {
        options.push(CreateOption::new("preallocate", OptionValue::Bool(b)));
    }
    if let Some(f) = cli.memory_fraction {
        options.push(CreateOption::new("memory_fraction", OptionValue::Float(f)));
    }
    if let Some(ids) = &cli.visible_devices {
        options.push(CreateOption::new(
            "visible_devices",
            OptionValue::IntList(ids.clone()),
        ));
    }
    for option in &cli.pjrt_options {
        if options.iter().any(|o| o.name == option.name) {
            anyhow::bail!("the plugin option {} is given twice", option.name);
        }
        options.push(option.clone());
    }
    Ok(options)
}

/// The TLS settings, read before the node starts: any problem with them stops start-up.
fn tls_settings(cli: &Cli) -> anyhow::Result<Option<Arc<TlsDist>>> {
    match (cli.proto_dist, &cli.ssl_dist_optfile) {
        (ProtoDist::InetTcp, None) => Ok(None),
        (ProtoDist::InetTcp, Some(_)) => {
            anyhow::bail!("--ssl-dist-optfile applies to TLS distribution: add --proto-dist inet_tls")
        }
        (ProtoDist::InetTls, None) => anyhow::bail!(
            "--proto-dist inet_tls needs --ssl-dist-optfile FILE (certificates and keys, as for erl)"
        ),
        (ProtoDist::InetTls, Some(path)) => Ok(Some(Arc::new(TlsDist::from_optfile(path)?))),
    }
}

fn full_name(cli: &Cli) -> anyhow::Result<String> {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    Ok(match (&cli.sname, &cli.name) {
        (Some(s), _) if s.contains('@') => s.clone(),
        (Some(s), _) => format!("{s}@{}", host.split('.').next().unwrap_or(&host)),
        (None, Some(n)) if n.contains('@') => n.clone(),
        (None, Some(n)) => format!("{n}@{host}"),
        (None, None) => anyhow::bail!("give --sname or --name"),
    })
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("XLA_NODE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: a log file or a supervisor's journal gets plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    // First of all: a parent waiting to write the cookie must not wait on anything else. It
    // writes it once asked (`COOKIE_PROMPT`).
    let stdin_cookie = cli
        .cookie_from_stdin
        .then(|| {
            eprintln!("{}", shutdown::COOKIE_PROMPT);
            shutdown::read_cookie(&mut std::io::stdin().lock())
        })
        .transpose()?;
    let tls = tls_settings(&cli)?;
    let plugin = server::locate_plugin(cli.pjrt_plugin.as_deref())?;
    let client_options = client_options(&cli)?;
    let tenants = TenantRules::build(cli.tenant_config.as_deref(), &cli.tenants)
        .map_err(anyhow::Error::msg)?;
    let config = NodeConfig {
        name: full_name(&cli)?,
        cookie: match stdin_cookie.or_else(|| cli.cookie.clone()) {
            Some(c) => c,
            None => cookie::load_or_create().context("reading $HOME/.erlang.cookie")?,
        },
        listen_address: cli.inet_dist_use_interface,
        port_min: cli.inet_dist_listen_min,
        port_max: cli.inet_dist_listen_max.unwrap_or(cli.inet_dist_listen_min),
        net_ticktime: Duration::from_secs(cli.net_ticktime.max(1)),
        busy_wait: Duration::from_micros(cli.busy_wait_us),
        tls,
        max_message_bytes: cli.max_message_bytes,
    };
    let metrics = cli
        .metrics_addr
        .as_deref()
        .map(metrics::endpoint::bind)
        .transpose()?;
    let stop = StopRequests::new();
    stop.watch_signals()?;
    if cli.exit_on_stdin_close {
        // The rest of the input, after the cookie's line where there was one (`Stdin` buffers
        // for the whole process, so nothing read ahead is lost).
        stop.watch_input(std::io::stdin())?;
    }
    // Deep (but accepted) terms are decoded and dropped recursively: give threads room.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(16 << 20)
        .build()?;
    runtime.block_on(async move {
        let node = Node::bind(config).await?;
        let server = server::start(
            &node,
            ServerConfig {
                plugin,
                client_options,
                callback_timeout: Duration::from_secs(cli.callback_timeout),
                callback_spin: Duration::from_micros(cli.callback_spin_us),
                queue_timeout: (cli.queue_timeout > 0)
                    .then(|| Duration::from_secs(cli.queue_timeout)),
                kernels: KernelPolicy {
                    kernels: cli.kernels,
                    dirs: cli.kernel_dirs,
                    version_shim: VersionShim::from_flags(&cli.kernel_version_shim),
                },
                max_device_bytes: cli.max_device_bytes.map(|n| n as u64),
                max_executables: cli.max_executables,
                tenants,
            },
        )?;
        let _metrics = metrics.map(|m| m.serve(server.metrics())).transpose()?;
        node.start_accepting();
        let reason = stop.first().await;
        tracing::info!("{reason}: shutting down");
        shutdown::bound_shutdown(reason);
        node.shutdown().await;
        drop(server);
        Ok::<_, anyhow::Error>(())
    })?;
    // Executor threads may still be finishing a run; the process exits without waiting for them.
    std::process::exit(0)
}
