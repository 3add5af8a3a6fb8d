//! Waiting for server pushes (`task.updated`, `notification`, `events.gap`) with a deadline.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::Client;

impl Client {
    /// Returns the first push (already received, or read now) for which `pred` holds, removing
    /// it from `pushes`; panics after `within`.
    pub fn wait_push(
        &mut self,
        within: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        if let Some(i) = self.pushes.iter().position(&pred) {
            return self.pushes.remove(i);
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "no push matching {what} within {within:?}; got: {:#?}",
                self.pushes
            );
            self.set_read_timeout(left);
            let msg = self.read_message_timeout();
            self.set_read_timeout(Duration::from_secs(120));
            match msg {
                Some(m) if pred(&m) => return m,
                Some(m) => self.pushes.push(m),
                None => {}
            }
        }
    }

    /// Reads pushes for `period` and returns those matching `pred` (for asserting that
    /// something does NOT arrive, or counting).
    pub fn collect_pushes(
        &mut self,
        period: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + period;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.set_read_timeout(left);
            if let Some(m) = self.read_message_timeout() {
                self.pushes.push(m);
            }
        }
        self.set_read_timeout(Duration::from_secs(120));
        let (hit, rest): (Vec<Value>, Vec<Value>) = std::mem::take(&mut self.pushes)
            .into_iter()
            .partition(|m| pred(m));
        self.pushes = rest;
        hit
    }
}

impl Client {
    /// Reads the stream up to the first push for which `pred` holds and returns every push
    /// received until then (those kept in `pushes` first), that one last; panics after
    /// `within`. With a sentinel the test caused last, this reads a subscription "to the end"
    /// without a fixed window: whatever was pushed before the sentinel is in the result.
    pub fn read_until(
        &mut self,
        within: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Vec<Value> {
        let mut out = Vec::new();
        if let Some(i) = self.pushes.iter().position(&pred) {
            out.extend(self.pushes.drain(..=i));
            return out;
        }
        out.append(&mut self.pushes);
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "no push matching {what} within {within:?}; got: {out:#?}"
            );
            self.set_read_timeout(left);
            let msg = self.read_message_timeout();
            self.set_read_timeout(Duration::from_secs(120));
            if let Some(m) = msg {
                let done = pred(&m);
                out.push(m);
                if done {
                    return out;
                }
            }
        }
    }
}

/// `method == "notification"` and the notification is about `task_id`.
pub fn is_notification_for(task_id: &str) -> impl Fn(&Value) -> bool + '_ {
    move |m| m["method"] == "notification" && m["params"]["notification"]["task_id"] == task_id
}

/// `method == "task.updated"` for `task_id` in `state`.
pub fn is_update<'a>(task_id: &'a str, state: &'static str) -> impl Fn(&Value) -> bool + 'a {
    move |m| {
        m["method"] == "task.updated"
            && m["params"]["task"]["task_id"] == task_id
            && m["params"]["task"]["state"] == state
    }
}
