//! gen_server conventions on the wire, so that `GenServer.call/3` and `:gen_server.call/3` from
//! any node reach processes of this node.
//!
//! A call arrives as `{:"$gen_call", {caller_pid, tag}, request}`. OTP 24+ callers use the tag
//! `[:alias | monitor_ref]` and want the reply `{tag, reply}` sent to that alias (ALIAS_SEND): a
//! reply after the caller gave up is then dropped by the caller's node instead of polluting its
//! mailbox. Older callers use a plain reference tag and get a plain send to their pid.

use super::term::{as_atom, tuple};
use super::Process;
use eetf::{Pid, Term};

/// Who to reply to.
#[derive(Debug, Clone)]
pub struct From {
    pub pid: Pid,
    pub tag: Term,
}

/// Splits a `$gen_call` message into its sender and request.
pub fn parse_call(message: Term) -> Result<(From, Term), Term> {
    parse_tagged("$gen_call", message)
}

/// Splits a system message (`{:system, from, request}`, as `:sys` sends) the same way.
pub fn parse_system(message: Term) -> Result<(From, Term), Term> {
    parse_tagged("system", message)
}

fn parse_tagged(tag: &str, message: Term) -> Result<(From, Term), Term> {
    let Term::Tuple(t) = message else {
        return Err(message);
    };
    let mut e = t.elements;
    let tagged = e.len() == 3 && as_atom(&e[0]) == Some(tag);
    let from = match e.get(1) {
        Some(Term::Tuple(f)) if tagged && f.elements.len() == 2 => match &f.elements[0] {
            Term::Pid(pid) => Some(From {
                pid: pid.clone(),
                tag: f.elements[1].clone(),
            }),
            _ => None,
        },
        _ => None,
    };
    match from {
        Some(from) => Ok((from, e.pop().expect("three elements"))),
        None => Err(Term::from(eetf::Tuple::from(e))),
    }
}

/// Sends `{tag, reply}` the way the caller expects it.
pub fn reply(process: &Process, from: &From, reply: Term) {
    reply_from(process.node(), process.pid(), from, reply)
}

/// [`reply`] for code that holds only the node and the replying pid (worker threads).
pub fn reply_from(node: &super::Node, me: &Pid, from: &From, reply: Term) {
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
