//! `{:share, refs, pid}`, `{:give_away, refs, pid}`, `{:release, refs}` and `{:release, refs,
//! pid}`: who holds a buffer or an executable (`resources.rs`).
//!
//! A resource is held by the process that made it, or by the `owner:` its request named, and
//! lives while any hold on it does: `share` gives `pid` a hold (one more each time: holds are
//! counted, as references are; a client node's keeper holding a buffer another node's client
//! made), `give_away` hands one of the caller's holds to another process (as `:ets.give_away/3`
//! hands a table), `release` ends one of the caller's holds, or of `pid`'s (the resource goes
//! with its last hold). A holder's exit ends all its holds. `refs` is one reference or a list. As a call, every change is
//! made or none: the reply is `:ok`, or the `:argument_error` of the first reference that
//! cannot change (unknown or freed, not held by the caller, an upload not yet done). `share`
//! and `release` with a pid are also casts (a cast does not say who sent it): the references
//! that can change do and the others are skipped, so that a stale or foreign reference never
//! costs anything else.

use super::error::RequestError;
use super::parse::{argument, Elements};
use super::resources::{HoldChange, Strictness};
use super::state::{unknown_reference, State};
use crate::node::gen::Caller;
use crate::node::term::atom;
use eetf::{Pid, Reference, Term};

/// What a request does to the holds of its references.
#[derive(Debug)]
enum Action {
    Share(Pid),
    GiveAway(Pid),
    /// The hold of this process, or of the caller's.
    Release(Option<Pid>),
}

/// `{:share, refs, pid}`, `{:give_away, refs, pid}` or `{:release, refs}`, parsed.
#[derive(Debug)]
pub struct HoldRequest {
    references: Vec<Reference>,
    action: Action,
}

impl HoldRequest {
    pub fn parse_share(elements: &mut Elements) -> Result<HoldRequest, RequestError> {
        let references = references(elements.required())?;
        let pid = pid("share", elements.required())?;
        Ok(HoldRequest {
            references,
            action: Action::Share(pid),
        })
    }

    pub fn parse_give_away(elements: &mut Elements) -> Result<HoldRequest, RequestError> {
        let references = references(elements.required())?;
        let pid = pid("give_away", elements.required())?;
        Ok(HoldRequest {
            references,
            action: Action::GiveAway(pid),
        })
    }

    pub fn parse_release(elements: &mut Elements) -> Result<HoldRequest, RequestError> {
        let references = references(elements.required())?;
        let holder = elements.optional().map(|t| pid("release", t)).transpose()?;
        Ok(HoldRequest {
            references,
            action: Action::Release(holder),
        })
    }

    /// The change, for a request from `caller` (`None`: a cast).
    fn change<'a>(&'a self, caller: Option<&'a Pid>) -> Option<HoldChange<'a>> {
        match (&self.action, caller) {
            (Action::Share(pid), _) => Some(HoldChange::Share(pid)),
            (Action::GiveAway(to), Some(from)) => Some(HoldChange::GiveAway { from, to }),
            (Action::Release(Some(pid)), _) | (Action::Release(None), Some(pid)) => {
                Some(HoldChange::Release(pid))
            }
            (Action::GiveAway(_) | Action::Release(None), None) => None,
        }
    }

    /// As a call: every change or none; replies `:ok` or the error.
    pub fn apply(self, state: &State, from: Caller) {
        let change = self.change(Some(&from.pid)).expect("a call has a caller");
        match state.change_holds(&self.references, change, Strictness::AllOrNothing) {
            Ok(()) => state.reply(&from, atom("ok")),
            Err(e) => state.reply_error(&from, &e),
        }
    }

    /// As a cast: the references that can change do. A give-away, or a release that names no
    /// holder, needs the caller, which a cast does not say: it is ignored.
    pub fn apply_cast(self, state: &State) {
        let Some(change) = self.change(None) else {
            return tracing::debug!(
                "xla: ignoring cast {self:?}: a give-away or a release without a pid is a call"
            );
        };
        if let Err(e) = state.change_holds(&self.references, change, Strictness::SkipInvalid) {
            tracing::debug!("xla: hold cast: {e}");
        }
    }
}

/// One reference or a list of them.
fn references(term: Term) -> Result<Vec<Reference>, RequestError> {
    match term {
        Term::Reference(r) => Ok(vec![*r]),
        Term::List(list) => list
            .elements
            .into_iter()
            .map(|t| match t {
                Term::Reference(r) => Ok(*r),
                other => Err(unknown_reference(other)),
            })
            .collect(),
        Term::ByteList(b) if b.bytes.is_empty() => Ok(Vec::new()),
        other => Err(unknown_reference(other)),
    }
}

fn pid(request: &str, term: Term) -> Result<Pid, RequestError> {
    match term {
        Term::Pid(pid) => Ok(pid),
        other => Err(argument(format!(
            "{request}: the holder must be a pid, got {other}"
        ))),
    }
}
