//! `{:load_kernel, target, path, symbol}` / `{:load_kernel, target, path, symbol, opts}`: a
//! native kernel (an XLA FFI handler in a shared library) loaded into a running node.
//!
//! Loading a library runs its code inside the node, so the path is checked here against the
//! directories the operator allowed (`--kernel-dir`, see `kernels.rs`) before anything is
//! loaded; the loading itself (see `xla/kernel.rs`) runs on an executor thread, which replies.

use super::error::RequestError;
use super::kernels::allowed_path;
use super::parse::{argument, boolean, keywords, string, Elements};
use super::state::State;
use crate::node::gen::Caller;
use crate::node::term::atom;
use crate::xla::{load_kernel, KernelSpec, Loaded};
use std::path::PathBuf;
use std::sync::Arc;

/// `{:load_kernel, target, path, symbol, opts}`, parsed.
#[derive(Debug)]
pub struct LoadKernelRequest {
    target: String,
    path: PathBuf,
    symbol: String,
    /// `None`: as the node's `--kernel-version-shim` says.
    version_shim: Option<bool>,
}

impl LoadKernelRequest {
    pub fn parse(elements: &mut Elements) -> Result<LoadKernelRequest, RequestError> {
        let mut text = |what: &str| {
            let term = elements.required();
            string(&term).ok_or_else(|| {
                argument(format!(
                    "load_kernel: the {what} must be a string, got {term}"
                ))
            })
        };
        let (target, path, symbol) = (text("target")?, text("path")?, text("symbol")?);
        let mut version_shim = None;
        if let Some(opts) = elements.optional() {
            for (key, value) in keywords(&opts)? {
                match key.as_str() {
                    "version_shim" => version_shim = Some(boolean(&key, &value)?),
                    other => {
                        return Err(argument(format!(
                            "unknown load_kernel option {other} (supported: version_shim)"
                        )))
                    }
                }
            }
        }
        Ok(LoadKernelRequest {
            target,
            path: path.into(),
            symbol,
            version_shim,
        })
    }

    /// Checks the path against `--kernel-dir` here, loads on an executor thread.
    pub fn apply(self, state: &Arc<State>, from: Caller) {
        let library = match allowed_path(&state.kernel_policy().dirs, &self.path) {
            Ok(library) => library,
            Err(e) => return state.reply_error(&from, &e),
        };
        let spec = KernelSpec {
            version_shim: self
                .version_shim
                .unwrap_or_else(|| state.kernel_policy().version_shim.applies_to(&self.target)),
            target: self.target,
            library,
            symbol: self.symbol,
        };
        state.spawn(move |state| {
            let result = load_kernel(state.client(), &spec);
            if let Ok(Loaded::New(k)) = &result {
                tracing::info!(target = %k.target, library = %k.library.display(), symbol = %k.symbol, shimmed = k.shimmed, "kernel loaded at run time");
            }
            match result {
                Ok(_) => state.reply(&from, atom("ok")),
                Err(e) => state.reply_error(&from, &RequestError::Kernel(e.to_string())),
            }
        });
    }
}
