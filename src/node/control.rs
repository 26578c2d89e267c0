//! Distribution control messages, named as in the Erlang documentation
//! ("Protocol between connected nodes", erl_dist_protocol). A control message is a tuple whose
//! first element is the operation code; some operations carry a second term, the payload
//! (the message of a SEND, the reason of a PAYLOAD_EXIT).
//!
//! Only the operations an OTP 25 node sends to a hidden node with our flags are decoded; the rest
//! are reported as [`ControlMessage::Unsupported`] so the connection can log and carry on.

use super::term::{as_i64, atom, int, tuple};
use eetf::{Atom, Pid, Reference, Term};

/// The target of MONITOR_P / DEMONITOR_P: a pid or a registered name on the receiving node.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcRef {
    Pid(Pid),
    Name(Atom),
}

impl From<ProcRef> for Term {
    fn from(p: ProcRef) -> Term {
        match p {
            ProcRef::Pid(p) => Term::from(p),
            ProcRef::Name(a) => Term::from(a),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::upper_case_acronyms)]
pub enum ControlMessage {
    /// `{1, FromPid, ToPid}`
    Link { from: Pid, to: Pid },
    /// `{2, Unused, ToPid}` + Message (also SEND_TT 12, SEND_SENDER 22, SEND_SENDER_TT 23)
    Send { to: Pid },
    /// `{3, FromPid, ToPid, Reason}` (also EXIT_TT 13; PAYLOAD_EXIT 24/25 with the reason as payload)
    Exit {
        from: Pid,
        to: Pid,
        reason: Option<Term>,
    },
    /// `{6, FromPid, Unused, ToName}` + Message (also REG_SEND_TT 16)
    RegSend { from: Pid, to_name: Atom },
    /// `{8, FromPid, ToPid, Reason}` (also EXIT2_TT 18; PAYLOAD_EXIT2 26/27)
    Exit2 {
        from: Pid,
        to: Pid,
        reason: Option<Term>,
    },
    /// `{19, FromPid, ToProc, Ref}`
    MonitorP {
        from: Pid,
        to: ProcRef,
        reference: Reference,
    },
    /// `{20, FromPid, ToProc, Ref}`
    DemonitorP {
        from: Pid,
        to: ProcRef,
        reference: Reference,
    },
    /// `{21, FromProc, ToPid, Ref, Reason}` (PAYLOAD_MONITOR_P_EXIT 28 with the reason as payload)
    MonitorPExit {
        from: ProcRef,
        to: Pid,
        reference: Reference,
        reason: Option<Term>,
    },
    /// `{33, FromPid, Alias}` + Message (also ALIAS_SEND_TT 34)
    AliasSend { from: Pid, alias: Reference },
    /// `{35, Id, FromPid, ToPid}`
    UnlinkId { id: Term, from: Pid, to: Pid },
    /// `{36, Id, FromPid, ToPid}`
    UnlinkIdAck { id: Term, from: Pid, to: Pid },
    /// Anything else (GROUP_LEADER, SPAWN_REQUEST, ...): logged and ignored.
    Unsupported { op: i64 },
}

/// Operation codes.
pub mod op {
    pub const LINK: i32 = 1;
    pub const SEND: i32 = 2;
    pub const EXIT: i32 = 3;
    pub const UNLINK: i32 = 4;
    pub const REG_SEND: i32 = 6;
    pub const EXIT2: i32 = 8;
    pub const SEND_TT: i32 = 12;
    pub const EXIT_TT: i32 = 13;
    pub const REG_SEND_TT: i32 = 16;
    pub const EXIT2_TT: i32 = 18;
    pub const MONITOR_P: i32 = 19;
    pub const DEMONITOR_P: i32 = 20;
    pub const MONITOR_P_EXIT: i32 = 21;
    pub const SEND_SENDER: i32 = 22;
    pub const SEND_SENDER_TT: i32 = 23;
    pub const PAYLOAD_EXIT: i32 = 24;
    pub const PAYLOAD_EXIT_TT: i32 = 25;
    pub const PAYLOAD_EXIT2: i32 = 26;
    pub const PAYLOAD_EXIT2_TT: i32 = 27;
    pub const PAYLOAD_MONITOR_P_EXIT: i32 = 28;
    pub const ALIAS_SEND: i32 = 33;
    pub const ALIAS_SEND_TT: i32 = 34;
    pub const UNLINK_ID: i32 = 35;
    pub const UNLINK_ID_ACK: i32 = 36;
}

#[derive(Debug, thiserror::Error)]
#[error("malformed control message: {0}")]
pub struct ControlError(pub String);

impl ControlMessage {
    /// Whether a payload term follows this control message on the wire.
    pub fn has_payload(op: i64) -> bool {
        matches!(
            op as i32,
            op::SEND
                | op::REG_SEND
                | op::SEND_TT
                | op::REG_SEND_TT
                | op::SEND_SENDER
                | op::SEND_SENDER_TT
                | op::PAYLOAD_EXIT
                | op::PAYLOAD_EXIT_TT
                | op::PAYLOAD_EXIT2
                | op::PAYLOAD_EXIT2_TT
                | op::PAYLOAD_MONITOR_P_EXIT
                | op::ALIAS_SEND
                | op::ALIAS_SEND_TT
                | 29 // SPAWN_REQUEST carries the argument list
                | 30 // SPAWN_REQUEST_TT
        )
    }

