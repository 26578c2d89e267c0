//! What an incoming control message does on this node: deliver a message, set or remove a
//! monitor or link, or pass an exit signal to a process. Mirrors the BEAM's behaviour where a
//! peer can observe it: a monitor of a process that is not there is answered at once with
//! `noproc`, as is a link to one (EXIT `noproc`), and UNLINK_ID is acknowledged.
//!
//! A message whose payload could not be decoded fails alone: a `$gen_call` is answered
//! `{:error, {:bad_request, message}}` in the name of the process it was for, an exit signal or
//! monitor exit arrives with the reason `{:undecodable, message}`, anything else is dropped; each
//! with one log line naming the peer. A `$gen_call` holding an OTP 29 native record is answered
//! `{:error, {:argument_error, message}}`: no process of this node can use one.
//!
//! One function per control message, named as in the Erlang documentation ("Protocol between
//! connected nodes") and in `erl_dist`'s `message` module; each finds its local process through
//! the process table's one lookup.

use super::control::{altact, AltactTarget, ControlError, ControlMessage, ProcRef};
use super::frame::Message;
use super::gen::{self, Caller};
use super::message::PayloadError;
use super::native_record;
use super::process::Signal;
use super::process_table::{Local, Watcher};
use super::term::{atom, binary, error_kind, list, tuple};
use super::Node;
use eetf::{Atom, Pid, Reference, Term};

/// Decodes the control message of `message` from `peer` and applies it.
pub fn handle(node: &Node, peer: &str, message: Message) -> Result<(), ControlError> {
    let Message {
        control,
        mut payload,
        payload_error,
        native_records,
    } = message;
    let control = ControlMessage::from_term(control, &mut payload)?;
    if let Some(failed) = payload_error {
        undecodable_payload(node, peer, control, failed);
        return Ok(());
    }
    // A SEND without a message cannot come from a BEAM; `[]` keeps the receiver's match simple.
    let message = payload.unwrap_or_else(|| list(vec![]));
    if native_records && refuse_native_records(node, peer, &control, &message) {
        return Ok(());
    }
    match control {
        ControlMessage::Send { to } => send(node, &to, message),
        ControlMessage::RegSend { from: _, to_name } => reg_send(node, &to_name, message),
        ControlMessage::AliasSend { .. } => alias_send(),
        ControlMessage::AltactSigSend { flags, from, to } => {
            altact_sig_send(node, flags, from, &to, message)
        }
        ControlMessage::Link { from, to } => link(node, peer, from, to),
        ControlMessage::UnlinkId { id, from, to } => unlink_id(node, peer, id, from, to),
        ControlMessage::UnlinkIdAck { .. } => unlink_id_ack(),
        ControlMessage::Exit { from, to, reason } => exit(node, from, &to, reason),
        ControlMessage::Exit2 { from, to, reason } => exit2(node, from, &to, reason),
        ControlMessage::MonitorP {
            from,
            to,
            reference,
        } => monitor_p(node, peer, from, to, reference),
        ControlMessage::DemonitorP { reference, .. } => demonitor_p(node, &reference),
        ControlMessage::MonitorPExit {
            reference, reason, ..
        } => monitor_p_exit(node, &reference, reason),
        ControlMessage::Unsupported { op } => {
            tracing::debug!(%peer, op, "ignoring unsupported control message");
        }
    }
    Ok(())
}

/// The local process a message (not an exit signal) is addressed to, if it goes to one.
fn message_target(control: &ControlMessage) -> Option<Local<'_>> {
    match control {
        ControlMessage::Send { to } => Some(Local::Pid(to)),
        ControlMessage::RegSend { to_name, .. } => Some(Local::Name(&to_name.name)),
        ControlMessage::AltactSigSend { flags, to, .. } if flags & altact::EXIT == 0 => match to {
            AltactTarget::Pid(p) => Some(Local::Pid(p)),
            AltactTarget::Name(n) => Some(Local::Name(&n.name)),
            AltactTarget::Alias(_) => None,
        },
        _ => None,
    }
}

