//! Host callbacks end to end with real pieces: the real PJRT CPU plugin (`XLA_NODE_PJRT_PLUGIN`,
//! else the default install path), a real node on loopback registered with epmd, and real Elixir
//! nodes started with `elixir --sname` that act as callback servers. Programs run through the
//! XLA API the server uses, with a [`Dispatcher`] installed; the `:xla` server is not involved.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

mod common;

use common::{plugin, run_host};
use eetf::{Pid, Term};
use xla_node::dispatch::{Dispatcher, Outcome, RunCallbacks, RunHandle};
use xla_node::node::term::{as_atom, as_i64, as_list, atom, int, term_to_binary, tuple};
use xla_node::node::{Dest, Node, NodeConfig, Process, Signal};
use xla_node::xla::{Client, DType, Executable, HostTensor, XlaError};

const COOKIE: &str = "dispatch_test_cookie";

/// The callback servers' code. Roles: `server` (registered `:cb`, plus a one-shot `dier`),
/// `victim` (registered `:halter`, which halts its node when called).
const SCRIPT: &str = r#"
our = String.to_atom(System.fetch_env!("DISP_OUR_NODE"))
ctl = String.to_atom(System.fetch_env!("DISP_CTL"))
role = System.fetch_env!("DISP_ROLE")
which = String.to_integer(System.fetch_env!("DISP_WHICH"))

defmodule CB do
  def f32s(bin), do: for(<<x::float-32-native <- bin>>, do: x)
  def reply({pid, ref}, r), do: send(pid, {ref, r})

  def loop(log, which) do
    receive do
      {:exla_runtime_call, id, args, tag} ->
        log = record(log, id)
        spawn(fn -> handle(id, args, tag, which) end)
        loop(log, which)

      {:exla_outfeed, args} ->
        loop(Map.update(log, :outfeed, [args], &[args | &1]), which)

      {:exla_infeed, tag, spec} ->
        n = length(Map.get(log, :infeed, []))
        bins =
          Enum.map(spec, fn
            {{:s, 32}, dims} ->
              for i <- 1..Enum.product(dims), into: <<>>, do: <<n * 100 + i::signed-32-native>>

            {{:f, 32}, dims} ->
              for i <- 1..Enum.product(dims), into: <<>>, do: <<i * 0.5::float-32-native>>
          end)
        reply(tag, {:ok, bins})
        loop(Map.update(log, :infeed, [spec], &[spec | &1]), which)

      {:get_log, key, pid, ref} ->
        send(pid, {ref, Enum.reverse(Map.get(log, key, []))})
        loop(log, which)
    end
  end

  def record(log, {:io, key, n}), do: Map.update(log, key, [n], &[n | &1])
  def record(log, _), do: log

  def handle(:add_one, [{bin, {{:f, 32}, _}}], tag, _),
    do: reply(tag, {:ok, [for(x <- f32s(bin), into: <<>>, do: <<x + 1.0::float-32-native>>)]})

  def handle(:which, _, tag, which), do: reply(tag, {:ok, [<<which * 1.0::float-32-native>>]})
  def handle(:wrong_size, _, tag, _), do: reply(tag, {:ok, [<<0, 0, 0, 0>>]})
  def handle(:fail, _, tag, _), do: reply(tag, {:error, {:argument_error, "bad"}})
  def handle(:garbage, _, tag, _), do: reply(tag, :what)
  def handle(:never, _, _tag, _), do: :ok

  def handle(:late, [{bin, _}], tag, _) do
    Process.sleep(600)
    reply(tag, {:ok, [:binary.copy(<<0>>, byte_size(bin))]})
  end

  def handle({:io, _, _}, _, tag, _), do: reply(tag, {:ok, []})
  def handle(other, _, tag, _), do: reply(tag, {:error, {:unknown_callback, inspect(other)}})
end

dier =
  spawn(fn ->
    receive do
      {:exla_runtime_call, _, _, _} ->
        Process.sleep(300)
        exit(:boom)
    end
  end)

mortal =
  spawn(fn ->
    receive do
      :die -> exit(:bye)
    end
  end)

