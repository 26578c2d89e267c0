//! `:info`: what the node is, what it holds and what it has done, as one map (the keys are the
//! README's `:info` row).
//!
//! Built on the server's task from counters alone: answering never waits on XLA or a run. The
//! same counters are what `/metrics` shows (`metrics.rs`).

use super::state::State;
use crate::dispatch::Outcome;
use crate::metrics::Snapshot;
use crate::node::term::{atom, binary, boolean, int, list, map};
use crate::node::{probe, traffic};
use crate::schedule::run_probe;
use crate::xla::{loaded_kernels, DeviceMemory, LoadedKernel};
use eetf::{Float, Term};
use std::sync::atomic::Ordering::Relaxed;

/// The reply's map.
pub fn info(state: &State) -> Term {
    let node = state.node();
    let client = state.client();
    let compiles = state.executor_stats();
    let held = state.held();
    let scheduled = state.run_counts();
    let (runs, run_errors) = state.runs().counts();
    let (major, minor) = client.api().version();
    let peers = node.connected_nodes().iter().map(|n| atom(n)).collect();
    let devices = client.devices().iter().map(|d| text(d.name())).collect();
    let mut entries = vec![
        ("node", atom(node.name())),
        ("version", text(env!("CARGO_PKG_VERSION"))),
        ("uptime_ms", int(node.uptime().as_millis() as i64)),
        ("peers", list(peers)),
        ("processes", int(node.process_count() as i64)),
        ("platform", text(client.platform_name())),
        ("platform_version", text(client.platform_version())),
        ("devices", list(devices)),
        (
            "device_info",
            list(
                client
                    .device_memory()
                    .iter()
                    .enumerate()
                    .map(|(index, memory)| device(memory, state.device_runs().counts(index)))
                    .collect(),
            ),
        ),
        ("host_callbacks", boolean(state.host_callbacks().is_ok())),
        ("plugin", text(state.plugin().display().to_string())),
        ("max_message_bytes", int(node.max_message_bytes() as i64)),
        ("pjrt_api_version", text(format!("{major}.{minor}"))),
        ("executables", int(held.executables as i64)),
        ("buffers", int(held.buffers as i64)),
        ("buffer_bytes", int(held.buffer_bytes as i64)),
        (
            "max_device_bytes",
            match state.device_limit() {
                Some(limit) => int(limit as i64),
                None => atom("infinity"),
            },
        ),
        ("compiles", int(compiles.compiles as i64)),
        ("cache_hits", int(compiles.cache_hits as i64)),
        ("compile_errors", int(compiles.compile_errors as i64)),
        ("cached_executables", int(compiles.cached as i64)),
        ("cache_evictions", int(compiles.evictions as i64)),
        ("runs", int(runs as i64)),
        ("runs_running", int(scheduled.running as i64)),
        ("runs_queued", int(scheduled.queued as i64)),
        ("queue_timeouts", int(scheduled.queue_timeouts as i64)),
        ("run_errors", int(run_errors as i64)),
        ("callbacks", callbacks(state)),
        ("latency_us", latency(state)),
        ("tenants", tenants(state)),
        ("request_errors", request_errors(state)),
        ("traffic", traffic()),
        (
            "kernels",
            list(loaded_kernels().iter().map(kernel).collect()),
        ),
    ];
    // With XLA_NODE_RUN_TRACE=1: the median microseconds from the server's receipt of a run to
    // each of its steps (see `schedule::run_probe`).
    if let Some((samples, medians)) = run_probe::medians() {
        let names = run_probe::MEASURED.iter().map(|(_, name)| *name);
        entries.push(("run_trace", trace(samples, names.zip(medians))));
    }
    map(entries)
}

/// One device: its id and kind, the runs it executed and is executing, and its memory where
/// the plugin reports it (`nil` otherwise).
fn device(d: &DeviceMemory, (runs, running): (u64, u64)) -> Term {
    let bytes = |n: Option<i64>| n.map_or_else(|| atom("nil"), int);
    map(vec![
        ("id", int(d.id as i64)),
        ("kind", text(&d.kind)),
        ("runs", int(runs as i64)),
        ("running", int(running as i64)),
        ("bytes_in_use", bytes(d.bytes_in_use)),
        ("peak_bytes_in_use", bytes(d.peak_bytes_in_use)),
        ("bytes_limit", bytes(d.bytes_limit)),
    ])
}

