//! Tensors in host memory: what a request carries in and a reply carries out.

use super::dtype::{DType, TensorSpec};

/// A dense row-major tensor in host memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostTensor {
    pub dtype: DType,
    pub dims: Vec<i64>,
    pub data: Vec<u8>,
}

impl HostTensor {
    pub fn new(dtype: DType, dims: Vec<i64>, data: Vec<u8>) -> Self {
        HostTensor { dtype, dims, data }
    }

    pub fn spec(&self) -> TensorSpec {
        TensorSpec::new(self.dtype, self.dims.clone())
    }
}
