//! The magic cookie, found as `erl` finds it: `--cookie`, else `$HOME/.erlang.cookie`, which is
//! created with 20 random capital letters and mode 0400 when missing.

use std::io::Write;
use std::path::PathBuf;

pub fn cookie_path() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".erlang.cookie"))
}

/// Reads the cookie file, creating it the way `erl` does if it does not exist.
pub fn load_or_create() -> std::io::Result<String> {
    let path =
        cookie_path().ok_or_else(|| std::io::Error::other("HOME is not set; pass --cookie"))?;
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text.trim().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let cookie: String = (0..20)
                .map(|_| (b'A' + rand::random::<u8>() % 26) as char)
                .collect();
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o400);
            options.open(&path)?.write_all(cookie.as_bytes())?;
            Ok(cookie)
        }
        Err(e) => Err(e),
    }
}