    /// The operation code of a decoded control tuple.
    pub fn op_of(control: &Term) -> Result<i64, ControlError> {
        match control {
            Term::Tuple(t) if !t.elements.is_empty() => as_i64(&t.elements[0])
                .ok_or_else(|| ControlError("operation is not an integer".into())),
            _ => Err(ControlError("not a non-empty tuple".into())),
        }
    }

    /// Parses a control tuple. The payload (if any) is taken separately by the caller, except for
    /// the PAYLOAD_* exits, whose reason is moved in here.
    pub fn from_term(control: Term, payload: &mut Option<Term>) -> Result<Self, ControlError> {
        let op = Self::op_of(&control)?;
        let Term::Tuple(t) = control else {
            unreachable!("op_of checked the tuple")
        };
        let e = t.elements;
        let need = |n: usize| {
            if e.len() == n {
                Ok(())
            } else {
                Err(ControlError(format!(
                    "operation {op} with {} elements",
                    e.len()
                )))
            }
        };
        let pid = |i: usize| match &e[i] {
            Term::Pid(p) => Ok(p.clone()),
            other => Err(ControlError(format!(
                "operation {op}: element {i} is not a pid: {other}"
            ))),
        };
        let reference = |i: usize| match &e[i] {
            Term::Reference(r) => Ok((**r).clone()),
            other => Err(ControlError(format!(
                "operation {op}: element {i} is not a reference: {other}"
            ))),
        };
        let proc_ref = |i: usize| match &e[i] {
            Term::Pid(p) => Ok(ProcRef::Pid(p.clone())),
            Term::Atom(a) => Ok(ProcRef::Name(a.clone())),
            other => Err(ControlError(format!(
                "operation {op}: element {i} is not a pid or name: {other}"
            ))),
        };
        Ok(match op as i32 {
            op::LINK => {
                need(3)?;
                ControlMessage::Link {
                    from: pid(1)?,
                    to: pid(2)?,
                }
            }
            op::SEND | op::SEND_TT | op::SEND_SENDER | op::SEND_SENDER_TT => {
                ControlMessage::Send { to: pid(2)? }
            }
            op::EXIT | op::EXIT_TT => ControlMessage::Exit {
                from: pid(1)?,
                to: pid(2)?,
                reason: e.get(3).cloned(),
            },
            op::PAYLOAD_EXIT | op::PAYLOAD_EXIT_TT => ControlMessage::Exit {
                from: pid(1)?,
                to: pid(2)?,
                reason: payload.take(),
            },
            op::REG_SEND | op::REG_SEND_TT => match &e.get(3) {
                Some(Term::Atom(name)) => ControlMessage::RegSend {
                    from: pid(1)?,
                    to_name: name.clone(),
                },
                _ => return Err(ControlError("REG_SEND without a name".into())),
            },
            op::EXIT2 | op::EXIT2_TT => ControlMessage::Exit2 {
                from: pid(1)?,
                to: pid(2)?,
                reason: e.get(3).cloned(),
            },
            op::PAYLOAD_EXIT2 | op::PAYLOAD_EXIT2_TT => ControlMessage::Exit2 {
                from: pid(1)?,
                to: pid(2)?,
                reason: payload.take(),
            },
            op::MONITOR_P => {
                need(4)?;
                ControlMessage::MonitorP {
                    from: pid(1)?,
                    to: proc_ref(2)?,
                    reference: reference(3)?,
                }
            }
            op::DEMONITOR_P => {
                need(4)?;
                ControlMessage::DemonitorP {
                    from: pid(1)?,
                    to: proc_ref(2)?,
                    reference: reference(3)?,
                }
            }
            op::MONITOR_P_EXIT => {
                need(5)?;
                ControlMessage::MonitorPExit {
                    from: proc_ref(1)?,
                    to: pid(2)?,
                    reference: reference(3)?,
                    reason: Some(e[4].clone()),
                }
            }
            op::PAYLOAD_MONITOR_P_EXIT => {
                need(4)?;
                ControlMessage::MonitorPExit {
                    from: proc_ref(1)?,
                    to: pid(2)?,
                    reference: reference(3)?,
                    reason: payload.take(),
                }
            }
            op::ALIAS_SEND | op::ALIAS_SEND_TT => ControlMessage::AliasSend {
                from: pid(1)?,
                alias: reference(2)?,
            },
            op::UNLINK_ID => {
                need(4)?;
                ControlMessage::UnlinkId {
                    id: e[1].clone(),
                    from: pid(2)?,
                    to: pid(3)?,
                }
            }
            op::UNLINK_ID_ACK => {
                need(4)?;
                ControlMessage::UnlinkIdAck {
                    id: e[1].clone(),
                    from: pid(2)?,
                    to: pid(3)?,
                }
            }
            _ => ControlMessage::Unsupported { op },
        })
    }