/// A local process as a log line names it.
fn describe(to: Local<'_>) -> String {
    match to {
        Local::Pid(pid) => pid.to_string(),
        Local::Name(name) => name.to_string(),
    }
}

/// Answers the call of `from` in the name of the process `to`, if that process is alive (if it
/// is not, the caller's monitor tells it so).
fn answer(node: &Node, to: Local<'_>, from: &Caller, reply: Term) {
    if let Some(pid) = node.live_pid(to) {
        gen::reply_from(node, &pid, from, reply);
    }
}

/// A payload that could not be decoded fails its message alone (see the module's doc).
fn undecodable_payload(node: &Node, peer: &str, control: ControlMessage, failed: PayloadError) {
    let why = failed.error.to_string();
    let reason = || Some(tuple(vec![atom("undecodable"), binary(why.clone().into())]));
    match control {
        ControlMessage::Exit { from, to, .. } => {
            tracing::warn!(%peer, "exit signal to {to} with a reason that could not be decoded: {why}");
            exit(node, from, &to, reason())
        }
        ControlMessage::Exit2 { from, to, .. } => {
            tracing::warn!(%peer, "exit signal to {to} with a reason that could not be decoded: {why}");
            exit2(node, from, &to, reason())
        }
        ControlMessage::MonitorPExit { reference, .. } => {
            tracing::warn!(%peer, "monitor exit with a reason that could not be decoded: {why}");
            monitor_p_exit(node, &reference, reason())
        }
        ControlMessage::AltactSigSend { flags, from, to } if flags & altact::EXIT != 0 => {
            tracing::warn!(%peer, "exit signal with a reason that could not be decoded: {why}");
            altact_sig_send(node, flags, from, &to, reason().expect("a reason"))
        }
        control => match (message_target(&control), failed.call) {
            (Some(to), Some(call)) => {
                let to_name = describe(to);
                tracing::warn!(%peer, "answering {{:error, {{:bad_request, _}}}} to a call to {to_name} whose request could not be decoded: {why}");
                let reply = error_kind(
                    "bad_request",
                    format!("the request could not be decoded: {why}"),
                );
                answer(node, to, &call, reply);
            }
            (Some(to), None) => {
                let to_name = describe(to);
                tracing::warn!(%peer, "dropping a message to {to_name} whose payload could not be decoded: {why}")
            }
            (None, _) => {
                tracing::warn!(%peer, "ignoring a control message whose payload could not be decoded: {why}")
            }
        },
    }
}

/// A `$gen_call` holding a native record (decoded as a tuple) is answered with an argument error
/// instead of being delivered; other messages pass through. True if the message was answered.
fn refuse_native_records(
    node: &Node,
    peer: &str,
    control: &ControlMessage,
    message: &Term,
) -> bool {
    let (Some(to), Some(from)) = (message_target(control), gen::call_from(message)) else {
        return false;
    };
    let record = native_record::find(message)
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    tracing::debug!(%peer, "refusing a call holding a native record{record}");
    let reply = error_kind(
        "argument_error",
        format!(
            "the request holds a native record{record}: native records (OTP 29) are not supported \
             by xla_node; send a tuple or a map instead"
        ),
    );
    answer(node, to, &from, reply);
    true
}

/// An exit reason the peer left out (the tuple forms without a payload) reads as `normal`.
fn reason_or_normal(reason: Option<Term>) -> Term {
    reason.unwrap_or_else(|| atom("normal"))
}

/// SEND: a message to a local pid.
fn send(node: &Node, to: &Pid, message: Term) {
    node.deliver(Local::Pid(to), Signal::Message(message));
}

/// REG_SEND: a message to a locally registered name.
fn reg_send(node: &Node, to_name: &Atom, message: Term) {
    node.deliver(Local::Name(&to_name.name), Signal::Message(message));
}

/// ALIAS_SEND: this node hands out no aliases, so nothing can be addressed through one.
fn alias_send() {}