case role do
  "server" ->
    cb = spawn(fn -> CB.loop(%{}, which) end)
    Process.register(cb, :cb)

  "victim" ->
    halter =
      spawn(fn ->
        receive do
          {:exla_runtime_call, _, _, _} ->
            Process.sleep(300)
            :erlang.halt(0)
        end
      end)
    Process.register(halter, :halter)
end

send({ctl, our}, {:hello, node(), Process.whereis(:cb) || dier, dier, mortal})
Node.monitor(our, true)

receive do
  {:nodedown, _} -> :ok
after
  300_000 -> :ok
end

System.halt(0)
"#;

struct Peer {
    node: String,
    cb: Pid,
    dier: Pid,
    /// Exits with reason `:bye` when sent `:die`.
    mortal: Pid,
    child: Mutex<Child>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let mut c = self.child.lock().unwrap();
        let _ = c.kill();
        let _ = c.wait();
    }
}

struct Env {
    rt: tokio::runtime::Runtime,
    node: Node,
    client: Client,
    dispatcher: Arc<Dispatcher>,
    host: String,
    a: Peer,
    b: Peer,
}

fn short_host() -> String {
    let h = gethostname::gethostname().to_string_lossy().into_owned();
    h.split('.').next().unwrap().to_string()
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let _ = Command::new("epmd").arg("-daemon").status();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let host = short_host();
        let tag = std::process::id();
        let node = rt
            .block_on(Node::start(NodeConfig {
                name: format!("disp{tag}@{host}"),
                cookie: COOKIE.into(),
                listen_address: "127.0.0.1".parse().unwrap(),
                port_min: 0,
                port_max: 0,
                net_ticktime: Duration::from_secs(60),
                busy_wait: Duration::from_micros(200),
                tls: None,
                max_message_bytes: xla_node::node::frame::DEFAULT_MAX_MESSAGE_SIZE,
            }))
            .expect("start node");
        let client = Client::from_plugin(plugin()).expect("load the PJRT plugin");
        let dispatcher = Dispatcher::install(
            node.clone(),
            &client,
            Duration::from_secs(5),
            Duration::from_micros(200),
        );
        assert!(
            dispatcher.host_callbacks(),
            "the callback targets are registered on the CPU plugin: {:?}",
            dispatcher.unavailable_reason()
        );
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| start_peer(&node, &format!("dispa{tag}"), "server", 1));
            let b = s.spawn(|| start_peer(&node, &format!("dispb{tag}"), "server", 2));
            (a.join().unwrap(), b.join().unwrap())
        });
        Env {
            rt,
            node,
            client,
            dispatcher,
            host,
            a,
            b,
        }
    })
}

fn start_peer(node: &Node, sname: &str, role: &str, which: i32) -> Peer {
    let ctl_name = format!("ctl_{sname}");
    let mut ctl = node.spawn_process();
    assert!(ctl.register(&ctl_name));
    let child = Command::new("elixir")
        .args(["--sname", sname, "--cookie", COOKIE, "-e", SCRIPT])
        .env("DISP_OUR_NODE", node.name())
        .env("DISP_CTL", &ctl_name)
        .env("DISP_ROLE", role)
        .env("DISP_WHICH", which.to_string())
        .stdin(Stdio::null())
        .spawn()
        .expect("start elixir");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match ctl.recv_blocking_timeout(left) {
            Some(Signal::Message(Term::Tuple(t))) if as_atom(&t.elements[0]) == Some("hello") => {
                let pid = |i: usize| match &t.elements[i] {
                    Term::Pid(p) => p.clone(),
                    other => panic!("expected a pid, got {other}"),
                };
                return Peer {
                    node: as_atom(&t.elements[1]).unwrap().to_string(),
                    cb: pid(2),
                    dier: pid(3),
                    mortal: pid(4),
                    child: Mutex::new(child),
                };
            }
            Some(_) => continue,
            None => panic!("elixir peer {sname} did not say hello"),
        }
    }
}

impl Env {
    fn cb(&self, peer: &Peer) -> Dest {
        Dest::Remote {
            name: "cb".into(),
            node: peer.node.clone(),
        }
    }

    fn compile(&self, mlir: &str) -> Arc<Executable> {
        let exe = self
            .client
            .compile(mlir.as_bytes())
            .unwrap_or_else(|e| panic!("compile failed: {e}\n{mlir}"));
        Arc::new(exe)
    }