    /// The control tuple to put on the wire.
    pub fn to_term(&self) -> Term {
        let pid = |p: &Pid| Term::from(p.clone());
        let reference = |r: &Reference| Term::from(r.clone());
        let proc_ref = |p: &ProcRef| Term::from(p.clone());
        let reason = |r: &Option<Term>| r.clone().unwrap_or_else(|| atom("normal"));
        match self {
            ControlMessage::Link { from, to } => {
                tuple(vec![int(op::LINK.into()), pid(from), pid(to)])
            }
            ControlMessage::Send { to } => tuple(vec![int(op::SEND.into()), atom(""), pid(to)]),
            ControlMessage::Exit {
                from,
                to,
                reason: r,
            } => tuple(vec![int(op::EXIT.into()), pid(from), pid(to), reason(r)]),
            ControlMessage::RegSend { from, to_name } => tuple(vec![
                int(op::REG_SEND.into()),
                pid(from),
                atom(""),
                Term::from(to_name.clone()),
            ]),
            ControlMessage::Exit2 {
                from,
                to,
                reason: r,
            } => tuple(vec![int(op::EXIT2.into()), pid(from), pid(to), reason(r)]),
            ControlMessage::MonitorP {
                from,
                to,
                reference: r,
            } => tuple(vec![
                int(op::MONITOR_P.into()),
                pid(from),
                proc_ref(to),
                reference(r),
            ]),
            ControlMessage::DemonitorP {
                from,
                to,
                reference: r,
            } => tuple(vec![
                int(op::DEMONITOR_P.into()),
                pid(from),
                proc_ref(to),
                reference(r),
            ]),
            ControlMessage::MonitorPExit {
                from,
                to,
                reference: r,
                reason: why,
            } => tuple(vec![
                int(op::MONITOR_P_EXIT.into()),
                proc_ref(from),
                pid(to),
                reference(r),
                reason(why),
            ]),
            ControlMessage::AliasSend { from, alias } => tuple(vec![
                int(op::ALIAS_SEND.into()),
                pid(from),
                reference(alias),
            ]),
            ControlMessage::UnlinkId { id, from, to } => tuple(vec![
                int(op::UNLINK_ID.into()),
                id.clone(),
                pid(from),
                pid(to),
            ]),
            ControlMessage::UnlinkIdAck { id, from, to } => tuple(vec![
                int(op::UNLINK_ID_ACK.into()),
                id.clone(),
                pid(from),
                pid(to),
            ]),
            ControlMessage::Unsupported { op } => tuple(vec![int(*op)]),
        }
    }
}
