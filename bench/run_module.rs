//! Times StableHLO modules run through the CPU plugin in this process, without the network:
//! `cargo run --release --example run_module -- FILE... [--kernel TARGET=PATH:SYMBOL]... [--runs N]
//! [--devices N] [--on-device] [--gap-us N]`.
//! The modules' parameters get zero-filled arguments; with several files, their runs alternate.
//! Against `bench/run.sh kernels`, it tells how much of a run's time is XLA itself and how much is
//! the node and the network around it.
//!
//! `--devices N` compiles each module as one SPMD program over the first N devices (its sharding
//! annotations say how it splits; each partition gets its own arguments). `--on-device` places
//! the arguments on their devices once, as buffers a node holds, instead of sending host tensors
//! each run. `--gap-us N` leaves N microseconds between runs, as a caller's round trip does: the
//! plugin's threads may fall asleep meanwhile, which a run back to back never lets them.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use xla_node::server::kernels::KernelArg;
use xla_node::server::locate_plugin;
use xla_node::xla::{
    load_kernel, Argument, Client, CompileOptions, Executable, HostTensor, KernelSpec, Run,
};

/// One module, compiled, with its arguments: one list per partition (one list for a
/// single-device program).
struct Program {
    exe: Arc<Executable>,
    lists: Vec<Vec<Argument>>,
}

impl Program {
    /// One run with `lists` (a copy of `self.lists`: a run takes its arguments), its results
    /// read back.
    fn run(&self, mut lists: Vec<Vec<Argument>>) {
        let run = if self.exe.partition_devices().is_empty() {
            Run::new(self.exe.clone(), vec![], lists.remove(0))
        } else {
            Run::partitioned(self.exe.clone(), lists)
        };
        for out in run.expect("arguments").execute().expect("run") {
            out.to_host().expect("read");
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut files, mut kernels, mut runs) = (Vec::new(), Vec::new(), 21usize);
    let (mut devices, mut on_device, mut gap) = (0usize, false, Duration::ZERO);
    let number = |arg: Option<String>, flag: &str| -> u64 {
        arg.and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{flag} N"))
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--kernel" => kernels.push(args.next().expect("--kernel TARGET=PATH:SYMBOL")),
            "--runs" => runs = number(args.next(), "--runs") as usize,
            "--devices" => devices = number(args.next(), "--devices") as usize,
            "--on-device" => on_device = true,
            "--gap-us" => gap = Duration::from_micros(number(args.next(), "--gap-us")),
            _ => files.push(arg),
        }
    }
    assert!(
        !files.is_empty(),
        "usage: run_module FILE... [--kernel TARGET=PATH:SYMBOL]... [--runs N] [--devices N] \
         [--on-device] [--gap-us N]"
    );
    let plugin = std::env::var_os("XLA_NODE_PJRT_PLUGIN").map(PathBuf::from);
    let client =
        Client::from_plugin(locate_plugin(plugin.as_deref()).expect("plugin")).expect("plugin");
    for k in kernels {
        let k: KernelArg = k.parse().expect("--kernel");
        let spec = KernelSpec {
            target: k.target,
            library: k.library,
            symbol: k.symbol,
            version_shim: false,
        };
        load_kernel(&client, &spec).expect("kernel");
    }
    let programs: Vec<Program> = files
        .iter()
        .map(|file| program(&client, file, devices, on_device))
        .collect();
    let mut times = vec![Vec::new(); files.len()];
    for _ in 0..runs.max(1) {
        for (program, times) in programs.iter().zip(&mut times) {
            if !gap.is_zero() {
                std::thread::sleep(gap);
            }
            let lists = program.lists.clone();
            let start = Instant::now();
            program.run(lists);
            times.push(start.elapsed().as_nanos());
        }
    }
    for (file, mut times) in files.iter().zip(times) {
        times.sort();
        println!(
            "{file}: median {:.1} us over {} runs",
            times[times.len() / 2] as f64 / 1000.0,
            times.len()
        );
    }
}

/// Compiles `file` (over the first `devices` devices when that is over 0) and gives each of its
/// parameters a zero-filled argument, on its device if `on_device`.
fn program(client: &Client, file: &str, devices: usize, on_device: bool) -> Program {
    let text = std::fs::read(file).expect("module file");
    let exe = if devices == 0 {
        client.compile(&text)
    } else {
        let ids = (0..devices)
            .map(|d| {
                client
                    .device_id(d)
                    .expect("--devices: more than the plugin has")
            })
            .collect();
        client.compile_with_options(&text, &CompileOptions::partitioned(ids))
    };
    let exe = Arc::new(exe.expect("compile"));
    let places = if devices == 0 {
        vec![0]
    } else {
        exe.partition_devices().to_vec()
    };
    let lists = places
        .iter()
        .map(|&device| {
            exe.parameters()
                .iter()
                .map(|p| {
                    let zeros = vec![0; p.byte_size()];
                    if on_device {
                        let buffer = client
                            .buffer_from_host_on(&zeros, p.dtype, &p.dims, device)
                            .expect("argument on its device");
                        Argument::Device(Arc::new(buffer))
                    } else {
                        Argument::Host(HostTensor::new(p.dtype, p.dims.clone(), zeros))
                    }
                })
                .collect()
        })
        .collect();
    Program { exe, lists }
}