/// The dispatcher's counters.
fn callbacks(state: &State) -> Term {
    let s = state.dispatch_stats();
    let mut entries = vec![
        ("sent", int(s.callbacks as i64)),
        ("replies", int(s.replies as i64)),
        ("errors", int(s.errors as i64)),
        ("timeouts", int(s.timeouts as i64)),
        ("reply_wait_us", int(s.reply_wait_us as i64)),
        ("pending", int(s.pending as i64)),
        ("outfeeds", int(s.outfeeds as i64)),
        ("open_runs", int(s.open_runs as i64)),
        ("ok", int(s.ended(Outcome::Ok) as i64)),
        ("error_replies", int(s.ended(Outcome::Error) as i64)),
        ("target_down", int(s.ended(Outcome::TargetDown) as i64)),
        ("abandoned", int(s.ended(Outcome::Abandoned) as i64)),
    ];
    // With XLA_NODE_CALLBACK_TRACE=1: the median microseconds from a custom call's start to
    // each step of its callback (see `node::probe`).
    if let Some((samples, medians)) = probe::medians() {
        let names = probe::MEASURED.iter().map(|(_, name)| *name);
        entries.push(("trace", trace(samples, names.zip(medians))));
    }
    map(entries)
}

/// How many durations there were, and their p50 and p99 in microseconds (0.0 before the first).
fn summary(snapshot: Snapshot) -> Term {
    let us = |q| snapshot.quantile(q).map_or(0.0, |d| d.as_secs_f64() * 1e6);
    map(vec![
        ("count", int(snapshot.count() as i64)),
        ("p50", Term::from(Float { value: us(0.5) })),
        ("p99", Term::from(Float { value: us(0.99) })),
    ])
}

/// A probe's medians: how many samples, and each step's median microseconds by its name.
fn trace<'a>(samples: usize, steps: impl Iterator<Item = (&'a str, f64)>) -> Term {
    let mut trace = vec![("samples", int(samples as i64))];
    trace.extend(steps.map(|(name, us)| (name, Term::from(Float { value: us }))));
    map(trace)
}

/// The p50 and p99, in microseconds, of the durations `/metrics` shows as histograms, with how
/// many there were; 0.0 before the first.
fn latency(state: &State) -> Term {
    map(vec![
        ("run", summary(state.runs().duration.snapshot())),
        ("queue_wait", summary(state.runs().queue_wait.snapshot())),
        ("compile", summary(state.compile_time().snapshot())),
        ("callback", summary(state.dispatch_stats().round_trip)),
    ])
}

/// Each client node seen so far, by name: its settings, its runs, the device memory it holds,
/// and its requests turned away by reason.
fn tenants(state: &State) -> Term {
    let tenants = state.tenants();
    let limit = |n: Option<u64>| n.map_or_else(|| atom("infinity"), |n| int(n as i64));
    map(tenants
        .iter()
        .map(|t| {
            let (buffers, in_flight) = state.device_bytes_of(&t.node);
            let settings = &t.settings;
            let refusals = t
                .refusals()
                .iter()
                .map(|&(why, n)| (why.as_str(), int(n as i64)))
                .collect();
            let entry = map(vec![
                ("rule", text(settings.rule.to_string())),
                ("weight", int(settings.weight.into())),
                ("max_device_bytes", limit(settings.max_device_bytes)),
                ("max_queued", limit(settings.max_queued.map(|n| n as u64))),
                ("runs", int(t.runs() as i64)),
                ("runs_running", int(t.running.load(Relaxed) as i64)),
                ("runs_queued", int(t.queued.load(Relaxed) as i64)),
                ("queue_wait_us", summary(t.queue_wait.snapshot())),
                ("device_bytes", int((buffers + in_flight) as i64)),
                ("buffer_bytes", int(buffers as i64)),
                ("in_flight_bytes", int(in_flight as i64)),
                ("refusals", map(refusals)),
            ]);
            (&*t.node, entry)
        })
        .collect())
}

/// Error replies sent, per kind.
fn request_errors(state: &State) -> Term {
    map(state
        .errors()
        .counts()
        .iter()
        .map(|&(kind, n)| (kind.as_str(), int(n as i64)))
        .collect())
}

/// Bytes and messages through the distribution connections.
fn traffic() -> Term {
    let t = traffic::totals();
    map(vec![
        ("received_bytes", int(t.received_bytes as i64)),
        ("sent_bytes", int(t.sent_bytes as i64)),
        ("received_messages", int(t.received_messages as i64)),
        ("sent_messages", int(t.sent_messages as i64)),
    ])
}

/// One loaded kernel.
fn kernel(k: &LoadedKernel) -> Term {
    map(vec![
        ("target", text(&k.target)),
        ("library", text(k.library.display().to_string())),
        ("symbol", text(&k.symbol)),
        (
            "ffi_version",
            text(format!("{}.{}", k.ffi_version.0, k.ffi_version.1)),
        ),
        ("shimmed", boolean(k.shimmed)),
    ])
}

/// A string as an Elixir string (a binary).
fn text(s: impl AsRef<str>) -> Term {
    binary(s.as_ref().as_bytes().to_vec())
}
