//! Which queued run a freed place goes to: weighted fair queueing between client nodes, and
//! within one node its priorities, then arrival order.
//!
//! Each client node has its own queue. A node's *pass* grows by `1 / weight` with each run it is
//! admitted (start-time fair queueing, counted in places): the next place goes to the node with
//! runs waiting whose pass is lowest, so two nodes that both keep runs waiting are admitted in
//! the ratio of their weights, and a node whose runs wait gets its next place after at most one
//! admission of every other node with runs waiting (of weight 1), whatever those have queued. A
//! node that had nothing waiting starts again at the pass of the last run admitted: time spent
//! idle is not saved up as credit.
//!
//! Within a node, a `:high` run goes before every `:normal` one, and a `:normal` before every
//! `:low`; runs of one priority go in arrival order. Runs also wait in *lanes* by what they may
//! take ([`Lane`]): a run whose lane is full now (the node's runs that call back, or the runs in
//! XLA's line on its device, at their bound) lets the runs of other lanes go by, so a place never
//! stays empty while a run that could take it waits.

use super::tenants::Priority;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// A node's pass grows by `PASS_UNIT / weight` per run admitted.
const PASS_UNIT: u128 = 1 << 40;

/// What a queued run needs besides a place: the bound it counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// A program known to execute within `Execute` on the calling thread (cheap).
    Inline,
    /// A program that may wait in XLA's line of queued computations on this device.
    Line(usize),
    /// A program that calls back.
    CallingBack,
}

/// A run taken off the queue, and the lane it waited in.
pub struct Popped<T> {
    pub lane: Lane,
    pub item: T,
}

struct Waiting<T> {
    id: u64,
    item: T,
}

struct TenantQueue<T> {
    weight: u32,
    pass: u128,
    queued: usize,
    /// By priority (highest first), then lane.
    lanes: [HashMap<Lane, VecDeque<Waiting<T>>>; 3],
}

impl<T> TenantQueue<T> {
    fn new(weight: u32) -> TenantQueue<T> {
        TenantQueue {
            weight: weight.max(1),
            pass: 0,
            queued: 0,
            lanes: Default::default(),
        }
    }

    /// The run this node would send now: (priority index, lane, id) of the first waiting run, by
    /// priority then arrival, that `admits` takes (it is asked about the first run of each lane).
    fn candidate(&self, admits: &impl Fn(Lane, &T) -> bool) -> Option<(usize, Lane, u64)> {
        self.lanes.iter().enumerate().find_map(|(priority, lanes)| {
            lanes
                .iter()
                .filter(|(lane, runs)| runs.front().is_some_and(|r| admits(**lane, &r.item)))
                .map(|(lane, runs)| (priority, *lane, runs[0].id))
                .min_by_key(|&(_, _, id)| id)
        })
    }
}

/// The queued runs of every client node.
pub struct FairQueue<T> {
    tenants: HashMap<Arc<str>, TenantQueue<T>>,
    /// The pass at which the last run admitted started: where a node that had nothing waiting
    /// starts again.
    virtual_time: u128,
    next_id: u64,
    len: usize,
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        FairQueue {
            tenants: HashMap::new(),
            virtual_time: 0,
            next_id: 0,
            len: 0,
        }
    }
}

impl<T> FairQueue<T> {
    fn tenant(&mut self, tenant: &Arc<str>, weight: u32) -> &mut TenantQueue<T> {
        self.tenants
            .entry(tenant.clone())
            .or_insert_with(|| TenantQueue::new(weight))
    }

