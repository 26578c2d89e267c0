//! gen_server conventions on the wire, so that `GenServer.call/3` and `:gen_server.call/3` from
//! any node reach processes of this node.
//!
//! A call arrives as `{:"$gen_call", {caller_pid, tag}, request}`. OTP 24+ callers use the tag
//! `[:alias | monitor_ref]` and want the reply `{tag, reply}` sent to that alias (ALIAS_SEND): a
//! reply after the caller gave up is then dropped by the caller's node instead of polluting its
//! mailbox. Older callers use a plain reference tag and get a plain send to their pid.

use super::term::{as_atom, as_tuple, decode_at, head, tuple, Decoded};
use super::Process;
use eetf::{Pid, Term};

/// The caller of a gen_server call, `{pid, tag}` (gen_server's `From`): who to reply to.
#[derive(Debug, Clone)]
pub struct Caller {
    pub pid: Pid,
    pub tag: Term,
}

/// Splits a `$gen_call` message into its sender and request.
pub fn parse_call(message: Term) -> Result<(Caller, Term), Term> {
    parse_tagged("$gen_call", message)
}

/// The request of a `$gen_cast` message (`{:"$gen_cast", request}`, as `GenServer.cast` sends).
pub fn parse_cast(message: Term) -> Result<Term, Term> {
    match message {
        Term::Tuple(t) if t.elements.len() == 2 && as_atom(&t.elements[0]) == Some("$gen_cast") => {
            let mut elements = t.elements;
            Ok(elements.pop().expect("two elements"))
        }
        other => Err(other),
    }
}

/// The caller of a `$gen_call` read from its encoded bytes at `at` (a term without version byte)
/// when only the request, its last element, could not be decoded: the tuple's header, the
/// `:"$gen_call"` atom and the `{pid, tag}` are decoded one by one and must be sound; what
/// follows is not looked at. `None` if the bytes are not such a call.
pub fn call_envelope(bytes: &[u8], at: usize) -> Option<Caller> {
    let tuple_head = head(bytes, at, bytes.len()).ok()?;
    // SMALL_TUPLE_EXT or LARGE_TUPLE_EXT of three elements.
    if !matches!(tuple_head.tag, 104 | 105) || tuple_head.children != 3 {
        return None;
    }
    let Decoded { term: tag, end, .. } = decode_at(bytes, tuple_head.end).ok()?;
    if as_atom(&tag) != Some("$gen_call") {
        return None;
    }
    let Decoded { term: from, .. } = decode_at(bytes, end).ok()?;
    let Term::Tuple(from) = from else { return None };
    match <[Term; 2]>::try_from(from.elements) {
        Ok([Term::Pid(pid), tag]) => Some(Caller { pid, tag }),
        _ => None,
    }
}

/// Splits a system message (`{:system, from, request}`, as `:sys` sends) the same way.
pub fn parse_system(message: Term) -> Result<(Caller, Term), Term> {
    parse_tagged("system", message)
}

/// The caller of a `$gen_call` message, without taking the message apart.
pub fn call_from(message: &Term) -> Option<Caller> {
    tagged_from("$gen_call", message)
}

fn tagged_from(tag: &str, message: &Term) -> Option<Caller> {
    let [t, from, _] = as_tuple(message, 3)? else {
        return None;
    };
    match (as_atom(t), as_tuple(from, 2)?) {
        (Some(t), [Term::Pid(pid), tag_term]) if t == tag => Some(Caller {
            pid: pid.clone(),
            tag: tag_term.clone(),
        }),
        _ => None,
    }
}

fn parse_tagged(tag: &str, message: Term) -> Result<(Caller, Term), Term> {
    match (tagged_from(tag, &message), message) {
        (Some(from), Term::Tuple(mut t)) => Ok((from, t.elements.pop().expect("three elements"))),
        (_, message) => Err(message),
    }
}

/// Sends `{tag, reply}` the way the caller expects it.
pub fn reply(process: &Process, from: &Caller, reply: Term) {
    reply_from(process.node(), process.pid(), from, reply)
}

/// [`reply`] for code that holds only the node and the replying pid (worker threads).
pub fn reply_from(node: &super::Node, me: &Pid, from: &Caller, reply: Term) {
    let message = tuple(vec![from.tag.clone(), reply]);
    match &from.tag {
        Term::ImproperList(l)
            if l.elements.len() == 1 && as_atom(&l.elements[0]) == Some("alias") =>
        {
            if let Term::Reference(alias) = &*l.last {
                return node.send_alias(me, alias, message);
            }
            node.send(me, from.pid.clone().into(), message)
        }
        _ => node.send(me, from.pid.clone().into(), message),
    }
}
