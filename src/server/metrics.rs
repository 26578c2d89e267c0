//! What `--metrics-addr` serves: the node's figures as Prometheus metric families, read at each
//! scrape from the counters the node keeps anyway, the ones `:info` reports (`info.rs`). One
//! source per figure: nothing here counts.
//!
//! Names follow Prometheus' conventions: the `xla_node_` prefix, base units in the name
//! (`_seconds`, `_bytes`), `_total` on counters, and labels with a fixed set of values
//! (outcomes and error kinds). The README's metrics table lists them.

use super::error::ErrorKind;
use super::state::State;
use crate::dispatch::Outcome;
use crate::metrics::endpoint::Render;
use crate::metrics::Snapshot;
use crate::node::traffic;
use crate::schedule::tenants::Tenant;
use crate::xla::DeviceMemory;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::fmt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The exposition of `state`'s figures, rendered at each call.
pub fn render(state: Arc<State>) -> Render {
    let start_time = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_sub(state.node().uptime())
        .as_secs_f64();
    let mut registry = Registry::with_prefix("xla_node");
    registry.register_collector(Box::new(Families { state, start_time }));
    Arc::new(move || {
        let mut text = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut text, &registry)
            .expect("writing to a String cannot fail");
        text
    })
}

struct Families {
    state: Arc<State>,
    /// When the node started, in seconds since the Unix epoch.
    start_time: f64,
}

impl fmt::Debug for Families {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Families").finish_non_exhaustive()
    }
}

