//! `{:describe, exe}`: what an executable takes and gives, `{:ok, %{parameters: [{type, dims}],
//! results: [{type, dims}], devices: [i, ...]}}`. For an SPMD program (compiled with `devices:`)
//! the types are each device's shard, as its runs take and give them, and `devices` its
//! devices in partition order; a single-device program has `devices: []` (it runs on any).
//! `{:describe, buffer}`: `{:ok, %{shape: {type, dims}, device: n}}`, where it lives.
//!
//! A client that leaves the partitioner to split an SPMD program's results learns their shapes
//! here, before any run, and can describe the buffers a run keeps on the devices; one that
//! placed buffers on several devices learns which is where.

use super::error::RequestError;
use super::parse::{reference, Elements};
use super::resources::Resource;
use super::state::State;
use crate::node::term::{int, list, map};
use crate::tensor_term::shape_term;
use crate::xla::TensorSpec;
use eetf::{Reference, Term};

/// `{:describe, exe_or_buffer}`, parsed.
#[derive(Debug)]
pub struct DescribeRequest {
    reference: Reference,
}

impl DescribeRequest {
    pub fn parse(elements: &mut Elements) -> Result<DescribeRequest, RequestError> {
        Ok(DescribeRequest {
            reference: reference(elements.required())?,
        })
    }

    /// Answered here: an executable knows its types since its compile, a buffer its own.
    pub fn apply(self, state: &State) -> Result<Term, RequestError> {
        if let Resource::Executable(program) = state.lookup(&self.reference)? {
            let exe = &program.exe;
            let devices = exe
                .partition_devices()
                .iter()
                .map(|&d| int(d as i64))
                .collect();
            return Ok(description(exe.parameters(), exe.outputs(), list(devices)));
        }
        // A buffer; an upload not yet done is refused with what it is.
        let buffer = state.lookup_buffer(&self.reference)?;
        Ok(buffer_description(buffer.spec(), buffer.device()))
    }
}

fn buffer_description(spec: &TensorSpec, device: usize) -> Term {
    map(vec![
        ("shape", shape_term(spec.dtype, &spec.dims)),
        ("device", int(device as i64)),
    ])
}

fn description(parameters: &[TensorSpec], results: &[TensorSpec], devices: Term) -> Term {
    let shapes =
        |specs: &[TensorSpec]| list(specs.iter().map(|s| shape_term(s.dtype, &s.dims)).collect());
    map(vec![
        ("parameters", shapes(parameters)),
        ("results", shapes(results)),
        ("devices", devices),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xla::DType;

    #[test]
    fn describes_types_as_run_arguments_are_written() {
        let term = description(
            &[TensorSpec::new(DType::F32, vec![2, 3])],
            &[TensorSpec::new(DType::F32, vec![2])],
            list(vec![int(0), int(1)]),
        );
        let text = term.to_string();
        assert!(text.contains("parameters"), "{text}");
        assert!(text.contains("[2, 3]") || text.contains("[2,3]"), "{text}");
        assert!(text.contains("devices"), "{text}");
    }

    #[test]
    fn describes_a_buffer_by_its_shape_and_device() {
        let text = buffer_description(&TensorSpec::new(DType::F32, vec![4]), 2).to_string();
        assert!(text.contains("shape") && text.contains("device"), "{text}");
        assert!(text.contains("[4]") && text.contains('2'), "{text}");
    }
}