    /// Queues `item` for `tenant` (whose weight is `weight`); returns its id.
    pub fn push(
        &mut self,
        tenant: &Arc<str>,
        weight: u32,
        priority: Priority,
        lane: Lane,
        item: T,
    ) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let virtual_time = self.virtual_time;
        let queue = self.tenant(tenant, weight);
        if queue.queued == 0 {
            queue.pass = queue.pass.max(virtual_time);
        }
        queue.queued += 1;
        queue.lanes[priority as usize]
            .entry(lane)
            .or_default()
            .push_back(Waiting { id, item });
        self.len += 1;
        id
    }

    /// Counts a run of `tenant` admitted without queueing (a place was free): it takes its share
    /// all the same, and it is the last run admitted.
    pub fn charge(&mut self, tenant: &Arc<str>, weight: u32) {
        let virtual_time = self.virtual_time;
        let queue = self.tenant(tenant, weight);
        let start = queue.pass.max(virtual_time);
        queue.pass = start + PASS_UNIT / u128::from(queue.weight);
        self.virtual_time = start;
    }

    /// Takes the next run to admit: of the nodes with a run that `admits` takes (asked about the
    /// first run of each of a node's lanes), the one with the lowest pass (the earliest run on a
    /// tie), and of its runs the first by priority then arrival.
    pub fn pop(&mut self, admits: impl Fn(Lane, &T) -> bool) -> Option<Popped<T>> {
        let (tenant, (priority, lane, _)) = self
            .tenants
            .iter()
            .filter(|(_, q)| q.queued > 0)
            .filter_map(|(name, q)| q.candidate(&admits).map(|c| (name, q.pass, c)))
            .min_by_key(|&(_, pass, (_, _, id))| (pass, id))
            .map(|(name, _, candidate)| (name.clone(), candidate))?;
        let queue = self.tenants.get_mut(&tenant).expect("found above");
        let runs = queue.lanes[priority].get_mut(&lane).expect("found above");
        let run = runs.pop_front().expect("not empty");
        if runs.is_empty() {
            queue.lanes[priority].remove(&lane);
        }
        queue.queued -= 1;
        self.virtual_time = self.virtual_time.max(queue.pass);
        queue.pass += PASS_UNIT / u128::from(queue.weight);
        self.len -= 1;
        Some(Popped {
            lane,
            item: run.item,
        })
    }

    /// Takes run `id` of `tenant` off the queue (its queue timeout fired), if it still waits.
    pub fn remove(&mut self, tenant: &str, priority: Priority, lane: Lane, id: u64) -> Option<T> {
        let queue = self.tenants.get_mut(tenant)?;
        let runs = queue.lanes[priority as usize].get_mut(&lane)?;
        let position = runs.iter().position(|r| r.id == id)?;
        let run = runs.remove(position).expect("position is in the queue");
        if runs.is_empty() {
            queue.lanes[priority as usize].remove(&lane);
        }
        queue.queued -= 1;
        self.len -= 1;
        Some(run.item)
    }

    /// Runs `tenant` has waiting.
    pub fn queued(&self, tenant: &str) -> usize {
        self.tenants.get(tenant).map_or(0, |q| q.queued)
    }

    /// Runs waiting, of every node.
    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> Arc<str> {
        Arc::from(n)
    }

    /// Admits everything, in the queue's order: the tenants' names.
    fn drain(queue: &mut FairQueue<&'static str>) -> Vec<String> {
        std::iter::from_fn(|| queue.pop(|_, _| true).map(|a| a.item.to_string())).collect()
    }

    #[test]
    fn a_node_with_runs_waiting_is_served_between_a_floods_runs() {
        let mut queue = FairQueue::default();
        let (flood, b, c) = (name("flood@h"), name("b@h"), name("c@h"));
        for _ in 0..20 {
            queue.push(&flood, 1, Priority::Normal, Lane::Inline, "flood");
        }
        queue.push(&b, 1, Priority::Normal, Lane::Inline, "b");
        queue.push(&c, 1, Priority::Normal, Lane::Inline, "c");
        let order = drain(&mut queue);
        let last_small = order.iter().rposition(|t| t != "flood").unwrap();
        assert!(
            last_small <= 3,
            "b and c wait for at most one run of the flood: {order:?}"
        );
    }

    #[test]
    fn weights_give_places_in_their_ratio() {
        let mut queue = FairQueue::default();
        let (a, b) = (name("a@h"), name("b@h"));
        for _ in 0..400 {
            queue.push(&a, 3, Priority::Normal, Lane::Inline, "a");
            queue.push(&b, 1, Priority::Normal, Lane::Inline, "b");
        }
        let first: Vec<_> = drain(&mut queue).into_iter().take(400).collect();
        let of_a = first.iter().filter(|t| *t == "a").count();
        assert_eq!((of_a, 400 - of_a), (300, 100));
    }

    #[test]
    fn a_node_idle_for_a_while_saves_no_credit() {
        let mut queue = FairQueue::default();
        let (a, b) = (name("a@h"), name("b@h"));
        for _ in 0..50 {
            queue.push(&a, 1, Priority::Normal, Lane::Inline, "a");
        }
        for _ in 0..40 {
            queue.pop(|_, _| true);
        }
        for _ in 0..10 {
            queue.push(&b, 1, Priority::Normal, Lane::Inline, "b");
        }
        // b starts at a's pass: the two alternate from here, b does not take ten places in a row.
        let order: Vec<_> = drain(&mut queue).into_iter().take(6).collect();
        assert_eq!(order.iter().filter(|t| *t == "b").count(), 3, "{order:?}");
    }

    #[test]
    fn a_node_that_arrives_while_another_holds_every_place_gets_no_credit_for_it() {
        let mut queue = FairQueue::default();
        let (flood, small) = (name("flood@h"), name("small@h"));
        // The flood took every place at once, then queued more; small arrives after.
        for _ in 0..24 {
            queue.charge(&flood, 1);
        }
        for _ in 0..10 {
            queue.push(&flood, 1, Priority::Normal, Lane::Inline, "flood");
        }
        for _ in 0..3 {
            queue.push(&small, 1, Priority::Normal, Lane::Inline, "small");
        }
        let order: Vec<_> = drain(&mut queue).into_iter().take(6).collect();
        assert_eq!(
            order,
            ["small", "flood", "small", "flood", "small", "flood"]
        );
    }

    #[test]
    fn runs_admitted_at_once_count_in_the_share() {
        let mut queue = FairQueue::default();
        let (a, b) = (name("a@h"), name("b@h"));
        for _ in 0..10 {
            queue.charge(&a, 1);
        }
        queue.push(&a, 1, Priority::Normal, Lane::Inline, "a");
        queue.push(&b, 1, Priority::Normal, Lane::Inline, "b");
        assert_eq!(drain(&mut queue), ["b", "a"]);
    }

    #[test]
    fn within_a_node_priority_then_arrival() {
        let mut queue = FairQueue::default();
        let a = name("a@h");
        queue.push(&a, 1, Priority::Low, Lane::Inline, "low1");
        queue.push(&a, 1, Priority::Normal, Lane::Inline, "normal1");
        queue.push(&a, 1, Priority::High, Lane::Inline, "high1");
        queue.push(&a, 1, Priority::Normal, Lane::Line(0), "normal2");
        queue.push(&a, 1, Priority::High, Lane::Line(0), "high2");
        assert_eq!(
            drain(&mut queue),
            ["high1", "high2", "normal1", "normal2", "low1"]
        );
    }

    #[test]
    fn a_full_lane_lets_other_lanes_go_by() {
        let mut queue = FairQueue::default();
        let (a, b) = (name("a@h"), name("b@h"));
        queue.push(&a, 1, Priority::High, Lane::Line(0), "a-line0");
        queue.push(&a, 1, Priority::Normal, Lane::CallingBack, "a-callback");
        queue.push(&b, 1, Priority::Normal, Lane::Line(1), "b-line1");
        let not_device_0 = |lane: Lane, _: &&str| lane != Lane::Line(0);
        let first = queue.pop(not_device_0).unwrap();
        let second = queue.pop(not_device_0).unwrap();
        assert_eq!([first.item, second.item], ["a-callback", "b-line1"]);
        assert!(queue.pop(not_device_0).is_none());
        assert_eq!(queue.pop(|_, _| true).unwrap().item, "a-line0");
        assert!(queue.is_empty());
    }

    #[test]
    fn a_run_taken_off_leaves_the_others() {
        let mut queue = FairQueue::default();
        let a = name("a@h");
        let first = queue.push(&a, 1, Priority::Normal, Lane::Inline, "first");
        queue.push(&a, 1, Priority::Normal, Lane::Inline, "second");
        assert_eq!(
            queue.remove("a@h", Priority::Normal, Lane::Inline, first),
            Some("first")
        );
        assert_eq!(
            queue.remove("a@h", Priority::Normal, Lane::Inline, first),
            None
        );
        assert_eq!((queue.queued("a@h"), queue.len()), (1, 1));
        assert_eq!(drain(&mut queue), ["second"]);
    }
}
