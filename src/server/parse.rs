//! Reading the parts of a request term: the elements after its tag, and the references,
//! strings, tensors and keyword options they hold.
//!
//! Shared by every request's parse (`request.rs` has the table of requests); each reader's
//! error is the `:argument_error` the caller gets.

use super::error::RequestError;
use crate::node::term::{as_atom, as_i64, as_list, as_tuple};
use crate::tensor_term::parse_tensor;
use crate::xla::HostTensor;
use eetf::{Pid, Reference, Term};
use std::time::Duration;

/// The elements of a request tuple after its tag, whose count [`super::request::Request::parse`]
/// checked against the request's forms.
pub struct Elements(std::vec::IntoIter<Term>);

impl Elements {
    /// The elements of `tuple` after the first (the tag).
    pub fn after_tag(tuple: Vec<Term>) -> Elements {
        let mut elements = tuple.into_iter();
        elements.next();
        Elements(elements)
    }

    /// The next element, which every form of the request has.
    pub fn required(&mut self) -> Term {
        self.0.next().expect("the arity was checked")
    }

    /// The next element, which only the longer form of the request has (its options).
    pub fn optional(&mut self) -> Option<Term> {
        self.0.next()
    }
}

/// An `:argument_error`.
pub fn argument(message: impl Into<String>) -> RequestError {
    RequestError::Argument(message.into())
}

/// A reference (to an executable or a buffer).
pub fn reference(term: Term) -> Result<Reference, RequestError> {
    match term {
        Term::Reference(r) => Ok(*r),
        other => Err(argument(format!("expected a reference, got {other}"))),
    }
}

/// A tensor `{binary, {type, dims}}`, its size checked.
pub fn tensor(term: Term) -> Result<HostTensor, RequestError> {
    parse_tensor(term).map_err(RequestError::Argument)
}

/// A string given as a binary, an atom or a charlist.
pub fn string(term: &Term) -> Option<String> {
    match term {
        Term::Binary(b) => String::from_utf8(b.bytes.clone()).ok(),
        Term::Atom(a) => Some(a.name.clone()),
        Term::ByteList(b) => String::from_utf8(b.bytes.clone()).ok(),
        _ => None,
    }
}

/// `true` or `false`, for option `key`.
pub fn boolean(key: &str, value: &Term) -> Result<bool, RequestError> {
    match as_atom(value) {
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        _ => Err(argument(format!("{key} must be a boolean, got {value}"))),
    }
}

/// A keyword list, as (key, value) pairs.
pub fn keywords(opts: &Term) -> Result<Vec<(String, Term)>, RequestError> {
    let items = as_list(opts)
        .ok_or_else(|| argument(format!("options must be a keyword list, got {opts}")))?;
    items
        .iter()
        .map(|item| match as_tuple(item, 2) {
            Some([k, v]) if as_atom(k).is_some() => {
                Ok((as_atom(k).expect("checked").to_string(), v.clone()))
            }
            _ => Err(argument(format!(
                "options must be a keyword list, got element {item}"
            ))),
        })
        .collect()
}

/// Option `key`'s device: an index into `:info`'s `devices`, checked against the node's
/// `device_count`.
pub fn device(key: &str, value: &Term, device_count: usize) -> Result<usize, RequestError> {
    match as_i64(value) {
        Some(n) if n >= 0 && (n as u64) < device_count as u64 => Ok(n as usize),
        Some(n) => Err(argument(format!(
            "{key} {n} is out of range: this node has {device_count} devices (0..{})",
            device_count.saturating_sub(1)
        ))),
        None => Err(argument(format!(
            "{key} must be a device index (an integer), got {value}"
        ))),
    }
}

/// Where a tensor placed on the device goes, and who holds its buffer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    /// An index into `:info`'s `devices` (0 unless `device:` says otherwise).
    pub device: usize,
    /// `owner: pid`: the process that holds the buffer; `None`: the caller.
    pub owner: Option<Pid>,
}

/// The options of `{:to_device, tensor, opts}` and `{:upload, shape, opts}`: `device:` and
/// `owner:`.
pub fn placement_options(
    opts: Option<Term>,
    device_count: usize,
) -> Result<Placement, RequestError> {
    let mut placement = Placement::default();
    if let Some(opts) = opts {
        for (key, value) in keywords(&opts)? {
            match key.as_str() {
                "device" => placement.device = device(&key, &value, device_count)?,
                "owner" => placement.owner = Some(owner(&value)?),
                other => {
                    return Err(argument(format!(
                        "unknown option {other} (supported: device, owner)"
                    )))
                }
            }
        }
    }
    Ok(placement)
}

/// Option `owner:`'s value: the pid of the process that is to hold what the request makes.
pub fn owner(value: &Term) -> Result<Pid, RequestError> {
    match value {
        Term::Pid(pid) => Ok(pid.clone()),
        other => Err(argument(format!("owner must be a pid, got {other}"))),
    }
}

/// Which timeouts in milliseconds an option takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Milliseconds {
    /// At least 1 ms.
    Positive,
    /// 0 ms too.
    NonNegative,
}

/// An option's timeout: a number of milliseconds, or `:infinity` (`None`).
pub fn milliseconds_or_infinity(
    key: &str,
    value: &Term,
    least: Milliseconds,
) -> Result<Option<Duration>, RequestError> {
    let smallest = match least {
        Milliseconds::Positive => 1,
        Milliseconds::NonNegative => 0,
    };
    match (as_i64(value), as_atom(value)) {
        (Some(ms), _) if ms >= smallest => Ok(Some(Duration::from_millis(ms as u64))),
        (_, Some("infinity")) => Ok(None),
        _ => {
            let kind = match least {
                Milliseconds::Positive => "positive",
                Milliseconds::NonNegative => "non-negative",
            };
            Err(argument(format!(
                "{key} must be a {kind} number of milliseconds or :infinity, got {value}"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::term::{atom, int};

    #[test]
    fn timeouts_are_milliseconds_or_infinity() {
        let read = |value: &Term, least| milliseconds_or_infinity("t", value, least);
        assert_eq!(
            read(&int(250), Milliseconds::Positive).unwrap(),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            read(&int(0), Milliseconds::NonNegative).unwrap(),
            Some(Duration::ZERO)
        );
        assert_eq!(
            read(&atom("infinity"), Milliseconds::Positive).unwrap(),
            None
        );
        let zero = read(&int(0), Milliseconds::Positive)
            .unwrap_err()
            .to_string();
        assert!(
            zero.contains("t must be a positive number of milliseconds or :infinity, got 0"),
            "{zero}"
        );
        let negative = read(&int(-1), Milliseconds::NonNegative)
            .unwrap_err()
            .to_string();
        assert!(
            negative.contains("t must be a non-negative number of milliseconds or :infinity"),
            "{negative}"
        );
        assert!(read(&atom("never"), Milliseconds::NonNegative).is_err());
    }
}
