//! `:spawn_echo`'s process: a plain gen_server on this node for clients to exercise monitors and
//! links against (`:ping` and `{:echo, term}` themselves are answered in `request.rs`).

use crate::node::gen;
use crate::node::term::{as_atom, as_tuple, atom, error_kind};
use crate::node::{Node, Process, Signal};
use eetf::Term;

/// Starts an echo process and returns its pid.
pub fn spawn(node: &Node) -> Term {
    let process = node.spawn_process();
    let pid = Term::from(process.pid().clone());
    tokio::spawn(echo_loop(process));
    pid
}

/// A process that answers `:ping` and `{:echo, term}` like `:xla` and otherwise behaves like a
/// plain gen_server that does not trap exits: `GenServer.stop/2` and `Process.exit/2` end it with
/// the given reason, which its monitors and links then see.
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