    /// Opens a run's callback context as the server does; returns it with the tensor the
    /// program's parameter 0 gets.
    fn open_run(
        &self,
        target: Option<Dest>,
        requester: Pid,
        timeout: Duration,
    ) -> (RunCallbacks, HostTensor) {
        let handle = RunHandle::next();
        let run = self
            .dispatcher
            .open_run(handle, target, requester, Some(timeout), None);
        (run, handle.tensor())
    }

    /// Asks peer's `:cb` for what it logged under `key`.
    fn log(&self, peer: &Peer, key: &str) -> Vec<Term> {
        let mut p = self.node.spawn_process();
        let r = self.node.make_ref();
        p.send(
            self.cb(peer),
            tuple(vec![
                atom("get_log"),
                atom(key),
                Term::from(p.pid().clone()),
                Term::from(r.clone()),
            ]),
        );
        loop {
            match p.recv_blocking_timeout(Duration::from_secs(10)) {
                Some(Signal::Message(Term::Tuple(t))) if matches!(&t.elements[0], Term::Reference(x) if **x == r) =>
                {
                    return as_list(&t.elements[1]).unwrap();
                }
                Some(_) => continue,
                None => panic!("no log reply"),
            }
        }
    }
}

// ---- module builders ---------------------------------------------------------------------------

/// `callback_id = array<i64: ...>, callback_id_size = N : ui64` for `id`, as EXLA writes it.
fn callback_id_attrs(id: &Term) -> String {
    let bytes = term_to_binary(id);
    let words: Vec<String> = bytes
        .chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            i64::from_ne_bytes(w).to_string()
        })
        .collect();
    format!(
        "callback_id = array<i64: {}>, callback_id_size = {} : ui64",
        words.join(", "),
        bytes.len()
    )
}

/// `y = runtime_call(id, x)` on `ty`, with the target operand of type `cb_ty`.
fn runtime_call_module(id: &Term, cb_ty: &str, ty: &str) -> String {
    format!(
        "module @cb {{
  func.func public @main(%cb: {cb_ty}, %x: {ty}) -> {ty} {{
    %0 = stablehlo.custom_call @exla_runtime_callback(%cb, %x) {{api_version = 4 : i32, has_side_effect = true, backend_config = {{{attrs}, num_aliased_data_outputs = 0 : ui64}}, output_operand_aliases = []}} : ({cb_ty}, {ty}) -> {ty}
    return %0 : {ty}
  }}
}}",
        attrs = callback_id_attrs(id)
    )
}

const CB8: &str = "tensor<8xui8>";
const F4: &str = "tensor<4xf32>";