/// ALTACT_SIG_SEND: a message or, with the EXIT flag, an exit signal (the payload is its reason)
/// to a pid, a registered name or an alias. Priority (PRIO) only applies through a priority alias,
/// which this node never makes, so those are ordinary signals; trace tokens are ignored as with
/// SEND_TT.
fn altact_sig_send(node: &Node, flags: u8, from: Pid, to: &AltactTarget, payload: Term) {
    let target = match to {
        AltactTarget::Pid(p) => Local::Pid(p),
        AltactTarget::Name(n) => Local::Name(&n.name),
        AltactTarget::Alias(_) => return alias_send(),
    };
    let signal = if flags & altact::EXIT != 0 {
        Signal::Exit {
            from,
            reason: payload,
            linked: false,
        }
    } else {
        Signal::Message(payload)
    };
    node.deliver(target, signal);
}

/// LINK: `from` links to our `to`; if `to` is not there, `from` gets EXIT `noproc` at once.
fn link(node: &Node, peer: &str, from: Pid, to: Pid) {
    if node.add_link(&to, from.clone()) {
        return;
    }
    let exit = ControlMessage::Exit {
        from: to.clone(),
        to: from,
        reason: Some(atom("noproc")),
    };
    node.send_control(&to, peer, exit, None);
}

/// UNLINK_ID: `from` unlinks from our `to`; acknowledged whether or not the link was there.
fn unlink_id(node: &Node, peer: &str, id: Term, from: Pid, to: Pid) {
    node.remove_link(&to, &from);
    let ack = ControlMessage::UnlinkIdAck {
        id,
        from: to.clone(),
        to: from,
    };
    node.send_control(&to, peer, ack, None);
}

/// UNLINK_ID_ACK: this node never unlinks from remote processes first, so there is nothing to
/// complete.
fn unlink_id_ack() {}

/// EXIT: a process linked to our `to` ended. Delivered only if the link is still there (an
/// unlink may have crossed it on the wire).
fn exit(node: &Node, from: Pid, to: &Pid, reason: Option<Term>) {
    if node.remove_link(to, &from) {
        let signal = Signal::Exit {
            from,
            reason: reason_or_normal(reason),
            linked: true,
        };
        node.deliver(Local::Pid(to), signal);
    }
}

/// EXIT2: an exit signal sent with `Process.exit/2`.
fn exit2(node: &Node, from: Pid, to: &Pid, reason: Option<Term>) {
    let signal = Signal::Exit {
        from,
        reason: reason_or_normal(reason),
        linked: false,
    };
    node.deliver(Local::Pid(to), signal);
}

/// MONITOR_P: `from` monitors our process `to` (a pid or a registered name); if it is not there,
/// MONITOR_P_EXIT `noproc` answers at once.
fn monitor_p(node: &Node, peer: &str, from: Pid, to: ProcRef, reference: Reference) {
    // What the monitor was set on, as `:DOWN` will name it: the pid, or `{name, node}`.
    let object = match &to {
        ProcRef::Pid(p) => Term::from(p.clone()),
        ProcRef::Name(n) => tuple(vec![Term::from(n.clone()), atom(node.name())]),
    };
    let watcher = Watcher {
        reference,
        pid: from,
        object,
    };
    let Err(refused) = node.add_watcher(Local::from(&to), watcher) else {
        return;
    };
    let Watcher {
        reference,
        pid: from,
        ..
    } = *refused;
    // Sent in the name of the monitored pid; a name that is not registered has none.
    let sender = match &to {
        ProcRef::Pid(p) => p.clone(),
        ProcRef::Name(_) => from.clone(),
    };
    let down = ControlMessage::MonitorPExit {
        from: to,
        to: from,
        reference,
        reason: Some(atom("noproc")),
    };
    node.send_control(&sender, peer, down, None);
}

/// DEMONITOR_P: a monitor a peer's process held on one of ours is gone.
fn demonitor_p(node: &Node, reference: &Reference) {
    node.remove_watcher(reference);
}

/// MONITOR_P_EXIT: a remote process one of ours monitors ended (or was never there).
fn monitor_p_exit(node: &Node, reference: &Reference, reason: Option<Term>) {
    node.fire_remote_monitor(reference, reason_or_normal(reason));
}
