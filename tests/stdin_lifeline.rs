//! The node binary under a parent that holds its standard input, as an Erlang port or `ssh`
//! does: `--cookie-from-stdin` takes the cookie from the first line, and `--exit-on-stdin-close`
//! stops the node (gracefully, exit status 0, its name gone from epmd) once the parent closes
//! the pipe. Real binary, real epmd, real plugin.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The node's stderr lines, as they come.
struct Started {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    name: String,
}

fn start(flags: &[&str]) -> Started {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let name = format!(
        "lifeline{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let mut command = Command::new(env!("CARGO_BIN_EXE_xla_node"));
    command
        .args(["--sname", &name])
        .args(flags)
        .env_remove("XLA_NODE_COOKIE")
        .env("XLA_NODE_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("the node binary starts");
    let stderr = child.stderr.take().unwrap();
    let (sender, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let stdin = child.stdin.take();
    Started {
        child,
        stdin,
        lines,
        name,
    }
}

impl Started {
    /// Waits for a log line containing `text`; returns every line seen up to it.
    fn wait_for_line(&self, text: &str) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(text);
                    seen.push(line);
                    if found {
                        return seen;
                    }
                }
                Err(_) => break,
            }
        }
        panic!("no line with {text:?} from {}; saw {seen:#?}", self.name);
    }

    fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn registered_in_epmd(&self) -> bool {
        let out = Command::new("epmd").arg("-names").output().unwrap();
        String::from_utf8_lossy(&out.stdout).contains(&format!("name {} at", self.name))
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_closed_stdin_stops_the_node_gracefully() {
    let mut node = start(&["--cookie-from-stdin", "--exit-on-stdin-close"]);
    let mut stdin = node.stdin.take().unwrap();
    // The node asks first, as a parent writing the cookie waits for it to.
    let asked = node.wait_for_line("waiting for the cookie");
    assert_eq!(
        asked,
        [xla_node::shutdown::COOKIE_PROMPT],
        "the node's first line asks for the cookie"
    );
    writeln!(stdin, "lifeline-cookie").unwrap();
    // Anything after the cookie's line is read and ignored, not taken as the end.
    writeln!(stdin, "noise").unwrap();
    node.wait_for_line("XLA ready");
    assert!(node.registered_in_epmd(), "{} is in epmd", node.name);
    assert!(
        node.child.try_wait().unwrap().is_none(),
        "the node keeps running"
    );

    drop(stdin);
    let lines = node.wait_for_line("shutting down");
    assert!(
        lines
            .last()
            .unwrap()
            .contains("standard input closed: shutting down"),
        "{lines:#?}"
    );
    let status = node
        .wait_exit(Duration::from_secs(10))
        .expect("the node exits once its stdin is closed");
    assert!(status.success(), "a graceful stop exits 0, got {status}");
    assert!(!node.registered_in_epmd(), "its name left epmd");
}

#[test]
fn without_the_flag_a_closed_stdin_changes_nothing() {
    let mut node = start(&["--cookie", "lifeline-cookie"]);
    node.wait_for_line("XLA ready");
    drop(node.stdin.take());
    assert!(
        node.wait_exit(Duration::from_millis(500)).is_none(),
        "the node runs on"
    );
    let pid = node.child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let status = node
        .wait_exit(Duration::from_secs(10))
        .expect("SIGTERM ends it");
    assert!(status.success());
}

#[test]
fn an_input_without_a_cookie_line_stops_start_up_saying_so() {
    let mut node = start(&["--cookie-from-stdin"]);
    drop(node.stdin.take());
    let status = node
        .wait_exit(Duration::from_secs(10))
        .expect("the node stops at once");
    assert!(!status.success());
    // The reader thread ends with the stderr pipe, which the exit closed.
    let lines: Vec<String> = node.lines.iter().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("standard input ended before a line with the cookie")),
        "{lines:#?}"
    );
}
