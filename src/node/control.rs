//! Distribution control messages, named as in the Erlang documentation
//! ("Protocol between connected nodes", erl_dist_protocol). A control message is a tuple whose
//! first element is the operation code; some operations carry a second term, the payload
//! (the message of a SEND, the reason of a PAYLOAD_EXIT).
//!
//! Only the operations an OTP 25-29 node sends to a hidden node with our flags are decoded; the
//! rest are reported as [`ControlMessage::Unsupported`] so the connection can log and carry on.
//!
//! Replies to aliases are made as [`ControlMessage::AliasSend`] and put on the wire by
//! [`ControlMessage::to_term_for`] in the form the peer negotiated: `ALTACT_SIG_SEND` with the
//! ALIAS flag for peers with `DFLAG_ALTACT_SIG` (OTP 28+, which deprecates `ALIAS_SEND`),
//! `ALIAS_SEND` for the others, as OTP's own `erts_dsig_send_msg` does.

use super::flags;
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

/// The `To` of ALTACT_SIG_SEND, as its NAME and ALIAS flags say: a pid, a registered name or an
/// alias.
#[derive(Debug, Clone, PartialEq)]
pub enum AltactTarget {
    Pid(Pid),
    Name(Atom),
    Alias(Reference),
}

/// Bits of ALTACT_SIG_SEND's `Flags` (`ERTS_DOP_ALTACT_SIG_FLG_*` in OTP's dist.h). A receiver
/// reads the least significant byte and ignores bits it does not know.
pub mod altact {
    /// A priority message or exit signal. It is handled as an ordinary one unless the receiver
    /// enabled priority reception on the target alias; this node makes no aliases.
    pub const PRIO: u8 = 1 << 0;
    /// The control tuple has a fifth element, a sequential-trace token.
    pub const TOKEN: u8 = 1 << 1;
    /// `To` is an alias (a reference).
    pub const ALIAS: u8 = 1 << 2;
    /// `To` is a registered name (an atom).
    pub const NAME: u8 = 1 << 3;
    /// The signal is an exit signal with the payload as reason; otherwise a message.
    pub const EXIT: u8 = 1 << 4;
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
    /// `{37, Flags, SenderPid, To}` or `{37, Flags, SenderPid, To, Token}` + Message, or the
    /// Reason of an exit signal (`flags` has [`altact::EXIT`]). OTP 28+; the tuple may grow
    /// more elements, which are ignored.
    AltactSigSend {
        flags: u8,
        from: Pid,
        to: AltactTarget,
    },
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
    pub const ALTACT_SIG_SEND: i32 = 37;
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
                | op::ALTACT_SIG_SEND
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
        // Operations whose arity is not checked first (those OTP lets grow) may be too short.
        let element = |i: usize| {
            e.get(i)
                .ok_or_else(|| ControlError(format!("operation {op} with {} elements", e.len())))
        };
        let pid = |i: usize| match element(i)? {
            Term::Pid(p) => Ok(p.clone()),
            other => Err(ControlError(format!(
                "operation {op}: element {i} is not a pid: {other}"
            ))),
        };
        let reference = |i: usize| match element(i)? {
            Term::Reference(r) => Ok((**r).clone()),
            other => Err(ControlError(format!(
                "operation {op}: element {i} is not a reference: {other}"
            ))),
        };
        let proc_ref = |i: usize| match element(i)? {
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
            op::ALTACT_SIG_SEND => Self::altact_sig_send(&e)?,
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

    /// ALTACT_SIG_SEND's elements, checked as OTP checks them: at least four, a non-negative
    /// integer `Flags` (of any size: only its low byte counts), a sender pid, a token when the
    /// TOKEN flag says so, and a `To` of the kind the ALIAS and NAME flags (never both) say.
    fn altact_sig_send(e: &[Term]) -> Result<Self, ControlError> {
        let bad = |why: &str| Err(ControlError(format!("ALTACT_SIG_SEND: {why}")));
        if e.len() < 4 {
            return bad("fewer than 4 elements");
        }
        let flags = match &e[1] {
            Term::FixInteger(i) if i.value >= 0 => i.value as u8,
            Term::BigInteger(b) => {
                // Two's complement, least significant byte first.
                let bytes = b.value.to_signed_bytes_le();
                match (bytes.first(), bytes.last()) {
                    (Some(&low), Some(&high)) if high & 0x80 == 0 => low,
                    _ => return bad("flags are not a non-negative integer"),
                }
            }
            _ => return bad("flags are not a non-negative integer"),
        };
        let Term::Pid(from) = &e[2] else {
            return bad("the sender is not a pid");
        };
        if flags & altact::TOKEN != 0 && e.len() < 5 {
            return bad("TOKEN flag without a token");
        }
        let to = match (flags & altact::ALIAS != 0, flags & altact::NAME != 0, &e[3]) {
            (true, false, Term::Reference(r)) => AltactTarget::Alias((**r).clone()),
            (false, true, Term::Atom(a)) => AltactTarget::Name(a.clone()),
            (false, false, Term::Pid(p)) => AltactTarget::Pid(p.clone()),
            (_, _, to) => return bad(&format!("target {to} does not match flags {flags}")),
        };
        Ok(ControlMessage::AltactSigSend {
            flags,
            from: from.clone(),
            to,
        })
    }

    /// The control tuple to put on the wire to a peer that negotiated `peer_flags`.
    pub fn to_term_for(&self, peer_flags: u64) -> Term {
        match self {
            ControlMessage::AliasSend { from, alias } if peer_flags & flags::ALTACT_SIG != 0 => {
                ControlMessage::AltactSigSend {
                    flags: altact::ALIAS,
                    from: from.clone(),
                    to: AltactTarget::Alias(alias.clone()),
                }
                .to_term()
            }
            _ => self.to_term(),
        }
    }

    /// The control tuple to put on the wire, in the form this value names.
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
            ControlMessage::AltactSigSend { flags, from, to } => tuple(vec![
                int(op::ALTACT_SIG_SEND.into()),
                // This node sends no trace tokens.
                int((flags & !altact::TOKEN).into()),
                pid(from),
                match to {
                    AltactTarget::Pid(p) => pid(p),
                    AltactTarget::Name(n) => Term::from(n.clone()),
                    AltactTarget::Alias(r) => reference(r),
                },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::term::list;

    fn pid() -> Pid {
        Pid::new("a@b", 1, 0, 1)
    }

    fn alias() -> Reference {
        Reference::from(("a@b", vec![1, 2, 3]))
    }

    fn parse(elements: Vec<Term>) -> Result<ControlMessage, ControlError> {
        ControlMessage::from_term(tuple(elements), &mut None)
    }

    fn altact(flags: Term, to: Term, rest: Vec<Term>) -> Result<ControlMessage, ControlError> {
        let mut e = vec![int(37), flags, Term::from(pid()), to];
        e.extend(rest);
        parse(e)
    }

    #[test]
    fn altact_sig_send_targets_follow_the_flags() {
        let sent = |flags: u8, to: AltactTarget| ControlMessage::AltactSigSend {
            flags,
            from: pid(),
            to,
        };
        let to_pid = Term::from(Pid::new("x@y", 5, 0, 2));
        assert_eq!(
            altact(int(0), to_pid.clone(), vec![]).unwrap(),
            sent(0, AltactTarget::Pid(Pid::new("x@y", 5, 0, 2)))
        );
        assert_eq!(
            altact(int(8), atom("xla"), vec![]).unwrap(),
            sent(8, AltactTarget::Name(Atom::from("xla")))
        );
        assert_eq!(
            altact(int(4 | 1), Term::from(alias()), vec![]).unwrap(),
            sent(5, AltactTarget::Alias(alias()))
        );
        // A token with TOKEN; more elements than OTP 28 sends are ignored.
        assert!(altact(int(2 | 16), to_pid.clone(), vec![atom("token")]).is_ok());
        assert!(altact(int(0), to_pid.clone(), vec![atom("x"), atom("y")]).is_ok());
        // Flags of any size count by their low byte; unknown bits are ignored.
        let big = Term::from(eetf::BigInteger::from((1i64 << 40) | 8 | 0x80));
        assert_eq!(
            altact(big, atom("xla"), vec![]).unwrap(),
            sent(0x88, AltactTarget::Name(Atom::from("xla")))
        );
        // What OTP refuses.
        for bad in [
            altact(int(2), to_pid.clone(), vec![]), // TOKEN without a token
            altact(int(4 | 8), atom("xla"), vec![]), // ALIAS and NAME
            altact(int(4), to_pid.clone(), vec![]), // ALIAS, but a pid
            altact(int(8), to_pid.clone(), vec![]), // NAME, but a pid
            altact(int(0), atom("xla"), vec![]),    // a pid expected
            altact(int(-1), to_pid.clone(), vec![]),
            altact(
                Term::from(eetf::BigInteger::from(-(1i64 << 40))),
                to_pid,
                vec![],
            ),
            altact(atom("zero"), atom("xla"), vec![]),
            parse(vec![int(37), int(0), Term::from(pid())]),
            // Too short for what the operation names.
            parse(vec![int(2)]),
            parse(vec![int(3), Term::from(pid())]),
            parse(vec![int(33), Term::from(pid())]),
            parse(vec![int(24)]),
            parse(vec![int(37), int(8), list(vec![]), atom("xla")]),
        ] {
            assert!(bad.is_err(), "{bad:?}");
        }
    }

    #[test]
    fn alias_replies_take_the_form_the_peer_negotiated() {
        let reply = ControlMessage::AliasSend {
            from: pid(),
            alias: alias(),
        };
        let old = tuple(vec![int(33), Term::from(pid()), Term::from(alias())]);
        let new = tuple(vec![
            int(37),
            int(4),
            Term::from(pid()),
            Term::from(alias()),
        ]);
        assert_eq!(
            reply.to_term_for(flags::ADVERTISED & !flags::ALTACT_SIG),
            old
        );
        assert_eq!(reply.to_term_for(flags::ADVERTISED), new);
        // And it reads back as what it is.
        let mut payload = None;
        assert_eq!(
            ControlMessage::from_term(new, &mut payload).unwrap(),
            ControlMessage::AltactSigSend {
                flags: altact::ALIAS,
                from: pid(),
                to: AltactTarget::Alias(alias()),
            }
        );
        assert!(ControlMessage::has_payload(37));
        // Other messages are the same for every peer.
        let send = ControlMessage::Send { to: pid() };
        assert_eq!(send.to_term_for(flags::ADVERTISED), send.to_term());
    }
}