impl Collector for Families {
    fn encode(&self, mut out: DescriptorEncoder) -> fmt::Result {
        let state = &self.state;
        let client = state.client();
        let (major, minor) = client.api().version();
        let pjrt = format!("{major}.{minor}");
        let build = [
            ("version", env!("CARGO_PKG_VERSION")),
            ("platform", client.platform_name()),
            ("platform_version", client.platform_version()),
            ("pjrt_api_version", pjrt.as_str()),
        ];
        let mut info = out.encode_descriptor(
            "build_info",
            "The node's version and its XLA platform, as labels; always 1.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1i64).encode(info.encode_family(&build)?)?;
        gauge(
            &mut out,
            "start_time",
            "When the node started, since the Unix epoch.",
            Some(&Unit::Seconds),
            self.start_time,
        )?;

        let (runs, run_errors) = state.runs().counts();
        let scheduled = state.run_counts();
        counters(
            &mut out,
            "runs",
            "Runs answered, by outcome: ok; error (XLA's error, a failed callback, arguments \
             that do not fit the executable, a reference that names no executable or buffer); \
             timeout (no place within the run's queue_timeout); overloaded (refused: its client \
             node had its max_queued runs waiting).",
            "outcome",
            &[
                ("ok", runs - run_errors),
                ("error", run_errors),
                ("timeout", scheduled.queue_timeouts),
                ("overloaded", scheduled.overloaded),
            ],
        )?;
        histogram(
            &mut out,
            "run_duration",
            "Runs' time on their executor thread, from start to results in hand.",
            &state.runs().duration.snapshot(),
        )?;
        histogram(
            &mut out,
            "run_queue_wait",
            "Runs' time from the request's arrival to their start on an executor thread.",
            &state.runs().queue_wait.snapshot(),
        )?;
        gauge(
            &mut out,
            "runs_running",
            "Runs executing now.",
            None,
            scheduled.running as f64,
        )?;
        gauge(
            &mut out,
            "runs_queued",
            "Runs waiting for a place to execute.",
            None,
            scheduled.queued as f64,
        )?;

        let compiles = state.executor_stats();
        counters(
            &mut out,
            "compiles",
            "Compile requests answered, by outcome: compiled, cache_hit (the same module was \
             compiled before), error.",
            "outcome",
            &[
                ("compiled", compiles.compiles),
                ("cache_hit", compiles.cache_hits),
                ("error", compiles.compile_errors),
            ],
        )?;
        histogram(
            &mut out,
            "compile_duration",
            "Compile requests' time on their executor thread (cache hits included).",
            &state.compile_time().snapshot(),
        )?;
        gauge(
            &mut out,
            "cached_executables",
            "Executables in the compile cache.",
            None,
            compiles.cached as f64,
        )?;
        counter(
            &mut out,
            "cache_evictions",
            "Executables evicted from the compile cache (no client held them) to keep it within \
             --max-executables.",
            None,
            compiles.evictions,
        )?;

        let callbacks = state.dispatch_stats();
        let outcomes: Vec<(&str, u64)> = Outcome::ALL
            .iter()
            .map(|&o| (o.as_str(), callbacks.ended(o)))
            .collect();
        counters(
            &mut out,
            "callbacks",
            "Host callbacks ended, by outcome: ok; error (the reply was an error or did not fit \
             the program); timeout; target_down (not alive, exited or unreachable); abandoned \
             (the run's requester went away, or the node is shutting down).",
            "outcome",
            &outcomes,
        )?;
        histogram(
            &mut out,
            "callback_round_trip",
            "Host callbacks' round trip, from the request's write to the reply in the waiting \
             thread's hands.",
            &callbacks.round_trip,
        )?;
        gauge(
            &mut out,
            "callbacks_pending",
            "Host callbacks waiting for their reply now.",
            None,
            callbacks.pending as f64,
        )?;
        counter(
            &mut out,
            "callback_outfeeds",
            "Outfeed messages sent.",
            None,
            callbacks.outfeeds,
        )?;

        let held = state.held();
        gauge(
            &mut out,
            "executables",
            "Executables held for clients.",
            None,
            held.executables as f64,
        )?;
        gauge(
            &mut out,
            "buffers",
            "Device buffers held for clients.",
            None,
            held.buffers as f64,
        )?;
        gauge(
            &mut out,
            "buffer",
            "Bytes of the device buffers held for clients.",
            Some(&Unit::Bytes),
            held.buffer_bytes as f64,
        )?;
        gauge(
            &mut out,
            "device_in_flight",
            "Bytes reserved on the device by transfers and runs in flight (host arguments and \
             results), counted with the buffers held against --max-device-bytes.",
            Some(&Unit::Bytes),
            state.device_in_flight() as f64,
        )?;

        device_memory(&mut out, &client.device_memory())?;
        tenants(&mut out, state)?;

        let errors: Vec<(&str, u64)> = state
            .errors()
            .counts()
            .iter()
            .map(|&(kind, n)| (ErrorKind::as_str(kind), n))
            .collect();
        counters(
            &mut out,
            "request_errors",
            "Error replies of the :xla server, by kind (the README's error kinds).",
            "kind",
            &errors,
        )?;

        let moved = traffic::totals();
        let dist = [
            (
                "dist_received",
                "Bytes of distribution frames read from peers.",
                Some(&Unit::Bytes),
                moved.received_bytes,
            ),
            (
                "dist_sent",
                "Bytes written to peers' distribution connections.",
                Some(&Unit::Bytes),
                moved.sent_bytes,
            ),
            (
                "dist_received_messages",
                "Messages received from peers.",
                None,
                moved.received_messages,
            ),
            (
                "dist_sent_messages",
                "Messages sent to peers.",
                None,
                moved.sent_messages,
            ),
        ];
        for (name, help, unit, value) in dist {
            counter(&mut out, name, help, unit, value)?;
        }
        gauge(
            &mut out,
            "peers",
            "Nodes connected.",
            None,
            state.node().connected_nodes().len() as f64,
        )?;
        gauge(
            &mut out,
            "processes",
            "Processes of the node (servers, callback waiters, echo processes).",
            None,
            state.node().process_count() as f64,
        )
    }
}

/// Each client node's figures, one series per node (labelled `node`), as `:info`'s `tenants`.
fn tenants(out: &mut DescriptorEncoder, state: &State) -> fmt::Result {
    let tenants = state.tenants();
    if tenants.is_empty() {
        return Ok(());
    }
    type Figure = fn(&State, &Tenant) -> Option<i64>;
    let gauges: [(&str, &str, Option<Unit>, Figure); 5] = [
        (
            "tenant_runs_running",
            "Runs of each client node executing now.",
            None,
            |_, t| Some(t.running.load(Relaxed) as i64),
        ),
        (
            "tenant_runs_queued",
            "Runs of each client node waiting for a place.",
            None,
            |_, t| Some(t.queued.load(Relaxed) as i64),
        ),
        (
            "tenant_weight",
            "Each client node's weight: its share of the places when runs wait.",
            None,
            |_, t| Some(t.settings.weight.into()),
        ),
        (
            "tenant_device",
            "Device bytes each client node holds: its buffers and its transfers and runs in \
             flight, counted against its quota.",
            Some(Unit::Bytes),
            |state, t| {
                let (buffers, in_flight) = state.device_bytes_of(&t.node);
                Some((buffers + in_flight) as i64)
            },
        ),
        (
            "tenant_device_quota",
            "Each client node's device memory quota (--tenant ...:max_device_bytes), where it \
             has one.",
            Some(Unit::Bytes),
            |_, t| t.settings.max_device_bytes.map(|n| n as i64),
        ),
    ];
    for (name, help, unit, figure) in gauges {
        let mut family = out.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
        for t in &tenants {
            if let Some(value) = figure(state, t) {
                ConstGauge::new(value).encode(family.encode_family(&[("node", &*t.node)])?)?;
            }
        }
    }
    let mut runs = out.encode_descriptor(
        "tenant_runs",
        "Runs of each client node answered (with results or an error; not those refused).",
        None,
        MetricType::Counter,
    )?;
    for t in &tenants {
        ConstCounter::new(t.runs()).encode(runs.encode_family(&[("node", &*t.node)])?)?;
    }
    let mut refusals = out.encode_descriptor(
        "tenant_refusals",
        "Requests of each client node turned away, by reason: overloaded (max_queued runs \
         waiting), quota (over its max_device_bytes), resource_exhausted (over the node's \
         --max-device-bytes), timeout (no place within the run's queue_timeout).",
        None,
        MetricType::Counter,
    )?;
    for t in &tenants {
        for (why, n) in t.refusals() {
            let labels = [("node", &*t.node), ("reason", why.as_str())];
            ConstCounter::new(n).encode(refusals.encode_family(&labels)?)?;
        }
    }
    let mut waits = out.encode_descriptor(
        "tenant_run_queue_wait",
        "Each client node's runs' time from the request's arrival to their start on an \
         executor thread.",
        Some(&Unit::Seconds),
        MetricType::Histogram,
    )?;
    for t in &tenants {
        let snapshot = t.queue_wait.snapshot();
        waits
            .encode_family(&[("node", &*t.node)])?
            .encode_histogram::<NoLabelSet>(
                snapshot.sum().as_secs_f64(),
                snapshot.count(),
                &snapshot.exported_buckets(),
                None,
            )?;
    }
    Ok(())
}

fn gauge(
    out: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: f64,
) -> fmt::Result {
    let gauge = ConstGauge::new(value);
    gauge.encode(out.encode_descriptor(name, help, unit, gauge.metric_type())?)
}

/// Each device's memory as the plugin reports it, one series per device (labelled as `:info`'s
/// `devices` name it); a figure no device reports is left out.
fn device_memory(out: &mut DescriptorEncoder, devices: &[DeviceMemory]) -> fmt::Result {
    type Figure = fn(&DeviceMemory) -> Option<i64>;
    let figures: [(&str, &str, Figure); 3] = [
        (
            "device_memory_in_use",
            "Device memory in use, per device, as the PJRT plugin reports it.",
            |d| d.bytes_in_use,
        ),
        (
            "device_memory_peak",
            "The most device memory in use so far, per device, as the PJRT plugin reports it.",
            |d| d.peak_bytes_in_use,
        ),
        (
            "device_memory_limit",
            "Device memory the plugin's allocator may use, per device.",
            |d| d.bytes_limit,
        ),
    ];
    for (name, help, figure) in figures {
        let reported: Vec<(String, i64)> = devices
            .iter()
            .filter_map(|d| figure(d).map(|n| (d.name(), n)))
            .collect();
        if reported.is_empty() {
            continue;
        }
        let mut family =
            out.encode_descriptor(name, help, Some(&Unit::Bytes), MetricType::Gauge)?;
        for (device, n) in reported {
            ConstGauge::new(n).encode(family.encode_family(&[("device", device.as_str())])?)?;
        }
    }
    Ok(())
}

fn counter(
    out: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: u64,
) -> fmt::Result {
    let counter = ConstCounter::new(value);
    counter.encode(out.encode_descriptor(name, help, unit, counter.metric_type())?)
}

/// A counter with one label, one series per value.
fn counters(
    out: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, u64)],
) -> fmt::Result {
    let mut family = out.encode_descriptor(name, help, None, MetricType::Counter)?;
    for &(value, n) in values {
        ConstCounter::new(n).encode(family.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}

fn histogram(
    out: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    snapshot: &Snapshot,
) -> fmt::Result {
    let mut metric =
        out.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
    metric.encode_histogram::<NoLabelSet>(
        snapshot.sum().as_secs_f64(),
        snapshot.count(),
        &snapshot.exported_buckets(),
        None,
    )
}