fn f32s(data: &[u8]) -> Vec<f32> {
    data.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn cb_tensor(bytes: &[u8]) -> HostTensor {
    HostTensor::new(DType::U8, vec![bytes.len() as i64], bytes.to_vec())
}

fn x4() -> HostTensor {
    HostTensor::new(DType::F32, vec![4], f32_bytes(&[1.0, 2.0, 3.0, 4.0]))
}

fn run_err(exe: &Arc<Executable>, inputs: &[HostTensor]) -> String {
    match run_host(exe, inputs) {
        Ok(out) => panic!("run succeeded: {out:?}"),
        Err(XlaError::Runtime(m)) => m,
        Err(other) => panic!("not a runtime error: {other:?}"),
    }
}

fn requester(e: &Env) -> Process {
    e.node.spawn_process()
}

// ---- tests -------------------------------------------------------------------------------------

#[test]
fn runtime_call_in_exla_form() {
    let e = env();
    let exe = e.compile(&runtime_call_module(&atom("add_one"), CB8, F4));
    let req = requester(e);
    let before = e.dispatcher.stats();
    let (_run, handle) = e.open_run(
        Some(Dest::Pid(e.a.cb.clone())),
        req.pid().clone(),
        Duration::from_secs(5),
    );
    let out = run_host(&exe, &[handle.clone(), x4()]).unwrap();
    assert_eq!(f32s(&out[0].data), vec![2.0, 3.0, 4.0, 5.0]);
    // The executable and the run stay usable.
    let out = run_host(&exe, &[handle.clone(), out[0].clone()]).unwrap();
    assert_eq!(f32s(&out[0].data), vec![3.0, 4.0, 5.0, 6.0]);
    let after = e.dispatcher.stats();
    assert!(after.callbacks >= before.callbacks + 2);
    assert!(after.replies >= before.replies + 2);
    // Counted by outcome, each reply's round trip timed (other tests add to these meanwhile).
    assert!(after.ended(Outcome::Ok) >= before.ended(Outcome::Ok) + 2);
    assert!(after.round_trip.count() >= before.round_trip.count() + 2);
}

#[test]
fn targets_on_other_nodes_by_pid_name_and_term() {
    let e = env();
    let which = |target: Dest, requester: Pid| -> f32 {
        let exe = e.compile(&runtime_call_module(&atom("which"), CB8, "tensor<f32>"));
        let (_run, handle) = e.open_run(Some(target), requester, Duration::from_secs(5));
        let x = HostTensor::new(DType::F32, vec![], f32_bytes(&[0.0]));
        let out = run_host(&exe, &[handle.clone(), x]).unwrap();
        f32s(&out[0].data)[0]
    };
    let req = requester(e);
    // By pid and by {name, node}, whoever asked.
    assert_eq!(which(Dest::Pid(e.b.cb.clone()), req.pid().clone()), 2.0);
    assert_eq!(which(e.cb(&e.b), req.pid().clone()), 2.0);
    assert_eq!(which(e.cb(&e.a), e.b.cb.clone()), 1.0);
    // A bare name is registered on the requester's node: requester on B -> B's :cb.
    assert_eq!(which(Dest::Name("cb".into()), e.b.cb.clone()), 2.0);
    assert_eq!(which(Dest::Name("cb".into()), e.a.cb.clone()), 1.0);

    // Modules that carry term_to_binary(target) as a u8[N] operand.
    for (target, want) in [
        (Term::from(e.a.cb.clone()), 1.0),
        (tuple(vec![atom("cb"), atom(&e.b.node)]), 2.0),
    ] {
        let bytes = term_to_binary(&target);
        let cb_ty = format!("tensor<{}xui8>", bytes.len());
        let exe = e.compile(&runtime_call_module(&atom("which"), &cb_ty, "tensor<f32>"));
        let x = HostTensor::new(DType::F32, vec![], f32_bytes(&[0.0]));
        let out = run_host(&exe, &[cb_tensor(&bytes), x]).unwrap();
        assert_eq!(f32s(&out[0].data)[0], want);
    }
}

#[test]
fn reply_errors_fail_the_run_with_clear_text() {
    let e = env();
    let req = requester(e);
    let (_run, handle) = e.open_run(Some(e.cb(&e.a)), req.pid().clone(), Duration::from_secs(5));
    let h = handle;
    let before = e.dispatcher.stats();

    let exe = e.compile(&runtime_call_module(&atom("wrong_size"), CB8, F4));
    let err = run_err(&exe, &[h.clone(), x4()]);
    eprintln!("wrong size: {err}");
    assert!(err.contains("callback :wrong_size"), "{err}");
    assert!(
        err.contains("f32[4] (16 bytes)") && err.contains("4 bytes"),
        "{err}"
    );

    let exe = e.compile(&runtime_call_module(&atom("fail"), CB8, F4));
    let err = run_err(&exe, &[h.clone(), x4()]);
    eprintln!("error reply: {err}");
    assert!(
        err.contains("elixir callback returned argument_error: bad"),
        "{err}"
    );

    let exe = e.compile(&runtime_call_module(&atom("garbage"), CB8, F4));
    let err = run_err(&exe, &[h.clone(), x4()]);
    assert!(err.contains("callback :garbage replied :what"), "{err}");
    // Replies, each a callback that ended in error.
    let after = e.dispatcher.stats();
    assert!(after.ended(Outcome::Error) >= before.ended(Outcome::Error) + 3);

    // The run and the target keep working after failed callbacks.
    let exe = e.compile(&runtime_call_module(&atom("add_one"), CB8, F4));
    let out = run_host(&exe, &[h, x4()]).unwrap();
    assert_eq!(f32s(&out[0].data), vec![2.0, 3.0, 4.0, 5.0]);
}

#[test]
fn no_callback_server() {
    let e = env();
    let exe = e.compile(&runtime_call_module(&atom("add_one"), CB8, F4));
    let req = requester(e);
    // EXLA's "no callbacks" value.
    let err = run_err(&exe, &[cb_tensor(&[0; 8]), x4()]);
    assert!(
        err.contains("no callback server: pass the run option callback_server"),
        "{err}"
    );
    // A run without callback_server.
    let (run, handle) = e.open_run(None, req.pid().clone(), Duration::from_secs(5));
    let err = run_err(&exe, &[handle.clone(), x4()]);
    assert!(
        err.contains("no callback server: pass the run option callback_server"),
        "{err}"
    );
    // A closed run's handle.
    let stale = handle.clone();
    drop(run);
    let err = run_err(&exe, &[stale, x4()]);
    assert!(err.contains("no callback server"), "{err}");
    // Raw pid bytes from some VM.
    let err = run_err(&exe, &[cb_tensor(&[3, 0, 0, 0, 1, 0, 0, 0]), x4()]);
    assert!(err.contains("no callback server"), "{err}");
}

#[test]
fn target_dies_mid_wait() {
    let e = env();
    let exe = e.compile(&runtime_call_module(&atom("die"), CB8, F4));
    let req = requester(e);
    let (_run, handle) = e.open_run(
        Some(Dest::Pid(e.a.dier.clone())),
        req.pid().clone(),
        Duration::from_secs(20),
    );
    let before = e.dispatcher.stats();
    let t = Instant::now();
    let err = run_err(&exe, &[handle.clone(), x4()]);
    eprintln!("target died: {err} after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(5));
    let want = format!(
        "callback process #PID<0.{}.{}> on node {} exited: boom",
        e.a.dier.id, e.a.dier.serial, e.a.node
    );
    assert!(err.contains(&want), "{err}\nwanted: {want}");

    // A name nobody registered: noproc, at once.
    let (_run, handle) = e.open_run(
        Some(Dest::Remote {
            name: "nobody_here".into(),
            node: e.a.node.clone(),
        }),
        req.pid().clone(),
        Duration::from_secs(20),
    );
    let t = Instant::now();
    let err = run_err(&exe, &[handle.clone(), x4()]);
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(
        err.contains(&format!(
            "callback process {{:nobody_here, :{}}} is not registered (noproc)",
            e.a.node
        )),
        "{err}"
    );
    let after = e.dispatcher.stats();
    assert!(after.ended(Outcome::TargetDown) >= before.ended(Outcome::TargetDown) + 2);
}

#[test]
fn node_down_mid_wait() {
    let e = env();
    let sname = format!("dispv{}", std::process::id());
    let victim = start_peer(&e.node, &sname, "victim", 3);
    let exe = e.compile(&runtime_call_module(&atom("halt"), CB8, F4));
    let req = requester(e);
    let (_run, handle) = e.open_run(
        Some(Dest::Remote {
            name: "halter".into(),
            node: victim.node.clone(),
        }),
        req.pid().clone(),
        Duration::from_secs(20),
    );
    let t = Instant::now();
    let err = run_err(&exe, &[handle.clone(), x4()]);
    eprintln!("node down: {err} after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(err.contains("noconnection"), "{err}");
    assert!(err.contains(&victim.node), "{err}");
}

#[test]
fn timeout_and_late_replies() {
    let e = env();
    let req = requester(e);
    let (_run, handle) = e.open_run(
        Some(e.cb(&e.a)),
        req.pid().clone(),
        Duration::from_millis(300),
    );
    let h = handle;
    let exe = e.compile(&runtime_call_module(&atom("never"), CB8, F4));
    let before = e.dispatcher.stats();
    let t = Instant::now();
    let err = run_err(&exe, &[h.clone(), x4()]);
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(err.contains("callback timed out after 300 ms"), "{err}");
    let after = e.dispatcher.stats();
    assert!(after.ended(Outcome::Timeout) > before.ended(Outcome::Timeout));

    // A reply that arrives after its callback timed out (zeros, after 600 ms) must never be
    // taken for the reply of a later callback.
    let late = e.compile(&runtime_call_module(&atom("late"), CB8, F4));
    let err = run_err(&late, &[h.clone(), x4()]);
    assert!(err.contains("timed out"), "{err}");
    let add = e.compile(&runtime_call_module(&atom("add_one"), CB8, F4));
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(800) {
        let out = run_host(&add, &[h.clone(), x4()]).unwrap();
        assert_eq!(f32s(&out[0].data), vec![2.0, 3.0, 4.0, 5.0]);
    }
}

#[test]
fn requester_death_abandons_the_run() {
    let e = env();
    let req = requester(e);
    let (_run, handle) = e.open_run(Some(e.cb(&e.a)), req.pid().clone(), Duration::from_secs(20));
    let h = handle;
    let exe = e.compile(&runtime_call_module(&atom("never"), CB8, F4));
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        req.exit(atom("shutdown"));
    });
    let t = Instant::now();
    let err = run_err(&exe, &[h.clone(), x4()]);
    killer.join().unwrap();
    eprintln!("requester died: {err} after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(
        err.contains("abandoned") && err.contains("exited: shutdown"),
        "{err}"
    );
    // Later callbacks of the run fail at once.
    let add = e.compile(&runtime_call_module(&atom("add_one"), CB8, F4));
    let before = e.dispatcher.stats();
    let t = Instant::now();
    let err = run_err(&add, &[h, x4()]);
    assert!(t.elapsed() < Duration::from_secs(1));
    assert!(err.contains("abandoned"), "{err}");
    let after = e.dispatcher.stats();
    assert!(after.ended(Outcome::Abandoned) > before.ended(Outcome::Abandoned));
}

#[test]
fn remote_requester_death_abandons_the_run() {
    let e = env();
    let mortal = e.a.mortal.clone();
    let (_run, handle) = e.open_run(Some(e.cb(&e.b)), mortal.clone(), Duration::from_secs(20));
    let exe = e.compile(&runtime_call_module(&atom("never"), CB8, F4));
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let p = env().node.spawn_process();
        p.send(Dest::Pid(mortal), atom("die"));
    });
    let t = Instant::now();
    let err = run_err(&exe, &[handle.clone(), x4()]);
    killer.join().unwrap();
    eprintln!("remote requester died: {err} after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(5));
    let want = format!(
        "the process that asked for the run, #PID<0.{}.{}> on node {}, exited: bye",
        e.a.mortal.id, e.a.mortal.serial, e.a.node
    );
    assert!(err.contains(&want), "{err}");
}

