//! What an incoming control message does on this node: deliver a message, set or remove a
//! monitor or link, or pass an exit signal to a process. Mirrors the BEAM's behaviour where a
//! peer can observe it: a monitor of a process that is not there is answered at once with
//! `noproc`, as is a link to one (EXIT `noproc`), and UNLINK_ID is acknowledged.

use super::control::{ControlMessage, ProcRef};
use super::frame::Message;
use super::process::{Signal, Watcher};
use super::term::atom;
use super::Node;
use eetf::Term;

pub fn handle(
    node: &Node,
    peer: &str,
    message: Message,
) -> Result<(), super::control::ControlError> {
    let Message {
        control,
        mut payload,
    } = message;
    let control = ControlMessage::from_term(control, &mut payload)?;
    let payload_or_nil = |p: Option<Term>| p.unwrap_or_else(|| super::term::list(vec![]));
    match control {
        ControlMessage::Send { to } => node.deliver(&to, Signal::Message(payload_or_nil(payload))),
        ControlMessage::RegSend { from, to_name } => node.send(
            &from,
            super::Dest::Name(to_name.name),
            payload_or_nil(payload),
        ),
        // This node hands out no aliases, so nothing can be addressed through one.
        ControlMessage::AliasSend { .. } => {}
        ControlMessage::Link { from, to } => {
            let mut state = node.state();
            match Node::resolve_local(&state, node.creation(), &ProcRef::Pid(to.clone())) {
                Some(key) => state
                    .processes
                    .get_mut(&key)
                    .expect("resolved")
                    .links
                    .push(from),
                None => {
                    drop(state);
                    node.send_control(
                        &to,
                        peer,
                        ControlMessage::Exit {
                            from: to.clone(),
                            to: from,
                            reason: Some(atom("noproc")),
                        },
                        None,
                    );
                }
            }
        }
        ControlMessage::UnlinkId { id, from, to } => {
            let mut state = node.state();
            if let Some(key) =
                Node::resolve_local(&state, node.creation(), &ProcRef::Pid(to.clone()))
            {
                state
                    .processes
                    .get_mut(&key)
                    .expect("resolved")
                    .links
                    .retain(|l| l != &from);
            }
            drop(state);
            node.send_control(
                &to,
                peer,
                ControlMessage::UnlinkIdAck {
                    id,
                    from: to.clone(),
                    to: from,
                },
                None,
            );
        }
        ControlMessage::UnlinkIdAck { .. } => {}
        ControlMessage::Exit { from, to, reason } => {
            let mut state = node.state();
            let linked =
                match Node::resolve_local(&state, node.creation(), &ProcRef::Pid(to.clone())) {
                    Some(key) => {
                        let links = &mut state.processes.get_mut(&key).expect("resolved").links;
                        let before = links.len();
                        links.retain(|l| l != &from);
                        links.len() != before
                    }
                    None => false,
                };
            drop(state);
            if linked {
                node.deliver(
                    &to,
                    Signal::Exit {
                        from,
                        reason: reason.unwrap_or_else(|| atom("normal")),
                        linked: true,
                    },
                );
            }
        }
        ControlMessage::Exit2 { from, to, reason } => node.deliver(
            &to,
            Signal::Exit {
                from,
                reason: reason.unwrap_or_else(|| atom("normal")),
                linked: false,
            },
        ),
        ControlMessage::MonitorP {
            from,
            to,
            reference,
        } => {
            let mut state = node.state();
            let object = match &to {
                ProcRef::Pid(p) => Term::from(p.clone()),
                ProcRef::Name(n) => {
                    super::term::tuple(vec![Term::from(n.clone()), atom(node.name())])
                }
            };
            match Node::resolve_local(&state, node.creation(), &to) {
                Some(key) => state
                    .processes
                    .get_mut(&key)
                    .expect("resolved")
                    .watchers
                    .push(Watcher {
                        reference,
                        pid: from,
                        object,
                    }),
                None => {
                    drop(state);
                    let me = match &to {
                        ProcRef::Pid(p) => p.clone(),
                        ProcRef::Name(_) => from.clone(),
                    };
                    node.send_control(
                        &me,
                        peer,
                        ControlMessage::MonitorPExit {
                            from: to,
                            to: from,
                            reference,
                            reason: Some(atom("noproc")),
                        },
                        None,
                    );
                }
            }
        }
        ControlMessage::DemonitorP { reference, .. } => {
            for entry in node.state().processes.values_mut() {
                entry.watchers.retain(|w| w.reference != reference);
            }
        }
        ControlMessage::MonitorPExit {
            reference, reason, ..
        } => node.fire_remote_monitor(&reference, reason.unwrap_or_else(|| atom("normal"))),
        ControlMessage::Unsupported { op } => {
            tracing::debug!(%peer, op, "ignoring unsupported control message");
        }
    }
    Ok(())
}
