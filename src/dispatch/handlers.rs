//! The three FFI targets: `exla_runtime_callback`, `exla_beam_outfeed`, `exla_beam_infeed`.
//!
//! Each runs on the XLA thread executing the custom call. It reads the call frame (operand 0 names
//! the target, see [`super::target`]), builds the Erlang message EXLA's callback servers expect,
//! and for the two calls that need an answer waits through [`super::wait`]. The reply is checked
//! against the custom call's result buffers *before* anything is written, and every failure is an
//! `Err(text)` that fails the run with that text (the server returns it as
//! `{:error, {:runtime_error, text}}`).
//!
//! Message shapes (EXLA's):
//! * runtime call / io_call: `{:exla_runtime_call, callback_id, [{binary, {type, dims}}], {pid, ref}}`,
//!   answered by `send(pid, {ref, {:ok, [binary]}})` or `{ref, {:error, {kind, message}}}`;
//! * outfeed: `{:exla_outfeed, [{binary, {type, dims}}]}`, not answered;
//! * infeed: `{:exla_infeed, {pid, ref}, [{type, dims}]}`, answered like a runtime call.

use super::inspect::inspect;
use super::target::Resolved;
use super::wait::Call;
use super::{Dispatcher, Outcome};
use crate::node::term::{as_atom, atom, binary_to_term, list, tuple};
use crate::tensor_term::{data_bits, shape_term, size_text, tensor_term};
use crate::xla::{Attr, CallFrame, DType, TensorRef, TensorSpec};
use eetf::Term;
use std::sync::atomic::Ordering;

/// `exla_runtime_callback`: `Nx.runtime_call` (results from the reply) and `Nx.io_call`
/// (`num_aliased_data_outputs > 0`: the first results alias the data operands and stay untouched).
pub(crate) fn runtime_callback(d: &Dispatcher, frame: &mut CallFrame<'_>) -> Result<(), String> {
    let id = callback_id(frame)?;
    let what = format!("callback {}", inspect(&id));
    let num_aliased = match frame.attr("num_aliased_data_outputs") {
        None => 0,
        Some(Attr::U64(n)) => n as usize,
        Some(Attr::I64(n)) if n >= 0 => n as usize,
        Some(other) => {
            return Err(format!(
                "{what}: num_aliased_data_outputs must be an unsigned integer, got {other:?}"
            ))
        }
    };
    let ret_specs = frame.ret_specs();
    let aliases = frame.ret_aliases();
    let (resolved, args_spec, alias_copies) = {
        let args = frame.args();
        let resolved = d.resolve(args.first())?;
        if num_aliased > ret_specs.len() || num_aliased + 1 > args.len().max(1) {
            return Err(format!(
                "{what}: num_aliased_data_outputs = {num_aliased} but the call has {} data operands and {} results",
                args.len().saturating_sub(1),
                ret_specs.len()
            ));
        }
        let spec = args_spec(&args[1.min(args.len())..], &what)?;
        // XLA honours output_operand_aliases by passing the operand's own buffer; should it
        // ever pass a separate one, the passthrough value is copied in.
        let copies: Vec<Option<Vec<u8>>> = (0..num_aliased)
            .map(|i| (aliases.get(i) != Some(&Some(i + 1))).then(|| args[i + 1].data.to_vec()))
            .collect();
        (resolved, spec, copies)
    };
    let expected = expected_outputs(&ret_specs[num_aliased..], &what)?;
    crate::node::probe::mark(crate::node::probe::Step::Resolved);
    let Resolved { dest, run } = resolved;
    let call = Call {
        dest: &dest,
        run: run.as_ref(),
        timeout: run.as_ref().map_or(Some(d.default_timeout), |r| r.timeout),
        what: &what,
    };
    let build = |tag| {
        tuple(vec![
            atom("exla_runtime_call"),
            id.clone(),
            list(args_spec),
            tag,
        ])
    };
    let binaries = d
        .waiters
        .call(call, &d.counters, build, |reply| {
            parse_reply(reply, &what, &expected)
        })
        .map_err(|e| e.into_message())?;
    let mut rets = frame.rets_mut()?;
    for (i, r) in rets.iter_mut().enumerate() {
        if i < num_aliased {
            if let Some(Some(copy)) = alias_copies.get(i) {
                if copy.len() == r.data.len() {
                    r.data.copy_from_slice(copy);
                }
            }
        } else {
            r.write_nx_bytes(&binaries[i - num_aliased]);
        }
    }
    Ok(())
}

