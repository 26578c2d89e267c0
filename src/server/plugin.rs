//! Where the PJRT plugin is: the one the operator names, else the CPU plugin where
//! `scripts/setup.sh` installs it.

use std::path::{Path, PathBuf};

/// Where `scripts/setup.sh` installs the CPU plugin.
fn default_plugin_dir() -> PathBuf {
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("/usr/local/share"));
    base.join("xla_node/pjrt")
}

fn default_plugin_path() -> PathBuf {
    default_plugin_dir().join("xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")
}

/// The plugin to load: the one named, else the default CPU plugin, else an error that says how
/// to install it.
pub fn locate_plugin(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        anyhow::ensure!(
            path.is_file(),
            "PJRT plugin {} does not exist",
            path.display()
        );
        return Ok(path.to_path_buf());
    }
    let default = default_plugin_path();
    anyhow::ensure!(
        default.is_file(),
        "no PJRT plugin found at {}. Install the CPU plugin with:\n    python3 -m pip install --target {} xla-cpu-pjrt\n\
         (or run scripts/setup.sh), or pass --pjrt-plugin PATH / set XLA_NODE_PJRT_PLUGIN",
        default.display(),
        default_plugin_dir().display()
    );
    Ok(default)
}