#[test]
fn io_calls_run_in_program_order() {
    let e = env();
    let id = |n: i64| tuple(vec![atom("io"), atom("io_order"), int(n)]);
    let alias = |idx: usize, op: usize| {
        format!("#stablehlo.output_operand_alias<output_tuple_indices = [{idx}], operand_index = {op}, operand_tuple_indices = []>")
    };
    let io = |name: &str, args: &str, n: i64| {
        format!(
            "%{name}:2 = stablehlo.custom_call @exla_runtime_callback(%cb, {args}) {{api_version = 4 : i32, has_side_effect = true, backend_config = {{{attrs}, num_aliased_data_outputs = 2 : ui64}}, output_operand_aliases = [{a0}, {a1}]}} : (tensor<8xui8>, tensor<4xf32>, tensor<2xi64>) -> (tensor<4xf32>, tensor<2xi64>)",
            attrs = callback_id_attrs(&id(n)),
            a0 = alias(0, 1),
            a1 = alias(1, 2)
        )
    };
    let module = format!(
        "module @io {{
  func.func public @main(%cb: tensor<8xui8>, %x: tensor<4xf32>, %k: tensor<2xi64>) -> (tensor<4xf32>, tensor<2xi64>) {{
    {first}
    %y = stablehlo.add %a#0, %a#0 : tensor<4xf32>
    {second}
    return %b#0, %b#1 : tensor<4xf32>, tensor<2xi64>
  }}
}}",
        first = io("a", "%x, %k", 1),
        second = io("b", "%y, %a#1", 2)
    );
    let exe = e.compile(&module);
    let req = requester(e);
    let (_run, handle) = e.open_run(Some(e.cb(&e.a)), req.pid().clone(), Duration::from_secs(5));
    let k = HostTensor::new(
        DType::S64,
        vec![2],
        [7i64, -9].iter().flat_map(|v| v.to_le_bytes()).collect(),
    );
    let out = run_host(&exe, &[handle.clone(), x4(), k.clone()]).unwrap();
    assert_eq!(f32s(&out[0].data), vec![2.0, 4.0, 6.0, 8.0]);
    assert_eq!(out[1].data, k.data);
    let log: Vec<i64> = e
        .log(&e.a, "io_order")
        .iter()
        .map(|t| as_i64(t).unwrap())
        .collect();
    assert_eq!(log, vec![1, 2]);
}

