//! `net_kernel`: enough of it for `:net_adm.ping/1`, which calls it with `{:is_auth, node}` and
//! wants `:yes`.

use crate::node::gen;
use crate::node::term::{as_atom, as_tuple, atom, error_kind};
use crate::node::{Process, Signal};

pub async fn serve(mut process: Process) {
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
