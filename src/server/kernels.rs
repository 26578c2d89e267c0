//! Native kernels from the operator's side: the `--kernel`, `--kernel-dir` and
//! `--kernel-version-shim` policy, and loading at start-up.
//!
//! Start-up loads every `--kernel` before the node accepts connections, and any failure stops
//! it. At run time a client may load only libraries under a directory the operator allowed with
//! `--kernel-dir` (`allowed_path`, used by `load_kernel.rs`): loading a library runs its code
//! inside the node, so without that flag the request is refused.

use super::error::RequestError;
use crate::xla::{load_kernel, Client, KernelSpec, Loaded};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// `--kernel TARGET=PATH:SYMBOL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelArg {
    pub target: String,
    pub library: PathBuf,
    pub symbol: String,
}

impl FromStr for KernelArg {
    type Err = String;

    /// The symbol follows the last `:`, so paths may contain colons.
    fn from_str(s: &str) -> Result<KernelArg, String> {
        let usage = || format!("expected TARGET=PATH:SYMBOL, got {s:?}");
        let (target, rest) = s.split_once('=').ok_or_else(usage)?;
        let (library, symbol) = rest.rsplit_once(':').ok_or_else(usage)?;
        if target.is_empty() || library.is_empty() || symbol.is_empty() {
            return Err(usage());
        }
        Ok(KernelArg {
            target: target.to_string(),
            library: PathBuf::from(library),
            symbol: symbol.to_string(),
        })
    }
}

/// Which kernels get the version shim (`--kernel-version-shim[=TARGET]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum VersionShim {
    #[default]
    None,
    All,
    Targets(Vec<String>),
}

impl VersionShim {
    /// From the values of the repeated flag: a bare flag (empty value) means every kernel.
    pub fn from_flags(values: &[String]) -> VersionShim {
        if values.is_empty() {
            VersionShim::None
        } else if values.iter().any(|v| v.is_empty()) {
            VersionShim::All
        } else {
            VersionShim::Targets(values.to_vec())
        }
    }

    pub(super) fn applies_to(&self, target: &str) -> bool {
        match self {
            VersionShim::None => false,
            VersionShim::All => true,
            VersionShim::Targets(targets) => targets.iter().any(|t| t == target),
        }
    }
}

/// The operator's kernel settings.
#[derive(Debug, Clone, Default)]
pub struct KernelPolicy {
    /// Loaded at start-up.
    pub kernels: Vec<KernelArg>,
    /// Where `{:load_kernel, ...}` may load libraries from (none: run-time loading refused).
    pub dirs: Vec<PathBuf>,
    pub version_shim: VersionShim,
}

/// Loads the start-up kernels; the first failure is the error that stops the node.
pub fn load_at_start(client: &Client, policy: &KernelPolicy) -> anyhow::Result<()> {
    for k in &policy.kernels {
        let spec = KernelSpec {
            target: k.target.clone(),
            library: k.library.clone(),
            symbol: k.symbol.clone(),
            version_shim: policy.version_shim.applies_to(&k.target),
        };
        let loaded = match load_kernel(client, &spec)? {
            Loaded::New(k) | Loaded::Already(k) => k,
        };
        tracing::info!(
            target = %loaded.target,
            library = %loaded.library.display(),
            symbol = %loaded.symbol,
            ffi = %format!("{}.{}", loaded.ffi_version.0, loaded.ffi_version.1),
            shimmed = loaded.shimmed,
            "kernel loaded"
        );
    }
    Ok(())
}

/// Where a run-time load may read `path` from: inside one of the allowed directories (a
/// relative path is taken relative to each in turn), after resolving links and `..`.
pub(super) fn allowed_path(dirs: &[PathBuf], path: &Path) -> Result<PathBuf, RequestError> {
    if dirs.is_empty() {
        return Err(RequestError::Kernel(
            "loading kernels at run time is disabled: start the node with --kernel-dir DIR to \
             allow libraries under DIR"
                .into(),
        ));
    }
    let candidates: Vec<PathBuf> = if path.is_absolute() {
        vec![path.to_path_buf()]
    } else {
        dirs.iter().map(|d| d.join(path)).collect()
    };
    let listed = dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    for candidate in &candidates {
        let Ok(resolved) = std::fs::canonicalize(candidate) else {
            continue;
        };
        let inside = dirs.iter().any(|d| {
            std::fs::canonicalize(d).is_ok_and(|d| resolved.starts_with(&d) && resolved != d)
        });
        return if inside {
            Ok(resolved)
        } else {
            Err(RequestError::Kernel(format!(
                "{} is outside the directories allowed by --kernel-dir ({listed})",
                path.display()
            )))
        };
    }
    Err(RequestError::Kernel(format!(
        "no such library: {} (allowed directories: {listed})",
        path.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_arg_takes_the_symbol_after_the_last_colon() {
        let k: KernelArg = "my_op=/opt/k:v2/libk.so:MyOp".parse().unwrap();
        assert_eq!(k.target, "my_op");
        assert_eq!(k.library, PathBuf::from("/opt/k:v2/libk.so"));
        assert_eq!(k.symbol, "MyOp");
        assert!("my_op=/opt/libk.so".parse::<KernelArg>().is_err());
        assert!("/opt/libk.so:MyOp".parse::<KernelArg>().is_err());
        assert!("t=:MyOp".parse::<KernelArg>().is_err());
    }

    #[test]
    fn version_shim_flags() {
        assert_eq!(VersionShim::from_flags(&[]), VersionShim::None);
        assert_eq!(VersionShim::from_flags(&["".into()]), VersionShim::All);
        let some = VersionShim::from_flags(&["a".into(), "b".into()]);
        assert!(some.applies_to("a") && !some.applies_to("c"));
    }

    #[test]
    fn run_time_loads_stay_inside_the_allowed_directories() {
        let dir = std::env::temp_dir().join(format!("xla_node_kdir_{}", std::process::id()));
        let inside = dir.join("allowed");
        std::fs::create_dir_all(&inside).unwrap();
        std::fs::write(inside.join("lib.so"), b"").unwrap();
        std::fs::write(dir.join("outside.so"), b"").unwrap();
        let dirs = vec![inside.clone()];
        let text = |r: Result<PathBuf, RequestError>| r.unwrap_err().to_string();
        assert!(text(allowed_path(&[], Path::new("/x.so"))).contains("--kernel-dir"));
        assert_eq!(
            allowed_path(&dirs, Path::new("lib.so")).unwrap(),
            std::fs::canonicalize(inside.join("lib.so")).unwrap()
        );
        assert!(allowed_path(&dirs, &inside.join("lib.so")).is_ok());
        assert!(text(allowed_path(&dirs, Path::new("../outside.so"))).contains("outside"));
        assert!(text(allowed_path(&dirs, &dir.join("outside.so"))).contains("outside"));
        assert!(text(allowed_path(&dirs, Path::new("missing.so"))).contains("no such library"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
