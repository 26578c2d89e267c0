//! Why the node stops: SIGTERM or SIGINT, or, under `--exit-on-stdin-close`, the end of its
//! standard input. A parent that starts the node with a pipe for its standard input (an Erlang
//! port, `ssh`) closes it by exiting, however it exits (`kill -9` included: the kernel closes
//! the pipe), so a node watching it never outlives the VM that started it.
//!
//! Also the cookie read from standard input (`--cookie-from-stdin`): its first line, so that the
//! cookie is in no command line (which `ps` shows to everyone, on the node's host and, through
//! `ssh`'s own arguments, on the parent's) and no environment.

use std::io::{BufRead, ErrorKind, Read};
use std::time::Duration;
use tokio::sync::mpsc;

/// How long a graceful shutdown may take before the node ends at once.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// What asked the node to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// SIGTERM or SIGINT (its number).
    Signal(i32),
    /// Standard input reached its end, or could no longer be read.
    InputClosed,
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::Signal(signal) => {
                f.write_str(signal_hook::low_level::signal_name(*signal).unwrap_or("a signal"))
            }
            StopReason::InputClosed => f.write_str("standard input closed"),
        }
    }
}

/// The requests to stop, from every watcher started on it; the first one counts.
pub struct StopRequests {
    sender: mpsc::UnboundedSender<StopReason>,
    receiver: mpsc::UnboundedReceiver<StopReason>,
}

impl Default for StopRequests {
    fn default() -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        StopRequests { sender, receiver }
    }
}

impl StopRequests {
    pub fn new() -> Self {
        Self::default()
    }

    /// Watches SIGTERM and SIGINT on a thread of its own, outside the async runtime. The first
    /// one is a request to stop; a second one ends the process at once (the signal's default
    /// action), whatever runs are doing.
    pub fn watch_signals(&self) -> std::io::Result<()> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        use signal_hook::low_level::emulate_default_handler;
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
        let sender = self.sender.clone();
        std::thread::Builder::new()
            .name("xla-node-signals".into())
            .spawn(move || {
                let mut signals = signals.forever();
                let Some(signal) = signals.next() else { return };
                let _ = sender.send(StopReason::Signal(signal));
                if let Some(again) = signals.next() {
                    let _ = emulate_default_handler(again);
                }
            })?;
        Ok(())
    }

    /// Reads `input` to its end on a thread of its own, discarding what it reads, and then asks
    /// the node to stop. A read error counts as the end: the node can no longer tell whether
    /// its parent lives.
    pub fn watch_input(&self, mut input: impl Read + Send + 'static) -> std::io::Result<()> {
        let sender = self.sender.clone();
        std::thread::Builder::new()
            .name("xla-node-stdin".into())
            .spawn(move || {
                let mut scratch = [0u8; 4096];
                loop {
                    match input.read(&mut scratch) {
                        Ok(0) => break,
                        Ok(_) => continue,
                        Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                        Err(e) => {
                            tracing::warn!("reading standard input failed: {e}");
                            break;
                        }
                    }
                }
                let _ = sender.send(StopReason::InputClosed);
            })?;
        Ok(())
    }

    /// The first request to stop.
    pub async fn first(mut self) -> StopReason {
        // `self` holds a sender, so the channel never closes and `recv` only ends with a request.
        self.receiver
            .recv()
            .await
            .expect("the stop channel holds a sender of its own")
    }
}

/// Ends the process if the graceful shutdown `reason` started is not over within
/// [`SHUTDOWN_GRACE`]: by the signal's default action for a signal (as a second one does), with
/// status 1 otherwise.
pub fn bound_shutdown(reason: StopReason) {
    std::thread::spawn(move || {
        std::thread::sleep(SHUTDOWN_GRACE);
        tracing::error!(
            "shutdown took more than {} s; ending now",
            SHUTDOWN_GRACE.as_secs()
        );
        if let StopReason::Signal(signal) = reason {
            let _ = signal_hook::low_level::emulate_default_handler(signal);
        }
        std::process::exit(1);
    });
}

/// The line the node writes on standard error, under `--cookie-from-stdin`, before it reads the
/// cookie. A parent writes the cookie once it sees it: a command that exits before (arguments
/// refused, `ssh` failing to connect) is then never written to, and its exit status reaches the
/// parent, where a write into its closed pipe would close an Erlang port without one.
pub const COOKIE_PROMPT: &str = "xla_node: waiting for the cookie on standard input";

/// The cookie on the first line of `input`, without its line ending. An input that ends before
/// a line, an empty line, or one that is not UTF-8 is an error saying so.
pub fn read_cookie(input: &mut impl BufRead) -> anyhow::Result<String> {
    let mut line = String::new();
    let read = input
        .read_line(&mut line)
        .map_err(|e| anyhow::anyhow!("--cookie-from-stdin: reading standard input failed: {e}"))?;
    if read == 0 {
        anyhow::bail!("--cookie-from-stdin: standard input ended before a line with the cookie");
    }
    let cookie = line.trim_end_matches(['\n', '\r']);
    if cookie.is_empty() {
        anyhow::bail!("--cookie-from-stdin: the first line of standard input is empty");
    }
    Ok(cookie.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn the_cookie_is_the_first_line() {
        let mut input = std::io::Cursor::new(b"secret cookie\r\nmore\n".to_vec());
        assert_eq!(read_cookie(&mut input).unwrap(), "secret cookie");
        let mut rest = String::new();
        input.read_line(&mut rest).unwrap();
        assert_eq!(rest, "more\n", "only the first line is taken");

        let mut last = std::io::Cursor::new(b"no newline".to_vec());
        assert_eq!(read_cookie(&mut last).unwrap(), "no newline");
    }

    #[test]
    fn no_cookie_line_is_an_error_saying_why() {
        let ended = read_cookie(&mut std::io::Cursor::new(Vec::new())).unwrap_err();
        assert!(ended.to_string().contains("ended before"), "{ended}");
        let empty = read_cookie(&mut std::io::Cursor::new(b"\n".to_vec())).unwrap_err();
        assert!(empty.to_string().contains("empty"), "{empty}");
    }

    #[tokio::test]
    async fn the_end_of_input_is_a_request_to_stop_and_data_is_not() {
        let (mut parent, child) = UnixStream::pair().unwrap();
        let requests = StopRequests::new();
        requests.watch_input(child).unwrap();
        parent
            .write_all(b"anything the parent writes is read and dropped\n")
            .unwrap();
        let mut first = Box::pin(requests.first());
        let early = tokio::time::timeout(Duration::from_millis(200), &mut first).await;
        assert!(early.is_err(), "data is no request to stop");
        drop(parent);
        let reason = tokio::time::timeout(Duration::from_secs(10), first)
            .await
            .expect("the closed input stops the node");
        assert_eq!(reason, StopReason::InputClosed);
        assert_eq!(reason.to_string(), "standard input closed");
    }

    #[test]
    fn signals_are_named() {
        assert_eq!(
            StopReason::Signal(signal_hook::consts::SIGTERM).to_string(),
            "SIGTERM"
        );
    }
}
