//! The sending side of outfeed streams.
//!
//! All outfeed messages leave from one process of this node, so messages to one stream target
//! arrive in the order the program produced them (Erlang orders messages per sender/receiver
//! pair only). The process's mailbox is used for one thing: telling whether a *local* pid is
//! alive, by monitoring it (a dead local pid answers `noproc` at once, synchronously), so the
//! outfeed's success flag can say 0. For remote targets sending cannot know; the flag is 1.

use crate::node::{Dest, Node, Process, Signal};
use eetf::Term;
use std::sync::Mutex;

pub(crate) struct Streams {
    node: Node,
    sender: Mutex<Process>,
}

impl Streams {
    pub(crate) fn new(node: Node) -> Self {
        let sender = Mutex::new(node.spawn_process());
        Streams { node, sender }
    }

    /// Sends `message` to `dest`; false when the target is known not to exist.
    pub(crate) fn send(&self, dest: &Dest, message: Term) -> bool {
        let local = self.node.name();
        let mut sender = self.sender.lock().unwrap_or_else(|p| p.into_inner());
        let known_gone = match dest {
            Dest::Name(name) => self.node.whereis(name).is_none(),
            Dest::Remote { name, node } if node == local => self.node.whereis(name).is_none(),
            Dest::Pid(pid) if pid.node.name == local => {
                let mref = sender.monitor(dest.clone());
                let mut gone = false;
                // A local monitor on a dead pid delivers its `noproc` before `monitor` returns.
                while let Some(signal) = sender.try_recv() {
                    if let Signal::Down { reference, .. } = signal {
                        gone |= reference == mref;
                    }
                }
                sender.demonitor(&mref);
                gone
            }
            _ => false,
        };
        if known_gone {
            return false;
        }
        sender.send(dest.clone(), message);
        true
    }
}
