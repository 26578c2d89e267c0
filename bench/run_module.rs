//! Times StableHLO modules run through the CPU plugin in this process, without the network:
//! `cargo run --release --example run_module -- FILE... [--kernel TARGET=PATH:SYMBOL]... [--runs N]`.
//! The modules' parameters get zero-filled arguments; with several files, their runs alternate. Against `bench/run.sh kernels`, it tells
//! how much of a run's time is XLA itself and how much is the node and the network around it.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use xla_node::server::kernels::KernelArg;
use xla_node::server::locate_plugin;
use xla_node::xla::{load_kernel, Argument, Client, HostTensor, KernelSpec, Run};

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut files, mut kernels, mut runs) = (Vec::new(), Vec::new(), 21usize);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--kernel" => kernels.push(args.next().expect("--kernel TARGET=PATH:SYMBOL")),
            "--runs" => runs = args.next().and_then(|n| n.parse().ok()).expect("--runs N"),
            _ => files.push(arg),
        }
    }
    assert!(
        !files.is_empty(),
        "usage: run_module FILE... [--kernel TARGET=PATH:SYMBOL]... [--runs N]"
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
    let programs: Vec<_> = files
        .iter()
        .map(|file| {
            let text = std::fs::read(file).expect("module file");
            let exe = Arc::new(client.compile(&text).expect("compile"));
            let inputs: Vec<HostTensor> = exe
                .parameters()
                .iter()
                .map(|p| HostTensor::new(p.dtype, p.dims.clone(), vec![0; p.byte_size()]))
                .collect();
            (exe, inputs)
        })
        .collect();
    let mut times = vec![Vec::new(); files.len()];
    for _ in 0..runs.max(1) {
        for ((exe, inputs), times) in programs.iter().zip(&mut times) {
            let args = inputs.iter().cloned().map(Argument::Host).collect();
            let start = Instant::now();
            let run = Run::new(exe.clone(), vec![], args).expect("arguments");
            for out in run.execute().expect("run") {
                out.to_host().expect("read");
            }
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
