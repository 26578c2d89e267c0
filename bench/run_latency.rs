//! Times the phases of a tiny run on the CPU plugin (upload, execute, read back), without the
//! network: `cargo run --release --example run_latency`. Tells how much of `bench/run.sh xla`
//! is XLA itself.
//!
//! Before each timed step, `COLD=1` evicts the data caches (as the network work between two
//! requests does), and `IDLE_US=N` sleeps N µs (as a server waiting for its next request does).
//! On the 2-core VM these benchmarks ran on, 20 µs of sleep made the server's path 4 times slower
//! (2.5 → 10 µs) and spinning for as long did not: the virtual CPU loses its caches when it idles.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use xla_node::server::locate_plugin;
use xla_node::xla::{Argument, Client, DType, HostTensor, Run};

fn main() {
    let plugin = std::env::var_os("XLA_NODE_PJRT_PLUGIN").map(PathBuf::from);
    let client =
        Client::from_plugin(locate_plugin(plugin.as_deref()).expect("plugin")).expect("plugin");
    let mlir = "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %one = stablehlo.constant dense<1.0> : tensor<4xf32>
  %y = stablehlo.add %x, %one : tensor<4xf32>
  return %y : tensor<4xf32>
}";
    let exe = Arc::new(client.compile(mlir.as_bytes()).expect("compile"));
    let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let n = 20000;
    let cold = std::env::var_os("COLD").is_some();
    let idle = std::env::var("IDLE_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_micros);
    let mut trash = vec![0u8; 8 << 20];
    let tensor = HostTensor::new(DType::F32, vec![4], data.clone());
    let (mut up, mut ex, mut rd, mut fr, mut whole) = (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..n {
        between_runs(&mut trash, i, cold, idle);
        let t0 = Instant::now();
        let b = Arc::new(client.buffer_from_host(&data, DType::F32, &[4]).unwrap());
        let t1 = Instant::now();
        let run = Run::new(exe.clone(), vec![], vec![Argument::Device(b)]).unwrap();
        let out = run.execute().unwrap();
        let t2 = Instant::now();
        let v = out[0].to_host().unwrap();
        let t3 = Instant::now();
        drop(out);
        drop(run);
        let t4 = Instant::now();
        assert_eq!(v.len(), 16);
        // The server's path: a host argument checked and run (reused input buffers on CPU),
        // read back, free.
        let argument = Argument::Host(tensor.clone());
        between_runs(&mut trash, i, cold, idle);
        let t5 = Instant::now();
        let out = Run::new(exe.clone(), vec![], vec![argument])
            .unwrap()
            .execute()
            .unwrap();
        let v = out[0].to_host().unwrap();
        drop(out);
        whole.push(t5.elapsed().as_nanos());
        assert_eq!(v.len(), 16);
        up.push((t1 - t0).as_nanos());
        ex.push((t2 - t1).as_nanos());
        rd.push((t3 - t2).as_nanos());
        fr.push((t4 - t3).as_nanos());
    }
    let phases = [("upload", up), ("execute", ex), ("read", rd), ("free", fr)];
    for (name, mut v) in phases
        .into_iter()
        .chain([("run, read and free (server path)", whole)])
    {
        v.sort();
        println!(
            "{name}: median {:.1} us, p90 {:.1} us",
            v[n / 2] as f64 / 1000.0,
            v[n * 9 / 10] as f64 / 1000.0
        );
    }
}

/// What happens between two timed steps: nothing, a cache eviction (writing every cache line of
/// `trash`), a sleep.
fn between_runs(trash: &mut [u8], i: usize, cold: bool, idle: Option<Duration>) {
    if cold {
        trash
            .iter_mut()
            .step_by(64)
            .for_each(|b| *b = b.wrapping_add(i as u8));
    }
    if let Some(idle) = idle {
        std::thread::sleep(idle);
    }
}