/// `exla_beam_outfeed`: sends `{:exla_outfeed, args_spec}` without waiting; result 0 (a `u8`
/// scalar) is 1 when the message was sent, 0 when the target is known to be gone (a dead local
/// pid or an unregistered local name). A remote target always gets 1: sending cannot know.
pub(crate) fn outfeed(d: &Dispatcher, frame: &mut CallFrame<'_>) -> Result<(), String> {
    let (resolved, spec) = {
        let args = frame.args();
        let resolved = d.resolve(args.first())?;
        let spec = args_spec(&args[1.min(args.len())..], "outfeed")?;
        (resolved, spec)
    };
    if let Some(run) = &resolved.run {
        if let Some(reason) = run.closed() {
            d.counters.ended(Outcome::Abandoned);
            return Err(format!("outfeed abandoned: {reason}"));
        }
    }
    let ret_specs = frame.ret_specs();
    if ret_specs.len() > 1 {
        return Err(format!(
            "exla_beam_outfeed must have one result (a u8 success flag), got {}",
            ret_specs.len()
        ));
    }
    if let Some((dtype, dims)) = ret_specs.first() {
        if !matches!(dtype, Some(DType::U8) | Some(DType::Pred) | Some(DType::S8))
            || crate::xla::element_count(dims) != 1
        {
            return Err(format!(
                "exla_beam_outfeed's result must be a u8 scalar (the success flag), got {}",
                describe_spec(*dtype, dims)
            ));
        }
    }
    let message = tuple(vec![atom("exla_outfeed"), list(spec)]);
    let sent = d.streams.send(&resolved.dest, message);
    d.counters.outfeeds.fetch_add(1, Ordering::Relaxed);
    if let Some(r) = frame.rets_mut()?.first_mut() {
        r.data[0] = u8::from(sent);
    }
    Ok(())
}

/// `exla_beam_infeed`: asks the stream target for the next value with
/// `{:exla_infeed, {pid, ref}, [{type, dims}]}` (one shape per result) and waits for
/// `{ref, {:ok, [binary]}}` exactly like a runtime call. Operands after operand 0 (EXLA's design
/// has a tag tensor there) are not sent.
pub(crate) fn infeed(d: &Dispatcher, frame: &mut CallFrame<'_>) -> Result<(), String> {
    let resolved = {
        let args = frame.args();
        d.resolve(args.first())?
    };
    let what = format!(
        "infeed from {}",
        super::inspect::dest(&resolved.dest, d.node.name())
    );
    let ret_specs = frame.ret_specs();
    let expected = expected_outputs(&ret_specs, &what)?;
    let out_spec: Vec<Term> = expected
        .iter()
        .map(|s| shape_term(s.dtype, &s.dims))
        .collect();
    let Resolved { dest, run } = resolved;
    let call = Call {
        dest: &dest,
        run: run.as_ref(),
        timeout: run.as_ref().map_or(Some(d.default_timeout), |r| r.timeout),
        what: &what,
    };
    let binaries = d
        .waiters
        .call(
            call,
            &d.counters,
            |tag| tuple(vec![atom("exla_infeed"), tag, list(out_spec)]),
            |reply| parse_reply(reply, &what, &expected),
        )
        .map_err(|e| e.into_message())?;
    for (r, b) in frame.rets_mut()?.iter_mut().zip(&binaries) {
        r.write_nx_bytes(b);
    }
    Ok(())
}

/// Decodes `callback_id` (term_to_binary(id), zero-padded into native-endian 64-bit words) using
/// its first `callback_id_size` bytes.
fn callback_id(frame: &CallFrame<'_>) -> Result<Term, String> {
    let bytes: Vec<u8> = match frame.attr("callback_id") {
        Some(Attr::ArrayI64(words)) => words.iter().flat_map(|w| w.to_ne_bytes()).collect(),
        Some(Attr::ArrayU64(words)) => words.iter().flat_map(|w| w.to_ne_bytes()).collect(),
        Some(Attr::ArrayU8(b)) => b,
        Some(other) => {
            return Err(format!(
                "exla_runtime_callback: callback_id must be an i64 array, got {other:?}"
            ))
        }
        None => {
            return Err(
                "exla_runtime_callback: the custom call has no backend_config callback_id".into(),
            )
        }
    };
    let size = match frame.attr("callback_id_size") {
        Some(Attr::U64(n)) => n as usize,
        Some(Attr::I64(n)) if n >= 0 => n as usize,
        None => bytes.len(),
        Some(other) => {
            return Err(format!(
                "exla_runtime_callback: callback_id_size must be an unsigned integer, got {other:?}"
            ))
        }
    };
    if size > bytes.len() {
        return Err(format!(
            "exla_runtime_callback: callback_id_size is {size} but callback_id holds {} bytes",
            bytes.len()
        ));
    }
    binary_to_term(&bytes[..size])
        .map_err(|e| format!("exla_runtime_callback: callback_id is not a valid term: {e}"))
}

