//! The last place a run waits before `Execute`: the [`Gate`] that keeps runs that call back out of
//! XLA's line of queued computations. The scheduler ([`super::Scheduler`]) hands each admitted run
//! a [`super::Place`] whose [`super::Place::enter_xla`] passes it.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Keeps runs that call back out of the line in which XLA's CPU client executes queued
/// computations.
///
/// The client executes a program within `Execute`, on the calling thread, only if the program is
/// cheap (under 1,000 flops) and no computation it queued earlier is still pending; otherwise it
/// queues it, and executes the queued ones one after another, client-wide, in the order they
/// came. A run that calls back and lands in that line holds it for as long as its callbacks wait:
/// every large program after it waits too. So a run that calls back starts only when no run that
/// may be queued is in XLA, and runs without callbacks start only when no run that calls back is
/// between its start and the moment it is known to be executing on its own thread. Both windows
/// last microseconds for the programs they are meant for; turns are taken in arrival order, so
/// neither kind starves the other. Runs that call back and are queued all the same (large ones)
/// are counted as queued runs from then on, which they are.
///
/// All waiting happens on executor threads. A run waits only for windows of runs that already
/// started, which end without any other run's help: no cycle.
#[derive(Default)]
pub struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    /// Runs that may be in XLA's line now: runs without callbacks from start to completion, and
    /// runs that call back once XLA queued them.
    queueable: usize,
    /// Runs that call back, started, and not yet known to execute on their own thread.
    starting: usize,
    next_ticket: u64,
    serving: u64,
}

/// Where a run that calls back stands (see [`Gate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Starting,
    OnItsThread,
    Queued,
    Done,
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for this run's turn and for `clear`, then counts the run in with `enter`.
    fn pass(&self, clear: impl Fn(&GateState) -> bool, enter: impl FnOnce(&mut GateState)) {
        let mut state = self.lock();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        while state.serving != ticket || !clear(&state) {
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        state.serving += 1;
        enter(&mut state);
        drop(state);
        self.changed.notify_all();
    }

    fn update(&self, change: impl FnOnce(&mut GateState)) {
        change(&mut self.lock());
        self.changed.notify_all();
    }

    /// A run without callbacks: its window lasts until the returned guard drops.
    pub(super) fn run_without_callbacks(&self) -> QueueableRun<'_> {
        self.pass(|s| s.starting == 0, |s| s.queueable += 1);
        QueueableRun(self)
    }

    /// A run that calls back: passes once no run may be in XLA's line. Report what is learned
    /// of where it executes on the returned guard.
    pub(super) fn run_calling_back(self: &Arc<Self>) -> Arc<CallingBackRun> {
        self.pass(|s| s.queueable == 0, |s| s.starting += 1);
        Arc::new(CallingBackRun {
            gate: self.clone(),
            phase: Mutex::new(Phase::Starting),
        })
    }
}

/// The window of a run without callbacks; dropping it closes the window.
pub struct QueueableRun<'a>(&'a Gate);

impl Drop for QueueableRun<'_> {
    fn drop(&mut self) {
        self.0.update(|s| s.queueable -= 1);
    }
}

/// A run that calls back, past the gate.
pub struct CallingBackRun {
    gate: Arc<Gate>,
    phase: Mutex<Phase>,
}

impl CallingBackRun {
    fn move_to(&self, next: Phase) {
        let mut phase = self.phase.lock().unwrap_or_else(|p| p.into_inner());
        let from = *phase;
        let moves = match next {
            Phase::OnItsThread | Phase::Queued => from == Phase::Starting,
            Phase::Done => from != Phase::Done,
            Phase::Starting => false,
        };
        if !moves {
            return;
        }
        *phase = next;
        self.gate.update(|s| {
            match from {
                Phase::Starting => s.starting -= 1,
                Phase::Queued => s.queueable -= 1,
                Phase::OnItsThread | Phase::Done => {}
            }
            if next == Phase::Queued {
                s.queueable += 1;
            }
        });
    }

    /// One of the program's custom calls is running on the thread that called `Execute`, which
    /// only happens inside `Execute`: the program executes there, out of XLA's line.
    pub fn called_back_on_run_thread(&self) {
        self.move_to(Phase::OnItsThread);
    }

    /// `Execute` returned; `completed`: the program had already finished (it executed on this
    /// thread), else XLA queued it.
    pub(super) fn launched(&self, completed: bool) {
        self.move_to(if completed {
            Phase::OnItsThread
        } else {
            Phase::Queued
        });
    }

    /// The run is over (also when it failed before `Execute`).
    pub(super) fn finished(&self) {
        self.move_to(Phase::Done);
    }
}

impl Drop for CallingBackRun {
    fn drop(&mut self) {
        self.finished();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Passes the gate as a run without callbacks on a thread of its own; the receiver hears
    /// when it is through.
    fn run_without_callbacks(
        gate: &Arc<Gate>,
    ) -> (mpsc::Receiver<()>, std::thread::JoinHandle<()>) {
        let (through, heard) = mpsc::channel();
        let gate = gate.clone();
        let thread = std::thread::spawn(move || {
            let _window = gate.run_without_callbacks();
            through.send(()).unwrap();
        });
        (heard, thread)
    }

    #[test]
    fn runs_without_callbacks_wait_while_a_run_that_calls_back_starts() {
        let gate = Arc::new(Gate::default());
        let calling_back = gate.run_calling_back();
        let (heard, thread) = run_without_callbacks(&gate);
        assert!(heard.recv_timeout(Duration::from_millis(100)).is_err());
        // Its first custom call on its own thread: it executes there, out of XLA's line.
        calling_back.called_back_on_run_thread();
        heard.recv_timeout(Duration::from_secs(5)).unwrap();
        thread.join().unwrap();
    }

    #[test]
    fn a_run_that_calls_back_and_was_queued_holds_the_line_until_it_is_done() {
        let gate = Arc::new(Gate::default());
        let calling_back = gate.run_calling_back();
        calling_back.launched(false);
        // Queued by XLA: it may be in the line, so a later run that calls back waits for it.
        let (through, heard) = mpsc::channel();
        let waiting = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                let _next = gate.run_calling_back();
                through.send(()).unwrap();
            })
        };
        assert!(heard.recv_timeout(Duration::from_millis(100)).is_err());
        drop(calling_back);
        heard.recv_timeout(Duration::from_secs(5)).unwrap();
        waiting.join().unwrap();
    }
}