#[test]
fn outfeed_streams_values_out() {
    let e = env();
    let module = |s_ty: &str| {
        format!(
            "module @out {{
  func.func public @main(%s: {s_ty}, %x: tensor<3xf32>) -> (tensor<ui8>, tensor<ui8>) {{
    %f1 = stablehlo.custom_call @exla_beam_outfeed(%s, %x) {{api_version = 4 : i32, has_side_effect = true}} : ({s_ty}, tensor<3xf32>) -> tensor<ui8>
    %y = stablehlo.multiply %x, %x : tensor<3xf32>
    %f2 = stablehlo.custom_call @exla_beam_outfeed(%s, %y, %f1) {{api_version = 4 : i32, has_side_effect = true}} : ({s_ty}, tensor<3xf32>, tensor<ui8>) -> tensor<ui8>
    return %f1, %f2 : tensor<ui8>, tensor<ui8>
  }}
}}"
        )
    };
    let x = HostTensor::new(DType::F32, vec![3], f32_bytes(&[1.0, 2.0, 3.0]));
    // To B's :cb through a run handle.
    let exe = e.compile(&module(CB8));
    let req = requester(e);
    let (_run, handle) = e.open_run(Some(e.cb(&e.b)), req.pid().clone(), Duration::from_secs(5));
    let out = run_host(&exe, &[handle.clone(), x.clone()]).unwrap();
    assert_eq!(
        (out[0].data.clone(), out[1].data.clone()),
        (vec![1], vec![1])
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let log = loop {
        let log = e.log(&e.b, "outfeed");
        if log.len() >= 2 || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(log.len(), 2, "{log:?}");
    let payload = |t: &Term, i: usize| -> (Vec<u8>, String) {
        let items = as_list(t).unwrap();
        let Term::Tuple(pair) = &items[i] else {
            panic!()
        };
        let Term::Binary(b) = &pair.elements[0] else {
            panic!()
        };
        (b.bytes.clone(), pair.elements[1].to_string())
    };
    assert_eq!(payload(&log[0], 0).0, f32_bytes(&[1.0, 2.0, 3.0]));
    assert_eq!(payload(&log[1], 0).0, f32_bytes(&[1.0, 4.0, 9.0]));
    assert_eq!(payload(&log[1], 1).0, vec![1]);
    assert!(
        payload(&log[0], 0).1.contains("'f'"),
        "{}",
        payload(&log[0], 0).1
    );

    // A dead local pid and an unregistered local name: the flag says 0.
    let dead = e.node.spawn_process().pid().clone();
    for target in [Term::from(dead), atom("nobody_registered_this")] {
        let bytes = term_to_binary(&target);
        let exe = e.compile(&module(&format!("tensor<{}xui8>", bytes.len())));
        let out = run_host(&exe, &[cb_tensor(&bytes), x.clone()]).unwrap();
        assert_eq!(
            (out[0].data.clone(), out[1].data.clone()),
            (vec![0], vec![0])
        );
    }
}

#[test]
fn infeed_asks_for_values() {
    let e = env();
    let module = "module @inf {
  func.func public @main(%s: tensor<8xui8>, %t: tensor<i32>) -> (tensor<3xi32>, tensor<2xf32>) {
    %0:2 = stablehlo.custom_call @exla_beam_infeed(%s, %t) {api_version = 4 : i32, has_side_effect = true} : (tensor<8xui8>, tensor<i32>) -> (tensor<3xi32>, tensor<2xf32>)
    return %0#0, %0#1 : tensor<3xi32>, tensor<2xf32>
  }
}";
    let exe = e.compile(module);
    let req = requester(e);
    let (_run, handle) = e.open_run(Some(e.cb(&e.b)), req.pid().clone(), Duration::from_secs(5));
    let tag = HostTensor::new(DType::S32, vec![], 0i32.to_le_bytes().to_vec());
    let ints = |d: &[u8]| -> Vec<i32> {
        d.chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let out1 = run_host(&exe, &[handle.clone(), tag.clone()]).unwrap();
    let out2 = run_host(&exe, &[handle.clone(), tag]).unwrap();
    let (a, b) = (ints(&out1[0].data), ints(&out2[0].data));
    // The stream numbers its answers: the second infeed gets the next value.
    assert_eq!(a[1] - a[0], 1);
    assert_eq!(b[0] - a[0], 100, "{a:?} {b:?}");
    assert_eq!(f32s(&out1[1].data), vec![0.5, 1.0]);
    let specs = e.log(&e.b, "infeed");
    assert!(specs.len() >= 2);
    assert_eq!(
        specs[0].to_string(),
        "[{{'s',32},[3]},{{'f',32},[2]}]".to_string()
    );
}

#[test]
fn while_loop_calls_back_many_times() {
    let e = env();
    let n = 10_000;
    let module = format!(
        "module @loop {{
  func.func public @main(%cb: tensor<8xui8>, %x: tensor<f32>) -> tensor<f32> {{
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %n = stablehlo.constant dense<{n}> : tensor<i32>
    %one = stablehlo.constant dense<1> : tensor<i32>
    %r:3 = stablehlo.while(%i = %c0, %acc = %x, %h = %cb) : tensor<i32>, tensor<f32>, tensor<8xui8>
      cond {{
        %lt = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %lt : tensor<i1>
      }} do {{
        %y = stablehlo.custom_call @exla_runtime_callback(%h, %acc) {{api_version = 4 : i32, has_side_effect = true, backend_config = {{{attrs}, num_aliased_data_outputs = 0 : ui64}}, output_operand_aliases = []}} : (tensor<8xui8>, tensor<f32>) -> tensor<f32>
        %i1 = stablehlo.add %i, %one : tensor<i32>
        stablehlo.return %i1, %y, %h : tensor<i32>, tensor<f32>, tensor<8xui8>
      }}
    return %r#1 : tensor<f32>
  }}
}}",
        attrs = callback_id_attrs(&atom("add_one"))
    );
    let exe = e.compile(&module);
    let req = requester(e);
    let (_run, handle) = e.open_run(Some(e.cb(&e.a)), req.pid().clone(), Duration::from_secs(5));
    let x = HostTensor::new(DType::F32, vec![], f32_bytes(&[0.0]));
    let t = Instant::now();
    let out = run_host(&exe, &[handle.clone(), x]).unwrap();
    let took = t.elapsed();
    eprintln!("{n} callbacks in {took:?} ({:?} each)", took / n as u32);
    assert_eq!(f32s(&out[0].data), vec![n as f32]);
}

#[test]
fn concurrent_runs() {
    let e = env();
    let exe = Arc::new(e.compile(&runtime_call_module(&atom("add_one"), CB8, F4)));
    let mut results: HashMap<usize, Vec<f32>> = HashMap::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let exe = exe.clone();
                s.spawn(move || {
                    let req = requester(e);
                    let peer = if i % 2 == 0 { &e.a } else { &e.b };
                    let (_run, handle) = e.open_run(
                        Some(Dest::Pid(peer.cb.clone())),
                        req.pid().clone(),
                        Duration::from_secs(10),
                    );
                    let mut x =
                        HostTensor::new(DType::F32, vec![4], f32_bytes(&[i as f32, 0.0, 1.0, 2.0]));
                    for _ in 0..100 {
                        x = run_host(&exe, &[handle.clone(), x]).unwrap().remove(0);
                    }
                    (i, f32s(&x.data))
                })
            })
            .collect();
        for h in handles {
            let (i, v) = h.join().unwrap();
            results.insert(i, v);
        }
    });
    for i in 0..4 {
        assert_eq!(results[&i], vec![i as f32 + 100.0, 100.0, 101.0, 102.0]);
    }
    let _ = (&e.rt, &e.host);
}