/// `[{binary, {type, dims}}]` for the data operands.
fn args_spec(args: &[TensorRef<'_>], what: &str) -> Result<Vec<Term>, String> {
    args.iter()
        .enumerate()
        .map(|(i, a)| match a.dtype {
            Some(dt) => Ok(tensor_term(dt, &a.dims, a.to_nx_bytes())),
            None => Err(format!(
                "{what}: operand {} has an element type (#{}) that has no Nx equivalent",
                i + 1,
                a.xla_type
            )),
        })
        .collect()
}

fn expected_outputs(
    specs: &[(Option<DType>, Vec<i64>)],
    what: &str,
) -> Result<Vec<TensorSpec>, String> {
    specs
        .iter()
        .enumerate()
        .map(|(i, (dt, dims))| match dt {
            Some(dt) => Ok(TensorSpec::new(*dt, dims.clone())),
            None => Err(format!(
                "{what}: result {i} has an element type with no Nx equivalent"
            )),
        })
        .collect()
}

fn describe_spec(dtype: Option<DType>, dims: &[i64]) -> String {
    match dtype {
        Some(d) => TensorSpec::new(d, dims.to_vec()).to_string(),
        None => format!("an unsupported type {dims:?}"),
    }
}

/// Checks a reply against the expected outputs and returns their bytes, packed as Nx packs
/// them: one binary per output, of exactly its size (a bitstring of `count * bits` bits for
/// 2- and 4-bit elements, as `Nx.to_binary/1` gives it).
fn parse_reply(reply: Term, what: &str, expected: &[TensorSpec]) -> Result<Vec<Vec<u8>>, String> {
    let shape = |t: &Term| -> Option<(String, Term)> {
        let Term::Tuple(t) = t else { return None };
        if t.elements.len() != 2 {
            return None;
        }
        Some((as_atom(&t.elements[0])?.to_string(), t.elements[1].clone()))
    };
    let Some((tag, payload)) = shape(&reply) else {
        return Err(bad_reply(what, &reply));
    };
    match (tag.as_str(), payload) {
        ("ok", Term::List(l)) => {
            let mut sizes = Vec::with_capacity(l.elements.len());
            let mut bins = Vec::with_capacity(l.elements.len());
            for e in l.elements {
                match data_bits(e) {
                    Ok((bytes, bits)) => {
                        sizes.push(bits);
                        bins.push(bytes);
                    }
                    Err(other) => {
                        return Err(format!(
                            "{what} replied {{:ok, list}} with a non-binary element {}; expected {{:ok, [binary, ...]}}",
                            inspect(&other)
                        ))
                    }
                }
            }
            let want: Vec<usize> = expected.iter().map(|s| s.bit_size()).collect();
            if sizes != want {
                let exp: Vec<String> = expected
                    .iter()
                    .map(|s| format!("{s} ({})", size_text(s.bit_size(), s.dtype.is_sub_byte())))
                    .collect();
                let got: Vec<String> = sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &bits)| {
                        size_text(bits, expected.get(i).is_some_and(|s| s.dtype.is_sub_byte()))
                    })
                    .collect();
                return Err(format!(
                    "{what} returned a reply that does not match its outputs: expected {} {} [{}], got {} [{}]",
                    want.len(),
                    if want.len() == 1 { "binary" } else { "binaries" },
                    exp.join(", "),
                    sizes.len(),
                    got.join(", ")
                ));
            }
            Ok(bins)
        }
        ("ok", Term::ByteList(b)) => Err(format!(
            "{what} replied {{:ok, {}}}: expected a list of binaries, one per output",
            inspect(&Term::ByteList(b))
        )),
        ("error", Term::Tuple(t)) if t.elements.len() == 2 => {
            let kind = match &t.elements[0] {
                Term::Atom(a) => a.name.clone(),
                other => inspect(other),
            };
            let message = match &t.elements[1] {
                Term::Binary(b) => String::from_utf8_lossy(&b.bytes).into_owned(),
                Term::ByteList(b) => String::from_utf8_lossy(&b.bytes).into_owned(),
                Term::Atom(a) => a.name.clone(),
                other => inspect(other),
            };
            Err(format!("elixir callback returned {kind}: {message}"))
        }
        _ => Err(bad_reply(what, &reply)),
    }
}

fn bad_reply(what: &str, reply: &Term) -> String {
    format!(
        "{what} replied {}; expected {{:ok, [binary, ...]}} or {{:error, {{kind, message}}}}",
        inspect(reply)
    )
}
